"""Compare's many-runs section: N >= 2 runs of one extraction side by side (a table and a chart of tau per run and
per category, the model-free baselines as reference lines) and each run judged against a reference run by the
paired bootstrap, in words. Helpers of pages/compare.py, not a page: they read the kept per-prompt rows and the
set's categories and draw with render (no torch, no SQL). URL: compare?runs=ID,ID,...&ref=ID."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from dflash_dash.analysis.compare import default_runs, is_baseline, many_rows, many_table, verdict_rows
from dflash_dash.render.labels import extraction_label, run_label
from dflash_dash.render.many import MANY_NOTE, PAIRED_NOTE, many_fig
from dflash_dash.render.missing import DASH
from pages import params, reads, speed_view, widgets

if TYPE_CHECKING:
    from dflash_dash.store import Run


def pick_runs(ws: str, stamp: str, runs: list[Run]) -> list[Run]:
    """The extraction and its runs to compare (a link's ?runs=A,B,C opens them; by default the newest drafter runs
    of the newest pair's extraction and its baselines), oldest first; the choice is kept in the URL."""
    by = {r.id: r for r in runs}
    asked = [i for i in (st.query_params.get("runs") or "").split(",") if i in by]
    first = asked or default_runs(runs)
    exs = list(dict.fromkeys(r.extraction_id for r in reversed(runs)))  # newest first
    rows = {e.id: e for e in reads.extractions(ws, stamp)}
    ex = st.selectbox(
        "extraction",
        exs,
        index=exs.index(by[first[0]].extraction_id),
        key="many_ex",
        format_func=extraction_label(rows) if all(e in rows for e in exs) else str,
    )
    on = [r for r in runs if r.extraction_id == ex]
    if st.session_state.get("_many_ex") != ex:  # a new extraction (or the first visit): its runs, or the link's
        st.session_state["_many_ex"] = ex
        mine = [i for i in first if by[i].extraction_id == ex] or default_runs(on)
        st.session_state["many_runs"] = mine
    ids = st.multiselect(
        "runs to compare (two or more; baselines draw as reference lines)",
        [r.id for r in on],
        key="many_runs",
        format_func=run_label(by),
    )
    st.query_params["runs"] = ",".join(ids)
    return [r for r in on if r.id in ids]


def many_block(ws: str, stamp: str, chosen: list[dict]) -> None:
    """The table, the chart and the paired verdicts of the chosen runs (all of one extraction)."""
    if len(chosen) < 2:
        st.info("Choose two or more runs of the extraction to compare them.")
        return
    taus = {r.id: {p: row["tau"] for p, row in reads.prompt_rows(ws, r.id).items()} for r in chosen}
    cats = {p: c.category for p, c in reads.completions(ws, chosen[0].set_name, stamp).items()}
    rows = many_rows(chosen, taus, cats)
    table, speed_note = speed_view.column(ws, chosen, many_table(chosen, rows), "many_costs")
    st.dataframe(table, hide_index=True, placeholder=DASH, width="stretch", column_config=widgets.numbers(table))
    st.caption(MANY_NOTE + (" " + speed_note if speed_note else ""))
    if not any(c for c in cats.values()):
        st.caption("This set has no categories (import MT-Bench, SPEED-Bench or a JSONL with a category for them).")
    st.plotly_chart(many_fig(rows), width="stretch")
    drafters = [r for r in chosen if not is_baseline(r)] or chosen
    by = {r.id: r for r in chosen}
    ref_id = params.select_param(
        "judge each run against", [r.id for r in drafters], "ref", "many_ref", format_func=run_label(by)
    )
    verdicts = verdict_rows(by[ref_id], chosen, taus, cats)
    st.dataframe(verdicts, hide_index=True, placeholder=DASH, width="stretch", column_config=widgets.numbers(verdicts))
    st.caption(PAIRED_NOTE)
    for v in verdicts:
        if v["category"] == "all" and v["warning"]:
            st.warning(f"{v['run']} against {by[ref_id].name}: {v['warning']}")
    widgets.download("tau per run and category (CSV)", rows, "compare-runs.csv", "many_dl")
