"""Diagnostics: backend parity (fla vs torch extractions of the same completions: per layer relative L2
and cosine, and tau of the runs on each), checkpoint-vs-extraction consistency, sliding-layer train/serve
semantics (the same checkpoint replayed causal and bidirectional inside the block), target-layer attribution (tau
lost per target tap), training-bug signatures (a run against a healthy reference run), server health: one at a time,
drawn when chosen in the page's section picker (a link naming a check's own parameters opens that check).
Torch-free: configs are read by drafters (config only) and target_info; the backend parity is computed by a job
(ops.Parity: dflash_dash/parity.py in the job process) and drawn from its result.
URL: diagnostics?section=parity|consistency|sliding|attribution|signatures|server&a=EXTRACTION&b=EXTRACTION
(parity)&ckpt=PATH&ex=EXTRACTION (consistency)&run=RUN (attribution)&sig_run=RUN&sig_ref=RUN (signatures)."""

from __future__ import annotations

import streamlit as st

from dflash_dash import ops
from dflash_dash.analysis import signatures as sig
from dflash_dash.analysis.checks import consistency, parity_pair, sliding_checkpoints, sliding_rows
from dflash_dash.jobs import gpu
from dflash_dash.render.analysis_figures import signatures_fig
from dflash_dash.render.figures import attribution_fig, parity_fig
from dflash_dash.render.formats import fmt
from dflash_dash.render.labels import extraction_label, streamed
from dflash_dash.render.missing import DASH
from dflash_dash.render.tables import PARITY_FORMATS, gpu_table, signature_table
from pages import frame, jobs_view, params, reads, server_view, trainers_view, widgets
from pages.guard import guard

frame.routed()


def parity_block(ws: str, stamp: str) -> None:
    st.header("Backend parity")
    st.caption(
        "The same completions extracted with the fla kernels (GPU) and with the torch path (CPU). "
        "relative L2 = ‖A − B‖ / ‖B‖ over all shared tokens, per target layer; cosine = mean over tokens of "
        "cos(A_t, B_t). A drafter trained on fla states can fail silently on torch-path states."
    )
    exs = [e for e in reads.extractions(ws, stamp) if e.status == "done"]
    if len(exs) < 2:
        st.info(
            "Parity needs two finished extractions of the same completions, ideally one with backend fla "
            "(GPU) and one with backend torch (CPU): use **Re-extract** on the Extraction page with the other "
            "device."
        )
        return
    by = {e.id: e for e in exs}
    ids = [e.id for e in exs]
    runs = reads.runs(ws, stamp)
    da, db = parity_pair(exs, runs)  # the newest torch and fla extractions of one set that hold runs
    label = lambda i: f"{i} · {by[i].backend} · {by[i].set_name} · {by[i].device}"  # noqa: E731
    c1, c2 = st.columns(2)
    with c1:
        a = params.select_param("A (compared)", ids, "a", "par_a", default=da, format_func=label)
    with c2:
        b = params.select_param("B (reference, normally fla)", ids, "b", "par_b", default=db, format_func=label)
    if a == b:
        st.info("Choose two different extractions.")
        return
    if by[a].backend == by[b].backend:
        st.caption(
            f"Both extractions use backend {by[a].backend}: this measures run-to-run differences, not fla vs torch."
        )
    res = reads.parity(ws, a, b)  # the newest finished parity job's numbers (torch runs in the job, not here)
    if res is None:
        parity_job(a, b, [by[a], by[b]])
    else:
        st.caption(f"{res['prompts']} prompts, {res['tokens']} tokens compared")
        rows = [
            {"layer": r["layer"], "relative L2": r["rel_l2"], "cosine": r["cosine"], "max |A−B|": r["max_abs"]}
            for r in res["layers"]
        ]
        c1, c2 = st.columns([1, 1])
        c1.dataframe(
            rows,
            hide_index=True,
            placeholder=DASH,
            width="stretch",
            column_config={k: st.column_config.NumberColumn(format=f) for k, f in PARITY_FORMATS.items()},
        )
        c2.plotly_chart(parity_fig(res["layers"]), width="stretch")
    st.subheader("tau of the same checkpoints on each extraction")
    ka, kb = f"tau macro on A ({by[a].backend})", f"tau macro on B ({by[b].backend})"
    table: dict[str, dict] = {}
    for r in runs:
        if r.extraction_id in (a, b):
            row = table.setdefault(r.checkpoint, {"checkpoint": r.name, ka: None, kb: None})
            row[ka if r.extraction_id == a else kb] = r.summary.get("tau_macro")
    if table:
        taus = list(table.values())
        st.dataframe(taus, hide_index=True, placeholder=DASH, width="stretch", column_config=widgets.numbers(taus))
    else:
        st.info("No run on these extractions yet: replay a checkpoint on each (Acceptance page, **Replay**).")


def parity_job(a: str, b: str, exs: list) -> None:
    """No parity of (a, b) kept yet: the button that compares them in a job (it reads every feature file of both,
    in torch) and the parity jobs' panel, which follows it; the numbers show when it is done."""
    kept = [e.id for e in exs if streamed(e)]
    if kept:
        st.info(
            f"Extraction {', '.join(kept)} was streamed: it kept no feature file to compare. Extract its completions "
            "again (Extraction page, **Re-extract**) and compare that extraction."
        )
        return
    st.info("Not compared yet: **Compare features** reads both extractions' feature files in a job.")
    if st.button("Compare features", key="parity_go", type="primary"):
        with guard():
            jobs_view.start_job(ops.Parity(a=a, b=b))
    jobs_view.job_panel(("parity",), key="parity")


def consistency_block(ws: str, stamp: str) -> None:
    from dflash_dash import drafters, target_info

    st.header("Checkpoint vs extraction")
    exs = [e for e in reads.extractions(ws, stamp) if e.status == "done"]
    runs = reads.runs(ws, stamp)
    if not exs:
        st.info("No finished extraction yet (Extraction page).")
        return
    default_ck = st.query_params.get("ckpt") or (runs[-1].checkpoint if runs else "")
    ck = st.text_input("drafter checkpoint folder", value=default_ck, key="diag_ck")
    if ck.strip():
        st.query_params["ckpt"] = ck.strip()
    by = {e.id: e for e in exs}
    ids = [e.id for e in exs]
    with_runs = [r.extraction_id for r in runs if r.extraction_id in by]  # default: where runs were made
    ex = params.select_param(
        "extraction",
        ids,
        "ex",
        "diag_ex",
        default=(with_runs or ids)[-1],
        format_func=extraction_label(by),
    )
    if not ck.strip():
        st.info("Give a checkpoint folder to check it against the extraction and its target.")
        return
    cfg = drafters.read_config(ck.strip())
    info = target_info.describe(by[ex].target_path)
    rows = consistency(cfg, by[ex], info)
    bad = [r for r in rows if r["ok"] != "✓"]
    fatal = [r for r in bad if r["check"] != "extraction backend" and r["ok"] != "⚠"]  # ⚠: an engine's limit
    (st.error if fatal else st.warning if bad else st.success)(
        f"{len(bad)} of {len(rows)} checks fail" if bad else "checkpoint and extraction are consistent"
    )
    st.dataframe(rows, hide_index=True, placeholder=DASH, width="stretch")


def sliding_block(ws: str, stamp: str) -> None:
    st.header("Sliding layers: train/serve semantics")
    st.caption(
        "SpecForge trains sliding_attention layers causal inside the block (slot i sees block slots 0..i) "
        "and SGLang serves them that way; the z-lab HF reference keeps the block bidirectional. The same "
        "checkpoint replayed both ways: a large difference means the engine and the training disagree on "
        "what the drafter sees, and the tau you measure depends on which one you run."
    )
    runs = reads.runs(ws, stamp)
    exs = [e for e in reads.extractions(ws, stamp) if e.status == "done"]
    if not exs:
        st.info("No finished extraction yet (Extraction page).")
        return
    known = sliding_checkpoints(runs)
    ck = st.text_input(
        "drafter checkpoint with sliding_attention layers",
        value=known[0] if known else "",
        key="slide_ck",
        placeholder="/path/to/checkpoint",
    )
    by = {e.id: e for e in exs}
    ids = [e.id for e in exs]
    with_runs = [r.extraction_id for r in runs if r.checkpoint == ck.strip()]
    ex = st.selectbox(
        "extraction",
        ids,
        index=ids.index(with_runs[-1]) if with_runs else len(ids) - 1,
        key="slide_ex",
        format_func=extraction_label(by),
    )
    if not ck.strip():
        st.info("No replayed drafter with sliding layers yet: give a checkpoint folder to check it.")
        return
    rows = sliding_rows(runs, ck.strip(), ex)
    if len(rows) == 2:
        delta = (rows[0]["tau (macro)"] or 0) - (rows[1]["tau (macro)"] or 0)
        (st.warning if abs(delta) >= 0.05 else st.success)(
            f"tau (macro) causal − bidirectional = {delta:+.2f} (tau = mean over prompts of committed / rounds)"
        )
    if rows:
        st.dataframe(rows, hide_index=True, placeholder=DASH, width="stretch", column_config=widgets.numbers(rows))
    if len(rows) < 2 and st.button("Replay both ways", type="primary", key="slide_go"):
        from dflash_dash import drafters

        with guard({"drafter": "drafter checkpoint"}):  # a mistyped or damaged checkpoint: said here, no job
            op = ops.SlidingCheck(drafter=ck.strip(), extraction=ex)
            drafters.check_files(drafters.locate(op.drafter))
            drafters.read_config(op.drafter)
            jobs_view.start_job(op)
    jobs_view.job_panel(("sliding-check",), key="slide")


def attribution_block(ws: str, stamp: str) -> None:
    st.header("Target-layer attribution")
    st.caption(
        "Which target layers does the drafter rely on? Its run is replayed again (same checkpoint, config "
        "and sliding semantics; DDTree off) with one target tap at a time replaced by its mean over the "
        "extraction (tap k = features[:, k*H:(k+1)*H], averaged over every token of every prompt). "
        "tau lost = base tau − tau with that tap ablated; a tap that costs nothing carries no information the "
        "drafter uses."
    )
    runs = reads.runs(ws, stamp)
    if not runs:
        st.info("No replay run yet: replay a checkpoint first (Acceptance page, **Replay**).")
        return
    rid = params.select_run("run to attribute", runs, "run", "attr_run")
    rows = reads.attributions(ws, rid, stamp)
    if rows:
        c1, c2 = st.columns([3, 2])
        c1.plotly_chart(attribution_fig(rows), width="stretch")
        c2.dataframe(rows, hide_index=True, placeholder=DASH, width="stretch")
        c2.caption(
            f"base tau (macro) {fmt(rows[0]['base_tau_macro'])}, (pooled) "
            f"{fmt(rows[0]['base_tau_pooled'])}: the same replay without ablation"
        )
        with c2:
            widgets.download("attribution (CSV)", rows, f"{rid}-attribution.csv", "attr_dl")
    else:
        st.info(
            "This run is not attributed yet: **Attribute** replays it once per target tap (or "
            f"`python -m dflash_dash attribute --run {rid}`)."
        )
    if st.button("Attribute again" if rows else "Attribute", type="primary", key="attr_go"):
        jobs_view.start_job(ops.Attribute(run=rid))
    jobs_view.job_panel(("attribute",), key="attr")


def signatures_block(ws: str, stamp: str) -> None:
    st.header("Training-bug signatures")
    st.caption(
        "A run against a healthy reference run, on the measurements that give away the three known training bugs: "
        "noisy labels (diffusion noise on the target logits used as labels), an anchor-visible shortcut (the "
        "drafter's fc fed the anchor's own hidden state in training), a soft KL where hard cross-entropy on the "
        "target's tokens was meant. Each figure with its 95 % bootstrap interval over prompts; a signature "
        "separates when the intervals do not overlap and the difference reaches its floor. Not measured: "
        "disagreement with the target's top-1 where the target is confident (no run stores the target's "
        "probabilities)."
    )
    runs = reads.runs(ws, stamp)
    if len(runs) < 2:
        st.info("Signatures need two runs: a run to diagnose and a healthy reference (Acceptance page, **Replay**).")
        return
    by_id = {r.id: r for r in runs}
    pair = sig.default_pair(runs)
    c1, c2 = st.columns(2)
    with c1:
        rid = params.select_run("run to diagnose", runs, "sig_run", "sig_run", default=pair and pair[0])
    with c2:
        ref = params.select_run(
            "healthy reference", runs, "sig_ref", "sig_ref", default=sig.reference_for(runs, rid), skip=rid
        )
    rows = sig.compare(
        reads.analysis(ws, rid, "signatures"),
        reads.analysis(ws, ref, "signatures"),
        reads.attributions(ws, rid, stamp),
        reads.attributions(ws, ref, stamp),
    )
    tau_run, tau_ref = (by_id[i].summary.get("tau_macro") for i in (rid, ref))
    if by_id[rid].extraction_id != by_id[ref].extraction_id:
        st.warning("The two runs replay different extractions: their figures come from different completions.")
    if None not in (tau_run, tau_ref) and tau_ref < tau_run:
        st.info(
            f"The reference's tau (macro) {fmt(tau_ref)} is below this run's {fmt(tau_run)}: is it the healthy one?"
        )
    hits = sum(1 for r in rows if r["separates"])
    named = ", ".join(f"{bug} ({n})" for bug, n in sig.points_to(rows).items())
    st.markdown(
        f"**{hits} of {len(rows)} signatures separate** this run from the reference"
        + (f"; they point to: **{named}**." if named else ".")
    )
    table = signature_table(rows)
    st.dataframe(
        table,
        hide_index=True,
        placeholder=DASH,
        width="stretch",
        key="sig_table",
        column_config={"what it suggests": st.column_config.TextColumn(width="large")},
    )
    c1, c2 = st.columns([3, 2])
    c1.plotly_chart(signatures_fig(rows, "this run", "reference"), width="stretch", key="sig_fig")
    with c2:
        widgets.download("signatures (CSV)", table, f"{rid}-signatures.csv", "sig_dl")


@st.cache_data(ttl=30, show_spinner=False)
def model_info(url: str, key_env: str) -> dict:
    """GET /model_info (answers at once on a real server), cached briefly; raises ServerError."""
    return server_view.client(url, timeout=8, retries=0).model_info()


def server_block() -> None:
    from dflash_dash.engines import ServerError

    st.header("Server health")
    url = st.text_input("server URL", value=server_view.server_url(), key="diag_url").strip()

    def status() -> None:
        ok, state = server_view.health(url)  # background poller: a real /health generates a token (seconds)
        if ok is None:
            st.info(f"GET /health: checking… ({state})")
        else:
            (st.success if ok else st.warning)(f"GET /health: {'ready' if ok else 'not ready'} ({state})")
        if ok:
            try:
                info = model_info(url, server_view._key_env())
                st.markdown(f"model path: `{info.get('model_path')}`")
                st.json(info, expanded=False)
            except (ServerError, ValueError) as e:
                st.warning(str(e))

    every = server_view.HEALTH_S[server_view.health(url)[0] is not None]  # as the sidebar's badge
    st.fragment(run_every=every)(status)()
    st.subheader("GPU memory")
    try:
        gpus = gpu.gpu_memory()
    except Exception as e:  # noqa: BLE001
        st.caption(f"GPU memory unavailable: {e}")
        return
    if gpus:
        st.dataframe(gpu_table(gpus), hide_index=True, placeholder=DASH, width="stretch")
    else:
        st.caption("No GPU visible on this machine.")


def audit_block(ws: str, stamp: str) -> None:
    """Feature audit: a trainer's capture (SpecForge, DeepSpec) against this product's extraction; kept reports."""
    from dflash_dash.pipeline.audit import audits
    from dflash_dash.render.audit import audit_rows

    st.header("Feature audit")
    st.caption(
        "A trainer's feature cache (SpecForge's prepare_hidden_states.py output, a DeepSpec target cache) recomputed "
        "with this product's extraction on the same tokens (the torch path on CPU, fla on GPU): per target layer "
        "relative L2 = ‖C − R‖ / ‖R‖ and cosine against the recomputation, all-zero and non-finite rows, the layer "
        "(−2..+2) and one-token position shift that fit best, scale, dtype. An off-by-one names itself."
    )
    kept = audits(reads.store_at(ws))
    if kept:
        label = lambda i: f"{kept[i]['id']} · {'clean' if kept[i]['clean'] else 'faulty'}"  # noqa: E731
        rep = kept[st.selectbox("audit", range(len(kept)), format_func=label, key="audit_pick")]
        (st.success if rep["clean"] else st.warning)(rep["verdict"])
        rec = rep["recompute"]
        st.caption(
            f"{rep['format']} cache ({rep['strategy']}; {rep['source']}) · {rep['samples']} samples, "
            f"{rep['positions']} positions · cache dtype {rep['dtype']} · recomputed on {rec['device']} with "
            f"{rec['backend']} kernels in {rec['dtype']} · target {rep['target']}"
        )
        st.dataframe(audit_rows(rep), hide_index=True, placeholder=DASH, width="stretch")
    else:
        st.info("No feature audit yet: give a trainer's feature cache folder and its target below.")
    with st.form("audit_form"):
        features = st.text_input("feature cache folder", key="audit_features", placeholder="/path/to/hidden_states")
        target = st.text_input("target model folder", key="audit_target", placeholder="/path/to/target")
        layers = st.text_input(
            "target layer ids (SpecForge captures do not record them)", key="audit_layers", placeholder="1,16,31,46,61"
        )
        samples = st.number_input("samples", min_value=1, value=8, key="audit_samples")
        go = st.form_submit_button("Audit", type="primary")
    if go:
        labels = {"features": "feature cache folder", "target": "target model folder", "layers": "target layer ids"}
        with guard(labels):
            jobs_view.start_job(
                ops.Audit(
                    features=features.strip(),
                    target=target.strip(),
                    layers=layers.strip() or None,
                    samples=int(samples),
                )
            )
    jobs_view.job_panel(("audit",), key="audit")


SECTIONS = {  # URL value: label (&section=...): one check drawn at a time, when chosen
    "parity": "Backend parity",
    "consistency": "Checkpoint vs extraction",
    "sliding": "Sliding layers",
    "attribution": "Target-layer attribution",
    "signatures": "Training-bug signatures",
    "server": "Server health",
    "audit": "Feature audit",
    "trainers": "Trainer reports",
}
BLOCKS = {  # URL value: the block drawing it, called with (ws, stamp)
    "parity": parity_block,
    "consistency": consistency_block,
    "sliding": sliding_block,
    "attribution": attribution_block,
    "signatures": signatures_block,
    "server": lambda ws, stamp: server_block(),
    "audit": audit_block,
    "trainers": trainers_view.trainers_block,
}
LINKED = (  # a link's parameter -> the check it belongs to
    ("a", "parity"),
    ("b", "parity"),
    ("ckpt", "consistency"),
    ("ex", "consistency"),
    ("run", "attribution"),
    ("sig_run", "signatures"),
    ("sig_ref", "signatures"),
    ("tr_run", "trainers"),
)


def main() -> None:
    ws = reads.workspace()
    stamp = reads.stamp()
    st.title("Diagnostics")
    st.caption(
        "One check at a time, drawn when chosen: **backend parity** (fla against torch-path features), a "
        "**checkpoint against an extraction** (does the drafter fit the extraction and its target?), **sliding "
        "layers** replayed causal and bidirectional, **target-layer attribution** (tau lost per target tap), "
        "**training-bug signatures** (a run against a healthy reference), **server health** and GPU memory."
    )
    if not any(e.status == "done" for e in reads.extractions(ws, stamp)):
        st.info(
            "No finished extraction yet: fetch completions (**Completions**) and extract hidden states "
            "(**Extraction**); the checks compare extractions and the runs replayed on them. Server health works "
            "without them."
        )
    section = params.section_param(
        "check",
        SECTIONS,
        "section",
        "diag_section",
        default=next((sec for param, sec in LINKED if st.query_params.get(param)), None),  # a link's own params
    )
    if section:
        with guard():  # a failing check does not hide the page
            BLOCKS[section](ws, stamp)


with guard():
    main()
