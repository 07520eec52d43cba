"""Statistics over prompts: how sure tau is (bootstrap intervals, median, Tukey outliers).

Contract: `Prompt`s and a `Ctx` in, numbers out. The prompts are the sampling unit: a bootstrap resamples whole
prompts (their rounds travel together); outliers are prompts whose tau lies outside Tukey's fences. Quantiles
are numpy's default (linear interpolation between order statistics); every statistic is deterministic (seeded).
"""

from __future__ import annotations

from collections.abc import Callable

from .base import Ctx, Prompt, _mean
from .core import tau

BOOT_N, BOOT_SEED, BOOT_LEVEL = 1000, 0, 0.95  # resamples, numpy default_rng seed, two-sided level
TUKEY_K = 1.5  # fences Q1 - k*IQR .. Q3 + k*IQR
TUKEY_MIN = 4  # fewer prompts: no fences, no outliers
TUKEY_RULE = (
    f"outlier: per-prompt tau < Q1 - {TUKEY_K:g}·IQR or > Q3 + {TUKEY_K:g}·IQR (Tukey's fences; "
    f"Q1, Q3 = quartiles of per-prompt tau, IQR = Q3 - Q1; needs at least {TUKEY_MIN} prompts)"
)


def _taus(ps: list[Prompt], ctx: Ctx) -> list[tuple[str, float]]:
    """(id, tau) of the prompts that have rounds."""
    return [(p.id, t) for p in ps if (t := tau(p, ctx)) is not None]


def bootstrap(
    values, stat: Callable, n: int = BOOT_N, seed: int = BOOT_SEED, level: float = BOOT_LEVEL
) -> list[float] | None:
    """Percentile bootstrap interval [lo, hi] of `stat` over the rows of `values` (one row per prompt):
    idx = default_rng(seed).integers(0, m, size=(n, m)); stat(values[idx]) gives the n resampled statistics
    (vectorised over the first axis); lo, hi = their (1-level)/2 and (1+level)/2 quantiles. None for no rows."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    if not len(v):
        return None
    return _interval(stat(v[_resamples(len(v), n, seed)]), level)


def _resamples(m: int, n: int, seed: int):
    """[n, m] row indices of n bootstrap resamples of m rows (the one draw every interval here uses)."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, m, size=(n, m))


def _interval(stats, level: float) -> list[float] | None:
    """The percentile interval of resampled statistics; NaN statistics (an undefined ratio) are left out."""
    import numpy as np

    s = np.asarray(stats, dtype=float)
    s = s[~np.isnan(s)]
    if not len(s):
        return None
    lo, hi = np.quantile(s, [(1 - level) / 2, (1 + level) / 2])
    return [float(lo), float(hi)]


def bootstrap_sums(
    parts, stat: Callable, n: int = BOOT_N, seed: int = BOOT_SEED, level: float = BOOT_LEVEL
) -> list[float] | None:
    """`bootstrap` of a statistic of summed per-prompt counts: `parts` [m, j] (one row of counts per prompt),
    stat(sums [n, j]) -> [n]; each resample's sums are weights @ parts (weights [n, m]: how often each prompt was
    drawn, from the same draw as `bootstrap`), so memory stays n*(m+j) for any j."""
    import numpy as np

    v = np.asarray(parts, dtype=float)
    if not len(v):
        return None
    idx = _resamples(len(v), n, seed)
    w = np.zeros((n, len(v)))
    np.add.at(w, (np.arange(n)[:, None], idx), 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _interval(stat(w @ v), level)


def tau_macro_ci(ps: list[Prompt], ctx: Ctx) -> list[float] | None:
    return bootstrap([t for _, t in _taus(ps, ctx)], lambda x: x.mean(axis=1))


def tau_pooled_ci(ps: list[Prompt], ctx: Ctx) -> list[float] | None:
    return bootstrap(
        [(sum(p.rounds), len(p.rounds)) for p in ps if p.rounds],
        lambda x: x[..., 0].sum(axis=1) / x[..., 1].sum(axis=1),
    )


def tau_median(ps: list[Prompt], ctx: Ctx) -> float | None:
    import statistics

    ts = [t for _, t in _taus(ps, ctx)]
    return float(statistics.median(ts)) if ts else None


def fences(ps: list[Prompt], ctx: Ctx) -> list[float] | None:
    """Tukey's fences [Q1 - k*IQR, Q3 + k*IQR] of per-prompt tau; None under TUKEY_MIN prompts."""
    return fences_of([t for _, t in _taus(ps, ctx)])


def fences_of(ts: list[float]) -> list[float] | None:
    import numpy as np

    if len(ts) < TUKEY_MIN:
        return None
    q1, q3 = np.quantile(ts, [0.25, 0.75])
    return [float(q1 - TUKEY_K * (q3 - q1)), float(q3 + TUKEY_K * (q3 - q1))]


def outliers(ps: list[Prompt], ctx: Ctx) -> dict[str, str]:
    """Prompt id -> "low" / "high" for the prompts whose tau lies outside the fences."""
    return outliers_of(dict(_taus(ps, ctx)))


def outliers_of(taus: dict[str, float | None]) -> dict[str, str]:
    """`outliers` from per-prompt tau values alone (None: a prompt without rounds, never an outlier)."""
    known = {i: t for i, t in taus.items() if t is not None}
    f = fences_of(list(known.values()))
    if f is None:
        return {}
    return {i: "low" if t < f[0] else "high" for i, t in known.items() if not f[0] <= t <= f[1]}


def tau_macro_trimmed(ps: list[Prompt], ctx: Ctx) -> float | None:
    out = outliers(ps, ctx)
    return _mean([t for i, t in _taus(ps, ctx) if i not in out])
