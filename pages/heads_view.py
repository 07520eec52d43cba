"""Acceptance page sections for what a drafter family's heads add: top-K headroom (every family) and the
confidence head (DSpark). Helpers of pages/acceptance.py, not a page: they read the kept "heads" analysis and draw
it (no torch, no SQL)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from dflash_dash import metrics
from dflash_dash.render.analysis_figures import headroom_fig, reliability_fig, stop_fig
from dflash_dash.render.formats import fmt, prob
from dflash_dash.render.missing import DASH
from pages import reads, widgets

if TYPE_CHECKING:
    from dflash_dash.store import Run


def headroom_block(ws: str, run: Run) -> None:
    st.subheader("Top-K headroom")
    st.caption(
        "Would a better selector among the drafter's own candidates help? Per slot: is the target's token the "
        "draft (top-1), and is it among the top-K candidates? The oracle tau is the chain walk of a selector "
        "that always picks the target's token when the candidates hold it (DFlash2's selector question: "
        "recall@1 against recall@K)."
    )
    h = reads.analysis(ws, run.id, "heads")["headroom"]
    if h is None:
        st.info(
            "Top-K ranks: not recorded. This run was replayed chain-only, or before dflash-dash stored the rank of "
            "the target's token among each slot's candidates; replay it with every anchor to see its headroom."
        )
        return
    c = st.columns(3)
    c[0].metric("tau (macro)", fmt(h["tau"]))
    c[1].metric(f"oracle tau over the top-{h['k']}", fmt(h["oracle_tau"]))
    c[1].caption(h["formula"]["oracle_tau"])
    c[2].metric(f"top-1 / top-{h['k']} recall", f"{prob(h['recall_top1'])} / {prob(h['recall_topk'])}")
    c[2].caption(h["formula"]["recall_topk"])
    c1, c2 = st.columns(2)
    c1.plotly_chart(headroom_fig(h["by_depth"], h["k"]), width="stretch")
    c2.dataframe(h["by_depth"], hide_index=True, placeholder=DASH, width="stretch")
    c2.caption(f"rounds: samples of depth k; top1: the draft is the target's token; topk: among the top-{h['k']}")
    with c2:
        widgets.download("headroom per depth (CSV)", h["by_depth"], f"{run.id}-headroom.csv", "acc_dl_head")


def confidence_block(ws: str, run: Run) -> None:
    st.subheader("Confidence head")
    c = reads.analysis(ws, run.id, "heads")["confidence"]
    if c is None:
        st.info(
            f"This run's drafter ({run.summary.get('family', 'DFlash')}) has no confidence head, or it was "
            "replayed chain-only: a DSpark checkpoint with enable_confidence_head, replayed at every anchor, has one."
        )
        return
    st.caption(
        "Does the head predict acceptance? c_k = its predicted acceptance of draft k, against whether the target "
        "accepted d_k after accepting d_1..d_{k-1}. An engine that verifies only while c_k >= t verifies fewer "
        "drafts per step and commits less: the curve below is that walk replayed exactly at every threshold."
    )
    a, b = st.columns(2)
    a.metric(metrics.label("confidence_head_ece"), prob(c["ece"]))
    a.caption("ECE = " + c["formula"])
    t = b.select_slider("stop threshold t", options=[r["threshold"] for r in c["stop"]], value=0.0, key="acc_stop_t")
    row = next(r for r in c["stop"] if r["threshold"] == t)
    b.caption(
        f"at t = {t:.2f}: tau (macro) **{fmt(row['tau'])}**, drafts verified per round "
        f"**{fmt(row['verified_per_round'])}**, committed per verified token {prob(row['committed_per_verified'])}"
    )
    c1, c2 = st.columns(2)
    rel = [r | {"depth": "pooled"} for r in c["reliability"]]
    c1.plotly_chart(
        reliability_fig({"confidence head": rel}, predicted="predicted: the confidence head's c_k"), width="stretch"
    )
    c1.caption("x: mean c_k of the bin, y: share of its drafts accepted; below the diagonal: over-confident")
    c2.plotly_chart(stop_fig(c["stop"], t), width="stretch")
    with c2:
        widgets.download("stop-threshold curve (CSV)", c["stop"], f"{run.id}-confidence-stop.csv", "acc_dl_stop")
