"""Pages at scale: a workspace of 1,000 completions of 2,560 tokens and 20 runs, built through the
product's own operations with tiny seeded models, then each page executed server-side by Streamlit's AppTest
with cold data caches.

    python benchmarks/bench_pages.py --work /tmp/pages            # build (once, reused) and measure
    python benchmarks/bench_pages.py --work /tmp/pages --prompts 100 --runs 4   # a smaller workspace
    python benchmarks/bench_pages.py --work /tmp/pages --device cuda --workers 12 --max-build-s 300 \\
        --page-cpus 0,1                 # build on a GPU machine, pages measured as on a 2-core machine

Options: `--device` is where extract and sweep run (cpu, cuda); `--workers N` shards their prompts over N
worker processes on that device (`jobs.workers.pool`, what the CLI's `--gpus` does; 1: this process);
`--max-build-s S` stops replaying checkpoints once the build has used S seconds: the sweep is run in rounds
(the folder of checkpoints grows by as many as the rounds so far say fit, and `pipeline.sweep` replays only
the new ones), so fewer runs than `--runs` may be built (`runs_built` says how many; the first round, one
checkpoint over every prompt, always runs to its end); `--page-cpus 0,1`
measures the pages in a child process pinned to those CPUs (os.sched_setaffinity, torch and DuckDB limited
to as many threads), so the figures stand for a machine of that many cores; `--profile` runs each page
slower than the goal (1.5 s) a third time, untimed, with cProfile on inside its script run, and prints where
the time went; `--session` runs each page script inside one `Store.session()` (one DuckDB connection per page run,
as app.py would by wrapping `page.run()`).

`--planted` builds the workspace without replaying (what a 2-core machine can build): completions imported, an
extraction recorded without feature files, and per run the parent's store step of a replay (`pipeline.store_run`)
on planted results of the replay's shapes (`tools/planted.py`); it adds `store_step_s` (per run) and its parts
`step_<part>_s` (summarize, scored, add_run, analysis).

Figures (`name: value`): `build_*_s` for each step of the build, `runs_built`, `store_db_mb` (the DuckDB file, WAL
included, and the runs' array files), `store_mb_per_1000_prompt_run` (its growth during the sweep per run built, scaled
to 1,000 prompts), `features_mb` (the extraction's feature files) and `page_render_s_<page>` for Overview, Acceptance
(per-prompt table plus the token view of one 2,560-token prompt), Compare (two runs) and the sweep chart (all runs),
each the first script run of the page in a process that has the app's modules imported, with `st.cache_data` cleared
(`page_rerender_s_<page>`: the next run, data caches cleared again, resources such as the tokenizer loaded); with each
page, `page_db_connects_<page>` and `page_db_connect_s_<page>` (DuckDB connections the page opened and the seconds spent
opening them).
Contract: the build goes through `pipeline` (import, extract, sweep) exactly as the CLI does (with
`--workers`, through the same worker runner as `--gpus`); nothing is written to the store behind the
product's back. The planted workspace is `tools/planted.py`'s (the 1,000-prompt browser tests build it too).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, note, report

PROMPTS, TOKENS, RUNS, BLOCK = 1000, 2560, 20, 16
GOAL_S = 1.5  # the goal for each page's first render at this scale


# ---------------------------------------------------------------------------
# the workspace


def _mb(*paths: Path) -> float:
    return sum(p.stat().st_size for p in paths if p.is_file()) / 2**20


def store_mb(ws: Path) -> float:
    """The store's size: the DuckDB file (WAL included) and the runs' array files (`store.ARRAYS_DIR`)."""
    from dflash_dash.store import ARRAYS_DIR

    return _mb(ws / "dflash.duckdb", ws / "dflash.duckdb.wal", *(ws / ARRAYS_DIR).rglob("*"))


def build_planted(
    work: str | Path,
    prompts: int = PROMPTS,
    tokens: int = TOKENS,
    runs: int = RUNS,
    block_size: int = BLOCK,
    figs: dict | None = None,
    budget: int = 8,
) -> Path:
    """The scale workspace with planted runs (`tools.planted.build`: completions imported, an extraction recorded
    without features, per checkpoint the parent's store step of a replay on planted results). figs get
    `store_step_s` (per run, mean), its parts `step_<part>_s`, and the store size."""
    import importlib

    from dflash_dash import replay
    from dflash_dash.store import Store
    from tools import planted

    replaying = importlib.import_module("dflash_dash.pipeline.replay")  # the module (`pipeline.replay`: the handler)

    figs = {} if figs is None else figs
    work, t_build = Path(work), time.perf_counter()
    ws, done = work / "ws", work / "BUILT.json"
    want = {"prompts": prompts, "tokens": tokens, "runs": runs, "block_size": block_size, "anchors": "planted"}
    if done.is_file() and {k: json.loads(done.read_text()).get(k) for k in want} == want:
        figs["runs_built"] = runs
        return ws
    parts = {
        "summarize": (replay, "summarize"),
        "scored": (replaying, "scored"),  # the store step (`pipeline.replay.store_run`) calls these
        "add_run": (Store, "add_run"),
        "analysis": (replaying, "keep"),  # the kept analyses (`pipeline.kept.keep`)
    }
    spent, orig = {k: 0.0 for k in parts}, {k: getattr(o, a) for k, (o, a) in parts.items()}
    steps, sizes = [], []

    def timed_part(name):  # each part of the store step timed where the step calls it
        def call(*a, **kw):
            t = time.perf_counter()
            try:
                return orig[name](*a, **kw)
            finally:
                spent[name] += time.perf_counter() - t

        return call

    def each(i, step):
        if i == 0:
            figs["build_import_s"] = time.perf_counter() - t_build  # models, completions, extraction record
            note(f"build_import_s: {figs['build_import_s']:.4g}")
            sizes.append(store_mb(ws))
        t0 = time.perf_counter()
        step()
        steps.append(time.perf_counter() - t0)
        note(
            f"run {i + 1}/{runs}: store step {steps[-1]:.1f} s (so far: "
            f"{', '.join(f'{k} {v:.1f}' for k, v in spent.items())} s)"
        )

    for name, (owner, attr) in parts.items():
        setattr(owner, attr, timed_part(name))
    try:
        planted.build(work, prompts, tokens, runs, block_size, budget, each)
    finally:
        for name, (owner, attr) in parts.items():
            setattr(owner, attr, orig[name])
    figs["runs_built"] = runs
    figs["store_step_s"] = sum(steps) / len(steps)
    figs.update({f"step_{k}_s": v / runs for k, v in spent.items()})
    figs["build_total_s"] = time.perf_counter() - t_build
    figs["store_db_mb"] = store_mb(ws)
    figs["store_mb_per_1000_prompt_run"] = (store_mb(ws) - sizes[0]) / runs * 1000 / prompts
    done.write_text(json.dumps(want | {"runs_built": runs}))
    return ws


def build(
    work: str | Path,
    prompts: int = PROMPTS,
    tokens: int = TOKENS,
    runs: int = RUNS,
    block_size: int = BLOCK,
    figs: dict | None = None,
    anchors: str = "every",
    device: str = "cpu",
    workers: int = 1,
    max_build_s: float | None = None,
) -> Path:
    """The scale workspace under `work` (reused when already complete): returns its path. With `max_build_s`,
    checkpoints are replayed in rounds while the build's time lasts (figs["runs_built"] says how many)."""
    from transformers import AutoTokenizer

    from dflash_dash import ops, pipeline
    from dflash_dash.jobs.workers import pool
    from dflash_dash.store import Store
    from tools import planted, tiny

    figs = {} if figs is None else figs
    t_build = time.perf_counter()

    def say(step: str):  # progress notes carry the build's elapsed seconds (a run cut off still shows them)
        return lambda d, t, m: note(f"[{time.perf_counter() - t_build:.0f} s] {step} {d}/{t} {m}")

    work = Path(work)
    ws = work / "ws"
    done = work / "BUILT.json"
    want = {"prompts": prompts, "tokens": tokens, "runs": runs, "block_size": block_size, "anchors": anchors}
    if done.is_file():
        got = json.loads(done.read_text())
        if {k: got.get(k) for k in want} == want:
            figs["runs_built"] = got.get("runs_built", runs)
            return ws
    models = work / "models"
    target = tiny.write_target(models / "target", tiny.TinyTarget())
    tiny.write_tokenizer(target, vocab_size=512)
    cks = models / "sweep"
    step = lambda i: cks / f"step_{(i + 1) * 100}"  # noqa: E731
    tiny.write_drafter(step(0), tiny.TinyDrafter(seed=0, block_size=block_size))
    tok = AutoTokenizer.from_pretrained(target)
    st = Store(ws)
    runner = pool(st, [device] * workers) if workers > 1 else None
    t0 = time.perf_counter()
    pipeline.import_completions(st, planted.completions_file(work, tok, prompts, tokens), planted.SET)
    figs["build_import_s"] = time.perf_counter() - t0
    note(f"build_import_s: {figs['build_import_s']:.4g}")
    t0 = time.perf_counter()
    ex = pipeline.extract(
        st,
        ops.Extract(
            target=str(target), completions=planted.SET, layers=pipeline.layers_of(str(step(0)), None), device=device
        ),
        progress=lambda d, t, m: say("extract")(d, t, m) if d % 100 == 0 else None,
        runner=runner,
    )
    figs["build_extract_s"] = time.perf_counter() - t0
    note(f"build_extract_s: {figs['build_extract_s']:.4g}")
    before = store_mb(ws)
    t_sweep = time.perf_counter()
    built, per_ck = 0, None
    while built < runs:
        if max_build_s is None:
            k = runs - built
        elif per_ck is None:
            k = 1  # the first round times one checkpoint
        else:
            left = max_build_s - (time.perf_counter() - t_build)
            k = min(runs - built, int(left * 0.85 / per_ck))
            if k < 1:
                note(f"build guard: {left:.0f} s left, {per_ck:.0f} s a checkpoint: stopping at {built} runs")
                break
        for i in range(built, built + k):
            tiny.write_drafter(step(i), tiny.TinyDrafter(seed=i, block_size=block_size))
        t0 = time.perf_counter()
        pipeline.sweep(
            st,
            ops.Sweep(checkpoints=str(cks), extraction=ex, anchors=anchors, device=device),
            progress=say("sweep"),
            runner=runner,
        )
        s = time.perf_counter() - t0
        per_ck = s / k
        built += k
        note(f"sweep round of {k} checkpoint(s): {s:.1f} s ({per_ck:.1f} s each); {built} runs built")
    figs["build_sweep_s"] = time.perf_counter() - t_sweep
    figs["build_total_s"] = time.perf_counter() - t_build
    figs["runs_built"] = built
    figs["store_db_mb"] = store_mb(ws)
    figs["store_mb_per_1000_prompt_run"] = (store_mb(ws) - before) / max(built, 1) * 1000 / prompts
    feats = pipeline.features_root(st)
    figs["features_mb"] = sum(p.stat().st_size for p in feats.rglob("*") if p.is_file()) / 2**20
    done.write_text(json.dumps(want | {"runs_built": built}))
    return ws


# ---------------------------------------------------------------------------
# the pages


def apptest(ws: Path):
    """An AppTest of app.py on `ws` (app.py's own routing, as a browser's first visit), modules imported."""
    from streamlit.testing.v1 import AppTest

    os.environ["DFLASH_WORKSPACE"] = str(ws)
    sys.argv = sys.argv[:1]
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.run()
    return at


def profiled(go, name: str, rows: int = 18) -> None:
    """Run `go` with cProfile on inside the page script's run (the thread AppTest runs scripts in) and print
    the functions with the most cumulative and own time."""
    import cProfile
    import io
    import pstats

    from streamlit.navigation.page import StreamlitPage

    pr, run = cProfile.Profile(), StreamlitPage.run

    def run_profiled(self, *a, **kw):
        pr.enable()
        try:
            return run(self, *a, **kw)
        finally:
            pr.disable()

    StreamlitPage.run = run_profiled
    try:
        go()
    finally:
        StreamlitPage.run = run
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(pr, stream=out).sort_stats(key).print_stats(rows)
        lines = out.getvalue().splitlines()
        at = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
        note(f"profile {name} by {key} (cProfile, untimed second run):")
        for ln in lines[at : at + rows + 1]:
            note("  " + ln.replace(str(ROOT) + "/", "").replace(sys.prefix, "<py>"))


class Connects:
    """Counts `duckdb.connect` calls and the seconds spent in them (the store opens the file per query)."""

    def __init__(self):
        import duckdb

        self.n, self.s, connect = 0, 0.0, duckdb.connect

        def counted(*a, **kw):
            t0 = time.perf_counter()
            try:
                return connect(*a, **kw)
            finally:
                self.n += 1
                self.s += time.perf_counter() - t0

        duckdb.connect = counted


def timed(
    at, page: str, params: dict, figs: dict, name: str, profile: bool = False, conns: Connects | None = None
) -> None:
    """Seconds of the first script run of `page` with `params`, data caches cleared, then of a second one (data
    caches cleared again; resources such as the tokenizer kept); with `profile`, a page over the goal is run a
    third time (caches cleared, untimed) under cProfile. A page that fails is
    reported (`page_failed_<name>`) and the next one measured."""
    import streamlit as st

    def go():
        at.switch_page(page)
        at.query_params.clear()
        for k, v in params.items():
            at.query_params[k] = v
        st.cache_data.clear()
        t0 = time.perf_counter()
        at.run()
        return time.perf_counter() - t0

    n0, s0 = (conns.n, conns.s) if conns else (0, 0.0)
    s = go()
    errs = [e.value for e in at.exception] + [e.value for e in at.error]
    if errs:
        figs[f"page_failed_{name}"] = 1
        print(f"page_failed_{name}: 1\n# page {page} failed: {str(errs[:2])[:1500]}", flush=True)
        return
    figs[f"page_render_s_{name}"] = s
    print(f"page_render_s_{name}: {s:.4g}", flush=True)
    if conns:
        print(f"page_db_connects_{name}: {conns.n - n0}\npage_db_connect_s_{name}: {conns.s - s0:.4g}", flush=True)
    figs[f"page_rerender_s_{name}"] = again = go()
    print(f"page_rerender_s_{name}: {again:.4g}", flush=True)
    if profile and max(s, again) > GOAL_S:
        profiled(go, name)


def one_session(ws: Path) -> None:
    """Every page script run inside `Store.session()` of the app's store (one DuckDB connection per page run):
    what wrapping app.py's `page.run()` in `with common.store().session():` gives."""
    from streamlit.navigation.page import StreamlitPage

    from pages import common

    run = StreamlitPage.run

    def run_in_session(self, *a, **kw):
        with common.store().session():
            return run(self, *a, **kw)

    StreamlitPage.run = run_in_session


def measure(ws: Path, figs: dict, profile: bool = False, session: bool = False) -> None:
    from dflash_dash.store import Store

    runs = Store(ws).runs()
    a, b = runs[0]["id"], runs[-1]["id"]
    conns = Connects()
    at = apptest(ws)
    if session:
        one_session(ws)
    folder = str(Path(runs[0]["checkpoint"]).parent)
    for page, params, name in [
        ("pages/overview.py", {}, "overview"),
        ("pages/acceptance.py", {"run": a, "prompt": "p0000"}, "acceptance"),
        ("pages/compare.py", {"a": a, "b": b, "prompt": "p0000"}, "compare"),
        ("pages/compare.py", {"a": a, "b": b, "sweep": folder}, "sweep_chart"),
    ]:
        timed(at, page, params, figs, name, profile, conns)


def pin(cpus: list[int]) -> None:
    """This process on `cpus` alone, torch and DuckDB with as many threads (a machine of that many cores)."""
    import duckdb
    import torch

    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus))
    connect = duckdb.connect

    def limited(database=":memory:", read_only=False, config=None, **kw):
        return connect(database, read_only=read_only, config={"threads": len(cpus)} | (config or {}), **kw)

    duckdb.connect = limited


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="folder for the workspace (reused when already built)")
    ap.add_argument("--prompts", type=int, default=PROMPTS)
    ap.add_argument("--tokens", type=int, default=TOKENS)
    ap.add_argument("--runs", type=int, default=RUNS)
    ap.add_argument("--block-size", type=int, default=BLOCK)
    ap.add_argument("--anchors", default="every", help="the sweep's anchors: every (default) or chain")
    ap.add_argument("--device", default="cpu", help="where extract and sweep run: cpu, cuda, cuda:N")
    ap.add_argument("--workers", type=int, default=1, help="worker processes on --device for extract and sweep")
    ap.add_argument("--max-build-s", type=float, default=None, help="replay fewer checkpoints past this time")
    ap.add_argument("--page-cpus", default=None, help="measure the pages in a child pinned to these CPUs: 0,1")
    ap.add_argument("--profile", action="store_true", help="cProfile pages slower than the goal")
    ap.add_argument("--session", action="store_true", help="each page run in one Store.session() (one_session)")
    ap.add_argument("--planted", action="store_true", help="planted runs through the store step, no replay")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--pages-only", action="store_true", help="measure an already built workspace")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    cpus = [int(x) for x in a.page_cpus.split(",")] if a.page_cpus else None
    figs: dict = {}
    try:
        if a.pages_only:
            if cpus:
                pin(cpus)
                figs["page_cpus"] = len(os.sched_getaffinity(0))
            measure(Path(a.work) / "ws", figs, a.profile, a.session)
            return
        ws = (
            build_planted(a.work, a.prompts, a.tokens, a.runs, a.block_size, figs)
            if a.planted
            else build(
                a.work, a.prompts, a.tokens, a.runs, a.block_size, figs, a.anchors, a.device, a.workers, a.max_build_s
            )
        )
        report(figs)
        figs = {}
        if a.build_only:
            return
        if cpus:  # a fresh process: nothing of the build (threads, caches, CUDA) in it
            cmd = [sys.executable, __file__, "--work", a.work, "--pages-only", "--page-cpus", a.page_cpus]
            subprocess.run(
                cmd + (["--profile"] if a.profile else []) + (["--session"] if a.session else []), check=True
            )
        else:
            measure(ws, figs, a.profile, a.session)
    finally:
        shown = ("page_render_s_", "page_rerender_s_", "page_failed_")  # printed as each page was measured
        report({k: v for k, v in figs.items() if not k.startswith(shown)})


if __name__ == "__main__":
    main()
