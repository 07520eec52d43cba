"""A feature audit's report shaped for the Diagnostics page: one table row per target layer, numbers formatted.

Contract: `audit_rows(report)` -> list of dicts (column label -> value) from `audit.check.run`'s report; computes
nothing a stored number depends on.
"""

from __future__ import annotations


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:.1f} %"


def _num(x, digits: int = 3) -> str:
    return "" if x is None else f"{x:.{digits}g}"


def audit_rows(report: dict) -> list[dict]:
    """Per target layer: what was found, its numbers, the best-fitting layer offset and position shift."""
    rows = []
    for r in report.get("rows", []):
        rows.append(
            {
                "layer": r["layer"],
                "finding": r["kind"],
                "fault": "yes" if r["fault"] else "",
                "rel-L2": _num(r["rel_l2"]),
                "cosine": _num(r["cosine"], 6),
                "zero rows": _pct(r["zero_share"]),
                "non-finite rows": _pct(r["nonfinite_share"]),
                "best layer offset": "" if r["best_offset"] is None else f"{r['best_offset']:+d}",
                "position shift": "" if r["best_shift"] is None else f"{r['best_shift']:+d}",
                "best rel-L2": _num(r["best_rel_l2"]),
                "adjacent layers rel-L2": _num(r["neighbour_rel_l2"]),
                "scale": _num(r["scale"], 4),
                "evidence": r["finding"],
            }
        )
    return rows
