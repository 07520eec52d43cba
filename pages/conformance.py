"""Conformance: engine or drafter? One replay run beside what a serving engine reported for the same completions
(same drafter, same tokens): per prompt the engine's tau against the tau the replay says a correct greedy engine
reaches, the prompts where the engine falls short by more than numeric noise flagged, a scatter, a CSV download and
links to each prompt's token view; where the engine gave per-step lengths, round by round: the first step where the
engine's verify steps leave the replay's rounds, linked to the token view; and the fault ranking (`diagnose`, kept in
the store): which known engine fault reproduces the engine's numbers, offered only where there is a gap to explain.
The torch-path caveat shows only where it can explain the verdict (an engine above the replay).
URL: conformance?run=ID&engine=NAME."""

from __future__ import annotations

import html

import pandas as pd
import streamlit as st

from dflash_dash import metrics, ops
from dflash_dash.analysis import conformance, steps, verdict
from dflash_dash.render.figures import conformance_fig, hist_fig
from dflash_dash.render.formats import acceptance_link, plain
from dflash_dash.render.missing import DASH
from dflash_dash.render.tables import (
    CONFORMANCE_COLUMNS,
    CONFORMANCE_NOTE,
    DIVERGENCE_COLUMNS,
    conformance_csv,
    conformance_table,
    divergence_table,
    fault_table,
    number_specs,
    verdict_table,
)
from pages import frame, jobs_view, params, reads, widgets
from pages.guard import guard

frame.routed()

QUESTION = (
    "Same drafter, accepted length 3 in the engine and 5.5 in the replay: engine or drafter? The replay "
    "computes, from the drafter and the target's cached hidden states, the acceptance a correct greedy "
    "speculative decoder must reach on these completions with the same drafter: an engine that falls short of "
    "it by more than numeric noise is losing acceptance itself (features from the wrong layer, a truncated "
    "context, a wrong mask, ...), not the drafter; one clearly above it served another drafter or config. The "
    "verdict first checks what the engine says it served against the replayed drafter."
)
NO_STATS = (
    "No engine stats for completion set `{set}`. Fetch the completions from a server that decodes "
    "speculatively with this drafter (SGLang with `--speculative-algorithm DFLASH`, or the local stand-in "
    "`python -m dflash_dash serve --model TARGET --speculative-draft CKPT`): each request's `spec_*` counters "
    "are recorded as engine `sglang`. Stats of another engine: `python -m dflash_dash import-engine-stats "
    "FILE.jsonl --completions {set} --engine NAME`, lines "
    "`{{\"id\", \"verify_steps\", \"accepted_tokens\"}}` or "
    "`{{\"id\", \"accept_lengths\": [...]}}`. Then extract and replay the drafter on that set."
)


def cards(summary: dict) -> None:
    heads = [m for m in metrics.CONFORMANCE if m.headline]
    for col, m in zip(st.columns(len(heads)), heads):
        col.metric(m.label, metrics.show(m.key, summary.get(m.key)))
        col.caption(m.formula.replace("threshold", f"threshold ({summary['threshold']:g})"))
    with st.expander("all conformance figures and formulas"):
        st.dataframe(
            [
                {"figure": m.label, "value": metrics.show(m.key, summary.get(m.key)), "formula": m.formula}
                for m in metrics.CONFORMANCE
            ],
            hide_index=True,
            placeholder=DASH,
            width="stretch",
        )


VERDICT_BOX = {  # verdict -> how it is shown
    "conforms": st.success,
    "engine-below": st.warning,
    "engine-above": st.warning,
    "other-drafter": st.warning,
    "unverified": st.info,
}


def verdict_box(v: dict, served: dict | None, source: str, replayed: dict) -> None:
    """The run's verdict first, then its evidence: what the engine served beside what was replayed, the numbers."""
    VERDICT_BOX[v["verdict"]](f"**Verdict: {v['verdict']}**. " + plain(v["why"]))
    t = verdict_table(v, served, replayed)
    st.dataframe(
        pd.DataFrame(t).style.format(na_rep="—"),
        column_config={
            "what": st.column_config.Column("evidence"),
            "engine": st.column_config.Column(
                "engine served", help="what the engine said it served; — : the engine does not say"
            ),
            "replay": st.column_config.Column(
                "replayed", help="the drafter this run replayed; — : not known (its checkpoint is gone)"
            ),
            "compared": st.column_config.Column(
                "compared", help="same / differs where both sides say; — : not comparable (one side does not say)"
            ),
        },
        hide_index=True,
        placeholder=DASH,
        width="stretch",
        key="conf_verdict",
    )
    st.caption(
        f"what the engine served: {plain(source)}; the replayed drafter: {plain(replayed.get('source', ''))}. "
        "The replay is the ceiling only for the same drafter, config and numerics: an engine clearly below it or "
        "above it is a finding either way."
    )


def flagged_note(rows: list[dict], run_id: str, threshold: float) -> None:
    """The prompts beyond the threshold either way, linked to their token views."""
    for key, way in (("flagged", "below"), ("above", "above")):
        bad = [r for r in rows if r.get(key)]
        if not bad:
            continue
        links = " · ".join(
            f'<a href="{html.escape(acceptance_link(run_id, r["id"]), quote=True)}" '
            f'target="_self">{html.escape(str(r["id"]))}</a>'
            for r in bad
        )
        st.html(
            f'<div style="font-size:14px">{len(bad)} of {len(rows)} prompt(s) {way} the replay by more than '
            f"{threshold:g} × its tau: {links}</div>"
        )


def table(rows: list[dict], run_id: str, engine: str) -> None:
    t = conformance_table(rows, run_id)
    df = pd.DataFrame(t)
    style = df.style.apply(
        lambda row: [
            "background-color: #ffd7d7" if row["flagged"] else "background-color: #fff0c2" if row["above"] else ""
            for _ in row
        ],
        axis=1,
    ).format(number_specs(t), na_rep="—")
    cfg = {k: st.column_config.Column(help=f) for k, f in CONFORMANCE_COLUMNS.items()}
    cfg["token_view"] = st.column_config.LinkColumn(
        "token view", help=CONFORMANCE_COLUMNS["token_view"], display_text="open"
    )
    cfg["flagged"] = st.column_config.CheckboxColumn("flagged", help=CONFORMANCE_COLUMNS["flagged"])
    cfg["above"] = st.column_config.CheckboxColumn("above", help=CONFORMANCE_COLUMNS["above"])
    st.dataframe(style, column_config=cfg, hide_index=True, placeholder=DASH, width="stretch", key="conf_table")
    st.caption(
        "sorted by gap (engine − replay), most negative first; flagged rows (below) in red, rows above in amber. "
        + CONFORMANCE_NOTE
    )
    st.download_button(
        "Download the table (CSV)",
        conformance_csv(t),
        file_name=f"conformance-{run_id}-{engine}.csv",
        mime="text/csv",
        icon=":material/download:",
    )


def round_by_round(rows: list[dict], prompts: list[dict], run_id: str) -> None:
    """The engine's verify steps beside the replay's rounds, where it gave per-step lengths."""
    st.subheader("Round by round")
    summ = conformance.step_summary(rows)
    if summ is None:
        st.caption(
            "The engine gave no per-step lengths (SGLang `--speculative-decoding-stats detailed`: accept_lengths; "
            "vLLM `--per-request-spec-decode-metrics detailed`: per_step_accepted), so its steps cannot be "
            "aligned with the replay's rounds; the fault ranking then scores per-prompt tau."
        )
        return
    c = st.columns(4)
    c[0].metric("steps equal", f"{summ['steps_equal']}")
    c[0].caption("verify steps committing exactly the replay's round, before each prompt's first difference")
    c[1].metric("prompts diverging", f"{summ['diverging']} of {summ['prompts']}")
    c[1].caption("prompts with a step that differs from the replay's round")
    med = summ["first_divergence_median"]
    c[2].metric("first divergence (median)", "—" if med is None else f"token {med}")
    c[2].caption("completion token index where the first differing step starts")
    c[3].metric("engine above / below", f"{summ['above']} / {summ['below']}")
    c[3].caption("at the first difference: the engine's step commits more / fewer tokens than the replay's")
    flagged = any(r["flagged"] for r in rows)
    t = divergence_table(rows, run_id, {p["prompt_id"]: p["prompt_len"] for p in prompts}, only_flagged=flagged)
    if not t:
        st.success("Every verify step of the engine commits exactly the replay's round.")
        return
    cfg = {k: st.column_config.Column(help=f) for k, f in DIVERGENCE_COLUMNS.items()}
    cfg["token_view"] = st.column_config.LinkColumn(
        "token view", help=DIVERGENCE_COLUMNS["token_view"], display_text="open step"
    )
    st.dataframe(
        pd.DataFrame(t), column_config=cfg, hide_index=True, placeholder=DASH, width="stretch", key="conf_steps"
    )
    links = " · ".join(
        f'<a href="{html.escape(r["token_view"], quote=True)}" target="_self">'
        f"{html.escape(str(r['prompt']))}: step {r['steps_equal'] + 1}, token {r['first_divergence']}</a>"
        for r in t
    )
    st.html(f'<div style="font-size:14px">open the first divergent step: {links}</div>')
    st.caption(
        ("flagged prompts" if flagged else "prompts whose steps differ")
        + ", earliest first divergence first; open step: the token view with that step outlined"
    )


def fault_ranking(ws: str, run_id: str, engine: str, gap: bool) -> None:
    """The kept ranking of known engine faults (CLI `diagnose`), with the evidence in words; `gap`: the engine
    and the replay disagree beyond the threshold (else there is no gap to explain)."""
    st.subheader("Which fault explains the gap?")
    ranking = reads.kept(ws, run_id, f"faults:{engine}")
    if ranking is None and not gap:
        st.success(
            "No gap to explain: the engine matches the replay within the threshold, so there is nothing to rank."
        )
        return
    if ranking is None:
        cmd = f"python -m dflash_dash --workspace {ws} diagnose --run {run_id} --engine {engine}"
        st.caption(
            "Not ranked yet. The ranking replays this checkpoint under each known engine fault (target layers "
            "shifted by −2 to +2, sliding-window faults, fewer draft tokens verified, context windows, the prefill "
            "counted, "
            f"bf16 numerics) and scores each against the engine's numbers: the button below, or `{cmd}`"
        )
        if st.button("Rank the faults (a job: replays on the CPU)", key="conf_diag"):
            jobs_view.start_job(ops.Diagnose(run=run_id, engine=engine))
        jobs_view.job_panel(("diagnose",), key="diag")
        return
    best = ranking.get("explained_by")
    gap = gap and ranking.get("gap", True) is not False  # the ranking's own: the clean replay reproduces it exactly
    how = (
        "per-step: mean overlap of the step boundaries"
        if ranking.get("mode") == "steps"
        else "per-prompt: 1 − mean |engine tau − variant tau| / mean engine tau"
    )
    rule = (
        f"named when it removes at least {ranking.get('share', steps.SHARE):g} of the clean replay's "
        f"disagreement and beats the runner-up by {ranking.get('margin_share', steps.MARGIN):g} of it"
    )
    if best:
        st.error(f"**{html.escape(best)}**: {html.escape(steps.verdict(ranking))}.")
    elif not gap:
        st.success(
            "No gap to explain: the engine matches the replay within the threshold, so no fault is named "
            "(the scores below only say how close each variant comes)."
        )
    else:
        words = steps.verdict(ranking)  # none named: the closest candidate and its margin
        st.info(html.escape(words[:1].upper() + words[1:]) + ".")
    st.dataframe(
        pd.DataFrame(fault_table(ranking)).style.format({"score": "{:.4f}"}, na_rep="—"),
        column_config={
            "score": st.column_config.Column(
                "score", help="1: reproduces the engine exactly; — : not scored (skipped: the detail says why)"
            )
        },
        hide_index=True,
        placeholder=DASH,
        width="stretch",
        key="conf_faults",
    )
    st.caption(f"score in [0, 1], 1: the variant reproduces the engine exactly ({how}); a fault is {rule}.")


def main() -> None:
    ws, stamp = reads.workspace(), reads.stamp()
    st.title("Conformance")
    st.caption(QUESTION)
    runs = reads.runs(ws, stamp)
    if not runs:
        st.info(
            "No replay runs in this workspace yet. Fetch completions from a server that decodes speculatively "
            "(**Completions**), extract hidden states (**Extraction**), replay the drafter it serves "
            "(**Acceptance**); then this page compares the engine's acceptance with the replay's."
        )
        return
    by_id = {r.id: r for r in runs}
    estamp = stamp + "|" + reads.engine_stamp()
    with_stats = {s for s in {r.set_name for r in runs} if reads.engines(ws, s, estamp)}
    rid = params.select_run(
        "run (checkpoint · family · backend · id)",
        runs,
        "run",
        "conf_run",
        default=conformance.default_run(runs, with_stats),  # the newest run that has engine stats to compare
    )
    run = by_id[rid]
    set_name = run.set_name
    engines = reads.engines(ws, set_name, estamp)
    if not engines:
        st.info(NO_STATS.format(set=set_name))
        return
    c1, c2 = st.columns([2, 1])
    with c1:
        engine = params.select_param(
            "engine (whose counters)", engines, "engine", "conf_engine", default=conformance.SGLANG
        )
    thr = c2.number_input(
        "threshold (share of the replay tau)",
        min_value=0.0,
        max_value=0.99,
        value=conformance.THRESHOLD,
        step=0.01,
        format="%.2f",
        key="conf_thr",
    )
    st.caption(
        f"checkpoint `{run.checkpoint}` · completions `{set_name}` · extraction `{run.extraction_id}` "
        f"(backend **{run.backend}**) · flagged: replay tau − engine tau > {thr:g} × replay tau. "
        "A correct "
        "engine with the replay's numerics matches exactly; bf16 kernels and batch shapes move a prompt's tau "
        "by a few percent either way (numeric noise); a broken engine costs more."
    )
    comps = reads.completions(ws, set_name, stamp)
    prompts = sorted(
        reads.all_prompts(ws, rid).values(),
        key=lambda p: (getattr(comps.get(p["prompt_id"]), "idx", 0), p["prompt_id"]),
    )
    stats = reads.engine_stats(ws, set_name, engine, estamp)
    rows = conformance.compare(prompts, stats, thr, engine)
    missing = conformance.missing(prompts, stats)
    if missing:
        st.caption(f"{len(missing)} prompt(s) of the run have no `{engine}` stats and are left out.")
    if not rows:
        st.info(f"No prompt of run `{rid}` has `{engine}` stats in set `{set_name}`.")
        return
    rec = reads.served(ws, set_name, engine)
    served = rec["served"] if rec else None
    source = rec["source"] if rec else "not recorded (stats imported from a file, or fetched before this was kept)"
    mine = reads.replayed(ws, run)
    v = verdict.verdict(rows, served, mine, thr)
    verdict_box(v, served, source, mine)
    if verdict.backend_explains(run.backend, v):  # the one case a torch-path replay can account for
        widgets.backend_note(run.backend, "This replay", verdict.TORCH_ABOVE)
    summary = conformance.summary(rows, thr)
    cards(summary)
    flagged_note(rows, rid, thr)
    st.plotly_chart(conformance_fig(rows, thr, engine), width="stretch")
    st.caption(
        "each point is a prompt: x = replay tau (committed / rounds), y = engine tau ((completion_tokens − 1) "
        f"/ verify_steps); dashed: engine = replay; dotted: engine = (1 − {thr:g}) × replay, below it "
        "flagged"
    )
    table(rows, rid, engine)
    round_by_round(rows, prompts, rid)
    fault_ranking(ws, rid, engine, gap=verdict.direction(rows, thr)[0] is not None)
    hist = conformance.engine_histogram(rows)
    if hist:
        B = (run.summary or {}).get("block_size") or len(hist)
        rep = conformance.replay_histogram(prompts, {r["id"] for r in rows}, B)
        st.plotly_chart(
            hist_fig({f"engine ({engine})": {"accept_hist": hist}, "replay": {"accept_hist": rep}}),
            width="stretch",
        )
        st.caption(
            "verify steps (engine: its spec_accept_histogram) and rounds (replay: its chain walk) by drafts "
            "accepted, 0..B-1, as shares; the replay counts only drafts inside the completion, as SGLang does; an "
            "engine that counts what verification accepted before its stop check can differ on a prompt's last step"
        )


with guard():
    main()
