"""The drafter's calibration on Acceptance: ECE, expected against observed tau, the reliability diagram at a chosen
depth and per-depth confidence, each table downloadable. A helper of pages/acceptance.py, not a page: it reads the
kept "calibration" analysis of the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from dflash_dash import metrics
from dflash_dash.render.analysis_figures import confidence_fig, expected_fig, reliability_fig
from dflash_dash.render.formats import fmt, prob
from dflash_dash.render.missing import DASH
from pages import reads, widgets

if TYPE_CHECKING:
    from dflash_dash.store import Run

POOLED = "pooled over depths"  # the reliability diagram over every depth at once


def depth_choice(block_size: int, key: str) -> str | int:
    """The depth the reliability diagram shows: "pooled" or k = 1..B-1."""
    opts = [POOLED] + [f"depth {k}" for k in range(1, block_size)]
    v = st.selectbox("reliability diagram: depth", opts, key=key)
    return "pooled" if v == POOLED else int(v.split()[1])


def calibration_block(ws: str, run: Run) -> None:
    s = run.summary
    B = s["block_size"]
    st.subheader("Calibration")
    st.caption(
        "Does the drafter know when it is right? p_k = the drafter's probability of its own top-1 draft at "
        "slot k. A sample is a chain-walk round with slot k inside the completion and d_1..d_{k-1} accepted; "
        "it counts as accepted when d_k is accepted too (the rounds of the per-depth conditional curve)."
    )
    cal = reads.analysis(ws, run.id, "calibration")
    if not cal["recorded"]:
        st.info(
            "Draft probabilities: not recorded, replay again. This run was replayed before dflash-dash stored "
            "the probability of each draft; replay the same checkpoint (Replay another checkpoint, below) to "
            "see its calibration."
        )
        return
    c = st.columns(3)
    c[0].metric(metrics.label("calibration_ece"), prob(cal["calibration_ece"]))
    c[0].caption("ECE = " + metrics.BY_KEY["calibration_ece"].formula)
    c[1].metric("expected tau (macro)", fmt(cal["expected_tau"]))
    c[1].caption(
        f"observed tau (macro) {fmt(cal['tau_macro'])}; expected per round = "
        "1 + sum_{k=1}^{min(B-1, left-1)} prod_{j<=k} p_j (capped to the tokens left), observed = committed"
    )
    c[2].metric("expected tau (pooled)", fmt(cal["expected_tau_pooled"]))
    c[2].caption(f"observed tau (pooled) {fmt(cal['tau_pooled'])}; all expected committed / all rounds")
    depth = depth_choice(B, "acc_cal_depth")
    c1, c2 = st.columns(2)
    c1.plotly_chart(reliability_fig({"run": cal["reliability"]}, depth), width="stretch")
    c1.caption(
        "x: mean p_k of the bin (predicted), y: share of its drafts accepted (observed); on the diagonal the "
        "drafter is calibrated, below it over-confident; bars: samples per bin"
    )
    with c1:
        widgets.download("reliability bins (CSV)", cal["reliability"], f"{run.id}-reliability.csv", "acc_dl_rel")
    c2.plotly_chart(confidence_fig({"run": cal["by_depth"]}), width="stretch")
    c2.caption("per depth: mean p_k against P(d_k accepted | d_1..d_{k-1} accepted), and the ECE of each depth")
    with c2:
        widgets.download(
            "per-depth calibration (CSV)", cal["by_depth"], f"{run.id}-calibration-depth.csv", "acc_dl_depth"
        )
    c1, c2 = st.columns(2)
    c1.plotly_chart(expected_fig({"run": cal["per_prompt"]}), width="stretch")
    with c1:
        widgets.download(
            "expected vs observed tau per prompt (CSV)",
            cal["per_prompt"],
            f"{run.id}-expected-tau.csv",
            "acc_dl_exp",
        )
    depth = cal["by_depth"]
    c2.dataframe(depth, hide_index=True, placeholder=DASH, width="stretch", column_config=widgets.numbers(depth))
    c2.caption("rounds: samples of depth k; mean_p: mean p_k; observed: P(d_k | d_<k); ece: ECE of depth k alone")
