"""Top-K headroom: how often the target's token is among the drafter's top-K candidates, and the tau a perfect
selector among them would reach.

Contract: `Prompt`s and a `Ctx` in, numbers out, from `Prompt.target_rank` [A, D] (the rank of the target's token
among each slot's top-K candidates, MISSED when absent, -1 where not computed). A recall sample is a chain-walk
round and a depth k with slot k inside the completion and d_1..d_{k-1} accepted (the rounds of
`depth_conditional`): along the target's own path, so the candidates are what the drafter had there, for every
family. The oracle walk commits, at each anchor, the leading slots whose candidates hold the target's token
(plus the bonus token): the tau of a drafter whose selector always picks the target's token when it can. For
DFlash (candidates that do not depend on earlier picks) it is exact; for the sequential families (DSpark, Domino,
DFlash2, whose kept candidates are ranked by scores that depend on the previous draft) the slots after the
drafter's own first miss hold the candidates of its own path, an approximation. None for runs without ranks
(chain-only replays, runs replayed before ranks were stored).
"""

from __future__ import annotations

import numpy as np

from .base import Ctx, Prompt, _mean

MISSED = -2  # target_rank: the target's token is not among the slot's top-K candidates


def ranked(p: Prompt, ctx: Ctx) -> bool:
    """The prompt's replay stored a rank at every anchor and slot (every-anchor replay)."""
    D = ctx.block_size - 1
    n = len(p.accepted_at)
    return n > 0 and p.target_rank.size == n * D and bool((p.target_rank.reshape(n, D)[:-1, 0] != -1).all())


def _samples(p: Prompt, ctx: Ctx) -> tuple[np.ndarray, np.ndarray]:
    """(depth k [S], rank [S]) over the recall samples of one prompt."""
    D = ctx.block_size - 1
    rows, ks, take = p.reached(D)
    return ks[take], p.target_rank.reshape(-1, D)[rows][take]


def recall_depth(ps: list[Prompt], ctx: Ctx, top1: bool = False) -> list[float | None] | None:
    """Per depth k = 1..D: share of recall samples whose target token is among the top-K (`top1`: is the draft)."""
    got = [_samples(p, ctx) for p in ps if ranked(p, ctx)]
    if not got:
        return None
    k = np.concatenate([g[0] for g in got])
    r = np.concatenate([g[1] for g in got])
    hit = (r == 0) if top1 else (r >= 0)
    D = ctx.block_size - 1
    n = np.bincount(k, minlength=D + 1)[1:]
    h = np.bincount(k, weights=hit, minlength=D + 1)[1:]
    return [float(h_ / n_) if n_ else None for n_, h_ in zip(n, h)]


def recall_pooled(ps: list[Prompt], ctx: Ctx, top1: bool = False) -> float | None:
    got = [_samples(p, ctx)[1] for p in ps if ranked(p, ctx)]
    if not got or not sum(len(g) for g in got):
        return None
    r = np.concatenate(got)
    return float(((r == 0) if top1 else (r >= 0)).mean())


def oracle_accepted(p: Prompt, ctx: Ctx) -> np.ndarray:
    """[A] leading slots at each anchor whose candidates hold the target's token (cut to the completion)."""
    D = ctx.block_size - 1
    rank = p.target_rank.reshape(-1, D)
    return np.cumprod(rank >= 0, axis=1).sum(1)


def oracle_rounds(p: Prompt, ctx: Ctx) -> list[int]:
    """Committed tokens per round of the oracle walk from P."""
    acc, out, q, T = oracle_accepted(p, ctx), [], p.prompt_len, p.T
    while q < T - 1:
        c = min(int(acc[q - p.prompt_len]) + 1, T - 1 - q)
        out.append(c)
        q += c
    return out


def oracle_tau(p: Prompt, ctx: Ctx) -> float | None:
    if not ranked(p, ctx):
        return None
    r = oracle_rounds(p, ctx)
    return sum(r) / len(r) if r else None


def oracle_tau_run(ps: list[Prompt], ctx: Ctx) -> float | None:
    return _mean([v for v in (oracle_tau(p, ctx) for p in ps) if v is not None])
