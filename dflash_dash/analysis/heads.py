"""What a drafter family's heads add to a run, as tables: top-K headroom (every family) and the confidence head
(DSpark).

Contract: `heads(ps, block_size, tree_budget, summary)` turns a run's prompt rows (`metrics.Prompt`s) into one
JSON-able dict: "headroom" (tau beside the oracle tau over the top-K, and per depth the conditional acceptance,
which is top-1 recall, beside top-K recall) and "confidence" (None without a confidence head: its ECE, reliability
bins, per-depth mean confidence against observed acceptance, and the stop-threshold curve: tau and drafts verified
per round when the engine verifies only the leading drafts whose confidence reaches the threshold). Every number
comes from the metric registry's functions. The pipeline keeps the result per run ("heads"); the pages draw it.
"""

from __future__ import annotations

from .. import metrics
from ..walks import ROUND_TOPK
from . import rounded


def heads(ps: list[metrics.Prompt], block_size: int, tree_budget: int = 0, summary: dict | None = None) -> dict:
    s = summary if summary is not None else metrics.summarize(ps, block_size, tree_budget)
    ctx = metrics.Ctx(block_size, tree_budget)
    K = s.get("topk") or max(tree_budget, ROUND_TOPK)  # candidates the replay kept per slot
    recall = s.get("recall_topk_depth")
    headroom = None
    if recall is not None:
        headroom = {
            "k": K,
            "tau": s.get("tau_macro"),
            "oracle_tau": s.get("oracle_tau"),
            "recall_top1": s.get("recall_top1"),
            "recall_topk": s.get("recall_topk"),
            "formula": {k: metrics.BY_KEY[k].formula for k in ("oracle_tau", "recall_topk")},
            "by_depth": [
                {
                    "depth": k,
                    "rounds": s["depth_samples"][k - 1],
                    "top1": rounded(s["depth_conditional"][k - 1], 4),
                    "topk": rounded(recall[k - 1], 4),
                }
                for k in range(1, block_size)
            ],
        }
    rel = metrics.confidence_reliability(ps, ctx)
    confidence = None
    if rel is not None:
        cond = s["depth_conditional"]
        confidence = {
            "ece": s.get("confidence_head_ece"),
            "formula": metrics.BY_KEY["confidence_head_ece"].formula,
            "by_depth": [
                {
                    "depth": k,
                    "mean_confidence": rounded(rel["mean"][k - 1], 4),
                    "observed": rounded(cond[k - 1], 4),
                }
                for k in range(1, block_size)
            ],
            "reliability": [
                {
                    "lo": round(b["lo"], 3),
                    "hi": round(b["hi"], 3),
                    "n": b["n"],
                    "predicted": rounded(b["predicted"], 4),
                    "observed": rounded(b["observed"], 4),
                }
                for b in rel["pooled"]
            ],
            "stop": [
                {k: (rounded(v, 4) if k != "threshold" else v) for k, v in row.items()}
                for row in metrics.stop_curve(ps, ctx)
            ],
        }
    return {"headroom": headroom, "confidence": confidence}
