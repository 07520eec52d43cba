"""The model-free baseline a drafter run is measured against: the best baseline run on the same completions.

Contract: `best_baseline(runs, run)` picks, among the baseline runs (`compare.is_baseline`) on the same extraction as
`run` (or, for a baseline stored without one, on the same completion set), the one of highest tau (macro); None
when there is none. `versus(run, base)` is how much the run beats it: both taus, their ratio and difference, and
which baseline. Run rows in, plain dicts out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .compare import is_baseline

if TYPE_CHECKING:
    from ..store import Run


def best_baseline(runs: list[Run], run: Run) -> Run | None:
    """The baseline run of highest tau_macro on `run`'s extraction (or set, for runs without one)."""

    def same(r: Run) -> bool:
        if run.extraction_id is not None and r.extraction_id == run.extraction_id:
            return True
        return r.extraction_id is None and r.set_name == run.set_name

    pool = [r for r in runs if is_baseline(r) and r.id != run.id and same(r)]
    pool = [r for r in pool if (r.summary or {}).get("tau_macro") is not None]
    return max(pool, key=lambda r: r.summary["tau_macro"], default=None)


def versus(run: Run, base: Run) -> dict:
    """{"tau", "base_tau", "ratio" (tau / base_tau), "gain" (tau - base_tau), "base_name", "method"}."""
    t, b = run.summary["tau_macro"], base.summary["tau_macro"]
    return {
        "tau": t,
        "base_tau": b,
        "ratio": t / b if b else None,
        "gain": t - b,
        "base_name": base.name or base.checkpoint,
        "method": (base.summary or {}).get("baseline") or base.checkpoint,
    }
