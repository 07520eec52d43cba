"""A confidence head's predictions (DSpark) against the target's verdicts, and what verifying fewer slots costs.

Contract: `Prompt`s and a `Ctx` in, numbers out, from `Prompt.confidence` [A, D] (the head's predicted
acceptance of each draft, computed with the previous tokens the drafter's walk used). A sample is a chain-walk
round and a depth k with slot k inside the completion and d_1..d_{k-1} accepted (the rounds of
`depth_conditional`); its outcome is whether d_k was accepted. `stop_walk(p, ctx, t)` re-walks the chain as an
engine that verifies only the leading drafts whose confidence is at least `t` would: at each anchor it verifies
L_t = the leading slots with c >= t and commits min(accepted, L_t) + 1. Every value is None for runs without
confidence (other families, chain-only replays).
"""

from __future__ import annotations

import numpy as np

from .base import Ctx, Prompt, _mean
from .calibration import _bins, ece_of

THRESHOLDS = [round(0.05 * i, 2) for i in range(21)]  # the stop thresholds the confidence view offers


def confident(p: Prompt, ctx: Ctx) -> bool:
    """The prompt's replay stored a confidence at every anchor and slot."""
    n = len(p.accepted_at)
    return n > 0 and p.confidence.size == n * (ctx.block_size - 1) and not np.isnan(p.confidence[:-1]).any()


def _samples(ps: list[Prompt], ctx: Ctx) -> tuple | None:
    """(depth k [S], confidence [S], accepted [S]) over every prompt's samples; None without confidence."""
    D, got = ctx.block_size - 1, []
    for p in ps:
        if not confident(p, ctx):
            continue
        rows, ks, take = p.reached(D)
        c = p.confidence.reshape(-1, D)[rows].astype(np.float64)
        got.append((ks[take], c[take], (p.walk()[1][:, None] >= ks)[take]))
    if not got:
        return None
    return tuple(np.concatenate([g[i] for g in got]) for i in range(3))


def confidence_ece(ps: list[Prompt], ctx: Ctx) -> float | None:
    s = _samples(ps, ctx)
    return None if s is None else ece_of(_bins(s[1], s[2]))


def confidence_reliability(ps: list[Prompt], ctx: Ctx) -> dict | None:
    """{"pooled": bins over all depths, "by_depth": [bins of depth k], "mean": [mean confidence per depth]}."""
    s = _samples(ps, ctx)
    if s is None:
        return None
    D = ctx.block_size - 1
    n = np.bincount(s[0], minlength=D + 1)
    tot = np.bincount(s[0], weights=s[1], minlength=D + 1)
    return {
        "pooled": _bins(s[1], s[2]),
        "by_depth": [_bins(s[1][s[0] == k], s[2][s[0] == k]) for k in range(1, D + 1)],
        "mean": [float(tot[k] / n[k]) if n[k] else None for k in range(1, D + 1)],
    }


def stop_walk(p: Prompt, ctx: Ctx, t: float) -> tuple[list[int], list[int]]:
    """(committed per round, drafts verified per round) of the chain walk that verifies only the leading drafts
    with confidence >= t at each anchor."""
    D = ctx.block_size - 1
    conf = p.confidence.reshape(-1, D)
    keep = np.cumprod(conf >= t, axis=1).sum(1)  # [A] L_t
    acc = np.minimum(np.asarray(p.accepted_at, dtype=np.int64), keep)
    committed, verified, q, T = [], [], p.prompt_len, p.T
    while q < T - 1:
        i = q - p.prompt_len
        c = min(int(acc[i]) + 1, T - 1 - q)
        committed.append(c)
        verified.append(int(min(keep[i], T - 1 - q)))
        q += c
    return committed, verified


def stop_curve(ps: list[Prompt], ctx: Ctx, thresholds: list[float] = THRESHOLDS) -> list[dict] | None:
    """Per threshold t: tau (macro) of the stopping walk, drafts verified per round and committed tokens per
    verified token (pooled); t = 0 verifies every draft (the run's own tau)."""
    ok = [p for p in ps if confident(p, ctx)]
    if not ok:
        return None
    out = []
    for t in thresholds:
        walks = [stop_walk(p, ctx, t) for p in ok]
        taus = [sum(c) / len(c) for c, _ in walks if c]
        com = sum(sum(c) for c, _ in walks)
        ver = sum(sum(v) for _, v in walks)
        rounds = sum(len(c) for c, _ in walks)
        out.append(
            {
                "threshold": t,
                "tau": _mean(taus),
                "verified_per_round": ver / rounds if rounds else None,
                "committed_per_verified": com / (ver + rounds) if rounds else None,  # the anchor's row verifies too
            }
        )
    return out
