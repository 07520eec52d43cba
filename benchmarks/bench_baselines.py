"""Baselines benchmark: model-free proposers replayed against a drafter's replay on the same completions, on the CPU.

A workspace (tiny seeded target with its tokenizer and a tiny DFlash checkpoint, tools/tiny.py) holding `--prompts`
completions of `--tokens` tokens cut from real Python source (the standard library's: code repeats itself as
model output does), extracted on the CPU. Then, timed: the drafter's replay (`pipeline.replay`, every anchor, as the
pages' default; with --chain also chain-only anchors) and each baseline (`pipeline.baseline`: vLLM ngram, SGLang
n-gram, suffix decoding), each to a stored run. Prints `name: value` per figure: seconds, the baseline/drafter
time ratio, and each run's tau (macro) so the figures name what was computed.

    python benchmarks/bench_baselines.py                       # 8 prompts x 1,000 tokens
    python benchmarks/bench_baselines.py --prompts 4 --tokens 400
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, note, report


def args_():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="completions in the set")
    ap.add_argument("--tokens", type=int, default=1000, help="tokens per completion")
    ap.add_argument("--chain", action="store_true", help="also time the drafter's chain-only replay (slow on a CPU)")
    ap.add_argument("--work", default=None, help="folder for the workspace (default: a temp folder)")
    return ap.parse_args()


def corpus() -> str:
    import argparse as m1
    import dataclasses as m2
    import json.decoder as m3
    import textwrap as m4

    return "".join(inspect.getsource(m) for m in (m1, m2, m3, m4))


def main():
    a = args_()
    sys.path.insert(0, str(ROOT))
    from transformers import AutoTokenizer

    from dflash_dash import ops, pipeline
    from dflash_dash.store import Store
    from tools import tiny

    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="dflash-baselines-"))
    note(f"work folder {work}; {os.cpu_count()} CPUs")
    models = work / "models"
    target = tiny.write_target(models / "target", tiny.TinyTarget())
    tiny.write_tokenizer(target, vocab_size=512)
    ck = tiny.write_drafter(models / "ckpt", tiny.TinyDrafter(seed=1))
    tok = AutoTokenizer.from_pretrained(target)
    ids = tok.encode(corpus(), add_special_tokens=False)
    P, L = 64, a.tokens
    need = a.prompts * (P + L)
    if len(ids) < need:
        raise SystemExit(f"--prompts x --tokens: the corpus holds {len(ids)} tokens, {need} needed; ask for fewer")
    recs = []
    for i in range(a.prompts):
        chunk = ids[i * (P + L) : (i + 1) * (P + L)]
        recs.append({"id": f"p{i}", "prompt": tok.decode(chunk[:P]), "prompt_ids": chunk[:P],
                     "output": tok.decode(chunk[P:]), "output_ids": chunk[P:]})  # fmt: skip
    f = work / "set.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    st = Store(work / "ws")
    pipeline.import_completions(st, f, "code")
    ex = pipeline.extract(
        st, ops.Extract(target=str(target), completions="code", layers=pipeline.layers_of(str(ck), None))
    )
    figs: dict = {"prompts": a.prompts, "completion_tokens": L}

    def timed(name: str, fn) -> dict:
        t0 = time.perf_counter()
        out = fn()
        figs[f"{name}_s"] = time.perf_counter() - t0
        figs[f"{name}_tau_macro"] = out["summary"]["tau_macro"]
        return out

    timed("drafter_replay_every", lambda: pipeline.replay(st, ops.Replay(drafter=str(ck), extraction=ex)))
    if a.chain:
        chain = ops.Replay(drafter=str(ck), extraction=ex, anchors="chain")
        timed("drafter_replay_chain", lambda: pipeline.replay(st, chain))
    for method, settings in (
        ("ngram", "prompt_lookup_min=2,prompt_lookup_max=5"),
        ("sglang-ngram", None),
        ("suffix", None),
    ):
        name = "baseline_" + method.replace("-", "_")
        timed(name, lambda: pipeline.baseline(st, ops.Baseline(method=method, completions="code", settings=settings)))
        if a.chain:
            figs[f"{name}_over_drafter_chain"] = figs[f"{name}_s"] / figs["drafter_replay_chain_s"]
        figs[f"{name}_over_drafter_every"] = figs[f"{name}_s"] / figs["drafter_replay_every_s"]
    report(figs)


if __name__ == "__main__":
    main()
