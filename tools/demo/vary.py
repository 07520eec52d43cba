"""Free choices in the demo corpus's bodies: what a writer picks at will, so the target meets near-ties.

Contract: `vary(r, prompt, body)` returns the body with (a) each local name that has synonyms renamed, with
probability 1/len(choices) each, to one of them (never to a word the document already uses, never inside the
prompt), and (b) an optional comment line, drawn uniformly from a small pool or left out, before the body's first
line and before its last `return`. The code is unchanged in meaning, and no line is repeated. A target trained on
such text is unsure exactly where a writer is free (its greedy pick there rests on slight preferences), as real
targets are: where the drafter must match a near-tie, it can miss, and a drafter trained to copy the target's
whole distribution (soft KL) misses more there than one trained on the target's own picks.
"""

from __future__ import annotations

import random
import re

SYNONYMS = {  # a local name -> the names a writer might use instead
    "out": ["result", "res", "collected"],
    "acc": ["total", "running", "agg"],
    "kept": ["picked", "chosen", "selected"],
    "merged": ["combined", "joined", "ordered"],
    "counts": ["tally", "freq", "seen_counts"],
    "groups": ["buckets", "by_size", "grouped"],
    "seen": ["visited", "known", "already"],
    "found": ["matches", "hits", "results"],
    "parent": ["came_from", "prev_of", "back"],
    "queue": ["frontier", "todo", "pending"],
    "path": ["route", "trail", "walk"],
    "stack": ["todo_stack", "work", "pending_stack"],
    "prev": ["previous", "done", "tail"],
    "following": ["rest", "after", "upcoming"],
    "mid": ["middle", "centre", "pivot"],
    "cols": ["width", "n_cols", "ncols"],
    "total": ["sum_so_far", "subtotal", "running_total"],
    "result": ["answer", "value_out", "product_so_far"],
    "clean": ["lowered", "folded", "norm"],
    "nb": ["neighbour", "nxt", "adjacent"],
}
OPENERS = ["# one pass over the input", "# build the answer step by step", "# the plain way", "# no imports needed"]
CLOSERS = ["# done", "# hand back the result", "# all cases covered", "# the answer"]


def vary(r: random.Random, prompt: str, body: str) -> str:
    used = set(re.findall(r"\w+", prompt + body))
    for name, alts in SYNONYMS.items():
        if not re.search(rf"\b{name}\b", body) or re.search(rf"\b{name}\b", prompt):
            continue
        pick = r.choice([name, *alts])
        if pick != name and pick not in used:
            body = re.sub(rf"\b{name}\b", pick, body)
            used.add(pick)
    lines = body.split("\n")
    rets = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("return ")]
    close = r.choice([None, *CLOSERS])
    if rets and close and rets[-1] > 0:
        k = rets[-1]
        lines.insert(k, " " * (len(lines[k]) - len(lines[k].lstrip())) + close)
    opener = r.choice([None, *OPENERS])
    if opener and lines[0].strip():
        lines.insert(0, " " * (len(lines[0]) - len(lines[0].lstrip())) + opener)
    return "\n".join(lines)
