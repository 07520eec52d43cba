"""The pages' reads: the workspace, its store, and cached store reads.

Contract: store rows come back typed (`Run`, `Extraction`, `Completion`, ...: store.rows), reads go through
`st.cache_data` keyed on the workspace path and `Store.stamp()` (changes when data is added; `engine_stamp` for
engine stats), objects through `st.cache_resource`; a read that changes no stamp (a kept value, what an engine
served) is read each time. Whole-run analyses come from pipeline.analysis (computed once, kept in the store). No
widgets here.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import streamlit as st

from dflash_dash import metrics
from dflash_dash.analysis.attribution import attribution_rows
from dflash_dash.store import Completion, CompletionEntry, Extraction, PromptSet, Run, Store, default_workspace
from dflash_dash.vocab import Vocab, load_vocab


def workspace() -> str:
    """`--workspace W` after `--` on the streamlit command line, else $DFLASH_WORKSPACE, else cache/."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--workspace")
    a, _ = p.parse_known_args(sys.argv[1:])
    return str(Path(a.workspace or os.environ.get("DFLASH_WORKSPACE") or default_workspace()).resolve())


@st.cache_resource
def store_at(ws: str) -> Store:
    """The store of workspace `ws`, opened once per server process."""
    return Store(ws)


def store() -> Store:
    return store_at(workspace())


def stamp() -> str:
    return store().stamp()


@st.cache_data(max_entries=32, show_spinner=False)
def runs(ws: str, stamp: str) -> list[Run]:
    return store_at(ws).runs()


@st.cache_data(max_entries=32, show_spinner=False)
def extractions(ws: str, stamp: str) -> list[Extraction]:
    return store_at(ws).extractions()


@st.cache_data(max_entries=32, show_spinner=False)
def sets(ws: str, stamp: str) -> list[PromptSet]:
    return store_at(ws).sets()


@st.cache_data(max_entries=32, show_spinner=False)
def set_sampling(ws: str, set_name: str, stamp: str) -> str:
    """How the set was sampled, in words ("greedy", "sampled at T=0.7, top-p 0.95, seed 1"): pipeline.set_sampling."""
    from dflash_dash import pipeline

    return pipeline.set_sampling(store_at(ws), set_name)


@st.cache_data(max_entries=32, show_spinner=False)
def completions(ws: str, set_name: str, stamp: str) -> dict[str, CompletionEntry]:
    """The set's completions for listings and selectors: text previews and token counts, no token ids."""
    return {c.prompt_id: c for c in store_at(ws).completion_index(set_name)}


@st.cache_data(max_entries=64, show_spinner=False)
def completion(ws: str, set_name: str, prompt_id: str, stamp: str) -> Completion | None:
    """One completion whole (text and token ids)."""
    return store_at(ws).completion(set_name, prompt_id)


@st.cache_data(max_entries=4, show_spinner=False)
def all_completions(ws: str, set_name: str, stamp: str) -> dict[str, Completion]:
    """Every completion of the set whole; only for analyses that need every token (Conformance)."""
    return {c.prompt_id: c for c in store_at(ws).completions(set_name)}


def analysis(ws: str, run_id: str, name: str):
    """A whole-run analysis of a finished run (pipeline.analysis: computed once, kept in the store)."""
    return _analysis(ws, run_id, name)


@st.cache_data(max_entries=64, show_spinner="analysing the run (once; kept in the workspace)")
def _analysis(ws: str, run_id: str, name: str):
    from dflash_dash import pipeline  # on first use: the pages that never analyse never load it

    return pipeline.analysis(store_at(ws), run_id, name)


def prompt_rows(ws: str, run_id: str) -> dict[str, dict]:
    """A finished run's per-prompt numbers (metrics.prompt_rows, no token arrays), by prompt id."""
    return {r["prompt_id"]: r for r in analysis(ws, run_id, "prompts")}


@st.cache_data(max_entries=64, show_spinner=False)
def run_prompt(ws: str, run_id: str, prompt_id: str) -> dict | None:
    """One prompt's whole run_prompts row (every array); a run never changes, so keyed on the ids only."""
    return store_at(ws).run_prompt(run_id, prompt_id)


@st.cache_data(max_entries=4, show_spinner=False)
def all_prompts(ws: str, run_id: str) -> dict[str, dict]:
    """Every prompt's whole row; only for analyses that need every token (Conformance, old summaries)."""
    return {r["prompt_id"]: r for r in store_at(ws).run_prompts(run_id)}


def summary(ws: str, run: Run) -> dict:
    """The run's summary with every registry metric (metrics.complete: a run summarised before a metric existed
    gets it from its rows, read only then)."""
    s = run.summary
    if all(m.key in s for m in metrics.REGISTRY):
        return s
    return metrics.complete(s, store_at(ws).prompts(run.id))


@st.cache_resource(max_entries=8, show_spinner="loading the tokenizer")
def vocab(target_path: str) -> Vocab:
    return load_vocab(target_path)


@st.cache_data(max_entries=32, show_spinner=False)
def attributions(ws: str, run_id: str, stamp: str) -> list[dict]:
    """The run's target-layer attribution as attribution_rows ([] before one)."""
    return attribution_rows(store_at(ws).attributions(run_id))


def engine_stamp() -> str:
    """Changes when engine stats are added (an import adds no completion, so `stamp` would not see it)."""
    return store().engine_stamp()


@st.cache_data(max_entries=32, show_spinner=False)
def engines(ws: str, set_name: str, stamp: str) -> list[str]:
    return store_at(ws).engines(set_name)


def kept(ws: str, run_id: str, name: str):
    """A value kept for a run by a CLI or job operation (e.g. the fault ranking), read each time: a new ranking
    changes no stamp, and the read is one small row."""
    return store_at(ws).analysis(run_id, name)


@st.cache_data(max_entries=32, show_spinner=False)
def engine_stats(ws: str, set_name: str, engine: str, stamp: str) -> list[dict]:
    return store_at(ws).engine_stats(set_name, engine)


def served(ws: str, set_name: str, engine: str) -> dict | None:
    """What `engine` said it served when set `set_name` was fetched (Store.served; None: nothing recorded), read
    each time (one small row)."""
    return store_at(ws).served(set_name, engine)


def replayed(ws: str, run: Run) -> dict:
    """The identity of the drafter run `run` replayed (pipeline.served.replayed: kept with the run, computed once
    from its checkpoint otherwise)."""
    from dflash_dash.pipeline import served as served_mod

    return served_mod.replayed(store_at(ws), run)


def parity(ws: str, a: str, b: str) -> dict | None:
    """The numbers of the newest finished backend-parity job of extraction `a` against `b` (parity.run's result;
    None before one), read each time: a job's end changes no stamp, and the jobs are few."""
    for j in store_at(ws).jobs(status="done"):  # newest first
        if j.kind == "parity" and j.args.get("a") == a and j.args.get("b") == b and j.result:
            return dict(j.result)
    return None
