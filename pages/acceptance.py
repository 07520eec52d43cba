"""Acceptance: one checkpoint on one extraction. Summary metrics with their formulas, histogram and
per-depth curves, the per-prompt table and the token-by-token view of one prompt; a Replay button
evaluates another checkpoint as a job. URL: acceptance?run=ID&prompt=PID."""
from __future__ import annotations

import streamlit as st

from dflash_dash import metrics, views
from pages import common

common.routed()


def replay_form(extractions: list[dict], default_ex: str | None, default_ck: str = "") -> None:
    st.subheader("Replay another checkpoint")
    done = [e for e in extractions if e["status"] == "done"]
    if not done:
        st.info("No finished extraction to replay on: extract hidden states first on the **Extraction** page "
                "(or `python -m dflash_dash extract ...`).")
        return
    ids = [e["id"] for e in done]
    by_id = {e["id"]: e for e in done}
    with st.form("replay"):
        ck = st.text_input("checkpoint folder (config.json + *.safetensors, or a SpecForge {run_id}-step{N}/ "
                           "folder)", value=default_ck, placeholder="/path/to/epoch_0_step_1000")
        how = common.checkpoint_inputs("replay")
        c1, c2, c3, c4 = st.columns(4)
        ex = c1.selectbox("extraction", ids, index=ids.index(default_ex) if default_ex in ids else len(ids) - 1,
                          format_func=lambda i: f"{i} · {by_id[i]['backend']} · {by_id[i]['set_name']}")
        budget = c2.number_input("DDTree budget", 0, 256, 8)
        device = c3.text_input("device", "cpu")
        dtype = c4.selectbox("dtype", ["float32", "bfloat16"])
        go = st.form_submit_button("Replay", type="primary")
    if go:
        if not ck.strip():
            st.error("Give the checkpoint folder to replay (a folder with config.json and *.safetensors, or a "
                     "SpecForge runtime folder with training_state.pt).")
        else:
            common.backend_note(by_id[ex]["backend"], f"Extraction {ex}")
            common.start_job("replay", {"drafter": ck.strip(), "extraction": ex, "tree_budget": int(budget),
                                        "device": device.strip() or "cpu", "dtype": dtype, **how})
    common.job_panel(("replay", "sweep"), key="acc")


def summary_block(s: dict) -> None:
    cols = st.columns(4)
    for col, m in zip(cols, metrics.HEADLINE):
        col.metric(metrics.label(m.key, s), views.fmt(s.get(m.key)))
        col.caption(m.formula)
    with st.expander("all run metrics and formulas"):
        st.dataframe(views.summary_rows(s), hide_index=True, width="stretch")
    c1, c2 = st.columns(2)
    c1.plotly_chart(views.hist_fig({"run": s}), width="stretch")
    c1.caption("histogram: rounds of the chain walk by accepted drafts 0..B-1")
    c2.plotly_chart(views.depth_fig({"run": s}), width="stretch")
    c2.caption("conditional P(d_k accepted | d_1..d_{k-1} accepted); marginal P(d_1..d_k all accepted); "
               "over the rounds of the trace")


def token_view(ws: str, run: dict, row: dict, comp: dict) -> None:
    B = run["summary"]["block_size"]
    ex = common.extractions(ws, common.stamp())
    target = next((e["target_path"] for e in ex if e["id"] == run["extraction_id"]), None)
    vocab = common.vocab(target) if target else views.Vocab()
    tr = views.trace(row, comp, B)
    c = st.columns(5)
    c[0].metric("tau (this prompt)", views.fmt(row["tau"]))
    c[0].caption("committed / rounds")
    c[1].metric("rounds", len(tr.rounds))
    c[2].metric("completion tokens", len(row["accepted_at"]))
    c[3].metric(f"DDTree-{run['tree_budget']} tau (this prompt)", views.fmt(row["tree_tau"]))
    c[3].caption("committed / rounds of the tree walk")
    c[4].metric("rejections", sum(r is not None for r in tr.rejected))
    with st.expander("prompt"):
        st.html(views.text_html(comp.get("prompt") or ""))
    t1, t2 = st.columns(2)
    sup = t1.toggle("depth superscripts", value=True)
    inline = t2.toggle("rejected drafts inline", value=True)
    st.html(views.legend_html(B))
    if vocab.tok is None:
        st.caption("The target folder has no tokenizer: tokens are shown as ⟨id⟩.")
    st.html(views.token_html(tr, vocab, B, superscript=sup, inline_rejects=inline))
    st.plotly_chart(views.accept_curve(tr, row, B), width="stretch")
    st.caption("accepted(p): leading drafts of the block at anchor p equal to the completion; "
               "markers: anchors the chain walk actually visits")


def main() -> None:
    ws = common.workspace()
    stamp = common.stamp()
    st.title("Acceptance")
    runs = common.runs(ws, stamp)
    exs = common.extractions(ws, stamp)
    if not runs:
        st.info("No replay runs in this workspace yet. Fetch completions (**Completions**), extract hidden "
                "states (**Extraction**), then replay a checkpoint below or with "
                "`python -m dflash_dash replay --drafter CKPT`.")
        replay_form(exs, None)
        return
    by_id = {r["id"]: r for r in runs}
    ids = [r["id"] for r in reversed(runs)]  # newest first
    rid = common.select_param("run (checkpoint · backend · id)", ids, "run", "acc_run", format_func=common.run_label(by_id))
    run = by_id[rid]
    s = run["summary"]
    st.caption(f"checkpoint `{run['checkpoint']}` · extraction `{run['extraction_id']}` (backend "
               f"**{run['backend']}**) · completions `{run['set_name']}` · block size {s.get('block_size')}"
               + views.sliding_note(run.get("sliding_block")))
    common.backend_note(run["backend"])
    summary_block(s)

    st.subheader("Per prompt")
    rows = common.run_prompts(ws, rid)
    comps = common.completions(ws, run["set_name"], stamp)
    table = views.prompt_table(list(rows.values()), comps)
    st.caption("sorted by tau, lowest first; select a row (or the prompt below) to open its token view")
    ev = st.dataframe(table, hide_index=True, width="stretch", on_select="rerun", selection_mode="single-row",
                      key="acc_table")
    order = [t["prompt"] for t in table]
    picked = ev.selection.rows if ev is not None and hasattr(ev, "selection") else []
    if picked:
        pid = order[picked[0]]
        if st.session_state.get("_acc_table_last") != pid:
            st.session_state["_acc_table_last"] = pid
            common.set_param("acc_prompt", "prompt", pid)
    pid = common.select_param("prompt", order, "prompt", "acc_prompt")
    if pid not in comps:
        st.error(f"prompt {pid!r} has no completion in set {run['set_name']!r} any more; re-import it.")
    else:
        st.subheader(f"Token view · {pid}")
        token_view(ws, run, rows[pid], comps[pid])
    replay_form(exs, run["extraction_id"])


with common.guard():
    main()
