"""What the demo corpus's families share: identifier pools and the comment helper.

Contract: constants and two pure helpers; no imports beyond the standard library.
"""

from __future__ import annotations

import random

Doc = tuple[str, str]  # (prompt, body)

SEQ = ["items", "values", "numbers", "data", "xs", "seq", "nums", "elements", "entries", "scores", "readings"]
WORDS = ["words", "names", "lines", "tokens", "labels", "tags", "keys", "titles"]
ONE = {"items": "item", "values": "value", "numbers": "number", "data": "x", "xs": "x", "seq": "x", "nums": "n",
       "elements": "element", "entries": "entry", "scores": "score", "readings": "reading", "words": "word",
       "names": "name", "lines": "line", "tokens": "token", "labels": "label", "tags": "tag", "keys": "key",
       "titles": "title"}  # fmt: skip
PAIRS = [("Fizz", "Buzz"), ("Foo", "Bar"), ("Ping", "Pong"), ("Tick", "Tock"), ("Zip", "Zap"), ("Bim", "Bam")]


def pick(r: random.Random, xs):
    return xs[r.randrange(len(xs))]


def cmt(*lines: str) -> str:
    return "".join(f"# {ln}\n" for ln in lines)
