"""The trainer-report tables shaped for the Diagnostics page: the same checkpoint on each source, and this product's
per-position numbers beside SpecForge's imported evaluation.

Contract: `source_rows(rows)` and `beside_rows(rows)` take `analysis.trainers.sources` / `.beside` rows and return
column label -> value dicts (rates as fractions, differences signed, missing values None for the page's dash);
computes nothing a stored number depends on.
"""

from __future__ import annotations


def source_rows(rows: list[dict]) -> list[dict]:
    return [
        {
            "checkpoint": r["checkpoint"],
            "source": r["source"],
            "features": r["features"],
            "tau": r["tau"],
            "every-anchor tau": r["every-anchor tau"],
            "prompts": r["prompts"],
            "run": r["run"],
        }
        for r in rows
    ]


def beside_rows(rows: list[dict]) -> list[dict]:
    return [
        {
            "metric": r["metric"],
            "position": r["position"],
            "this product": r["this product"],
            "SpecForge": r["SpecForge"],
            "difference": r["difference"],
            "noise (2 s.e.)": r["noise"],
            "why": r["why"],
        }
        for r in rows
    ]
