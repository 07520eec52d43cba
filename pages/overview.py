"""Overview (the app's home at /): in a demo workspace, what its checkpoints are and the view that reveals each
(`demo.story`, from the demo's MANIFEST.json); where the workspace stands in the pipeline and what to do next, and
every run grouped by the extraction it replayed (human column labels, the metric's formula as the column's help); a
row opens its run on the Acceptance page (acceptance?run=ID)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from dflash_dash.analysis.compare import is_baseline
from dflash_dash.render.formats import backend_label, count
from dflash_dash.render.missing import DASH
from dflash_dash.render.story import story_html
from dflash_dash.render.tables import run_columns, run_groups
from pages import baseline_view, frame, reads
from pages.guard import guard

if TYPE_CHECKING:
    from dflash_dash.store import Extraction, Run

frame.routed()


@st.cache_data(max_entries=32, show_spinner=False)
def story(ws: str, stamp: str) -> dict | None:
    """What the Overview of a demo workspace tells (`demo.story`, from its MANIFEST.json); None elsewhere."""
    from dflash_dash import demo

    return demo.story(ws, reads.runs(ws, stamp))


def main() -> None:
    ws = reads.workspace()
    stamp = reads.stamp()
    st.title("dflash-dash")
    st.caption(
        "Per-prompt, per-token acceptance of DFlash drafter checkpoints against their target, from cached "
        "target hidden states (no network at replay)."
    )
    sets = reads.sets(ws, stamp)
    exs = reads.extractions(ws, stamp)
    runs = reads.runs(ws, stamp)
    told = story(ws, stamp)  # None outside a demo workspace
    if told:
        st.html(story_html(told))
    steps = [
        (
            "1. Completions",
            f"{count(len(sets), 'set')}, {count(sum(s.prompts for s in sets), 'completion')}",
            bool(sets),
            "pages/completions.py",
            "fetch a prompt set from the SGLang server, or import a JSONL",
        ),
        (
            "2. Extraction",
            count(len(exs), "extraction")
            + f" ({', '.join(sorted({backend_label(e.backend) for e in exs})) or 'none'})",
            any(e.status == "done" for e in exs),
            "pages/extraction.py",
            "extract the target's hidden states at the drafter's layers",
        ),
        (
            "3. Replay",
            count(len(runs), "run"),
            bool(runs),
            "pages/acceptance.py",
            "replay a checkpoint over an extraction",
        ),
        (
            "4. Compare",
            "two runs side by side, training sweeps",
            len(runs) >= 2,
            "pages/compare.py",
            "replay a second checkpoint on the same extraction",
        ),
    ]
    nxt = next((s for s in steps if not s[2]), None)
    for title, what, done, page, todo in steps:
        c1, c2 = st.columns([1, 3])
        c1.page_link(page, label=title, icon=":material/check_circle:" if done else ":material/radio_button_unchecked:")
        c2.markdown(what if done else f"{what} · next: {todo}")
    if nxt:
        st.info(f"Next: {nxt[4]} (**{nxt[0][3:]}** page).")
    if runs:
        runs_block(runs, exs, ws, stamp)
    st.page_link(
        "pages/diagnostics.py",
        label="Diagnostics: backend parity, checkpoint consistency, server",
        icon=":material/monitor_heart:",
    )


def runs_block(runs: list[Run], exs: list[Extraction], ws: str, stamp: str) -> None:
    st.subheader("Runs")
    st.caption(
        "grouped by the extraction they replayed, by checkpoint within; select a row (or follow its *open* "
        "link) to open the run on the Acceptance page"
    )
    config = {
        "open": st.column_config.LinkColumn("open", display_text="open", help="the run on the Acceptance page"),
        **{label: st.column_config.TextColumn(label, help=formula) for label, formula in run_columns().items()},
    }
    groups = run_groups(runs, exs)
    set_of = {r.id: r.set_name for r in runs}
    for i, g in enumerate(groups):
        name = set_of.get(g["ids"][0]) if g["ids"] else None  # a group's runs share their completion set
        title = g["title"] + (f" · {reads.set_sampling(ws, name, stamp)}" if name else "")
        with st.expander(title, expanded=i == 0 or len(groups) <= 3):
            ev = st.dataframe(
                g["rows"],
                hide_index=True,
                placeholder=DASH,
                width="stretch",
                column_config=config,
                on_select="rerun",
                selection_mode="single-row",
                key=f"runs_{g['extraction']}",
            )
            drafters = [r for r in runs if r.id in g["ids"] and not is_baseline(r)]
            if drafters:  # the group's best drafter against the best model-free baseline on its completions
                top = max(drafters, key=lambda r: (r.summary or {}).get("tau_macro") or 0)
                baseline_view.beside(runs, top, f"its best drafter, {top.name or top.checkpoint},")
            picked = ev.selection.rows if ev is not None and hasattr(ev, "selection") else []
            if picked:
                st.switch_page("pages/acceptance.py", query_params={"run": g["ids"][picked[0]]})


with guard():
    main()
