"""Statistics that decide between checkpoints: per-category tau with bootstrap intervals, and the paired bootstrap of
two runs' per-prompt tau difference, with its interval, a verdict in words and a warning when the set is too small
to separate them.

Contract: numpy only, through `metrics.bootstrap` (the one seeded percentile bootstrap of the product: resamples
BOOT_N, seed BOOT_SEED, level BOOT_LEVEL). Per-prompt taus come in as {prompt id: tau or None} (a prompt without
rounds has None and is left out), categories as {prompt id: category or None}; plain dicts come out. The prompts are
the sampling unit. Paired: only the prompts both runs hold with a tau; d_i = tau_B(i) - tau_A(i); the interval is
the percentile interval of the mean of d over resamples of the prompts (so the same prompts' luck cancels: two runs
on the same text compare far more sharply than their two separate intervals suggest).

When is a set too small (`warning`): fewer than MIN_PROMPTS shared prompts (a percentile bootstrap from so few
prompts under-covers: its interval is too narrow too often), or an undecided comparison whose interval is wider
than ±RESOLVE tau (the difference a user would act on): the warning names the half-width and about how many
prompts would resolve ±RESOLVE (the half-width shrinks as 1/sqrt(prompts)).
"""

from __future__ import annotations

import math

import numpy as np

from ..metrics import BOOT_LEVEL, BOOT_N, BOOT_SEED, bootstrap

MIN_PROMPTS = 20  # fewer shared prompts than this: always a warning (a bootstrap from so few under-covers)
RESOLVE = 0.1  # tau difference a comparison should be able to show; an undecided interval wider than ± this warns
NONE = "(none)"  # the category of prompts without one
ALL = "all"  # the row over every prompt
NULL_VERDICT = "no difference the data can show"


def _mean_ci(values: list[float], n: int, seed: int, level: float) -> tuple[float | None, float | None, float | None]:
    """(mean, lo, hi) of `values`: the mean and its percentile bootstrap interval (None below two values)."""
    if not values:
        return None, None, None
    m = float(np.mean(values))
    if len(values) < 2:
        return m, None, None
    lo, hi = bootstrap(values, lambda x: x.mean(axis=1), n, seed, level)
    return m, lo, hi


def _taus(taus: dict[str, float | None]) -> dict[str, float]:
    return {p: float(t) for p, t in taus.items() if t is not None and t == t}


def groups(pids, cats: dict[str, str | None]) -> dict[str, list[str]]:
    """{ALL: every prompt id, category: its ids, ...}: categories in first-seen order, NONE for prompts without one;
    only ALL when no prompt has a category."""
    pids = list(pids)
    out: dict[str, list[str]] = {ALL: pids}
    if any(cats.get(p) for p in pids):
        for p in pids:
            out.setdefault(cats.get(p) or NONE, []).append(p)
    return out


def by_category(
    taus: dict[str, float | None],
    cats: dict[str, str | None],
    n: int = BOOT_N,
    seed: int = BOOT_SEED,
    level: float = BOOT_LEVEL,
) -> list[dict]:
    """tau (macro: the mean of per-prompt tau) with its bootstrap interval over ALL prompts and per category:
    rows {"category", "prompts", "tau", "lo", "hi"} (lo, hi None below two prompts)."""
    t = _taus(taus)
    out = []
    for cat, ids in groups(t, cats).items():
        m, lo, hi = _mean_ci([t[p] for p in ids], n, seed, level)
        out.append({"category": cat, "prompts": len(ids), "tau": m, "lo": lo, "hi": hi})
    return out


def paired(
    ta: dict[str, float | None],
    tb: dict[str, float | None],
    name_a: str = "A",
    name_b: str = "B",
    n: int = BOOT_N,
    seed: int = BOOT_SEED,
    level: float = BOOT_LEVEL,
) -> dict:
    """The paired bootstrap of B - A over the prompts both hold with a tau: {"prompts", "diff" (mean of
    d_i = tau_B - tau_A), "lo", "hi" (its percentile interval), "verdict" (words: `verdict`), "warning" (None, or
    why the set cannot separate them: see the module's note)}."""
    a, b = _taus(ta), _taus(tb)
    shared = [p for p in a if p in b]
    d = [b[p] - a[p] for p in shared]
    if not d:
        return {
            "prompts": 0,
            "diff": None,
            "lo": None,
            "hi": None,
            "verdict": "no shared prompt with a tau",
            "warning": None,
        }
    m = float(np.mean(d))
    lo, hi = bootstrap(d, lambda x: x.mean(axis=1), n, seed, level) if len(d) > 1 else (m, m)
    out = {"prompts": len(d), "diff": m, "lo": lo, "hi": hi, "verdict": verdict(m, lo, hi, name_a, name_b)}
    return out | {"warning": warning(len(d), lo, hi, decided=lo > 0 or hi < 0, level=level)}


def verdict(diff: float, lo: float, hi: float, name_a: str = "A", name_b: str = "B") -> str:
    """ "B is better by 0.40 [0.20, 0.60]" when the interval of B - A lies above 0, "A is better by ..." (the
    interval of A - B) when below, else NULL_VERDICT with B - A and its interval."""
    if lo > 0:
        return f"{name_b} is better by {diff:.2f} [{lo:.2f}, {hi:.2f}]"
    if hi < 0:
        return f"{name_a} is better by {-diff:.2f} [{-hi:.2f}, {-lo:.2f}]"
    return f"{NULL_VERDICT} ({name_b} − {name_a} = {diff:+.2f} [{lo:+.2f}, {hi:+.2f}])"


def warning(prompts: int, lo: float, hi: float, decided: bool, level: float = BOOT_LEVEL) -> str | None:
    """Why a comparison on `prompts` shared prompts cannot be trusted to separate two checkpoints, or None."""
    half = (hi - lo) / 2
    need = math.ceil(prompts * (half / RESOLVE) ** 2) if half > 0 else prompts
    if prompts < MIN_PROMPTS:
        return (
            f"only {prompts} shared prompt{'s' if prompts != 1 else ''}: fewer than {MIN_PROMPTS} cannot separate two "
            "checkpoints reliably (a bootstrap interval from so few prompts is too narrow too often); use a larger set"
        )
    if not decided and half > RESOLVE:
        return (
            f"the set is too small to separate them: the {level:.0%} interval is ±{half:.2f} tau, so a difference "
            f"under about {half:.2f} cannot show with {prompts} prompts; about {need:,} prompts would resolve "
            f"±{RESOLVE:g}"
        )
    return None


def paired_by_category(
    ta: dict[str, float | None],
    tb: dict[str, float | None],
    cats: dict[str, str | None],
    name_a: str = "A",
    name_b: str = "B",
    n: int = BOOT_N,
    seed: int = BOOT_SEED,
    level: float = BOOT_LEVEL,
) -> list[dict]:
    """`paired` over ALL shared prompts, then within each category (`groups`): rows with a "category" key first."""
    a, b = _taus(ta), _taus(tb)
    shared = [p for p in a if p in b]
    return [
        {"category": cat} | paired({p: a[p] for p in ids}, {p: b[p] for p in ids}, name_a, name_b, n, seed, level)
        for cat, ids in groups(shared, cats).items()
    ]
