"""Target-layer attribution as a table: per tap of the target's hidden states that the drafter reads, the tau
measured with that tap replaced by its mean, and the tau lost against the same replay without ablation.

Contract: store `attributions` rows in, rows sorted by tap out (numbers rounded for tables); the pipeline exports
them and the Diagnostics page draws them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import rounded

if TYPE_CHECKING:
    from ..store import Attribution


def attribution_rows(rows: list[Attribution]) -> list[dict[str, Any]]:
    """Store `attributions` rows as a table: per tap, tau with the tap ablated and the tau lost (base - ablated)."""
    out = []
    for r in sorted(rows, key=lambda r: r.tap):
        lost = {
            "tau_macro": _lost(r.base_tau_macro, r.tau_macro),
            "tau_pooled": _lost(r.base_tau_pooled, r.tau_pooled),
        }
        out.append(
            {
                "tap": r.tap,
                "layer_id": r.layer_id,
                "tau_lost_macro": lost["tau_macro"],
                "tau_lost_pooled": lost["tau_pooled"],
                "tau_macro_ablated": rounded(r.tau_macro, 4),
                "tau_pooled_ablated": rounded(r.tau_pooled, 4),
                "base_tau_macro": rounded(r.base_tau_macro, 4),
                "base_tau_pooled": rounded(r.base_tau_pooled, 4),
            }
        )
    return out


def _lost(base: float | None, ablated: float | None) -> float | None:
    """The tau lost (base - ablated), None where either is missing."""
    return None if base is None or ablated is None else rounded(base - ablated, 4)
