"""Pages at scale (issue 12): a workspace of 1,000 completions of 2,560 tokens and 20 runs, built through the
product's own operations with tiny seeded models on the CPU, then each page executed server-side by
Streamlit's AppTest with cold data caches.

    python benchmarks/bench_pages.py --work /tmp/pages            # build (once, reused) and measure
    python benchmarks/bench_pages.py --work /tmp/pages --prompts 100 --runs 4   # a smaller workspace

Figures (`name: value`): `build_*_s` for each step of the build, `store_mb_per_1000_prompt_run` (DuckDB file
growth per run, scaled to 1,000 prompts), and `page_render_s_<page>` for Overview, Acceptance (per-prompt table
plus the token view of one 2,560-token prompt), Compare (two runs) and the sweep chart (all runs), each the
first script run of the page in a process that has the app's modules imported, with `st.cache_data` cleared.

Contract: the build goes through `pipeline` (import, extract, sweep) exactly as the CLI does; nothing is
written to the store behind the product's back. `build` is importable (the 1,000-prompt browser tests use it).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from _common import ROOT, note, report

PROMPTS, TOKENS, RUNS, BLOCK = 1000, 2560, 20, 16
SET = "scale"


# ---------------------------------------------------------------------------
# the workspace


def corpus_ids(tok, need: int) -> list[int]:
    """A long token stream of real text (the standard library's sources) for the completions."""
    import inspect
    import json as json_mod
    import textwrap
    import argparse as argparse_mod
    import email.message
    text = "".join(inspect.getsource(m) for m in (json_mod, textwrap, argparse_mod, inspect, email.message))
    ids = tok.encode(text, add_special_tokens=False)
    return (ids * (need // len(ids) + 1))[:need]


def completions_file(work: Path, tok, prompts: int, tokens: int, seed: int = 0) -> Path:
    """`prompts` completions of `tokens` output tokens each, cut at seeded offsets of the corpus."""
    rng = random.Random(seed)
    stream = corpus_ids(tok, 400_000)
    f = work / "scale.jsonl"
    with f.open("w") as out:
        for i in range(prompts):
            at = rng.randrange(0, len(stream) - tokens - 32)
            p_ids, o_ids = stream[at:at + 24], stream[at + 24:at + 24 + tokens]
            out.write(json.dumps({"id": f"p{i:04d}", "prompt": tok.decode(p_ids), "prompt_ids": p_ids,
                                  "output": tok.decode(o_ids), "output_ids": o_ids}) + "\n")
    return f


def build(work: str | Path, prompts: int = PROMPTS, tokens: int = TOKENS, runs: int = RUNS,
          block_size: int = BLOCK, figs: dict | None = None, anchors: str = "every") -> Path:
    """The scale workspace under `work` (reused when already complete): returns its path."""
    from dflash_dash import pipeline
    from tools import tiny
    from dflash_dash.store import Store
    from transformers import AutoTokenizer

    figs = {} if figs is None else figs
    work = Path(work)
    ws = work / "ws"
    done = work / "BUILT.json"
    want = {"prompts": prompts, "tokens": tokens, "runs": runs, "block_size": block_size, "anchors": anchors}
    if done.is_file() and json.loads(done.read_text()) == want:
        return ws
    models = work / "models"
    target = tiny.write_target(models / "target", tiny.TinyTarget())
    tiny.write_tokenizer(target, vocab_size=512)
    cks = models / "sweep"
    for i in range(runs):
        tiny.write_drafter(cks / f"step_{(i + 1) * 100}", tiny.TinyDrafter(seed=i, block_size=block_size))
    tok = AutoTokenizer.from_pretrained(target)
    st = Store(ws)
    t0 = time.perf_counter()
    pipeline.import_completions(st, completions_file(work, tok, prompts, tokens), SET)
    figs["build_import_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ex = pipeline.extract(st, str(target), SET, pipeline.layer_ids_of(str(cks / "step_100"), None))
    figs["build_extract_s"] = time.perf_counter() - t0
    db = ws / "dflash.duckdb"
    before = db.stat().st_size
    t0 = time.perf_counter()
    pipeline.sweep(st, str(cks), ex, progress=lambda d, t, m: note(f"sweep {d}/{t} {m}"), anchors=anchors)
    figs["build_sweep_s"] = time.perf_counter() - t0
    figs["store_mb_per_1000_prompt_run"] = (db.stat().st_size - before) / 2 ** 20 / runs * 1000 / prompts
    done.write_text(json.dumps(want))
    return ws


# ---------------------------------------------------------------------------
# the pages


def apptest(ws: Path):
    """An AppTest of app.py on `ws`, routed as a server is after its first view, modules imported."""
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.testing.v1 import AppTest
    from streamlit.testing.v1 import app_test as app_test_mod

    from pages import common

    class Routed(PagesManager):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            common.app_routing()

    app_test_mod.PagesManager = Routed
    os.environ["DFLASH_WORKSPACE"] = str(ws)
    sys.argv = sys.argv[:1]
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.run()
    return at


def timed(at, page: str, params: dict, figs: dict, name: str) -> None:
    """Seconds of the first script run of `page` with `params`, data caches cleared."""
    import streamlit as st
    at.switch_page(page)
    at.query_params.clear()
    for k, v in params.items():
        at.query_params[k] = v
    st.cache_data.clear()
    t0 = time.perf_counter()
    at.run()
    figs[f"page_render_s_{name}"] = time.perf_counter() - t0
    errs = [e.value for e in at.exception] + [e.value for e in at.error]
    if errs:
        raise RuntimeError(f"page {page} failed: {str(errs[:2])[:600]}")


def measure(ws: Path, figs: dict) -> None:
    from dflash_dash.store import Store
    runs = Store(ws).runs()
    a, b = runs[0]["id"], runs[-1]["id"]
    at = apptest(ws)
    timed(at, "pages/overview.py", {}, figs, "overview")
    timed(at, "pages/acceptance.py", {"run": a, "prompt": "p0000"}, figs, "acceptance")
    timed(at, "pages/compare.py", {"a": a, "b": b, "prompt": "p0000"}, figs, "compare")
    folder = str(Path(runs[0]["checkpoint"]).parent)
    timed(at, "pages/compare.py", {"a": a, "b": b, "sweep": folder}, figs, "sweep_chart")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="folder for the workspace (reused when already built)")
    ap.add_argument("--prompts", type=int, default=PROMPTS)
    ap.add_argument("--tokens", type=int, default=TOKENS)
    ap.add_argument("--runs", type=int, default=RUNS)
    ap.add_argument("--block-size", type=int, default=BLOCK)
    ap.add_argument("--build-only", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    figs: dict = {}
    try:
        ws = build(a.work, a.prompts, a.tokens, a.runs, a.block_size, figs)
        if not a.build_only:
            measure(ws, figs)
    finally:
        report(figs)


if __name__ == "__main__":
    main()
