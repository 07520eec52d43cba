"""Calibration: the drafter's probability of its own top-1 draft against how often the target accepts it.

Contract: `Prompt`s and a `Ctx` in, numbers out. p_k = exp(draft_logp) of the argmax draft at slot k of a round's
block. A sample is a chain-walk round and a depth k with slot k inside the completion and d_1..d_{k-1} accepted;
its outcome is whether d_k was accepted too (the same rounds as `depth_conditional`). Runs replayed before draft
log-probabilities were stored have none: every calibration value is then None ("not recorded, replay again").
Also the expected tau those probabilities predict.
"""

from __future__ import annotations

from .base import Ctx, Prompt, _mean
from .core import macro

CAL_BINS = 10  # equal-width bins of the predicted probability over [0, 1]


def recorded(p: Prompt, ctx: Ctx) -> bool:
    """The prompt's replay stored the log-probability of every draft (A*(B-1) values)."""
    return len(p.accepted_at) > 0 and p.draft_logp.size == len(p.accepted_at) * (ctx.block_size - 1)


def cal_samples(p: Prompt, ctx: Ctx) -> list[tuple[int, float, bool]]:
    """(depth k, predicted p_k, accepted) per chain-walk round and depth k: slot k inside the completion and
    d_1..d_{k-1} accepted. [] when the prompt has no draft log-probabilities."""
    k, q, ok = cal_arrays(p, ctx)
    return list(zip(k.tolist(), q.tolist(), ok.tolist()))


def cal_arrays(p: Prompt, ctx: Ctx) -> tuple:
    """`cal_samples` as arrays (depth k [S], p_k [S], accepted [S]), round by round, k ascending; once per Prompt."""
    import numpy as np

    D = ctx.block_size - 1
    got = p.__dict__.get(("_cal", D))
    if got is not None:
        return got
    if not recorded(p, ctx):
        got = (np.zeros(0, np.int64), np.zeros(0, np.float64), np.zeros(0, bool))
    else:
        _, ks, take = p.reached(D)  # [R, D], row-major = loop order
        acc = p.walk()[1]
        got = (ks[take], p.draft_p(D)[take], (acc[:, None] >= ks)[take])
    p.__dict__[("_cal", D)] = got
    return got


def _samples(ps: list[Prompt], ctx: Ctx) -> tuple | None:
    """Samples of every prompt as arrays (depth k, p_k, accepted); None when no prompt recorded draft
    log-probabilities."""
    import numpy as np

    if not any(recorded(p, ctx) for p in ps):
        return None
    got = [cal_arrays(p, ctx) for p in ps]
    return tuple(np.concatenate([g[i] for g in got]) for i in range(3))


def _bins(q, ok, n: int = CAL_BINS) -> list[dict]:
    """Reliability bins over samples p_k [S], accepted [S]: per equal-width bin [lo, hi) of p (the last one closed)
    the sample count, the mean predicted p (confidence) and the share accepted (observed); None for an empty bin
    (sums in sample order)."""
    import numpy as np

    b = np.minimum((q * n).astype(np.int64), n - 1)
    cnt, sp = np.bincount(b, minlength=n).tolist(), np.bincount(b, weights=q, minlength=n).tolist()
    hit = np.bincount(b[ok], minlength=n).tolist()
    return [
        {
            "lo": b / n,
            "hi": (b + 1) / n,
            "n": cnt[b],
            "predicted": sp[b] / cnt[b] if cnt[b] else None,
            "observed": hit[b] / cnt[b] if cnt[b] else None,
        }
        for b in range(n)
    ]


def ece_of(bins: list[dict]) -> float | None:
    """Expected calibration error: sum over bins of (n_b / N) * |observed_b - predicted_b|."""
    N = sum(b["n"] for b in bins)
    return sum(b["n"] / N * abs(b["observed"] - b["predicted"]) for b in bins if b["n"]) if N else None


def calibration_ece(ps: list[Prompt], ctx: Ctx) -> float | None:
    s = _samples(ps, ctx)
    return None if s is None else ece_of(_bins(s[1], s[2]))


def calibration_ece_depth(ps: list[Prompt], ctx: Ctx) -> list[float | None] | None:
    s = _samples(ps, ctx)
    return None if s is None else [ece_of(_bins(s[1][s[0] == k], s[2][s[0] == k])) for k in range(1, ctx.block_size)]


def confidence_depth(ps: list[Prompt], ctx: Ctx) -> list[float | None] | None:
    """Mean p_k per depth over the samples (the conditional curve's rounds): against depth_conditional."""
    import numpy as np

    s = _samples(ps, ctx)
    if s is None:
        return None
    n = np.bincount(s[0], minlength=ctx.block_size).tolist()
    tot = np.bincount(s[0], weights=s[1], minlength=ctx.block_size).tolist()  # summed in sample order
    return [tot[k] / n[k] if n[k] else None for k in range(1, ctx.block_size)]


def reliability(ps: list[Prompt], ctx: Ctx) -> dict | None:
    """{"bins": n, "pooled": bins over all depths, "by_depth": [bins of depth k] for k = 1..B-1}."""
    s = _samples(ps, ctx)
    if s is None:
        return None
    return {
        "bins": CAL_BINS,
        "pooled": _bins(s[1], s[2]),
        "by_depth": [_bins(s[1][s[0] == k], s[2][s[0] == k]) for k in range(1, ctx.block_size)],
    }


def expected_rounds(p: Prompt, ctx: Ctx) -> list[float]:
    """Expected committed tokens of each chain-walk round from the draft probabilities:
    1 + sum_{k=1}^{min(B-1, left-1)} prod_{j<=k} p_j, left = T-1-anchor (the same cap as the committed count)."""
    import numpy as np

    if not recorded(p, ctx):
        return []
    got = p.__dict__.get(("_exp", ctx.block_size))
    if got is None:
        D, (_, _, left) = ctx.block_size - 1, p.walk()
        pk = np.where(np.arange(1, D + 1)[None, :] <= np.minimum(D, left - 1)[:, None], p.draft_p(D), 0.0)
        run = np.cumprod(pk, axis=1)  # products in the loop's order; 0 past the cap adds nothing
        got = np.cumsum(np.concatenate([np.ones((len(run), 1)), run], axis=1), axis=1)[:, -1].tolist()
        if np.isnan(pk).any():  # a chain-only replay without DDTree computes no slot after the rejected one
            got = []
        p.__dict__[("_exp", ctx.block_size)] = got
    return list(got)


def expected_tau(p: Prompt, ctx: Ctx) -> float | None:
    return _mean(expected_rounds(p, ctx))


def _slots_missing(ps: list[Prompt], ctx: Ctx) -> bool:
    """Some prompt's rounds lack slots (a chain-only replay without DDTree): no run-level expected tau."""
    return any(recorded(p, ctx) and p.rounds and not expected_rounds(p, ctx) for p in ps)


def expected_tau_run(ps: list[Prompt], ctx: Ctx) -> float | None:
    return None if _slots_missing(ps, ctx) else macro(expected_tau)(ps, ctx)


def expected_tau_pooled(ps: list[Prompt], ctx: Ctx) -> float | None:
    es = [e for p in ps for e in expected_rounds(p, ctx)]
    return sum(es) / len(es) if es and not _slots_missing(ps, ctx) else None
