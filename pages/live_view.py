"""Acceptance page section "Live loop vs estimate": the product's own speculative decoder run on the run's completion
set with its checkpoint (the `live` command or job) beside the run's estimate, per prompt, and their difference. A
helper of pages/acceptance.py, not a page; nothing is drawn when no live result exists for the run's set and
checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from dflash_dash.render.formats import fmt
from dflash_dash.render.missing import DASH
from pages import reads, widgets

if TYPE_CHECKING:
    from dflash_dash.store import Run


def _results(ws: str, run: Run) -> list[dict]:
    from dflash_dash.pipeline.live import live_for  # on first use: the pages without this section never load it

    return live_for(reads.store_at(ws), run)


def _label(res: dict) -> str:
    t = res["temperature"]
    how = "greedy" if t == 0 else f"T={t:g}" + (f", top-p {res['top_p']:g}" if res["top_p"] < 1 else "")
    return f"{how} · {res['verify']} · {len(res['seeds'])} seeds · {res['device']}"


def live_block(ws: str, run: Run, rows: dict[str, dict]) -> None:
    """The section, when a live result exists for the run's set and checkpoint (one chosen when several do)."""
    results = _results(ws, run)
    if not results:
        return
    from dflash_dash.pipeline.live import versus

    st.subheader("Live loop vs estimate")
    res = results[0]
    if len(results) > 1:
        labels = [_label(r) for r in results]
        res = results[labels.index(st.selectbox("live result", labels, key="live_pick"))]
    s, rs = res["summary"], run.summary
    t = rs.get("temperature")
    same_t = t is not None and abs(t - res["temperature"]) < 1e-9 and rs.get("verify") == res["verify"]
    est = rs.get("tau_expected") if same_t else rs.get("tau_pooled")
    est_name = "tau_expected (teacher-forced)" if same_t else "tau (greedy replay)"
    cpu = " (CPU timings: not what a GPU serves)" if res["device"] == "cpu" else ""
    st.caption(
        f"The product's own speculative decoder at {_label(res)}{cpu}: accept length = tokens committed by verify "
        "steps / verify steps (the replay's tau of the decoded trace), mean over seeds with its 95% interval; "
        f"tokens/s after the first token, plain decoding of the same target against speculative. The estimate is "
        f"this run's {est_name}"
        + ("" if same_t else f" (this run has no estimate at T={res['temperature']:g}, {res['verify']})")
        + ". Teacher forcing conditions each draft on the stored completion, the live loop on its own drafts."
    )
    c = st.columns(4)
    lo, hi = s.get("accept_length_lo"), s.get("accept_length_hi")
    c[0].metric("live accept length", fmt(s.get("accept_length")))
    c[0].caption(f"95% interval over seeds [{fmt(lo)}, {fmt(hi)}]" if lo is not None else "one seed: no interval")
    c[1].metric(est_name, fmt(est))
    gap = s["accept_length"] - est if s.get("accept_length") is not None and est is not None else None
    c[1].caption(f"live minus estimate {fmt(gap)}")
    c[2].metric("measured speedup", fmt(s.get("speedup")))
    c[2].caption(f"{fmt(s.get('spec_tokens_s'))} vs {fmt(s.get('plain_tokens_s'))} tokens/s (speculative vs plain)")
    c[3].metric("same tokens as plain", "yes" if s.get("same_tokens") else "no")
    c[3].caption("target-sample: equal for the same seed; rejection: only equally distributed")
    table = versus(res, rows, "expected_accept_length" if same_t else "tau")
    st.dataframe(table, hide_index=True, placeholder=DASH, width="stretch", column_config=widgets.numbers(table))
