"""Acceptance: one checkpoint on one extraction. Summary metrics with their formulas, how sure tau is (bootstrap
intervals over prompts, median, outlier prompts, DDTree against a chain of the same token budget), the per-prompt
table (outlier rows marked) and the token-by-token view of one prompt with its round detail: drawn first, what a user
opens the page for. The rest is drawn only when chosen in the section picker below the token view (a chart costs the
browser more than the whole token view): the histogram and per-depth curves with the rounds behind each point,
accepted(p) along the prompt, every run metric, the drafter's calibration and its failure patterns (each table
downloadable as CSV), top-K headroom and the confidence head; a Replay button evaluates another checkpoint as a job.
URL: acceptance?run=ID&prompt=PID[&pos=START-END: positions outlined in the token view][&round=N: the round shown
in full below the token view][&section=charts|curve|metrics|calibration|patterns|headroom|confidence: that section
shown]."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from dflash_dash import metrics
from dflash_dash.analysis.compare import healthiest_run
from dflash_dash.analysis.rounds import round_detail, round_options
from dflash_dash.analysis.trace import trace
from dflash_dash.render.analysis_figures import (
    binned_fig,
    class_fig,
    context_position_fig,
)
from dflash_dash.render.figures import accept_curve, depth_fig, hist_fig
from dflash_dash.render.formats import DEFAULT_RUN_NOTES, ci, fmt, sliding_note
from dflash_dash.render.labels import family
from dflash_dash.render.missing import DASH
from dflash_dash.render.tables import TAU_COLUMNS, outlier_links, pattern_rows, prompt_table, summary_rows
from dflash_dash.render.tokens import legend_html, round_html, text_html, token_html
from dflash_dash.vocab import Vocab
from pages import baseline_view, expected_view, frame, jobs_view, params, reads, speed_view, widgets
from pages.calibration_view import calibration_block
from pages.guard import guard
from pages.heads_view import confidence_block, headroom_block
from pages.live_view import live_block

if TYPE_CHECKING:
    from dflash_dash.store import Completion, Run

frame.routed()


def summary_block(s: dict, rows: list[dict], run_id: str) -> None:
    cols = st.columns(4)
    for col, m in zip(cols, metrics.HEADLINE):
        col.metric(metrics.label(m.key, s), fmt(s.get(m.key)))
        col.caption(m.formula)
    stats_block(s, rows, run_id)


def metrics_block(s: dict) -> None:
    """Every run metric with its formula (a section: drawn when chosen)."""
    st.subheader("All run metrics and formulas")
    st.dataframe(summary_rows(s), hide_index=True, placeholder=DASH, width="stretch")


def charts_block(s: dict) -> None:
    """The run's histogram and per-depth curves (a section: drawn when chosen)."""
    st.subheader("Rounds by accepted drafts, acceptance per depth")
    c1, c2 = st.columns(2)
    c1.plotly_chart(hist_fig({"run": s}), width="stretch")
    c1.caption("histogram: rounds of the chain walk by accepted drafts 0..B-1; hover: share and rounds (n)")
    c2.plotly_chart(depth_fig({"run": s}), width="stretch")
    c2.caption(
        "conditional P(d_k accepted | d_1..d_{k-1} accepted) over the rounds with d_1..d_{k-1} accepted "
        "(bars, right axis: their count n); marginal P(d_1..d_k all accepted) over the rounds with slot k in "
        "the completion; hover shows n. A depth no round reached is a gap marked n = 0."
    )


def stats_block(s: dict, rows: list[dict], run_id: str) -> None:
    """How sure tau is: bootstrap intervals, median, outlier prompts, DDTree against a same-budget chain."""
    st.markdown("**How sure is tau?** Prompts are the sampling unit: a few odd prompts can move the macro mean.")
    c = st.columns(2)  # an interval ('1.28 [1.19, 1.38]') needs half the row: a quarter cut it below 1,440 px
    for col, key, point in ((c[0], "tau_macro_ci", "tau_macro"), (c[1], "tau_pooled_ci", "tau_pooled")):
        col.metric(metrics.label(key, s), ci(s.get(point), s.get(key)))
        col.caption(f"{metrics.label(point)} [lo, hi]: {metrics.BY_KEY[key].formula}")
    c = st.columns(4)
    for col, key in ((c[0], "tau_median"), (c[1], "tau_macro_trimmed")):
        col.metric(metrics.label(key, s), fmt(s.get(key)))
        col.caption(metrics.BY_KEY[key].formula)
    odd = outlier_links(s, rows, run_id)
    st.markdown(
        f"**Outlier prompts: {metrics.show('tau_outlier_count', s.get('tau_outlier_count'))}** · "
        f"fences {metrics.show('tau_fences', s.get('tau_fences'))}"
    )
    st.caption(
        metrics.TUKEY_RULE + "; tau (macro) without outliers leaves them out. Rows marked in the `outlier` "
        "column of the per-prompt table."
    )
    for o in odd:
        st.markdown(
            f"- `{str(o['prompt']).replace('`', '')}` · tau {fmt(o['tau'])} ({o['side']}) · "
            f"[open in the token view]({o['link']})"
        )
    b, B = s.get("tree_budget") or 0, s.get("block_size") or 0
    if not b:
        return
    st.markdown(f"**DDTree-{b} against a chain of the same token budget** ({b} drafts verified per round)")
    c1, c2 = st.columns(2)
    for col, key, tree in (
        (c1, "chain_tau_at_budget", "ddtree_tau"),
        (c2, "chain_tau_at_budget_pooled", "ddtree_tau_pooled"),
    ):
        v, t = s.get(key), s.get(tree)
        col.metric(
            metrics.label(key, s),
            fmt(v),
            delta=None if v is None or t is None else f"{t - v:+.2f} {metrics.label(tree, s)} − chain",
        )
        col.caption(
            metrics.BY_KEY[key].formula
            + (" (needs accepted(p) at every anchor: replay with every anchor)" if v is None else "")
        )
    st.caption(
        f"DDTree-{b} verifies {b} drafted tokens per round, so a round commits at most {b} + 1 = {b + 1} "
        f"tokens; the chain of block {B} verifies {B - 1} drafts and can commit up to {B}. On easy text, where "
        f"the chain's drafts run deep, DDTree-{b} can therefore commit fewer tokens per round than the "
        f"{B}-block chain: its budget caps it. Like with like is a chain verifying the same {b} drafts per "
        f"round (block {b + 1}), above; the delta is DDTree − that chain."
        + (
            f" Here the budget covers all {B - 1} drafts: the same-budget chain is the chain itself."
            if b >= B - 1
            else ""
        )
    )


def token_view(ws: str, run: Run, row: dict, comp: Completion, span: tuple[int, int] | None = None) -> None:
    B = run.summary["block_size"]
    ex = reads.extractions(ws, reads.stamp())
    target = next((e.target_path for e in ex if e.id == run.extraction_id), None)
    vocab = reads.vocab(target) if target else Vocab()
    tr = trace(row, comp, B)
    c = st.columns(5)
    c[0].metric("tau (this prompt)", fmt(row["tau"]))
    c[0].caption("committed / rounds")
    c[1].metric("rounds", len(tr.rounds))
    c[2].metric("completion tokens", len(row["accepted_at"]))
    c[3].metric(f"DDTree-{run.tree_budget} tau (this prompt)", fmt(row["tree_tau"]))
    c[3].caption("committed / rounds of the tree walk")
    c[4].metric("rejections", sum(r is not None for r in tr.rejected))
    with st.expander("prompt"):
        st.html(text_html(comp.prompt or ""))
    t1, t2 = st.columns(2)
    sup = t1.toggle("depth superscripts", value=True)
    inline = t2.toggle("rejected drafts inline", value=True)
    st.html(legend_html(B))
    if vocab.tok is None:
        st.caption("The target folder has no tokenizer: tokens are shown as ⟨id⟩.")
    outline = None
    if span:  # a worst-span link (Failure patterns): outline its positions
        P, T = row["prompt_len"], row["prompt_len"] + len(row["accepted_at"])
        outline = {q - P for q in range(max(span[0], P), min(span[1], T - 1) + 1)}
        st.caption(
            f"Outlined: positions {span[0]}–{span[1]} from the link (a worst span of Failure patterns: the "
            "lowest mean accepted(p) there; or, from Conformance, the first verify step where the engine's "
            "steps leave the replay's rounds)"
        )
    win = params.window_param(
        len(tr.role), tr.prompt_len, "acc_win", row["prompt_id"], around=min(outline) if outline else None
    )
    st.html(token_html(tr, vocab, B, superscript=sup, inline_rejects=inline, diff=outline, window=win))
    if rnd := round_block(run, row, comp, vocab):
        baseline_view.source_note(ws, run, row, comp, vocab, rnd)


def curve_block(ws: str, run: Run, pid: str) -> None:
    """accepted(p) along the shown prompt (a section: drawn when chosen)."""
    B = run.summary["block_size"]
    row, comp = reads.run_prompt(ws, run.id, pid), reads.completion(ws, run.set_name, pid, reads.stamp())
    st.subheader(f"accepted(p) along {pid}")
    st.plotly_chart(accept_curve(trace(row, comp, B), row, B), width="stretch")
    st.caption(
        "accepted(p): leading drafts of the block at anchor p equal to the completion; "
        "markers: anchors the chain walk actually visits"
    )


def round_block(run: Run, row: dict, comp: Completion, vocab: Vocab) -> int | None:
    """One round of the chain walk in full: the drafter's B-1 slots with their top-k candidates beside the
    target's tokens, where the chain stopped and what DDTree took at that anchor (URL: &round=N); the round shown."""
    B, budget = run.summary["block_size"], run.tree_budget
    st.markdown("**Round detail** · the drafter's whole block at one round of the chain walk")
    opts = round_options(row, comp, B)
    if not opts:
        st.caption("This completion has no round: its only token comes from the target's prefill.")
        return
    labels = {str(o["round"]): o["label"] for o in opts}
    first_stop = next((o["round"] for o in opts if o["accepted"] < o["inside"]), 1)  # default: a rejection
    rnd = params.select_param(
        "round of the chain walk", list(labels), "round", "acc_round", default=str(first_stop), format_func=labels.get
    )
    detail = round_detail(row, comp, B, int(rnd), vocab, run.summary.get("round_topk"), budget)
    st.html(round_html(detail))
    st.caption(
        "candidate j: the drafter's j-th most probable token for the slot, with its probability; green: "
        "the target's token among them; the chain stops at the first rejected slot (committed = accepted "
        "+ 1, the target's bonus token)"
        + (
            f"; DDTree-{budget}: the slots on the tree's longest accepted path, which are the target's tokens"
            if budget
            else ""
        )
        + ". Each block start in the token view "
        "names its round in its tooltip."
    )
    return int(rnd)


# ---------------------------------------------------------------------------
# why drafts fail: calibration and failure patterns of the run

SECTIONS = {  # URL value: label (&section=...): each drawn only when chosen
    "charts": "Histogram and per-depth curves",
    "curve": "accepted(p) of this prompt",
    "metrics": "All run metrics",
    "calibration": "Calibration",
    "patterns": "Failure patterns",
    "headroom": "Top-K headroom",
    "confidence": "Confidence head",
}
BLOCKS = {"headroom": headroom_block, "confidence": confidence_block}  # sections drawn by pages/heads_view.py


PATTERN_TABLES = {  # table key: (title, what it answers)
    "by_class": ("by token class", "acceptance by the class of the target token at slot 1 (position anchor+1)"),
    "by_position": ("by position in the completion", "acceptance by the anchor's position p - P in the completion"),
    "by_context": ("by context length", "acceptance by the anchor p: the drafter sees the p tokens before it"),
    "context_position": (
        "against context position",
        "per bin of anchor positions p (1,000 a bin for long traces), pooled over prompts: samples and mean "
        "accepted(p)+1 over every anchor, rounds and tau = committed / rounds of the chain walk",
    ),
    "rejection_pairs": ("most frequent rejections", "(draft, target) pairs at the first rejected slot of a round"),
    "worst_spans": ("worst spans", "windows of consecutive anchors with the lowest mean accepted(p), all prompts"),
}


def context_limits(run: Run) -> list[tuple[int, str]]:
    """Where a run's drafter sees its context differently (drafters.context_limits of its stored config); none
    when that config no longer parses."""
    from dflash_dash import drafters

    try:
        return drafters.context_limits(run.config or {})
    except drafters.CheckpointError:
        return []


def patterns_block(ws: str, run: Run) -> None:
    st.subheader("Failure patterns")
    st.caption(
        "Where and on what the drafter fails, over the chain-walk rounds. P(d_1 accepted) = share of "
        "rounds whose first draft is accepted; tau = committed / rounds of the group. Token classes come "
        "from the decoded token text (Python keywords for keyword; a quote makes a string token)."
    )
    pat = reads.analysis(ws, run.id, "patterns")
    if not pat["decoded_tokens"]:
        st.caption("The target folder has no tokenizer: tokens are shown as ⟨id⟩ and every class is `other`.")

    def table(key: str, col=None) -> None:
        col = col or st.container()
        title, what = PATTERN_TABLES[key]
        col.markdown(f"**{title}** · {what}")
        cfg = {"link": st.column_config.LinkColumn("token view", display_text="open")} if key == "worst_spans" else None
        rows = pattern_rows(key, pat[key])  # token cells with their whitespace visible
        col.dataframe(
            rows, hide_index=True, placeholder=DASH, width="stretch", column_config=widgets.numbers(rows, **(cfg or {}))
        )
        with col:
            widgets.download(f"{title} (CSV)", pat[key], f"{run.id}-{key}.csv", f"acc_dl_{key}")

    c1, c2 = st.columns(2)
    c1.plotly_chart(class_fig(pat["by_class"]), width="stretch")
    table("by_class", c2)
    c1, c2 = st.columns(2)
    c1.plotly_chart(
        binned_fig(
            pat["by_position"],
            "completion_position",
            "acceptance by position in the completion",
            "anchor position p - P (bin)",
        ),
        width="stretch",
    )
    c2.plotly_chart(
        binned_fig(pat["by_context"], "context_length", "acceptance by context length", "context length p (bin)"),
        width="stretch",
    )
    c1, c2 = st.columns(2)
    table("by_position", c1)
    table("by_context", c2)
    c1, c2 = st.columns(2)
    limits = context_limits(run)
    c1.plotly_chart(context_position_fig(pat["context_position"], limits), width="stretch")
    c1.caption(
        "Long traces: does acceptance fall as the context grows? x: the bin's first anchor position in thousands; "
        "solid: mean accepted(p)+1 over every anchor of the bin (a chain-only run: the anchors its walks visited); "
        "dotted: the chain walk's tau over the rounds anchored in the bin; bars: samples per bin; dashed, where the "
        "traces reach them: the positions past which the drafter's config changes how it sees its context ("
        + ("; ".join(label for _, label in limits) or "none in its config")
        + ")"
    )
    table("context_position", c2)
    table("rejection_pairs")
    table("worst_spans")
    st.caption(
        f"The last {pat['worst_spans_end_cut']} positions of each completion are left out of the worst spans: "
        "fewer than a block of tokens follows them, so the text's end, not the drafter, caps their acceptance."
    )
    if run.summary.get("anchors") == "chain":
        st.caption(
            "A chain-only run knows accepted(p) only at the anchors its walks visited: a span's mean is over "
            "those (column `anchors`); replay with every anchor for the full picture."
        )
    if pat["worst_spans"]:
        with st.expander("open a worst span in the token view"):
            for i, sp in enumerate(pat["worst_spans"], 1):
                st.markdown(
                    f"{i}. `{sp['prompt']}` positions {sp['start']}–{sp['end']} · mean accepted(p) "
                    f"{sp['mean_accepted']:.2f} · [open in the token view]({sp['link']})"
                )


def link_span(pid: str) -> tuple[int, int] | None:
    """The `pos=START-END` of a worst-span link, for the prompt the link opened (dropped once another prompt is
    chosen)."""
    raw = st.query_params.get("pos")
    if not raw:
        st.session_state.pop("_acc_pos", None)
        return None
    owner = st.session_state.get("_acc_pos")
    if owner is None or owner[0] != raw:
        st.session_state["_acc_pos"] = owner = (raw, pid)
    if owner[1] != pid:
        del st.query_params["pos"]
        st.session_state.pop("_acc_pos", None)
        return None
    a, sep, b = raw.partition("-")
    if not (a.isdigit() and b.isdigit() and sep):
        st.warning(f"The link's pos={raw!r} is not START-END (token positions); nothing is outlined.")
        return None
    return int(a), int(b)


def main() -> None:
    ws = reads.workspace()
    stamp = reads.stamp()
    st.title("Acceptance")
    runs = reads.runs(ws, stamp)
    exs = reads.extractions(ws, stamp)
    if not runs:
        st.info(
            "No replay runs in this workspace yet. Fetch completions (**Completions**), extract hidden "
            "states (**Extraction**), then replay a checkpoint below or with "
            "`python -m dflash_dash replay --drafter CKPT`."
        )
        jobs_view.replay_form(exs, None)
        return
    by_id = {r.id: r for r in runs}
    default, basis = healthiest_run(runs)  # the healthiest run on the extraction that matches serving
    rid = params.select_run("run (checkpoint · family · backend · id)", runs, "run", "acc_run", default=default)
    if rid == default:
        st.caption(DEFAULT_RUN_NOTES[basis])
    run = by_id[rid]
    s = run.summary
    st.caption(
        f"**{family(run)}** checkpoint `{run.checkpoint}` · extraction `{run.extraction_id}` "
        f"(backend **{run.backend}**) · completions `{run.set_name}` "
        f"({reads.set_sampling(ws, run.set_name, stamp)}) · {s.get('block_size', 1) - 1} drafts "
        "per step" + sliding_note(run.sliding_block)
    )
    widgets.backend_note(run.backend)
    baseline_view.beside(runs, run)
    widgets.streamed_note(next((e for e in exs if e.id == run.extraction_id), None))
    rows = reads.prompt_rows(ws, rid)  # per-prompt numbers only: no page loads every token of every prompt
    full = reads.summary(ws, run)
    summary_block(full, list(rows.values()), rid)
    expected_view.shown(full)  # a run at a temperature: tau_expected, its bound, rule and formula
    speed_view.shown(ws, run)  # predicted speedup on a measured cost table; what to serve
    live_block(ws, run, rows)  # the live loop's measured acceptance and tokens/s beside the estimate, when run

    st.subheader("Per prompt")
    comps = reads.completions(ws, run.set_name, stamp)
    table = prompt_table(list(rows.values()), comps, run.tree_budget)
    st.caption(
        "sorted by tau, lowest first; tau = committed / rounds; outlier = low / high outside Tukey's fences "
        "of per-prompt tau; chain_tau_at_budget = tau of the chain verifying as many drafts as the tree "
        "(block N+1); select a row (or the prompt below) to open its token view"
    )
    cfg = {c: st.column_config.NumberColumn(c, format="%.2f") for c in TAU_COLUMNS}
    ev = st.dataframe(
        table,
        hide_index=True,
        placeholder=DASH,
        width="stretch",
        on_select="rerun",
        selection_mode="single-row",
        key="acc_table",
        column_config=cfg | {"outlier": st.column_config.TextColumn("outlier", help=metrics.TUKEY_RULE)},
    )
    order = [t["prompt"] for t in table]
    picked = ev.selection.rows if ev is not None and hasattr(ev, "selection") else []
    if picked:
        pid = order[picked[0]]
        if st.session_state.get("_acc_table_last") != pid:
            st.session_state["_acc_table_last"] = pid
            params.set_param("acc_prompt", "prompt", pid)
    pid = params.select_param("prompt", order, "prompt", "acc_prompt")
    if pid not in comps:
        st.error(f"prompt {pid!r} has no completion in set {run.set_name!r} any more; re-import it.")
    else:
        st.subheader(f"Token view · {pid}")
        token_view(
            ws, run, reads.run_prompt(ws, rid, pid), reads.completion(ws, run.set_name, pid, stamp), link_span(pid)
        )
    st.subheader("More on this run")
    section = params.section_param(
        "its charts, every metric, calibration, failure patterns, top-K headroom or confidence head (drawn when "
        "chosen)",
        SECTIONS,
        "section",
        "acc_section",
    )
    draw = {
        "charts": lambda: charts_block(full),
        "curve": lambda: curve_block(ws, run, pid) if pid in comps else st.info("No completion for this prompt."),
        "metrics": lambda: metrics_block(full),
        "calibration": lambda: calibration_block(ws, run),
        "patterns": lambda: patterns_block(ws, run),
    }
    if section:
        with guard():  # a failing analysis does not hide the rest of the page
            draw.get(section, lambda: BLOCKS[section](ws, run))()
    jobs_view.replay_form(exs, run.extraction_id)


with guard():
    main()
