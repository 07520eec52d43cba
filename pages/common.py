"""Streamlit helpers shared by app.py and the pages: routing and the app's frame (`app`, `routed`), workspace,
cached store reads, URL-synced selects, the error guard and the live job panel.

Contract: the only other file (with app.py and the pages) that imports streamlit. Reads go through `st.cache_data`
keyed on the workspace path and `Store.stamp()` (changes when data is added), objects through `st.cache_resource`.
Long work is started as a job (`dflash_dash.jobs.lifecycle`) and followed by a fragment that polls the store every
second while a job runs (`pages.jobs_view`: an idle tab polls nothing); when a job finishes the page reruns so new data
shows up. `guard()` turns every error into an `st.error`.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import traceback
from contextlib import contextmanager
from pathlib import Path

import streamlit as st

from dflash_dash import metrics
from dflash_dash.analysis.attribution import attribution_rows
from dflash_dash.errors import UserError
from dflash_dash.render import missing, tokens as token_render
from dflash_dash.render.formats import csv_text
from dflash_dash.render.tables import number_formats
from dflash_dash.store import Store, default_workspace
from dflash_dash.vocab import Vocab, load_vocab

ACTIVE = ("queued", "running")
STATUS_ICON = {
    "queued": ":material/schedule:",
    "running": ":blue[:material/autorenew:]",
    "done": ":green[:material/check_circle:]",
    "failed": ":red[:material/error:]",
    "cancelled": ":gray[:material/stop_circle:]",
}


# ---------------------------------------------------------------------------
# routing

PAGES = [  # (script, title, icon, URL path): the home page at /, every view at its file name
    ("pages/overview.py", "Overview", ":material/home:", None),
    ("pages/acceptance.py", "Acceptance", ":material/track_changes:", "acceptance"),
    ("pages/compare.py", "Compare", ":material/compare_arrows:", "compare"),
    ("pages/completions.py", "Completions", ":material/description:", "completions"),
    ("pages/extraction.py", "Extraction", ":material/memory:", "extraction"),
    ("pages/diagnostics.py", "Diagnostics", ":material/monitor_heart:", "diagnostics"),
    ("pages/conformance.py", "Conformance", ":material/rule:", "conformance"),
]
_router = threading.local()  # per script thread: set while app.py runs the chosen page


def navigation():
    """st.navigation over PAGES: the page the URL asks for (declaring them ends the pages/-directory mode)."""
    pages = [st.Page(p, title=t, icon=i, **({"url_path": u} if u else {"default": True})) for p, t, i, u in PAGES]
    return st.navigation(pages)


@contextmanager
def routing():
    """`app()` runs the chosen page inside this: `routed()` then knows the page runs under the router."""
    _router.on = True
    try:
        yield
    finally:
        _router.on = False


def app() -> None:
    """One script run of the app (app.py): page config, st.navigation picking the page from the URL, the sidebar,
    the page in one store session (one connection for its reads; jobs' writes wait at most one page render)."""
    page_config()
    page = navigation()
    jobs_slot = sidebar()
    with store().session(), routing():
        page.run()
    from pages import jobs_view  # after the page: a job it started is listed (and followed) at once

    with jobs_slot.container():
        jobs_view.running_jobs()


def routed() -> None:
    """A page script run alone (a deep link opened first after the server starts: Streamlit's pages/-directory
    mode, on until some script declares st.navigation) runs the app here instead, as app.py would, and stops the
    bare run; same script run, so a click that came with it still counts."""
    if not getattr(_router, "on", False):
        app()
        st.stop()


def page_config() -> None:
    # an emoji icon: the browser draws it as an inline SVG (data: URL); a :material/...: icon would be fetched from
    # fonts.gstatic.com (console errors offline, a request off this machine)
    st.set_page_config(page_title="dflash-dash", page_icon="⚡", layout="wide")


def sidebar():
    """The app's sidebar: the workspace and the server's readiness; returns the slot of the running jobs (drawn after
    the page, `jobs_view.running_jobs`)."""
    from pages import server_view  # it reads the workspace through this module

    with st.sidebar:
        st.markdown("**Workspace**")
        st.text(workspace())  # not st.code: its syntax highlighter costs every page load ~0.2 s of browser time
        server_view.server_status(server_view.server_url())
        st.markdown("**Jobs**")
        return st.empty()


# ---------------------------------------------------------------------------
# workspace and store


def workspace() -> str:
    """`--workspace W` after `--` on the streamlit command line, else $DFLASH_WORKSPACE, else cache/."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--workspace")
    a, _ = p.parse_known_args(sys.argv[1:])
    return str(Path(a.workspace or os.environ.get("DFLASH_WORKSPACE") or default_workspace()).resolve())


@st.cache_resource
def _store(ws: str) -> Store:
    return Store(ws)


def store() -> Store:
    return _store(workspace())


def stamp() -> str:
    return store().stamp()


@st.cache_data(max_entries=32, show_spinner=False)
def runs(ws: str, stamp: str) -> list[dict]:
    return _store(ws).runs()


@st.cache_data(max_entries=32, show_spinner=False)
def extractions(ws: str, stamp: str) -> list[dict]:
    return _store(ws).extractions()


@st.cache_data(max_entries=32, show_spinner=False)
def sets(ws: str, stamp: str) -> list[dict]:
    return _store(ws).sets()


@st.cache_data(max_entries=32, show_spinner=False)
def set_sampling(ws: str, set_name: str, stamp: str) -> str:
    """How the set was sampled, in words ("greedy", "sampled at T=0.7, top-p 0.95, seed 1"): pipeline.set_sampling."""
    from dflash_dash import pipeline

    return pipeline.set_sampling(_store(ws), set_name)


@st.cache_data(max_entries=32, show_spinner=False)
def completions(ws: str, set_name: str, stamp: str) -> dict[str, dict]:
    """The set's completions for listings and selectors: text previews and token counts, no token ids."""
    return {c["prompt_id"]: c for c in _store(ws).completion_index(set_name)}


@st.cache_data(max_entries=64, show_spinner=False)
def completion(ws: str, set_name: str, prompt_id: str, stamp: str) -> dict | None:
    """One completion whole (text and token ids)."""
    return _store(ws).completion(set_name, prompt_id)


@st.cache_data(max_entries=4, show_spinner=False)
def all_completions(ws: str, set_name: str, stamp: str) -> dict[str, dict]:
    """Every completion of the set whole; only for analyses that need every token (Conformance)."""
    return {c["prompt_id"]: c for c in _store(ws).completions(set_name)}


def analysis(ws: str, run_id: str, name: str):
    """A whole-run analysis of a finished run (pipeline.analysis: computed once, kept in the store)."""
    return _analysis(ws, run_id, name)


@st.cache_data(max_entries=64, show_spinner="analysing the run (once; kept in the workspace)")
def _analysis(ws: str, run_id: str, name: str):
    from dflash_dash import pipeline  # on first use: the pages that never analyse never load it

    return pipeline.analysis(_store(ws), run_id, name)


def prompt_rows(ws: str, run_id: str) -> dict[str, dict]:
    """A finished run's per-prompt numbers (metrics.prompt_rows, no token arrays), by prompt id."""
    return {r["prompt_id"]: r for r in analysis(ws, run_id, "prompts")}


@st.cache_data(max_entries=64, show_spinner=False)
def run_prompt(ws: str, run_id: str, prompt_id: str) -> dict | None:
    """One prompt's whole run_prompts row (every array); a run never changes, so keyed on the ids only."""
    return _store(ws).run_prompt(run_id, prompt_id)


@st.cache_data(max_entries=4, show_spinner=False)
def all_prompts(ws: str, run_id: str) -> dict[str, dict]:
    """Every prompt's whole row; only for analyses that need every token (Conformance, old summaries)."""
    return {r["prompt_id"]: r for r in _store(ws).run_prompts(run_id)}


def summary(ws: str, run: dict) -> dict:
    """The run's summary with every registry metric (metrics.complete: a run summarised before a metric existed
    gets it from its rows, read only then)."""
    s = run["summary"]
    if all(m.key in s for m in metrics.REGISTRY):
        return s
    return metrics.complete(s, _store(ws).prompts(run["id"]))


@st.cache_resource(max_entries=8, show_spinner="loading the tokenizer")
def vocab(target_path: str) -> Vocab:
    return load_vocab(target_path)


@st.cache_data(max_entries=32, show_spinner=False)
def attributions(ws: str, run_id: str, stamp: str) -> list[dict]:
    """The run's target-layer attribution as attribution_rows ([] before one)."""
    return attribution_rows(_store(ws).attributions(run_id))


def numbers(rows: list[dict], **config) -> dict:
    """A dataframe's column_config printing its float columns one way per kind of number (render.tables
    number_formats: tau-like 2 decimals, probabilities 3), a help saying why on each column with a missing value
    (drawn as `missing.DASH`: `st.dataframe(placeholder=DASH)`), plus `config`."""
    fmts, why = number_formats(rows), missing.helps(rows)
    cfg = {c: st.column_config.NumberColumn(format=f, help=why.get(c)) for c, f in fmts.items()}
    return cfg | {c: st.column_config.Column(help=h) for c, h in why.items() if c not in cfg} | config


def download(label: str, rows: list[dict], file_name: str, key: str) -> None:
    """A CSV download button for one table (or figure data)."""
    st.download_button(
        label, csv_text(rows) if rows else "", file_name=file_name, mime="text/csv", key=key, disabled=not rows
    )


def engine_stamp() -> str:
    """Changes when engine stats are added (an import adds no completion, so `stamp` would not see it)."""
    return store().engine_stamp()


@st.cache_data(max_entries=32, show_spinner=False)
def engines(ws: str, set_name: str, stamp: str) -> list[str]:
    return _store(ws).engines(set_name)


def kept(ws: str, run_id: str, name: str):
    """A value kept for a run by a CLI or job operation (e.g. the fault ranking), read each time: a new ranking
    changes no stamp, and the read is one small row."""
    return _store(ws).analysis(run_id, name)


@st.cache_data(max_entries=32, show_spinner=False)
def engine_stats(ws: str, set_name: str, engine: str, stamp: str) -> list[dict]:
    return _store(ws).engine_stats(set_name, engine)


def served(ws: str, set_name: str, engine: str) -> dict | None:
    """What `engine` said it served when set `set_name` was fetched (Store.served; None: nothing recorded), read
    each time (one small row)."""
    return _store(ws).served(set_name, engine)


def replayed(ws: str, run: dict) -> dict:
    """The identity of the drafter run `run` replayed (pipeline.served.replayed: kept with the run, computed once
    from its checkpoint otherwise)."""
    from dflash_dash.pipeline import served as served_mod

    return served_mod.replayed(_store(ws), run)


# ---------------------------------------------------------------------------
# errors


def forms():
    """pages.forms (form labels and checks), imported on first use."""
    from pages import forms

    return forms


@contextmanager
def guard(labels: dict[str, str] | None = None):
    """Run a page body; show user errors as their message and anything else as a short message (the
    traceback goes to the server log only). `labels` {op field: form label} (a form's own, beside forms.FIELDS): a
    form's errors name its fields (`forms.said`)."""
    try:
        yield
    except UserError as e:
        st.error(forms().said(e, forms().FIELDS | labels) if labels is not None else str(e))
    except Exception as e:  # noqa: BLE001  (never a traceback in the browser)
        traceback.print_exc(file=sys.stderr)
        st.error(f"Unexpected error ({type(e).__name__}): {e}. The details are in the log of `streamlit run`.")


# ---------------------------------------------------------------------------
# URL-synced selection


def select_param(label: str, options: list, param: str, key: str, default=None, format_func=str, **kw):
    """A selectbox whose value lives in `st.query_params[param]`: a link with ?param=X opens X."""
    if not options:
        return None
    qv = st.query_params.get(param)
    seen = st.session_state.get(f"_qp_{key}")
    if qv in options and qv != seen:
        st.session_state[key] = qv
    elif qv is not None and qv not in options and qv != seen:
        st.warning(f"The link asks for {param}={qv!r}, which this workspace does not have; showing another.")
        st.session_state[key] = default if default in options else options[0]
    elif st.session_state.get(key) not in options:
        st.session_state[key] = default if default in options else options[0]
    val = st.selectbox(label, options, key=key, format_func=format_func, **kw)
    st.query_params[param] = val
    st.session_state[f"_qp_{key}"] = val
    return val


def window_param(n: int, P: int, key: str, owner: str, around: int | None = None) -> tuple[int, int]:
    """The completion offsets [lo, hi) a token view of n positions draws: all up to `render.tokens.WINDOW`, else
    the window picked (`&win=K` in the URL); a link's outlined offset `around` opens its window when the URL names
    none. The window belongs to `owner` (the prompt shown): another prompt opens at its own default."""
    spans, W = token_render.windows(n), token_render.WINDOW
    labels = {str(k): f"positions {P + lo:,}–{P + hi - 1:,}" for k, (lo, hi) in enumerate(spans)}
    last, st.session_state[f"_win_owner_{key}"] = st.session_state.get(f"_win_owner_{key}"), owner
    if "win" in st.query_params and (last not in (None, owner) or st.query_params.get("win") not in labels):
        del st.query_params["win"]
        for k in (f"_qp_{key}", key):
            st.session_state.pop(k, None)
    if len(spans) == 1:
        return spans[0]
    if around is not None and "win" not in st.query_params:
        st.query_params["win"] = str(min(max(around, 0) // W, len(spans) - 1))
    label = f"positions shown ({W:,} at a time, {n:,} in all)"
    return spans[int(select_param(label, list(labels), "win", key, format_func=labels.get))]


def section_param(label: str, options: dict[str, str], param: str, key: str, default: str | None = None) -> str | None:
    """Which optional section of a page to draw (a segmented control, none chosen by default): a heavy section is
    drawn only when asked, so the page opens fast. Its value lives in `st.query_params[param]`: a link with
    ?param=X opens section X; choosing none removes the parameter. `default` opens a section on the session's
    first visit to the page when the link names none (a link carrying that section's own parameters)."""
    qv = st.query_params.get(param)
    if qv is None and default in options and f"_qp_{key}" not in st.session_state:
        qv = default
    seen = st.session_state.get(f"_qp_{key}")
    if qv != seen:  # a link (or the URL) chose
        if qv is not None and qv not in options:
            st.warning(f"The link asks for {param}={qv!r}, which this page does not have; showing none.")
        st.session_state[key] = qv if qv in options else None
    val = st.segmented_control(label, list(options), format_func=options.get, key=key)
    if val is None:
        st.query_params.pop(param, None)
    else:
        st.query_params[param] = val
    st.session_state[f"_qp_{key}"] = val
    return val


def set_param(key: str, param: str, value) -> None:
    """Programmatic change of a URL-synced select (before the select is drawn)."""
    st.session_state[key] = value
    st.query_params[param] = value


def family(run: dict) -> str:
    """The drafter family of a run (DFlash for runs replayed before families were recorded)."""
    return (run.get("summary") or {}).get("family", "DFlash")


def extraction_label(by_id: dict[str, dict]):
    """An extraction selectbox's label: id, backend, completion set and the target layers it holds (a drafter
    replays on any extraction holding its layers)."""

    def f(i: str) -> str:
        e = by_id[i]
        label = f"{i} · {e['backend']} · {e['set_name']} · layers {','.join(map(str, e['layer_ids'] or []))}"
        return label + (" · streamed: a replay runs the target again" if streamed(e) else "")

    return f


def streamed(e: dict | None) -> bool:
    """Whether an extraction row was computed by streaming (replay/sweep --stream): no feature file was written."""
    return bool(e and (e.get("versions") or {}).get("streamed"))


def streamed_note(e: dict | None, what: str = "This run") -> None:
    """Say so where a streamed extraction's runs are shown: a replay on it runs the target again."""
    if streamed(e):
        st.info(
            f"{what} was computed by **streaming**: the target `{e['target_path']}` ran over set `{e['set_name']}` "
            f"({e['backend']}, {e['device']} {e['dtype']}) and the drafter replayed on the features in memory; no "
            f"feature file was written. A replay on extraction `{e['id']}` needs the target again: the Replay "
            f"button below streams it (CLI: `replay --stream --target {e['target_path']} --completions "
            f"{e['set_name']} --drafter CKPT`)."
        )


def select_run(label: str, runs: list[dict], param: str, key: str, default=None, skip: str | None = None):
    """`select_param` over `runs` (oldest first, as Store.runs lists them) shown newest first with `run_label`;
    `skip`: a run id left out of the options. Returns the chosen run id."""
    by_id = {r["id"]: r for r in runs}
    ids = [r["id"] for r in reversed(runs) if r["id"] != skip]
    return select_param(label, ids, param, key, default=default, format_func=run_label(by_id))


def run_label(runs_by_id: dict[str, dict]):
    def f(rid: str) -> str:
        r = runs_by_id.get(rid, {})
        return f"{r.get('name')} · {family(r)} · {r.get('backend')} · {rid}"

    return f


def backend_note(backend: str | None, what: str = "This run") -> None:
    """A warning wherever a torch-path extraction feeds a drafter (trained on fla states, which differ)."""
    if backend == "torch":
        st.warning(
            f"{what} uses a **torch-path** extraction (backend `torch`, the CPU fallback of the "
            "linear-attention kernels). The drafter was trained on states from the **fla** kernels; the "
            "two differ, so acceptance here can be lower than in serving. Compare both on the "
            "Diagnostics page (backend parity)."
        )


# ---------------------------------------------------------------------------
# jobs


def job_lifecycle():
    """The job lifecycle (start, cancel, rerun, log tail, ...), imported on first use: it loads the operations."""
    from dflash_dash.jobs import lifecycle

    return lifecycle
