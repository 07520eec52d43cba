"""Compare: two checkpoints on the same extraction (per-prompt tau scatter, overlaid per-depth curves and
histograms, overlaid calibration (reliability diagrams, ECE, expected vs observed tau), aligned token views with
differences highlighted, configs side by side), and the training
sweep (tau against step for the checkpoints of a training folder). URL: compare?a=ID&b=ID&prompt=PID&sweep=DIR."""
from __future__ import annotations

import streamlit as st

from dflash_dash import metrics, views
from pages import common

common.routed()


def metrics_table(a: dict, b: dict) -> list[dict]:
    out = []
    for m in metrics.HEADLINE:
        va, vb = a["summary"].get(m.key), b["summary"].get(m.key)
        out.append({"metric": metrics.label(m.key, a["summary"]), "A": views.fmt(va), "B": views.fmt(vb),
                    "B − A": views.fmt(vb - va) if va is not None and vb is not None else "—", "formula": m.formula})
    return out


def token_views(ws: str, stamp: str, a: dict, b: dict, ra: dict, rb: dict) -> None:
    comps = common.completions(ws, a["set_name"], stamp)
    shared = [p for p in ra if p in rb and p in comps]
    if not shared:
        st.info("The two runs share no prompt.")
        return
    order = sorted(shared, key=lambda p: abs((ra[p]["tau"] or 0) - (rb[p]["tau"] or 0)), reverse=True)
    pid = common.select_param("prompt (largest tau difference first)", order, "prompt", "cmp_prompt",
                              format_func=lambda p: f"{p} · A {views.fmt(ra[p]['tau'])} · B {views.fmt(rb[p]['tau'])}")
    ex = {e["id"]: e for e in common.extractions(ws, stamp)}
    target = (ex.get(a["extraction_id"]) or {}).get("target_path")
    vocab = common.vocab(target) if target else views.Vocab()
    ta = views.trace(ra[pid], comps[pid], a["summary"]["block_size"])
    tb = views.trace(rb[pid], comps[pid], b["summary"]["block_size"])
    diff = views.differing(ta, tb)
    st.caption(f"{len(diff)} of {len(ta.role)} completion positions differ (role, depth, block start or rejected "
               "draft), outlined in both views")
    st.html(views.legend_html(a["summary"]["block_size"], compare=True))
    ca, cb = st.columns(2)
    with ca:
        st.markdown(f"**A** · {a['name']} · tau {views.fmt(ra[pid]['tau'])}")
        st.html(views.token_html(ta, vocab, a["summary"]["block_size"], diff=diff))
    with cb:
        st.markdown(f"**B** · {b['name']} · tau {views.fmt(rb[pid]['tau'])}")
        st.html(views.token_html(tb, vocab, b["summary"]["block_size"], diff=diff))


def calibration_block(ws: str, a: dict, b: dict) -> None:
    """Calibration of A and B overlaid: ECE and expected vs observed tau, reliability diagrams, per-depth curves."""
    st.subheader("Calibration, A and B")
    cals = {f"{side} {r['name']}": common.calibration(ws, r["id"], r["summary"]["block_size"], r["tree_budget"])
            for side, r in (("A", a), ("B", b))}
    for name, cal in cals.items():
        if not cal["recorded"]:
            st.info(f"{name}: draft probabilities not recorded, replay again (the run predates them).")
    cals = {n: c for n, c in cals.items() if c["recorded"]}
    if not cals:
        return
    st.dataframe([{"metric": label, **{n: views.fmt(c[key]) for n, c in cals.items()}, "formula": formula}
                  for key, label, formula in (
                      ("calibration_ece", "calibration ECE (pooled over depths)",
                       metrics.BY_KEY["calibration_ece"].formula),
                      ("expected_tau", "expected tau (macro)", metrics.BY_KEY["expected_tau"].formula),
                      ("tau_macro", "observed tau (macro)", metrics.BY_KEY["tau_macro"].formula),
                      ("expected_tau_pooled", "expected tau (pooled)", metrics.BY_KEY["expected_tau_pooled"].formula),
                      ("tau_pooled", "observed tau (pooled)", metrics.BY_KEY["tau_pooled"].formula))],
                 hide_index=True, width="stretch")
    B = max(r["summary"]["block_size"] for r in (a, b))
    opts = ["pooled over depths"] + [f"depth {k}" for k in range(1, B)]
    v = st.selectbox("reliability diagram: depth", opts, key="cmp_cal_depth")
    depth = "pooled" if v == opts[0] else int(v.split()[1])
    c1, c2 = st.columns(2)
    c1.plotly_chart(views.reliability_fig({n: c["reliability"] for n, c in cals.items()}, depth), width="stretch")
    c2.plotly_chart(views.confidence_fig({n: c["by_depth"] for n, c in cals.items()}), width="stretch")
    with c1:
        common.download("reliability bins, both runs (CSV)",
                        [{"run": n, **r} for n, c in cals.items() for r in c["reliability"]],
                        "compare-reliability.csv", "cmp_dl_rel")
    with c2:
        common.download("per-depth calibration, both runs (CSV)",
                        [{"run": n, **r} for n, c in cals.items() for r in c["by_depth"]],
                        "compare-calibration-depth.csv", "cmp_dl_depth")


def config_block(a: dict, b: dict) -> None:
    st.subheader("Configs side by side")
    rows = views.config_diff(a["config"], b["config"])
    n = sum(1 for r in rows if r["differs"])
    st.caption(f"{n} {'key differs' if n == 1 else 'keys differ'} (marked ≠, listed first)")

    def mark(row):
        return ["background-color:#ffe0e0" if row["differs"] else "" for _ in row]
    import pandas as pd
    st.dataframe(pd.DataFrame(rows).style.apply(mark, axis=1), hide_index=True, width="stretch")


def sweep_block(ws: str, stamp: str, runs: list[dict]) -> None:
    st.header("Training sweep")
    st.caption("Point at a training output folder (epoch_E_step_S/, SpecForge runtime {run_id}-step{N}/, "
               "checkpoint-N/ folders): every checkpoint in it is replayed on one extraction, as one job, in step "
               "order ({run_id}-latest/-best links count once); tau is plotted against step.")
    exs = [e for e in common.extractions(ws, stamp) if e["status"] == "done"]
    folder = st.text_input("training output folder", value=st.query_params.get("sweep", ""), key="sweep_folder")
    if folder.strip():
        st.query_params["sweep"] = folder.strip()
    if exs:
        ids = [e["id"] for e in exs]
        by = {e["id"]: e for e in exs}
        ex = st.selectbox("extraction", ids, index=len(ids) - 1, key="sweep_ex",
                          format_func=lambda i: f"{i} · {by[i]['backend']} · {by[i]['set_name']}")
        how = common.checkpoint_inputs("sweep")
        if st.button("Start sweep", type="primary", disabled=not folder.strip()):
            common.backend_note(by[ex]["backend"], f"Extraction {ex}")
            common.start_job("sweep", {"checkpoints": folder.strip(), "extraction": ex, **how})
    else:
        st.info("No finished extraction: extract hidden states on the **Extraction** page first.")
    common.job_panel(("sweep",), key="sweep")
    if folder.strip():
        pts = views.sweep_points(runs, folder.strip(), ex if exs else None)
        if not pts:
            st.info("No run of a checkpoint inside this folder yet: start the sweep.")
            return
        st.plotly_chart(views.sweep_fig(pts), width="stretch")
        st.caption("tau (macro): mean over prompts of committed/rounds; tau (pooled): all committed / all rounds; "
                   "DDTree tau: the same with tree drafting")
        for p in pts:
            st.markdown(f"step {p['step'] if p['step'] is not None else '?'} · `{p['name']}`"
                        f"{views.sliding_note(p['sliding_block'])} · tau {views.fmt(p['tau_macro'])} / pooled "
                        f"{views.fmt(p['tau_pooled'])} / DDTree {views.fmt(p['ddtree_tau'])} · "
                        f"[open in Acceptance](acceptance?run={p['run']})")


def main() -> None:
    ws = common.workspace()
    stamp = common.stamp()
    st.title("Compare")
    runs = common.runs(ws, stamp)
    if len(runs) < 2:
        st.info("Compare needs two replay runs: replay two checkpoints on the same extraction (Acceptance page, "
                "**Replay**, or a training sweep below).")
    else:
        by_id = {r["id"]: r for r in runs}
        ids = [r["id"] for r in reversed(runs)]
        c1, c2 = st.columns(2)
        with c1:
            a_id = common.select_param("A", ids, "a", "cmp_a", default=ids[1], format_func=common.run_label(by_id))
        with c2:
            b_id = common.select_param("B", ids, "b", "cmp_b", default=ids[0], format_func=common.run_label(by_id))
        a, b = by_id[a_id], by_id[b_id]
        st.caption(f"A: `{a['checkpoint']}` on `{a['extraction_id']}` (backend **{a['backend']}**)  \n"
                   f"B: `{b['checkpoint']}` on `{b['extraction_id']}` (backend **{b['backend']}**)")
        common.backend_note(a["backend"], "Run A")
        if b["backend"] != a["backend"]:
            common.backend_note(b["backend"], "Run B")
        if a["extraction_id"] != b["extraction_id"]:
            st.warning(f"A and B are on different extractions ({a['extraction_id']} vs {b['extraction_id']}): "
                       "differences may come from the hidden states, not the checkpoints. Replay both on one "
                       "extraction for a clean comparison.")
        if a["set_name"] != b["set_name"]:
            st.error("A and B are on different completion sets; per-prompt comparisons need the same set.")
        else:
            st.dataframe(metrics_table(a, b), hide_index=True, width="stretch")
            ra, rb = common.run_prompts(ws, a_id), common.run_prompts(ws, b_id)
            st.plotly_chart(views.scatter_fig({p: r["tau"] for p, r in ra.items()},
                                              {p: r["tau"] for p, r in rb.items()}, a["name"], b["name"]),
                            width="stretch")
            sa, sb = {f"A {a['name']}": a["summary"]}, {f"B {b['name']}": b["summary"]}
            c1, c2 = st.columns(2)
            c1.plotly_chart(views.depth_fig(sa | sb), width="stretch")
            c2.plotly_chart(views.hist_fig(sa | sb), width="stretch")
            with common.guard():
                calibration_block(ws, a, b)
            st.subheader("Token views, aligned")
            token_views(ws, stamp, a, b, ra, rb)
        config_block(a, b)
    sweep_block(ws, stamp, runs)


with common.guard():
    main()
