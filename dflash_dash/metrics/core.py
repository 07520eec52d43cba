"""The tau metrics and the acceptance-by-depth curves of the chain walk (and the DDTree walk).

Contract: `Prompt`s and a `Ctx` in, numbers out: tau per prompt (committed / rounds), its macro and pooled
forms, the every-anchor tau, the acceptance histogram and the per-depth conditional and marginal acceptance.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import Ctx, Prompt, _mean


def tau(p: Prompt, ctx: Ctx) -> float | None:
    return sum(p.rounds) / len(p.rounds) if p.rounds else None


def tree_tau(p: Prompt, ctx: Ctx) -> float | None:
    return sum(p.tree_rounds) / len(p.tree_rounds) if ctx.tree_budget and p.tree_rounds else None


def every_anchor(p: Prompt, ctx: Ctx) -> float | None:
    """Mean of accepted(p) + 1 over anchors P..T-2 (the last token has nothing left to draft); None for a
    chain-only replay (anchors off the walks hold -1: not computed)."""
    return _every_anchor_mean([p])


def _every_anchor_mean(ps: list[Prompt]) -> float | None:
    """Mean of accepted(p) + 1 over the anchors P..T-2 of every prompt (integer sums, then one division);
    None when one is -1 (not computed)."""
    import numpy as np

    acc = [np.asarray(p.accepted_at[:-1], dtype=np.int64) for p in ps]
    n = sum(len(a) for a in acc)
    if any(len(a) and a.min() < 0 for a in acc) or not n:
        return None
    return (sum(int(a.sum()) for a in acc) + n) / n


def macro(fn: Callable[[Prompt, Ctx], float | None]) -> Callable[[list[Prompt], Ctx], float | None]:
    def run(ps: list[Prompt], ctx: Ctx) -> float | None:
        return _mean([v for v in (fn(p, ctx) for p in ps) if v is not None])

    return run


def pooled(attr: str, need_tree: bool = False) -> Callable[[list[Prompt], Ctx], float | None]:
    def run(ps: list[Prompt], ctx: Ctx) -> float | None:
        if need_tree and not ctx.tree_budget:
            return None
        rs = [c for p in ps for c in getattr(p, attr)]
        return sum(rs) / len(rs) if rs else None

    return run


def every_anchor_run(ps: list[Prompt], ctx: Ctx) -> float | None:
    return _every_anchor_mean(ps)


def accept_hist(ps: list[Prompt], ctx: Ctx) -> list[int]:
    """Rounds of the chain walk by accepted drafts 0..B-1."""
    h = [0] * ctx.block_size
    for p in ps:
        for a in p.walk()[1].tolist():
            h[a] += 1
    return h


def depth_counts(ps: list[Prompt], ctx: Ctx) -> tuple[list[int], list[int], list[int]]:
    """Per depth k = 1..B-1 over the trace rounds whose slot k lies inside the completion: (inside, reached:
    d_1..d_{k-1} accepted, hit: d_1..d_k accepted)."""
    import numpy as np

    D = ctx.block_size - 1
    if not ps:
        return [0] * D, [0] * D, [0] * D
    acc = np.concatenate([p.walk()[1] for p in ps])
    kmax = np.minimum(D, np.concatenate([p.walk()[2] for p in ps]))  # slots inside the completion

    def at_least(m):  # [#(m >= k) for k = 1..D]
        return np.cumsum(np.bincount(np.clip(m, 0, D), minlength=D + 1)[::-1])[::-1][1:].tolist()

    return at_least(kmax), at_least(np.minimum(kmax, acc + 1)), at_least(np.minimum(kmax, acc))


def depth_conditional(ps: list[Prompt], ctx: Ctx) -> list[float | None]:
    _, reach, hit = depth_counts(ps, ctx)
    return [h / r if r else None for r, h in zip(reach, hit)]


def depth_marginal(ps: list[Prompt], ctx: Ctx) -> list[float | None]:
    inside, _, hit = depth_counts(ps, ctx)
    return [h / n if n else None for n, h in zip(inside, hit)]


def depth_samples(ps: list[Prompt], ctx: Ctx) -> list[int]:
    """Rounds behind each point of the conditional curve (d_1..d_{k-1} accepted, slot k inside)."""
    return depth_counts(ps, ctx)[1]
