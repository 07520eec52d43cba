"""Predicted speedup and "What to serve" for Acceptance and Compare: a run's tau priced by a measured cost table
(`profile`), the engine's measured tokens/s beside it, and the advisor (k drafts, DDTree budgets, temperatures) with
the best setting marked. Helpers of the pages, not a page: they read kept tables and analyses through
pipeline.speed (no torch, no SQL) and draw with render.speedup."""

from __future__ import annotations

import streamlit as st

from dflash_dash.analysis.compare import is_baseline
from dflash_dash.errors import UserError
from dflash_dash.render.missing import DASH
from dflash_dash.render.speedup import (
    PREDICTED,
    WHAT_TO_SERVE,
    advice_caption,
    advice_rows,
    measured_caption,
    predicted_caption,
    table_label,
)
from pages import common, profile_view

NO_TABLE = (
    "No cost table in this workspace yet: measure one on the GPU you serve with, through **Measure a cost table** in "
    "Acceptance's Predicted speedup section (or `python -m dflash_dash profile` on that machine)."
)


@st.cache_data(max_entries=16, show_spinner=False)
def _tables(ws: str, ids: tuple[str, ...]) -> list[dict]:
    from dflash_dash.pipeline import speed

    return speed.tables(common._store(ws))


def pick_table(ws: str, key: str) -> str | None:
    """The cost table the page prices with (newest first; None: none kept, said so). Cached on the kept tables' ids
    (a profile job's new table adds no run, so the workspace's stamp would not show it)."""
    from dflash_dash.pipeline import speed

    tabs = _tables(ws, tuple(common.store().analysis(speed.COSTS, speed.INDEX) or ()))
    if not tabs:
        st.info(NO_TABLE)
        return None
    by = {t["id"]: t for t in tabs}
    return st.selectbox("cost table", list(by), key=key, format_func=lambda i: table_label(by[i]))


@st.cache_data(max_entries=64, show_spinner="pricing the run's rounds (once; kept in the workspace)")
def predicted(ws: str, run_id: str, table_id: str) -> dict:
    from dflash_dash.pipeline import speed

    s = common._store(ws)
    return speed.predicted(s, run_id, speed.table(s, table_id))


@st.cache_data(max_entries=16, show_spinner="re-walking the chain per setting")
def advice(ws: str, run_id: str, table_id: str, stamp: str) -> dict:
    from dflash_dash.pipeline import speed

    return speed.advise(common._store(ws), run_id, table_id)


def shown(ws: str, run: dict) -> None:
    """Acceptance: the run's predicted speedup with its cost table, then the advisor."""
    st.subheader(PREDICTED)
    if is_baseline(run):
        st.caption("A model-free baseline drafts on the host: its drafting cost is not a drafter block's.")
        return
    tid = pick_table(ws, "speed_costs")
    profile_view.form(ws, run, expanded=tid is None)  # a new table: open while none is kept
    if tid is None:
        return
    try:
        got = predicted(ws, run["id"], tid)
        adv = advice(ws, run["id"], tid, common.stamp())
    except UserError as e:
        st.error(str(e))
        return
    c = st.columns(3)
    c[0].metric("tau (pooled)", f"{got['tau']:.3f}" if got["tau"] is not None else DASH)
    c[1].metric(PREDICTED, f"{got['speedup']:.2f}×" if got["speedup"] is not None else DASH)
    m = got.get("measured")
    c[2].metric("measured tokens/s (engine)", f"{m['tokens_per_s']:,.1f}" if m else DASH)
    st.caption(predicted_caption(got, tid))
    st.caption(measured_caption(m))
    st.subheader(WHAT_TO_SERVE)
    rows = advice_rows(adv)
    st.dataframe(rows, hide_index=True, placeholder=DASH, width="stretch", column_config=common.numbers(rows))
    if adv["best"]:
        st.success(f"Best setting to serve: **{adv['best']}** (highest predicted speedup on {adv['costs']}).")
    st.caption(advice_caption(adv))
    for why in adv["skipped"]:
        st.caption(f"Left out: {why}")


def column(ws: str, runs: list[dict], table: list[dict], key: str) -> tuple[list[dict], str]:
    """Compare: the rows of `table` (one per run, same order) with each run's predicted speedup on the chosen cost
    table (a dash for baselines and where the table cannot price it), and the caption naming formula and device."""
    tid = pick_table(ws, key)
    out, note = [], ""
    for r, row in zip(runs, table):
        got = None
        if tid and not is_baseline(r):
            try:
                got = predicted(ws, r["id"], tid)
                note = note or f"{PREDICTED}: " + predicted_caption(got, tid)
            except UserError as e:
                note = note or f"{PREDICTED}: {e}"
        out.append(row | {"predicted speedup": None if got is None else round(got["speedup"], 3)})
    return out, note
