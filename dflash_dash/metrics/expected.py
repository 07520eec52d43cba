"""Expected acceptance at temperature T: the run's tau_expected with its top-K truncation bound, and each prompt's
expected accept length (SPEC section 3; the per-anchor values come from `sampling` through the replay).

Contract: numpy over `Prompt.expected_at` ([A, 2] low/high expected committed tokens per anchor, NaN where not
computed, empty without a temperature). An anchor's value is the middle of its bound. Anchors P..T-2 count (the
last token has nothing left to draft), as every-anchor tau counts them: every anchor of an every-anchor replay, the
greedy chain walk's round anchors of a chain-only one. None when no prompt holds a value.
"""

from __future__ import annotations

import numpy as np

from .base import Ctx, Prompt

FORMULA = (
    "teacher-forced along the stored completion: mean over completion anchors p (every-anchor runs: every p; "
    "chain runs: the chain walk's round anchors) of 1 + sum_{k=1}^{B-1} prod_{j<=k} alpha_j, alpha_j = "
    "p_T(d_j | prefix) (verify target-sample) or sum_x min(p_T(x), q_T(x)) (verify rejection); slots past the "
    "completion count 0"
)


def _bounds(p: Prompt) -> np.ndarray:
    """[n, 2] (low, high) of a prompt's computed anchors P..T-2."""
    e = np.asarray(p.expected_at, dtype=np.float64).reshape(-1, 2)[:-1]
    return e[~np.isnan(e).any(axis=1)]


def _pooled(ps: list[Prompt]) -> np.ndarray | None:
    got = [_bounds(p) for p in ps if len(p.expected_at)]
    n = sum(len(g) for g in got)
    return np.concatenate(got).mean(axis=0) if n else None


def tau_expected_run(ps: list[Prompt], ctx: Ctx) -> float | None:
    m = _pooled(ps)
    return None if m is None else float(m.mean())


def tau_expected_bound(ps: list[Prompt], ctx: Ctx) -> list[float] | None:
    m = _pooled(ps)
    return None if m is None else [float(m[0]), float(m[1])]


def expected_accept_length(p: Prompt, ctx: Ctx) -> float | None:
    b = _bounds(p) if len(p.expected_at) else np.zeros((0, 2))
    return float(b.mean()) if len(b) else None
