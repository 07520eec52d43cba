"""A model-free proposer replayed over stored completions as a greedy speculative decoder would run it.

Contract: `replay_prompt` walks one sequence (prompt + completion, the completion from P) the way SPEC section 2's
chain walk does: the first completion token comes from the prefill, then rounds at anchor P, anchor += committed,
committed = accepted + 1 capped at the tokens left, while anchor < T - 1; at each round the proposer sees the
sequence up to the anchor and drafts, the target's tokens (the stored completion, greedy) decide the accepted
count. A round without drafts is a plain decode step (accepted 0, committed 1), as in the engines. It returns the
run's per-prompt row (`metrics.Prompt`: accepted(p) at the visited anchors, -1 elsewhere; drafts per anchor, -1
where none) scored by `walks` (`accepted`, `chain_walk`), and where each round's drafts came from. `replay` runs a
proposer over a set's sequences in order, one proposer for the set (engines keep caches across requests).
Numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..metrics import Prompt
from ..walks import accepted, chain_walk
from .base import Proposer


@dataclass
class Replayed:
    prompt: Prompt  # the run's per-prompt row
    sources: dict = field(default_factory=dict)  # per round: anchor, at (copied from), match (length), origin


def replay_prompt(prop: Proposer, pid: str, tokens, prompt_len: int) -> Replayed:
    """One request of `prop` over `tokens` (prompt + completion), the completion starting at `prompt_len`."""
    tokens = np.asarray(tokens, dtype=np.int64)
    T, P, W = len(tokens), prompt_len, prop.width
    drafts = np.full((max(T - P, 0), W), -1, dtype=np.int64)
    seen = np.zeros(max(T - P, 0), dtype=bool)
    src: dict[str, list] = {"anchor": [], "at": [], "match": [], "origin": []}
    if T <= P:
        return Replayed(Prompt(pid, P, np.zeros(0, dtype=np.int64), [], drafts=drafts), src)
    prop.start(tokens[:P], int(tokens[P]))
    p = P
    while p < T - 1:
        a, got = prop.accept(tokens[: p + 1], tokens[p + 1 : p + 1 + W])
        row = got.ids[:W]
        drafts[p - P, : len(row)], seen[p - P] = row, True
        for k, v in (("anchor", p), ("at", got.at), ("match", got.match), ("origin", got.origin)):
            src[k].append(v)
        c = min(a + 1, T - 1 - p)
        p += c
        prop.advance(tokens[: p + 1], tokens[p - c + 1 : p + 1])
    prop.finish(tokens)
    acc = accepted(drafts, tokens, P)
    acc[~seen] = -1
    rounds = chain_walk(acc, P, T)
    if [r[0] for r in rounds] != src["anchor"]:  # the proposer's own acceptance and walks' disagree: a bug here
        raise RuntimeError(f"{prop.method} on {pid}: the rounds' anchors differ from walks.chain_walk's")
    return Replayed(Prompt(pid, P, acc, [c for _, _, c in rounds], drafts=drafts), src)


def replay(prop: Proposer, seqs, progress=None) -> list[Replayed]:
    """`prop` over `seqs` [(prompt id, tokens, prompt length)] in order; progress(done, total, msg) after each."""
    out = []
    for i, (pid, tokens, P) in enumerate(seqs):
        out.append(replay_prompt(prop, pid, tokens, P))
        if progress:
            progress(i + 1, len(seqs), f"{prop.method}: prompt {pid}")
    return out
