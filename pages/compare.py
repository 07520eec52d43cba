"""Compare: N >= 2 runs of one extraction side by side (pages/many_view.py: a table and a chart of tau per run and
per category with bootstrap intervals, the baselines as reference lines, each run judged against a reference by the
paired bootstrap), then two of them prompt by prompt (by default the newest two of the chosen runs). The pair:
headline metrics side by side, a sortable per-prompt delta table and the two token views in one
scroll-synced element with the positions whose outcome (accepted draft vs target token) differs outlined and a
next-difference jump. Drawn only when chosen in the section picker below them: the per-prompt tau scatter with
overlaid per-depth curves and histograms, overlaid calibration (reliability diagrams, ECE, expected vs observed tau),
the one-position draft lag rate per slot, configs side by side, and the training sweep (tau against step for the
checkpoints of a training folder; a link with &sweep=DIR opens it).
URL: compare?runs=ID,ID,..&ref=ID&a=ID&b=ID&prompt=PID&sweep=DIR[&section=charts|calibration|lag|config|sweep]."""

from __future__ import annotations

import streamlit as st

from dflash_dash import demo, metrics, ops
from dflash_dash.analysis.compare import (
    config_diff,
    default_pair,
    delta_rows,
    lag_rows,
    sweep_extraction,
    sweep_points,
)
from dflash_dash.analysis.reference import best_baseline
from dflash_dash.analysis.trace import differing, trace
from dflash_dash.render.analysis_figures import confidence_fig, reliability_fig
from dflash_dash.render.compare import DELTA_NOTE, OUTCOME_NOTE, compare_html
from dflash_dash.render.figures import depth_fig, hist_fig, lag_fig, scatter_fig, sweep_fig
from dflash_dash.render.formats import fmt, sliding_note
from dflash_dash.render.labels import extraction_label, family, streamed
from dflash_dash.render.missing import DASH
from dflash_dash.render.tokens import legend_html
from dflash_dash.store import Run
from dflash_dash.vocab import Vocab
from pages import frame, jobs_view, many_view, params, reads, speed_view, widgets
from pages.guard import guard

frame.routed()

SECTIONS = {  # URL value: label (&section=...): each drawn only when chosen
    "charts": "tau per prompt, per depth, histogram",
    "calibration": "Calibration, A and B",
    "lag": "One-position draft lag",
    "config": "Configs side by side",
    "sweep": "Training sweep",
}


def metrics_table(a: Run, b: Run) -> list[dict]:
    out = []
    for m in metrics.HEADLINE:
        va, vb = a.summary.get(m.key), b.summary.get(m.key)
        out.append(
            {
                "metric": metrics.label(m.key, a.summary),
                "A": fmt(va),
                "B": fmt(vb),
                "B − A": fmt(vb - va) if va is not None and vb is not None else "—",
                "formula": m.formula,
            }
        )
    return out


def pick_prompt(a: Run, b: Run, ra: dict, rb: dict, comps: dict) -> str | None:
    """The per-prompt delta table (sortable; a selected row opens its prompt) and the prompt select, both ordered
    by |delta| descending; a new A or B re-sorts them and selects the largest difference."""
    rows = [r for r in delta_rows(ra, rb) if r["prompt"] in comps]
    if not rows:
        st.info("The two runs share no prompt.")
        return None
    st.caption(DELTA_NOTE)
    order = [r["prompt"] for r in rows]
    pair = f"{a.id}|{b.id}"
    ev = st.dataframe(
        rows,
        hide_index=True,
        placeholder=DASH,
        width="stretch",
        column_config=widgets.numbers(rows),
        on_select="rerun",
        selection_mode="single-row",
        key=f"cmp_delta_{pair}",
    )
    picked = ev.selection.rows if ev is not None and hasattr(ev, "selection") else []
    prev = st.session_state.get("_cmp_pair")
    st.session_state["_cmp_pair"] = pair
    if prev is not None and prev != pair:
        params.set_param("cmp_prompt", "prompt", order[0])
    elif picked and st.session_state.get("_cmp_delta_last") != (pair, order[picked[0]]):
        st.session_state["_cmp_delta_last"] = (pair, order[picked[0]])
        params.set_param("cmp_prompt", "prompt", order[picked[0]])
    by = {r["prompt"]: r for r in rows}
    return params.select_param(
        "prompt (largest |delta| first)",
        order,
        "prompt",
        "cmp_prompt",
        format_func=lambda p: (
            f"{p} · A {fmt(by[p]['tau A'])} · B {fmt(by[p]['tau B'])} · delta {fmt(by[p]['delta (B − A)'])}"
        ),
    )


def token_views(ws: str, stamp: str, a: Run, b: Run, ra: dict, rb: dict) -> None:
    comps = reads.completions(ws, a.set_name, stamp)
    pid = pick_prompt(a, b, ra, rb, comps)
    if pid is None:
        return
    ex = {e.id: e for e in reads.extractions(ws, stamp)}
    target = ex[a.extraction_id].target_path if a.extraction_id in ex else None
    vocab = reads.vocab(target) if target else Vocab()
    Ba, Bb = a.summary["block_size"], b.summary["block_size"]
    comp = reads.completion(ws, a.set_name, pid, stamp)
    ta, tb = (
        trace(reads.run_prompt(ws, a.id, pid), comp, Ba),
        trace(reads.run_prompt(ws, b.id, pid), comp, Bb),
    )
    diff = differing(ta, tb)
    st.caption(f"{len(diff)} of {len(ta.role)} completion positions differ in outcome. {OUTCOME_NOTE}")
    st.html(legend_html(Ba, compare=True))
    heads = (
        f"A · {a.name} ({family(a)}) · tau {fmt(ra[pid]['tau'])}",
        f"B · {b.name} ({family(b)}) · tau {fmt(rb[pid]['tau'])}",
    )
    win = params.window_param(len(ta.role), ta.prompt_len, "cmp_win", pid, around=min(diff) if diff else None)
    st.html(compare_html(ta, tb, vocab, (Ba, Bb), diff, heads, window=win), unsafe_allow_javascript=True)


def lag_block(ws: str, stamp: str, a: Run, b: Run) -> None:
    st.subheader("One-position draft lag, per slot")
    st.caption(
        "How often the draft at slot k is the target's token one position behind the one it should predict: "
        "the signature of a drafter trained with the anchor's own hidden state in view. " + metrics.LAG_FORMULA
    )
    rows = lag_rows(
        reads.analysis(ws, a.id, "lag"),
        reads.analysis(ws, b.id, "lag"),
        a.summary["block_size"],
        b.summary["block_size"],
    )
    if not any(r["anchors A"] or r["anchors B"] for r in rows):
        st.info("No drafts to count: the runs hold no drafts for their shared prompts.")
        return
    c1, c2 = st.columns([3, 2])
    c1.plotly_chart(lag_fig(rows, a.name, b.name), width="stretch")
    with c2:
        st.dataframe(rows, hide_index=True, placeholder=DASH, width="stretch", column_config=widgets.numbers(rows))
        widgets.download("draft lag per slot, both runs (CSV)", rows, "compare-lag.csv", "cmp_dl_lag")


def calibration_block(ws: str, a: Run, b: Run) -> None:
    """Calibration of A and B overlaid: ECE and expected vs observed tau, reliability diagrams, per-depth curves."""
    st.subheader("Calibration, A and B")
    cals = {f"{side} {r.name}": reads.analysis(ws, r.id, "calibration") for side, r in (("A", a), ("B", b))}
    for name, cal in cals.items():
        if not cal["recorded"]:
            st.info(f"{name}: draft probabilities not recorded, replay again (the run predates them).")
    cals = {n: c for n, c in cals.items() if c["recorded"]}
    if not cals:
        return
    st.dataframe(
        [
            {"metric": label, **{n: fmt(c[key]) for n, c in cals.items()}, "formula": formula}
            for key, label, formula in (
                ("calibration_ece", "calibration ECE (pooled over depths)", metrics.BY_KEY["calibration_ece"].formula),
                ("expected_tau", "expected tau (macro)", metrics.BY_KEY["expected_tau"].formula),
                ("tau_macro", "observed tau (macro)", metrics.BY_KEY["tau_macro"].formula),
                ("expected_tau_pooled", "expected tau (pooled)", metrics.BY_KEY["expected_tau_pooled"].formula),
                ("tau_pooled", "observed tau (pooled)", metrics.BY_KEY["tau_pooled"].formula),
            )
        ],
        hide_index=True,
        placeholder=DASH,
        width="stretch",
    )
    B = max(r.block_size for r in (a, b))
    opts = ["pooled over depths"] + [f"depth {k}" for k in range(1, B)]
    v = st.selectbox("reliability diagram: depth", opts, key="cmp_cal_depth")
    depth = "pooled" if v == opts[0] else int(v.split()[1])
    c1, c2 = st.columns(2)
    c1.plotly_chart(reliability_fig({n: c["reliability"] for n, c in cals.items()}, depth), width="stretch")
    c2.plotly_chart(confidence_fig({n: c["by_depth"] for n, c in cals.items()}), width="stretch")
    with c1:
        widgets.download(
            "reliability bins, both runs (CSV)",
            [{"run": n, **r} for n, c in cals.items() for r in c["reliability"]],
            "compare-reliability.csv",
            "cmp_dl_rel",
        )
    with c2:
        widgets.download(
            "per-depth calibration, both runs (CSV)",
            [{"run": n, **r} for n, c in cals.items() for r in c["by_depth"]],
            "compare-calibration-depth.csv",
            "cmp_dl_depth",
        )


def config_block(a: Run, b: Run) -> None:
    st.subheader("Configs side by side")
    rows = config_diff(a.config, b.config)
    n = sum(1 for r in rows if r["differs"])
    st.caption(f"{n} {'key differs' if n == 1 else 'keys differ'} (marked ≠, listed first)")

    def mark(row):
        return ["background-color:#ffe0e0" if row["differs"] else "" for _ in row]

    import pandas as pd

    st.dataframe(pd.DataFrame(rows).style.apply(mark, axis=1), hide_index=True, placeholder=DASH, width="stretch")


def sweep_block(ws: str, stamp: str, runs: list[Run]) -> None:
    st.header("Training sweep")
    st.caption(
        "Point at a training output folder (epoch_E_step_S/, SpecForge runtime {run_id}-step{N}/, "
        "checkpoint-N/ folders): every checkpoint in it is replayed on one extraction, as one job, in step "
        "order ({run_id}-latest/-best links count once); tau is plotted against step."
    )
    exs = [e for e in reads.extractions(ws, stamp) if e.status == "done"]
    default = st.query_params.get("sweep", "") or demo.series_folder(ws) or ""  # a demo: its healthy run's steps
    folder = st.text_input("training output folder", value=default, key="sweep_folder")
    if folder.strip():
        st.query_params["sweep"] = folder.strip()
    if exs:
        ids = [e.id for e in exs]
        by = {e.id: e for e in exs}
        ex = st.selectbox(
            "extraction",
            ids,
            index=ids.index(sweep_extraction(runs, folder.strip(), ids)),  # the newest with the folder's runs
            key="sweep_ex",
            format_func=extraction_label(by),
        )
        how = (
            jobs_view.checkpoint_inputs("sweep") | jobs_view.sampling_inputs("sweep") | jobs_view.where_inputs("sweep")
        )
        if st.button("Start sweep", type="primary", disabled=not folder.strip()):
            from dflash_dash import pipeline

            widgets.backend_note(by[ex].backend, f"Extraction {ex}")
            e = by[ex]
            stream = (  # no feature files: the sweep runs the target again over the set
                dict(stream=True, target=e.target_path, completions=e.set_name) if streamed(e) else {}
            )
            with guard({"checkpoints": "training output folder"} | jobs_view.SAMPLING):  # a mistyped folder,
                # one without a checkpoint or with a damaged one, a temperature without the extraction's top-K: said
                # here, no job; what is not a checkpoint is listed
                jobs_view.has_topk(e, how | stream)
                _, skipped = pipeline.checkpoints_in(folder.strip())
                jobs_view.start_job(ops.Sweep(checkpoints=folder.strip(), extraction=ex, **how, **stream))
                if skipped:
                    st.info(f"Not checkpoints, skipped: {'; '.join(skipped)}")
    else:
        st.info("No finished extraction: extract hidden states on the **Extraction** page first.")
    jobs_view.job_panel(("sweep",), key="sweep")
    if folder.strip():
        pts = sweep_points(runs, folder.strip(), ex if exs else None)
        if not pts:
            st.info("No run of a checkpoint inside this folder yet: start the sweep.")
            return
        base = best_baseline(runs, Run(id="", extraction_id=ex)) if exs else None
        st.plotly_chart(sweep_fig(pts, base and (base.name, base.summary["tau_macro"])), width="stretch")
        st.caption(
            "tau (macro): mean over prompts of committed/rounds; tau (pooled): all committed / all rounds; "
            "DDTree tau: the same with tree drafting"
        )
        by = {r.id: r for r in runs}
        pts, speed_note = speed_view.column(ws, [by[p["run"]] for p in pts], pts, "sweep_costs")
        for p in pts:
            x = p["predicted speedup"]
            st.markdown(
                f"step {p['step'] if p['step'] is not None else '?'} · `{p['name']}`"
                f"{sliding_note(p['sliding_block'])} · tau {fmt(p['tau_macro'])} / pooled "
                f"{fmt(p['tau_pooled'])} / DDTree {fmt(p['ddtree_tau'])} · predicted speedup "
                f"{fmt(x) + ('×' if x else '')} · [open in Acceptance](acceptance?run={p['run']})"
            )
        st.caption(speed_note)


def main() -> None:
    ws = reads.workspace()
    stamp = reads.stamp()
    st.title("Compare")
    runs = reads.runs(ws, stamp)
    if len(runs) < 2:
        st.info(
            "Compare needs two replay runs: replay two checkpoints on the same extraction (Acceptance page, "
            "**Replay**, or a training sweep below)."
        )
    else:
        by_id = {r.id: r for r in runs}
        st.subheader("Runs side by side")
        chosen = many_view.pick_runs(ws, stamp, runs)
        with guard():  # a failing table does not hide the pair below
            many_view.many_block(ws, stamp, chosen)
        st.subheader("Two of them, prompt by prompt")
        linked = {st.query_params.get("a"), st.query_params.get("b")}  # a link's pair stays choosable
        pool = [r for r in runs if r.id in {c.id for c in chosen} | linked]
        pool = pool if len(pool) >= 2 else runs
        da, db = default_pair(pool)  # the newest two of them on one extraction
        c1, c2 = st.columns(2)
        with c1:
            a_id = params.select_run("A", pool, "a", "cmp_a", default=da)
        with c2:
            b_id = params.select_run("B", pool, "b", "cmp_b", default=db)
        a, b = by_id[a_id], by_id[b_id]
        st.caption(
            f"A: `{a.checkpoint}` on `{a.extraction_id}` (backend **{a.backend}**)  \n"
            f"B: `{b.checkpoint}` on `{b.extraction_id}` (backend **{b.backend}**)"
        )
        widgets.backend_note(a.backend, "Run A")
        if b.backend != a.backend:
            widgets.backend_note(b.backend, "Run B")
        if a.extraction_id != b.extraction_id:
            st.warning(
                f"A and B are on different extractions ({a.extraction_id} vs {b.extraction_id}): "
                "differences may come from the hidden states, not the checkpoints. Replay both on one "
                "extraction for a clean comparison."
            )
        if a.set_name != b.set_name:
            st.error("A and B are on different completion sets; per-prompt comparisons need the same set.")
        else:
            st.dataframe(metrics_table(a, b), hide_index=True, placeholder=DASH, width="stretch")
            ra, rb = reads.prompt_rows(ws, a_id), reads.prompt_rows(ws, b_id)  # numbers only, per prompt
            st.subheader("Per prompt, A vs B, and the token views aligned")
            token_views(ws, stamp, a, b, ra, rb)
        more_block(ws, stamp, runs, a, b)
        return
    sweep_block(ws, stamp, runs)


def charts_block(ws: str, a: Run, b: Run) -> None:
    """Per-prompt tau scatter, per-depth curves and histograms of A and B overlaid (a section)."""
    st.subheader("tau per prompt, per depth, histogram")
    ra, rb = reads.prompt_rows(ws, a.id), reads.prompt_rows(ws, b.id)
    st.plotly_chart(
        scatter_fig({p: r["tau"] for p, r in ra.items()}, {p: r["tau"] for p, r in rb.items()}, a.name, b.name),
        width="stretch",
    )
    sa = {f"A {a.name} ({family(a)})": a.summary}
    sb = {f"B {b.name} ({family(b)})": b.summary}
    c1, c2 = st.columns(2)
    c1.plotly_chart(depth_fig(sa | sb), width="stretch")
    c2.plotly_chart(hist_fig(sa | sb), width="stretch")


def more_block(ws: str, stamp: str, runs: list[Run], a: Run, b: Run) -> None:
    """The section picker below the pair: one section drawn when chosen (a link with &sweep=DIR opens the sweep)."""
    st.subheader("More on A and B")
    same = a.set_name == b.set_name  # per-prompt sections need one completion set
    options = {k: v for k, v in SECTIONS.items() if same or k in ("config", "sweep")}
    section = params.section_param(
        "their charts, calibration, draft lag, configs, or a training sweep (drawn when chosen)",
        options,
        "section",
        "cmp_section",
        default="sweep" if st.query_params.get("sweep") else None,
    )
    draw = {
        "charts": lambda: charts_block(ws, a, b),
        "calibration": lambda: calibration_block(ws, a, b),
        "lag": lambda: lag_block(ws, stamp, a, b),
        "config": lambda: config_block(a, b),
        "sweep": lambda: sweep_block(ws, stamp, runs),
    }
    if section:
        with guard():  # a failing section does not hide the rest of the page
            draw[section]()


with guard():
    main()
