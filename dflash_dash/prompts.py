"""Prompt sets: the built-in `coding-10` set and JSONL prompt files.

Contract: `load(name_or_path)` returns a list of {"id", "prompt"} or {"id", "prompt_ids"} dicts in order,
from a built-in set (`SETS`) or a JSONL file with one such object per line; a bad file raises
`PromptSetError` naming the line and the fix. The built-in prompts were written for this project: each is a
short task in a comment followed by the start of the Python code, so a small code model completes it.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import UserError


class PromptSetError(UserError, ValueError):
    """A prompt set that cannot be used; the message names the file, line and fix."""


# ---------------------------------------------------------------------------
# coding-10

CODING_10 = {
    "fizzbuzz": (
        "# Return the FizzBuzz sequence for 1..n as a list of strings: \"Fizz\" for multiples of 3,\n"
        "# \"Buzz\" for multiples of 5, \"FizzBuzz\" for both, otherwise the number itself.\n"
        "def fizzbuzz(n):\n"
    ),
    "binary_search": (
        "# Find `target` in the sorted list `items` with binary search.\n"
        "# Return its index, or -1 when it is absent. Do not use the bisect module.\n"
        "def binary_search(items, target):\n"
    ),
    "linked_list_reverse": (
        "# Reverse a singly linked list in place and return the new head.\n"
        "class Node:\n"
        "    def __init__(self, value, next=None):\n"
        "        self.value = value\n"
        "        self.next = next\n"
        "\n\n"
        "def reverse(head):\n"
    ),
    "json_parser": (
        "# A minimal recursive-descent JSON parser: objects, arrays, strings with escapes,\n"
        "# numbers, true, false and null. Raise ValueError with the position on bad input.\n"
        "def parse_json(text):\n"
        "    pos = 0\n"
    ),
    "async_rate_limiter": (
        "# An asyncio rate limiter allowing at most `rate` acquisitions per `period` seconds\n"
        "# (token bucket). Usage: `async with limiter: ...`.\n"
        "import asyncio\n"
        "import time\n"
        "\n\n"
        "class RateLimiter:\n"
        "    def __init__(self, rate: int, period: float = 1.0):\n"
    ),
    "trie_autocomplete": (
        "# A trie of words with insert(word) and complete(prefix, limit=10), which returns up to\n"
        "# `limit` stored words starting with `prefix`, in alphabetical order.\n"
        "class Trie:\n"
        "    def __init__(self):\n"
    ),
    "merge_sort": (
        "# Sort a list with merge sort and return a new list; the sort must be stable.\ndef merge_sort(items):\n"
    ),
    "lru_cache": (
        "# A least-recently-used cache with O(1) get(key) and put(key, value); get returns None\n"
        "# for a missing key, and put evicts the least recently used entry beyond `capacity`.\n"
        "class LRUCache:\n"
        "    def __init__(self, capacity: int):\n"
    ),
    "graph_bfs": (
        "# Breadth-first search on a graph given as an adjacency dict {node: [neighbours]}.\n"
        "# Return the shortest path from `start` to `goal` as a list of nodes, or None.\n"
        "from collections import deque\n"
        "\n\n"
        "def shortest_path(graph, start, goal):\n"
    ),
    "matrix_multiply": (
        "# Multiply two matrices given as lists of rows, without numpy.\n"
        "# Raise ValueError when the inner dimensions do not match.\n"
        "def matmul(a, b):\n"
    ),
}

SETS: dict[str, list[dict]] = {
    "coding-10": [{"id": k, "prompt": v} for k, v in CODING_10.items()],
}


# ---------------------------------------------------------------------------
# loading


def load(name_or_path: str) -> list[dict]:
    """A built-in set by name, else a JSONL file of {"id", "prompt"} or {"id", "prompt_ids"} per line."""
    if name_or_path in SETS:
        return [dict(p) for p in SETS[name_or_path]]
    p = Path(name_or_path)
    if not p.is_file():
        raise PromptSetError(
            f"prompt set {name_or_path!r}: neither a built-in set ({', '.join(SETS)}) nor an existing JSONL file"
        )
    return parse(p.read_text(), str(p))


def records(text: str, err: type[Exception], where: str = ""):
    """JSONL lines -> (line number, object, id): valid JSON objects with a unique non-empty string 'id'.

    The one JSONL reader of the project (prompt files here, completion files in pipeline); errors are `err`
    with a message that starts with the line."""
    seen = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        at = f"{where} line {n}" if where else f"line {n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise err(f"{at}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(rec, dict):
            raise err(f"{at}: expected a JSON object, got {type(rec).__name__}")
        pid = rec.get("id")
        if not isinstance(pid, str) or not pid:
            raise err(f"{at}: field 'id' must be a non-empty string")
        if pid in seen:
            raise err(f"{at}: duplicate id {pid!r}")
        seen.add(pid)
        yield n, rec, pid


def parse(text: str, where: str = "prompts") -> list[dict]:
    out = []
    for n, rec, pid in records(text, PromptSetError, where):
        if isinstance(rec.get("prompt_ids"), list):
            ids = rec["prompt_ids"]
            if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                raise PromptSetError(
                    f"{where} line {n} (id {pid!r}): 'prompt_ids' must be a non-empty list of token ids >= 0"
                )
            out.append({"id": pid, "prompt_ids": ids, "prompt": rec.get("prompt")})
        elif isinstance(rec.get("prompt"), str) and rec["prompt"]:
            out.append({"id": pid, "prompt": rec["prompt"]})
        else:
            raise PromptSetError(
                f"{where} line {n} (id {pid!r}): give 'prompt' (a non-empty string) or "
                "'prompt_ids' (a list of token ids)"
            )
    if not out:
        raise PromptSetError(f"{where}: no prompts (expected one JSON object per line)")
    return out
