"""The demo's training corpus: small Python functions drawn from a seeded generator, with learnable structure.

Contract: `document(rng)` returns one (prompt, body) pair in the shape of the `coding-10` prompts: a `#` comment
saying what the code does, any imports or class preamble, then the `def` line (the prompt); the body follows. Each
`coding-10` task is one family among many (its exact prompt is one of the family's phrasings, its identifiers one
of several), beside generic families (reductions, filters, string and dict helpers, small classes); identifiers,
constants and comment wording are drawn per document, so the corpus is far larger than a small model memorises
and a held-out draw scores like the training draws. `corpus(n, seed)` draws n documents; the same seed gives the
same text. Bodies repeat no line within a document, so a completion that follows the corpus repeats none either.
CPU only, nothing downloaded.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from .coding import CODING
from .synth_base import ONE, SEQ, WORDS, Doc, cmt, pick
from .vary import vary

# ---------------------------------------------------------------------------
# generic families


def reduce_fn(r: random.Random) -> Doc:
    xs = pick(r, SEQ)
    x = ONE[xs]
    kind = pick(r, ["sum", "product", "count_pos", "count_even", "max", "min", "sum_sq", "mean"])
    name, what, init, step, ret = {
        "sum": ("total", "Return the sum of", "0", "acc += {x}", "acc"),
        "product": ("product", "Return the product of", "1", "acc *= {x}", "acc"),
        "count_pos": ("count_positive", "Count the positive numbers in", "0", "acc += {x} > 0", "acc"),
        "count_even": ("count_even", "Count the even numbers in", "0", "acc += {x} % 2 == 0", "acc"),
        "max": ("largest", "Return the largest of", "None", "acc = {x} if acc is None or {x} > acc else acc", "acc"),
        "min": ("smallest", "Return the smallest of", "None", "acc = {x} if acc is None or {x} < acc else acc", "acc"),
        "sum_sq": ("sum_of_squares", "Return the sum of the squares of", "0", "acc += {x} * {x}", "acc"),
        "mean": ("mean", "Return the mean of", "0", "acc += {x}", "acc / len({xs}) if {xs} else 0.0"),
    }[kind]
    fname = pick(r, [name, f"{name}_of", f"{name}_{xs}"])
    p = cmt(f"{what} `{xs}` without using builtins.") + f"def {fname}({xs}):\n"
    body = f"    acc = {init}\n    for {x} in {xs}:\n        {step.format(x=x)}\n    return {ret.format(xs=xs)}\n"
    return p, body


def filter_fn(r: random.Random) -> Doc:
    xs = pick(r, SEQ)
    x = ONE[xs]
    k = r.randrange(2, 100)
    cond, what = pick(
        r,
        [
            (f"{x} > {k}", f"greater than {k}"),
            (f"{x} < {k}", f"smaller than {k}"),
            (f"{x} % {k} == 0", f"divisible by {k}"),
            (f"{x} != {k}", f"not equal to {k}"),
            (f"{x} >= {k}", f"at least {k}"),
        ],
    )
    fname = pick(r, ["keep", "select", "filter", "only"]) + "_" + xs
    if r.random() < 0.5:
        p = cmt(f"Return the {xs} {what}, in their order.") + f"def {fname}({xs}):\n"
        body = f"    return [{x} for {x} in {xs} if {cond}]\n"
    else:
        p = cmt(f"Return a new list of the {xs} {what}.") + f"def {fname}({xs}):\n"
        body = (
            f"    kept = []\n    for {x} in {xs}:\n        if {cond}:\n            kept.append({x})\n    return kept\n"
        )
    return p, body


def string_fn(r: random.Random) -> Doc:
    s = pick(r, ["text", "s", "line", "word", "name"])
    kind = pick(r, ["palindrome", "reverse", "vowels", "capitalize", "words", "strip_digits", "snake"])
    spec = {
        "palindrome": ("is_palindrome", "Return True when `{s}` reads the same backwards, ignoring case.",
                       "    clean = {s}.lower()\n    return clean == clean[::-1]\n"),
        "reverse": ("reverse_string", "Return `{s}` reversed.", "    return {s}[::-1]\n"),
        "vowels": ("count_vowels", "Count the vowels in `{s}`.",
                   "    return sum(1 for ch in {s}.lower() if ch in 'aeiou')\n"),
        "capitalize": ("title_case", "Capitalize the first letter of every word in `{s}`.",
                       "    return ' '.join(w[:1].upper() + w[1:] for w in {s}.split())\n"),
        "words": ("word_count", "Count how often each word occurs in `{s}`; return a dict.",
                  "    counts = {{}}\n    for w in {s}.split():\n        counts[w] = counts.get(w, 0) + 1\n"
                  "    return counts\n"),
        "strip_digits": ("strip_digits", "Return `{s}` without its digits.",
                         "    return ''.join(ch for ch in {s} if not ch.isdigit())\n"),
        "snake": ("to_snake_case", "Convert the camelCase string `{s}` to snake_case.",
                  "    out = []\n    for ch in {s}:\n        if ch.isupper() and out:\n            out.append('_')\n"
                  "        out.append(ch.lower())\n    return ''.join(out)\n"),
    }[kind]  # fmt: skip
    p = cmt(spec[1].format(s=s)) + f"def {spec[0]}({s}):\n"
    return p, spec[2].format(s=s)


def math_fn(r: random.Random) -> Doc:
    n = pick(r, ["n", "k", "num", "count"])
    kind = pick(r, ["fib", "fact", "prime", "gcd", "digits", "power", "triangle"])
    spec = {
        "fib": ("fibonacci", "Return the `{n}`-th Fibonacci number (0, 1, 1, 2, ...) iteratively.",
                "({n})", "    a, b = 0, 1\n    for _ in range({n}):\n        a, b = b, a + b\n    return a\n"),
        "fact": ("factorial", "Return `{n}` factorial; raise ValueError for a negative `{n}`.", "({n})",
                 "    if {n} < 0:\n        raise ValueError('negative')\n    result = 1\n"
                 "    for i in range(2, {n} + 1):\n        result *= i\n    return result\n"),
        "prime": ("is_prime", "Return True when `{n}` is a prime number.", "({n})",
                  "    i = 2\n    while i * i <= {n}:\n"
                  "        if {n} % i == 0:\n            return False\n        i += 1\n    return {n} >= 2\n"),
        "gcd": ("gcd", "Return the greatest common divisor of `a` and `b` (Euclid).", "(a, b)",
                "    while b:\n        a, b = b, a % b\n    return abs(a)\n"),
        "digits": ("digit_sum", "Return the sum of the decimal digits of `{n}`.", "({n})",
                   "    {n} = abs({n})\n    total = 0\n    while {n}:\n        total += {n} % 10\n"
                   "        {n} //= 10\n    return total\n"),
        "power": ("power", "Return `base` to the power `{n}` by repeated squaring.", "(base, {n})",
                  "    result = 1\n    while {n} > 0:\n        if {n} & 1:\n            result *= base\n"
                  "        base *= base\n        {n} >>= 1\n    return result\n"),
        "triangle": ("triangle", "Return the `{n}`-th triangular number.", "({n})",
                     "    return {n} * ({n} + 1) // 2\n"),
    }[kind]  # fmt: skip
    p = cmt(spec[1].format(n=n)) + f"def {spec[0]}{spec[2].format(n=n)}:\n"
    return p, spec[3].format(n=n)


def list_fn(r: random.Random) -> Doc:
    xs = pick(r, SEQ + WORDS)
    x = ONE[xs]
    k = pick(r, ["size", "n", "width"])
    kind = pick(r, ["dedupe", "chunk", "flatten", "running", "pairs", "rotate", "index"])
    spec = {
        "dedupe": ("unique", "Remove duplicates from `{xs}`, keeping the first occurrence of each.", "({xs})",
                   "    seen = set()\n    out = []\n    for {x} in {xs}:\n        if {x} not in seen:\n"
                   "            seen.add({x})\n            out.append({x})\n    return out\n"),
        "chunk": ("chunks", "Split `{xs}` into lists of `{k}` items; the last one may be shorter.", "({xs}, {k})",
                  "    return [{xs}[i:i + {k}] for i in range(0, len({xs}), {k})]\n"),
        "flatten": ("flatten", "Flatten a list of lists `{xs}` into one list.", "({xs})",
                    "    return [{x} for part in {xs} for {x} in part]\n"),
        "running": ("running_total", "Return the running totals of `{xs}`.", "({xs})",
                    "    out = []\n    total = 0\n    for {x} in {xs}:\n        total += {x}\n"
                    "        out.append(total)\n    return out\n"),
        "pairs": ("adjacent_pairs", "Return the pairs of neighbouring items of `{xs}`.", "({xs})",
                  "    return list(zip({xs}, {xs}[1:]))\n"),
        "rotate": ("rotate", "Rotate `{xs}` left by `{k}` places.", "({xs}, {k})",
                   "    if not {xs}:\n        return []\n    {k} %= len({xs})\n    return {xs}[{k}:] + {xs}[:{k}]\n"),
        "index": ("index_of", "Return the index of the first `{x}` equal to `target` in `{xs}`, or -1.",
                  "({xs}, target)", "    for i, {x} in enumerate({xs}):\n        if {x} == target:\n"
                  "            return i\n    return -1\n"),
    }[kind]  # fmt: skip
    f = {"xs": xs, "x": x, "k": k}
    p = cmt(spec[1].format(**f)) + f"def {spec[0]}{spec[2].format(**f)}:\n"
    return p, spec[3].format(**f)


def dict_fn(r: random.Random) -> Doc:
    xs = pick(r, WORDS)
    x = ONE[xs]
    kind = pick(r, ["group_len", "invert", "merge", "count", "first_letter"])
    spec = {
        "group_len": ("group_by_length", "Group `{xs}` by their length: {{length: [{xs}]}}.", "({xs})",
                      "    groups = {{}}\n    for {x} in {xs}:\n        groups.setdefault(len({x}), []).append({x})\n"
                      "    return groups\n"),
        "invert": ("invert", "Swap the keys and values of the dict `mapping`.", "(mapping)",
                   "    return {{v: k for k, v in mapping.items()}}\n"),
        "merge": ("merge_counts", "Merge two dicts of counts, adding the counts of shared keys.", "(a, b)",
                  "    out = dict(a)\n    for k, v in b.items():\n        out[k] = out.get(k, 0) + v\n"
                  "    return out\n"),
        "count": ("frequencies", "Count how often each of the `{xs}` occurs.", "({xs})",
                  "    counts = {{}}\n    for {x} in {xs}:\n        counts[{x}] = counts.get({x}, 0) + 1\n"
                  "    return counts\n"),
        "first_letter": ("by_initial", "Map each first letter to the `{xs}` that start with it.", "({xs})",
                         "    out = {{}}\n    for {x} in {xs}:\n        if {x}:\n"
                         "            out.setdefault({x}[0], []).append({x})\n    return out\n"),
    }[kind]  # fmt: skip
    f = {"xs": xs, "x": x}
    p = cmt(spec[1].format(**f)) + f"def {spec[0]}{spec[2].format(**f)}:\n"
    return p, spec[3].format(**f)


def class_fn(r: random.Random) -> Doc:
    cls, kind = pick(r, [("Stack", "stack"), ("Queue", "queue"), ("Counter", "counter"), ("Point", "point")])
    if kind == "stack":
        p = cmt("A stack with push(item), pop() and peek(); pop and peek raise IndexError when empty.")
        body = ("        self.items = []\n\n    def push(self, item):\n        self.items.append(item)\n\n"
                "    def pop(self):\n        if not self.items:\n            raise IndexError('pop from empty stack')\n"
                "        return self.items.pop()\n\n    def peek(self):\n        if self.items:\n"
                "            return self.items[-1]\n        raise IndexError('peek at empty stack')\n")  # fmt: skip
    elif kind == "queue":
        p = cmt("A FIFO queue with enqueue(item), dequeue() and len(); dequeue raises IndexError when empty.")
        body = ("        self.items = []\n        self.head = 0\n\n    def enqueue(self, item):\n"
                "        self.items.append(item)\n\n    def dequeue(self):\n        if self.head == len(self.items):\n"
                "            raise IndexError('dequeue from empty queue')\n        item = self.items[self.head]\n"
                "        self.head += 1\n        return item\n\n    def __len__(self):\n"
                "        return len(self.items) - self.head\n")  # fmt: skip
    elif kind == "counter":
        p = cmt("A counter with increment(step=1), reset() and a value property.")
        body = ("        self._value = 0\n\n    def increment(self, step=1):\n        self._value += step\n\n"
                "    def reset(self):\n        self.__init__()\n\n    @property\n    def value(self):\n"
                "        return self._value\n")  # fmt: skip
    else:
        p = cmt("A 2-D point with x and y, distance_to(other) and a readable repr.")
        body = ("        self.x = 0.0\n        self.y = 0.0\n\n    def distance_to(self, other):\n"
                "        return ((self.x - other.x) ** 2 + (self.y - other.y) ** 2) ** 0.5\n\n"
                "    def __repr__(self):\n        return f'Point({self.x}, {self.y})'\n")  # fmt: skip
    return p + f"class {cls}:\n    def __init__(self):\n", body


GENERIC = [reduce_fn, filter_fn, string_fn, math_fn, list_fn, dict_fn, class_fn]
FAMILIES: list[Callable[[random.Random], Doc]] = CODING + GENERIC
WEIGHTS = [1.0] * len(CODING) + [3.0] * len(GENERIC)  # generic families are the bulk of the corpus


def document(r: random.Random, free: bool = False) -> Doc:
    """One (prompt, body) drawn from the families; with `free`, with a writer's free choices (`vary`)."""
    p, body = r.choices(FAMILIES, weights=WEIGHTS)[0](r)
    return (p, vary(r, p, body)) if free else (p, body)


def tagged(n: int, seed: int, free: bool = False) -> list[tuple[bool, Doc]]:
    """`corpus(n, seed, free)` with each document tagged True when it comes from a coding-10 family (the same
    draws: the same documents as `corpus`)."""
    r, out = random.Random(seed), []
    for _ in range(n):
        fam = r.choices(FAMILIES, weights=WEIGHTS)[0]
        p, body = fam(r)
        out.append((fam in CODING, (p, vary(r, p, body)) if free else (p, body)))
    return out


def corpus(n: int, seed: int, free: bool = False) -> list[Doc]:
    """n documents, deterministic for a seed (and `free`)."""
    r = random.Random(seed)
    return [document(r, free) for _ in range(n)]


def repeated_line_rate(text: str) -> float:
    """Share of a completion's non-blank lines that repeat an earlier line of the same completion (compared
    without their indentation)."""
    seen, rep, n = set(), 0, 0
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        n += 1
        rep += line in seen
        seen.add(line)
    return rep / n if n else 0.0
