"""The coding-10 task families of the demo corpus (`synth`): each returns one (prompt, body) pair, and its variant 0
is the coding-10 prompt itself, so the target learns these tasks among many other functions.

Contract: every family is `f(rng) -> (prompt, body)`, deterministic for the generator's state; a body repeats no
line (compared without indentation) and compiles after its prompt.
"""

from __future__ import annotations

import random

from .synth_base import PAIRS, Doc, cmt, pick


def fizzbuzz(r: random.Random) -> Doc:
    (a, b), (m, k) = (("Fizz", "Buzz"), (3, 5)) if r.random() < 0.3 else (pick(r, PAIRS), r.sample([2, 3, 4, 5, 7], 2))
    name = "fizzbuzz" if a == "Fizz" else f"{a.lower()}{b.lower()}"
    p = (
        cmt(
            f'Return the {a}{b} sequence for 1..n as a list of strings: "{a}" for multiples of {m},',
            f'"{b}" for multiples of {k}, "{a}{b}" for both, otherwise the number itself.',
        )
        + f"def {name}(n):\n"
    )
    body = (
        "    out = []\n"
        "    for i in range(1, n + 1):\n"
        f"        if i % {m * k} == 0:\n"
        f'            out.append("{a}{b}")\n'
        f"        elif i % {m} == 0:\n"
        f'            out.append("{a}")\n'
        f"        elif i % {k} == 0:\n"
        f'            out.append("{b}")\n'
        "        else:\n"
        "            out.append(str(i))\n"
        "    return out\n"
    )
    return p, body


def binary_search(r: random.Random) -> Doc:
    xs, t = pick(r, [("items", "target"), ("values", "key"), ("nums", "x"), ("seq", "value")])
    name = pick(r, ["binary_search", "bisect_find", "find_sorted", "search"])
    if r.random() < 0.3:
        xs, t, name = "items", "target", "binary_search"
    p = (
        cmt(
            f"Find `{t}` in the sorted list `{xs}` with binary search.",
            "Return its index, or -1 when it is absent. Do not use the bisect module.",
        )
        + f"def {name}({xs}, {t}):\n"
    )
    body = (
        f"    lo, hi = 0, len({xs}) - 1\n"
        "    while lo <= hi:\n"
        "        mid = (lo + hi) // 2\n"
        f"        if {xs}[mid] == {t}:\n"
        "            return mid\n"
        f"        if {xs}[mid] < {t}:\n"
        "            lo = mid + 1\n"
        "        else:\n"
        "            hi = mid - 1\n"
        "    return -1\n"
    )
    return p, body


def reverse_list(r: random.Random) -> Doc:
    node, val, nxt = pick(r, [("Node", "value", "next"), ("ListNode", "val", "next"), ("Cell", "item", "link")])
    name = pick(r, ["reverse", "reverse_list", "reversed_nodes"]) if r.random() > 0.3 else "reverse"
    p = (
        cmt("Reverse a singly linked list in place and return the new head.")
        + f"class {node}:\n    def __init__(self, {val}, {nxt}=None):\n"
        + f"        self.{val} = {val}\n        self.{nxt} = {nxt}\n\n\n"
        + f"def {name}(head):\n"
    )
    body = (
        "    prev = None\n"
        "    while head is not None:\n"
        f"        following = head.{nxt}\n"
        f"        head.{nxt} = prev\n"
        "        prev = head\n"
        "        head = following\n"
        "    return prev\n"
    )
    return p, body


def merge_sort(r: random.Random) -> Doc:
    xs = pick(r, ["items", "values", "seq", "data"]) if r.random() > 0.3 else "items"
    p = cmt("Sort a list with merge sort and return a new list; the sort must be stable.") + f"def merge_sort({xs}):\n"
    body = (
        f"    if len({xs}) <= 1:\n"
        f"        return list({xs})\n"
        f"    mid = len({xs}) // 2\n"
        f"    left = merge_sort({xs}[:mid])\n"
        f"    right = merge_sort({xs}[mid:])\n"
        "    merged = []\n"
        "    i = j = 0\n"
        "    while i < len(left) and j < len(right):\n"
        "        if left[i] <= right[j]:\n"
        "            merged.append(left[i])\n"
        "            i += 1\n"
        "        else:\n"
        "            merged.append(right[j])\n"
        "            j += 1\n"
        "    merged.extend(left[i:])\n"
        "    merged.extend(right[j:])\n"
        "    return merged\n"
    )
    return p, body


def matmul(r: random.Random) -> Doc:
    a, b = pick(r, [("a", "b"), ("x", "y"), ("left", "right"), ("m", "n")]) if r.random() > 0.3 else ("a", "b")
    name = pick(r, ["matmul", "mat_mul", "multiply"]) if r.random() > 0.3 else "matmul"
    p = (
        cmt(
            "Multiply two matrices given as lists of rows, without numpy.",
            "Raise ValueError when the inner dimensions do not match.",
        )
        + f"def {name}({a}, {b}):\n"
    )
    body = (
        f"    if not {a} or len({a}[0]) != len({b}):\n"
        '        raise ValueError("inner dimensions do not match")\n'
        f"    cols = len({b}[0])\n"
        "    out = []\n"
        f"    for row in {a}:\n"
        f"        out.append([sum(row[k] * {b}[k][c] for k in range(len(row))) for c in range(cols)])\n"
        "    return out\n"
    )
    return p, body


def bfs(r: random.Random) -> Doc:
    g, s, t = pick(r, [("graph", "start", "goal"), ("adj", "source", "target"), ("edges", "src", "dst")])
    name = pick(r, ["shortest_path", "bfs_path", "find_path"])
    if r.random() < 0.3:
        g, s, t, name = "graph", "start", "goal", "shortest_path"
    p = (
        cmt(
            "Breadth-first search on a graph given as an adjacency dict {node: [neighbours]}.",
            f"Return the shortest path from `{s}` to `{t}` as a list of nodes, or None.",
        )
        + "from collections import deque\n\n\n"
        + f"def {name}({g}, {s}, {t}):\n"
    )
    body = (
        f"    parent = {{{s}: None}}\n"
        f"    queue = deque([{s}])\n"
        "    while queue:\n"
        "        node = queue.popleft()\n"
        f"        if node == {t}:\n"
        "            path = []\n"
        "            while node is not None:\n"
        "                path.append(node)\n"
        "                node = parent[node]\n"
        "            return path[::-1]\n"
        f"        for nb in {g}.get(node, []):\n"
        "            if nb not in parent:\n"
        "                parent[nb] = node\n"
        "                queue.append(nb)\n"
        "    return None\n"
    )
    return p, body


def lru(r: random.Random) -> Doc:
    cls, cap = pick(r, [("LRUCache", "capacity"), ("Cache", "size"), ("RecentCache", "limit")])
    if r.random() < 0.3:
        cls, cap = "LRUCache", "capacity"
    p = (
        cmt(
            "A least-recently-used cache with O(1) get(key) and put(key, value); get returns None",
            f"for a missing key, and put evicts the least recently used entry beyond `{cap}`.",
        )
        + f"class {cls}:\n    def __init__(self, {cap}: int):\n"
    )
    body = (
        f"        self.{cap} = {cap}\n"
        "        self.data = {}\n"
        "\n"
        "    def get(self, key):\n"
        "        if key not in self.data:\n"
        "            return None\n"
        "        self.data[key] = self.data.pop(key)\n"
        "        return self.data[key]\n"
        "\n"
        "    def put(self, key, value):\n"
        "        self.data.pop(key, None)\n"
        "        self.data[key] = value\n"
        f"        if len(self.data) > self.{cap}:\n"
        "            del self.data[next(iter(self.data))]\n"
    )
    return p, body


def trie(r: random.Random) -> Doc:
    cls = pick(r, ["Trie", "PrefixTree", "WordTrie"]) if r.random() > 0.3 else "Trie"
    p = (
        cmt(
            "A trie of words with insert(word) and complete(prefix, limit=10), which returns up to",
            "`limit` stored words starting with `prefix`, in alphabetical order.",
        )
        + f"class {cls}:\n    def __init__(self):\n"
    )
    body = (
        "        self.children = {}\n"
        "        self.end = False\n"
        "\n"
        "    def insert(self, word):\n"
        "        node = self\n"
        "        for ch in word:\n"
        f"            node = node.children.setdefault(ch, {cls}())\n"
        "        node.end = True\n"
        "\n"
        "    def complete(self, prefix, limit=10):\n"
        "        here = self\n"
        "        for ch in prefix:\n"
        "            if ch not in here.children:\n"
        "                return []\n"
        "            here = here.children[ch]\n"
        "        found = []\n"
        "        stack = [(here, prefix)]\n"
        "        while stack and len(found) < limit:\n"
        "            cur, word = stack.pop()\n"
        "            if cur.end:\n"
        "                found.append(word)\n"
        "            for ch in sorted(cur.children, reverse=True):\n"
        "                stack.append((cur.children[ch], word + ch))\n"
        "        return found\n"
    )
    return p, body


def rate_limiter(r: random.Random) -> Doc:
    cls, rate, per = pick(r, [("RateLimiter", "rate", "period"), ("Throttle", "limit", "window")])
    if r.random() < 0.3:
        cls, rate, per = "RateLimiter", "rate", "period"
    p = (
        cmt(
            f"An asyncio rate limiter allowing at most `{rate}` acquisitions per `{per}` seconds",
            "(token bucket). Usage: `async with limiter: ...`.",
        )
        + "import asyncio\nimport time\n\n\n"
        + f"class {cls}:\n    def __init__(self, {rate}: int, {per}: float = 1.0):\n"
    )
    body = (
        f"        self.{rate} = {rate}\n"
        f"        self.{per} = {per}\n"
        f"        self.tokens = float({rate})\n"
        "        self.updated = time.monotonic()\n"
        "        self.lock = asyncio.Lock()\n"
        "\n"
        "    async def __aenter__(self):\n"
        "        async with self.lock:\n"
        "            while True:\n"
        "                now = time.monotonic()\n"
        f"                gained = (now - self.updated) * self.{rate} / self.{per}\n"
        f"                self.tokens = min(self.{rate}, self.tokens + gained)\n"
        "                self.updated = now\n"
        "                if self.tokens >= 1:\n"
        "                    self.tokens -= 1\n"
        "                    return self\n"
        f"                await asyncio.sleep((1 - self.tokens) * self.{per} / self.{rate})\n"
        "\n"
        "    async def __aexit__(self, *exc):\n"
        "        return False\n"
    )
    return p, body


def json_parser(r: random.Random) -> Doc:
    name, text = pick(r, [("parse_json", "text"), ("loads", "source"), ("parse", "data")])
    if r.random() < 0.3:
        name, text = "parse_json", "text"
    p = (
        cmt(
            "A minimal recursive-descent JSON parser: objects, arrays, strings with escapes,",
            "numbers, true, false and null. Raise ValueError with the position on bad input.",
        )
        + f"def {name}({text}):\n    pos = 0\n"
    )
    body = (  # no blank line first: "\n\n" after the prompt's last newline would tokenise across the boundary
        "    def skip(i):\n"
        f"        while i < len({text}) and {text}[i] in ' \\t\\n\\r':\n"
        "            i += 1\n"
        "        return i\n"
        "\n"
        "    def number(i):\n"
        "        end = i\n"
        f"        while end < len({text}) and {text}[end] in '+-0123456789.eE':\n"
        "            end += 1\n"
        "        if end == i:\n"
        "            raise ValueError(f'bad value at {i}')\n"
        f"        return float({text}[i:end]), end\n"
        "\n"
        "    def value(i):\n"
        "        for word, result in (('true', True), ('false', False), ('null', None)):\n"
        f"            if {text}.startswith(word, i):\n"
        "                return result, i + len(word)\n"
        f"        if {text}[i:i + 1] == '[':\n"
        "            items, i = [], skip(i + 1)\n"
        f"            while {text}[i:i + 1] != ']':\n"
        "                item, i = value(i)\n"
        "                items.append(item)\n"
        "                i = skip(i)\n"
        f"                if {text}[i:i + 1] == ',':\n"
        "                    i = skip(i + 1)\n"
        "            return items, i + 1\n"
        "        return number(i)\n"
        "\n"
        "    result, pos = value(skip(pos))\n"
        f"    if skip(pos) != len({text}):\n"
        "        raise ValueError(f'extra data at {pos}')\n"
        "    return result\n"
    )
    return p, body


CODING = [fizzbuzz, binary_search, reverse_list, merge_sort, matmul, bfs, lru, trie, rate_limiter, json_parser]
