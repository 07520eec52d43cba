"""Calibration of a run: does the drafter's probability of its draft predict whether the target accepts it?

Contract: `calibration` turns a run's prompt rows (`metrics.Prompt`s) into one JSON-able dict: the
headline values (ECE, expected tau, observed tau), their formulas, and three tables (per depth, reliability bins
pooled and per depth, expected against observed tau per prompt), numbers rounded for tables. Every number comes
from the metric registry (`metrics`), so a run summarised before these metrics existed gets them too. The
pipeline keeps the result per run ("calibration") and exports it; the pages draw it (`render`).
"""

from __future__ import annotations

from .. import metrics
from . import rounded

CAL_KEYS = ("calibration_ece", "expected_tau", "expected_tau_pooled", "tau_macro", "tau_pooled")


def calibration(ps: list[metrics.Prompt], block_size: int, tree_budget: int = 0, summary: dict | None = None) -> dict:
    """A run's calibration from its prompt rows (the registry applied to them, so
    a run summarised before these metrics existed gets them too; `summary`: metrics.summarize of these rows when
    the caller has just computed it): {"recorded", headline values, "formula", "by_depth" rows, "reliability"
    rows (depth "pooled" and 1..B-1), "per_prompt" expected vs observed tau rows}."""
    s = summary if summary is not None else metrics.summarize(ps, block_size, tree_budget)
    rel = metrics.reliability(ps, metrics.Ctx(block_size, tree_budget))
    out = {
        "recorded": rel is not None,
        **{k: s.get(k) for k in CAL_KEYS},
        "formula": {k: metrics.BY_KEY[k].formula for k in ("calibration_ece", "expected_tau")}
        | {"reliability": metrics.RELIABILITY_FORMULA},
    }
    if rel is None:
        return out | {"by_depth": [], "reliability": [], "per_prompt": []}
    cond, conf = s["depth_conditional"], s["confidence_depth"]
    out["by_depth"] = [
        {
            "depth": k,
            "rounds": s["depth_samples"][k - 1],
            "mean_p": rounded(conf[k - 1], 4),
            "observed": rounded(cond[k - 1], 4),
            "ece": rounded(s["calibration_ece_depth"][k - 1], 4),
        }
        for k in range(1, block_size)
    ]
    out["reliability"] = [
        {
            "depth": d,
            "lo": round(b["lo"], 3),
            "hi": round(b["hi"], 3),
            "n": b["n"],
            "predicted": rounded(b["predicted"], 4),
            "observed": rounded(b["observed"], 4),
        }
        for d, bins in [("pooled", rel["pooled"])] + list(enumerate(rel["by_depth"], 1))
        for b in bins
    ]
    ctx = metrics.Ctx(block_size, tree_budget)
    out["per_prompt"] = []
    for p in ps:
        obs, exp = metrics.tau(p, ctx), metrics.expected_tau(p, ctx)
        out["per_prompt"].append(
            {
                "prompt": p.id,
                "rounds": len(p.rounds),
                "tau": rounded(obs, 4),
                "expected_tau": rounded(exp, 4),
                "expected_minus_observed": rounded(exp - obs, 4) if None not in (exp, obs) else None,
            }
        )
    return out
