"""Diagnostics section "Trainer reports": the same checkpoint's tau on a trainer's own features (replay --features),
on this product's extractions and on real generations side by side; SpecForge's imported evaluation beside this
product's per-position numbers, each difference explained; the run exported in SpecForge's and AIPerf's shapes.
A helper of pages/diagnostics.py, not a page (no torch, no SQL)."""

from __future__ import annotations

import json

import streamlit as st

from dflash_dash.analysis.trainers import sources
from dflash_dash.pipeline import trainers
from dflash_dash.render.labels import run_label
from dflash_dash.render.missing import DASH
from dflash_dash.render.trainers import beside_rows, source_rows
from pages import params, reads
from pages.guard import guard


def trainers_block(ws: str, stamp: str) -> None:
    st.header("Trainer reports")
    st.caption(
        "A checkpoint replayed teacher-forced on the trainer's own feature cache (CLI: `replay --features DIR "
        "--target T --drafter CKPT`) beside its runs on this product's extractions of real generations: the gap "
        "between them is the diagnosis (features: audit the cache; labels: the trainer's recorded answers against "
        "the target's own greedy output). tau = committed / rounds (macro over prompts); every-anchor tau = mean "
        "over completion anchors of accepted(p) + 1."
    )
    runs, store = reads.runs(ws, stamp), reads.store_at(ws)
    rows = sources(runs, reads.extractions(ws, stamp))
    if rows:
        st.dataframe(source_rows(rows), hide_index=True, placeholder=DASH, width="stretch")
    else:
        st.info("No run on a trainer's cache yet: replay a checkpoint with `replay --features DIR` (CLI).")
    if not runs:
        return
    by_id = {r.id: r for r in runs}
    run = params.select_param("run", [r.id for r in reversed(runs)], "tr_run", "tr_run", format_func=run_label(by_id))
    st.subheader("SpecForge's evaluation beside this run")
    st.caption(
        "Per draft position j: marginal accuracy = slot j's draft equals the label (over blocks where slot j is "
        "supervised); conditional acceptance = accepted / reached prefixes; prefix survival = blocks accepted "
        "through j / all blocks; accepted length = 1 + Σ survival. This product's numbers take a block at every "
        "completion anchor of the run (exported in SpecForge's report shape below)."
    )
    got = trainers.beside(store, run)
    if got is None:
        st.info("No SpecForge evaluation imported for this run: give its evaluate-checkpoint JSON below.")
    else:
        imp = got["imported"]
        named = f"checkpoint `{imp['checkpoint']}`" if imp.get("checkpoint") else "no checkpoint named"
        same = "the same checkpoint" if imp.get("same_checkpoint") else named
        st.caption(f"Imported `{imp['file']}` ({imp['examples']} examples, {same}) on {imp['imported']}.")
        st.dataframe(beside_rows(got["rows"]), hide_index=True, placeholder=DASH, width="stretch")
    with st.form("tr_import"):
        file = st.text_input("SpecForge evaluation file", key="tr_file", placeholder="/path/to/eval.json")
        go = st.form_submit_button("Import")
    if go:
        with guard({"file": "SpecForge evaluation file"}):
            trainers.import_specforge(store, file.strip(), run)
            st.rerun()
    c1, c2 = st.columns(2)
    with c1, guard():
        st.download_button(
            "SpecForge report (JSON)",
            json.dumps(trainers.specforge_export(store, run), indent=1),
            file_name=f"{run}-specforge.json",
            key="tr_sf",
        )
    with c2, guard():
        lines = "".join(json.dumps(r) + "\n" for r in trainers.aiperf_export(store, run))
        st.download_button("AIPerf records (JSONL)", lines, file_name=f"{run}-aiperf.jsonl", key="tr_ai")
