"""Predicted speedup and "What to serve" for Acceptance and Compare: a run's tau (and, for a run at a temperature,
its tau_expected) priced by a measured cost table (`profile`; its times shown, CPU costs labelled, a noisy table
flagged; a new one measured through profile_view's form), the engine's measured tokens/s beside it, and the advisor
(k drafts, DDTree budgets, temperatures) with the best setting marked, or said to beat no plain decoding. Helpers
of the pages, not a page: they read kept tables and analyses through pipeline.speed (no torch, no SQL) and draw with
render.speedup."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import streamlit as st

from dflash_dash.analysis.compare import is_baseline
from dflash_dash.errors import UserError
from dflash_dash.render.formats import fmt
from dflash_dash.render.missing import DASH
from dflash_dash.render.speedup import (
    PREDICTED,
    WHAT_TO_SERVE,
    advice_caption,
    advice_rows,
    cost_rows,
    measured_caption,
    noisy,
    predicted_caption,
    table_label,
)
from pages import profile_view, reads, widgets

if TYPE_CHECKING:
    from dflash_dash.store import Run

NO_TABLE = (
    "No cost table in this workspace yet: measure one on the GPU you serve with, through **Measure a cost table** in "
    "Acceptance's Predicted speedup section (or `python -m dflash_dash profile` on that machine)."
)


@st.cache_data(max_entries=16, show_spinner=False)
def _tables(ws: str, ids: tuple[str, ...]) -> list[dict]:
    from dflash_dash.pipeline import speed

    return speed.tables(reads.store_at(ws))


def kept(ws: str) -> list[dict]:
    """The kept cost tables, newest first, cached on their ids (a profile job's new table adds no run, so the
    workspace's stamp would not show it)."""
    from dflash_dash.pipeline import speed

    return _tables(ws, tuple(reads.store().analysis(speed.COSTS, speed.INDEX) or ()))


def pick_table(ws: str, key: str) -> str | None:
    """The cost table the page prices with (newest first; None: none kept, said so)."""
    tabs = kept(ws)
    if not tabs:
        st.info(NO_TABLE)
        return None
    by = {t["id"]: t for t in tabs}
    return st.selectbox("cost table", list(by), key=key, format_func=lambda i: table_label(by[i]))


@st.cache_data(max_entries=64, show_spinner="pricing the run's rounds (once; kept in the workspace)")
def predicted(ws: str, run_id: str, table_id: str) -> dict:
    from dflash_dash.pipeline import speed

    s = reads.store_at(ws)
    return speed.predicted(s, run_id, speed.table(s, table_id))


@st.cache_data(max_entries=16, show_spinner="re-walking the chain per setting")
def advice(ws: str, run_id: str, table_id: str, stamp: str) -> dict:
    from dflash_dash.pipeline import speed

    return speed.advise(reads.store_at(ws), run_id, table_id)


def shown(ws: str, run: Run) -> None:
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
        got = predicted(ws, run.id, tid)
        adv = advice(ws, run.id, tid, reads.stamp())
    except UserError as e:
        st.error(str(e))
        return
    tab = next(t for t in kept(ws) if t["id"] == tid)
    cpu = {"delta": "CPU costs", "delta_color": "off", "delta_arrow": "off"} if tab.get("device") == "cpu" else {}
    t = (run.summary or {}).get("temperature")
    at_t = [r for r in adv["rows"] if r["kind"] == "temperature" and r["run"] == run.id]
    c = st.columns(4 if at_t else 3)
    c[0].metric("tau (pooled)" + (", greedy" if t is not None else ""), fmt(got["tau"], 3))
    c[1].metric(PREDICTED, f"{got['speedup']:.2f}×" if got["speedup"] is not None else DASH, **cpu)
    if at_t:  # the run at its temperature: tau_expected priced on the same rounds
        c[2].metric(f"{PREDICTED} at T = {t:g}", f"{at_t[0]['speedup']:.2f}×", **cpu)
    m = got.get("measured")
    c[-1].metric("measured tokens/s (engine)", f"{m['tokens_per_s']:,.1f}" if m else DASH)
    st.caption(predicted_caption(got, tid) + (f" At T = {t:g}: {adv['temperature_rule']}." if at_t else ""))
    st.caption(measured_caption(m))
    st.caption(f"Cost table `{tid}`, milliseconds per forward (the target's of q new tokens after c cached tokens):")
    rows = cost_rows(tab)
    st.dataframe(rows, hide_index=True, placeholder=DASH, width="stretch", column_config=widgets.numbers(rows))
    why = noisy(tab)
    if why:
        st.warning(
            f"This cost table looks noisy: {why} (more tokens should not take under half the time). Its "
            "predictions are unreliable: measure again on an idle machine with more timed forwards per point "
            f"({profile_view.TITLE})."
        )
    st.subheader(WHAT_TO_SERVE)
    rows = advice_rows(adv)
    st.dataframe(rows, hide_index=True, placeholder=DASH, width="stretch", column_config=widgets.numbers(rows))
    best = next((r for r in adv["rows"] if r["best"]), None)
    greedy = " (drafts at T = 0; the rows at T price a run's tau_expected)" if at_t else ""
    if best and best["speedup"] >= 1:
        st.success(
            f"Best setting to serve: **{best['setting']}**{greedy}, highest predicted speedup on {adv['costs']}."
        )
    elif best:  # every setting slower than plain decoding: no setting to recommend
        st.warning(
            f"No setting beats plain decoding on {adv['costs']}: the best, **{best['setting']}**{greedy}, is predicted "
            f"at {best['speedup']:.2f}× (under 1×: speculative decoding would be slower here)."
        )
    st.caption(advice_caption(adv))
    for why in adv["skipped"]:  # the CLI's flag said as this page's form field
        why = re.sub(
            r"\(profile --tree-budget (\d+)\)", rf"(measure a table with DDTree budget \1: {profile_view.TITLE})", why
        )
        st.caption(f"Left out: {why}")


def column(ws: str, runs: list[Run], table: list[dict], key: str) -> tuple[list[dict], str]:
    """Compare: the rows of `table` (one per run, same order) with each run's predicted speedup on the chosen cost
    table (a dash for baselines and where the table cannot price it), and the caption naming formula and device."""
    tid = pick_table(ws, key)
    out, note = [], ""
    for r, row in zip(runs, table):
        got = None
        if tid and not is_baseline(r):
            try:
                got = predicted(ws, r.id, tid)
                note = note or f"{PREDICTED}: " + predicted_caption(got, tid)
            except UserError as e:
                note = note or f"{PREDICTED}: {e}"
        out.append(row | {"predicted speedup": None if got is None else round(got["speedup"], 3)})
    return out, note
