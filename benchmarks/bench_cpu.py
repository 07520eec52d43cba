"""CPU benchmark: the demo pipeline end to end, and the server-side render of the Acceptance page.

1. `python -m dflash_dash --workspace W demo` in a fresh workspace, as a user runs it (a subprocess: the
   imports, the local SGLang stand-in, fetch, CPU extraction, the shipped fla extraction, every replay).
2. A workspace holding one 4,000-token completion (tiny seeded hybrid target with its tokenizer, a tiny
   DFlash checkpoint; import, CPU extraction and replay through `pipeline`), then the Acceptance page for that
   run and prompt executed server-side by Streamlit's AppTest (the script run that builds every element the
   browser receives: metrics, figures, the per-prompt table and the token view of all 4,000 tokens).
   `acceptance_page_render_s` is that run with the app's modules already imported (as in a serving process)
   and the page's data caches empty; the rerun with warm caches is reported too.

    python benchmarks/bench_cpu.py                  # both
    python benchmarks/bench_cpu.py --skip-demo      # only the page render
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, note, report

COMPLETION_TOKENS = 4000


def args_():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-demo", action="store_true", help="only the Acceptance page render")
    ap.add_argument("--tokens", type=int, default=COMPLETION_TOKENS, help="completion tokens")
    ap.add_argument("--work", default=None, help="folder for the workspaces (default: a temp folder)")
    return ap.parse_args()


def demo(work: Path, figs: dict) -> None:
    ws = work / "demo-ws"
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "dflash_dash", "--workspace", str(ws), "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    figs["demo_build_s"] = time.perf_counter() - t0
    if out.returncode:
        raise RuntimeError(f"demo build failed ({out.returncode}): {out.stderr[-2000:]}")
    from dflash_dash.store import Store

    st = Store(ws)
    figs["demo_runs"] = len(st.runs())
    figs["demo_completions"] = sum(e["prompts"] for e in st.extractions()[:1])


def workspace_with_long_completion(work: Path, n: int) -> tuple[Path, str, str]:
    """Tiny target + tokenizer + checkpoint; one completion of `n` tokens, extracted and replayed."""
    import json as json_mod
    import textwrap

    from transformers import AutoTokenizer

    from dflash_dash import ops, pipeline
    from dflash_dash.store import Store
    from tools import tiny

    models = work / "models"
    target = tiny.write_target(models / "target", tiny.TinyTarget())
    tiny.write_tokenizer(target, vocab_size=512)
    ck = tiny.write_drafter(models / "ckpt", tiny.TinyDrafter(seed=1))
    tok = AutoTokenizer.from_pretrained(target)
    text = "".join(inspect.getsource(m) for m in (json_mod, textwrap, inspect))  # real text with <, &, tabs
    ids = tok.encode(text, add_special_tokens=False)[:n]
    assert len(ids) == n, f"corpus too short: {len(ids)} tokens"
    rec = {
        "id": "long-4k",
        "prompt": "Explain this code.",
        "prompt_ids": tok.encode("Explain this code."),
        "output": tok.decode(ids),
        "output_ids": ids,
    }
    f = work / "long.jsonl"
    f.write_text(json.dumps(rec) + "\n")
    ws = work / "long-ws"
    st = Store(ws)
    pipeline.import_completions(st, f, "long")
    t0 = time.perf_counter()
    ex = pipeline.extract(
        st, ops.Extract(target=str(target), completions="long", layers=pipeline.layers_of(str(ck), None))
    )
    t1 = time.perf_counter()
    run = pipeline.replay(st, ops.Replay(drafter=str(ck), extraction=ex))
    note(f"{n}-token completion: CPU extraction {t1 - t0:.1f} s, replay {time.perf_counter() - t1:.1f} s")
    return ws, run["id"], rec["id"]


def render(ws: Path, run: str, prompt: str, figs: dict) -> None:
    from streamlit.testing.v1 import AppTest

    os.environ["DFLASH_WORKSPACE"] = str(ws)
    sys.argv = sys.argv[:1]  # the app reads --workspace from argv: none of this script's options
    warm = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    warm.run()  # imports the app's modules (a serving process has them loaded)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.run()
    at.switch_page("pages/acceptance.py")
    at.query_params["run"] = run
    at.query_params["prompt"] = prompt
    import streamlit as st

    st.cache_data.clear()  # the page's data caches start empty
    t0 = time.perf_counter()
    at.run()
    figs["acceptance_page_render_s"] = time.perf_counter() - t0
    errs = [e.value for e in at.exception] + [e.value for e in at.error]
    if errs:
        raise RuntimeError(f"the Acceptance page failed: {errs[:3]}")
    view = max((h.proto.body for h in at.get("html")), key=len, default="")
    if '<div class="dfv">' not in view:
        raise RuntimeError(
            f"the Acceptance page showed no token view (title {[t.value for t in at.title]}, "
            f"warnings {[w.value[:80] for w in at.warning]}, info {[i.value[:80] for i in at.info]})"
        )
    figs["acceptance_token_view_bytes"] = len(view)
    t0 = time.perf_counter()
    at.run()
    figs["acceptance_page_rerun_s"] = time.perf_counter() - t0


def main():
    a = args_()
    sys.path.insert(0, str(ROOT))
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="dflash-cpu-"))
    work.mkdir(parents=True, exist_ok=True)
    note(f"work folder {work}; {os.cpu_count()} CPUs")
    figs: dict = {}
    try:
        ws, run, prompt = workspace_with_long_completion(work, a.tokens)
        render(ws, run, prompt, figs)
        if not a.skip_demo:
            demo(work, figs)
    finally:
        report(figs)


if __name__ == "__main__":
    main()
