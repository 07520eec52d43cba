"""Token roles of one prompt's chain walk: for every completion position, which round committed it and how.

Contract: `trace` reads a run_prompts row (prompt_len, accepted_at, flat drafts [A*(B-1)]) and its completion and
returns a `Trace`: per completion position its role (`pre`: the target's prefill token, `acc`: an accepted draft
at depth k of its block, `bonus`: the target's token that ends a round, `tail`: no round committed it), the round
that committed it, whether a block starts there and which draft the target rejected there. A draft of -1 is no
proposal (`baselines.replay` stores -1 where a proposer that found no match drafted nothing; a chain-only replay
leaves slots undrafted): the round stops there without a rejection, so `rejected` holds None. `outcomes` and
`differing` reduce two traces of the same tokens to the positions whose outcome (draft or target token) differs,
what Compare outlines. Token ids only: decoding and HTML belong to `vocab` and `render`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Trace:
    """The token roles of one prompt's completion under the chain walk (`trace`)."""

    prompt_len: int  # P
    tokens: list[int]  # [T] prompt + completion ids
    role: list[str]  # [T-P] per completion position: pre | acc | bonus | tail
    depth: list[int]  # [T-P] depth within the block (1..B-1 for accepted drafts, else 0)
    round: list[int]  # [T-P] index of the round that committed the position (-1: prefill)
    start: list[bool]  # [T-P] first position committed by its round (block boundary)
    rejected: list[int | None]  # [T-P] the drafted token the target rejected at this position (None: none, or -1)
    rounds: list[tuple[int, int, int]]  # (anchor, accepted, committed) per round


def trace(row: dict[str, Any], completion: dict[str, Any], block_size: int) -> Trace:
    """Roles of every completion position from a run_prompts row and its completion."""
    from ..walks import chain_walk as walk

    P = row["prompt_len"]
    tokens = list(completion["prompt_ids"]) + list(completion["output_ids"])
    T = len(tokens)
    acc = np.asarray(row["accepted_at"], dtype=np.int64)
    D = block_size - 1
    drafts = row.get("drafts") or []
    n = T - P
    role, depth, rnd = ["tail"] * n, [0] * n, [-1] * n
    start = [False] * n
    rejected: list[int | None] = [None] * n
    if n:
        role[0] = "pre"
    rounds = walk(acc, P, T) if len(acc) else []
    for r, (p, a, c) in enumerate(rounds):
        for k in range(1, c + 1):
            i = p + k - P
            rnd[i] = r
            if k <= a:
                role[i], depth[i] = "acc", k
            else:
                role[i] = "bonus"
                j = (p - P) * D + a
                d = int(drafts[j]) if a < D and j < len(drafts) else -1
                if d >= 0 and d != tokens[p + k]:  # -1: nothing proposed at this slot, so nothing rejected
                    rejected[i] = d
        start[p + 1 - P] = True
    return Trace(P, tokens, role, depth, rnd, start, rejected, rounds)


OUTCOME = {"pre": "prefill", "acc": "draft", "bonus": "target", "tail": "none"}  # Trace.role -> outcome


def outcomes(tr: Trace) -> list[str]:
    """Per completion offset: 'draft' (an accepted draft committed it), 'target' (the round's verify/bonus token),
    'prefill' (the first completion token) or 'none' (no round committed it)."""
    return [OUTCOME[r] for r in tr.role]


def differing(a: Trace, b: Trace) -> set[int]:
    """Completion offsets whose outcome (`outcomes`) differs between two traces of the same tokens."""
    return {i for i, (x, y) in enumerate(zip(outcomes(a), outcomes(b))) if x != y}
