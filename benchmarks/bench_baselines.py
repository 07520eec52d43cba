"""Baselines benchmark: model-free proposers replayed against a drafter's replay on the same completions.

A workspace (tiny seeded target with its tokenizer and a tiny DFlash checkpoint, tools/tiny.py) holding `--prompts`
completions of `--tokens` tokens cut from real Python source (the standard library's: code repeats itself as
model output does), extracted on the CPU. Then, timed: the drafter's replay (`pipeline.replay`, every anchor, as the
pages' default; with --chain also chain-only anchors) and each baseline (`pipeline.baseline`: vLLM ngram, SGLang
n-gram, suffix decoding), each to a stored run. Prints `name: value` per figure: seconds, the baseline/drafter
time ratio, and each run's tau (macro) so the figures name what was computed.

    python benchmarks/bench_baselines.py                       # 8 prompts x 1,000 tokens
    python benchmarks/bench_baselines.py --prompts 4 --tokens 400
    python benchmarks/bench_baselines.py --shape 27b           # the 27B-shaped drafter on CUDA (figures _27b_cuda)
    python benchmarks/bench_baselines.py --shape small         # the same path at small shapes on the CPU

With --shape (27b: bench_replay's FULL, the 27B DFlash drafter of SPEC section 8; small: its SMALL) the drafter is
a checkpoint of random weights and its target's embedding and LM head, the features random values of its width
written as the product's cache files (`bench_replay.write_inputs`), and the completions are the same token ids
(the tiny tokenizer's, valid in any larger vocabulary). Timed on --device as `pipeline.replay`'s worker runs them:
the features read from the cache (`cache.read_many`) then `replay.every_anchor` and `replay.chain_only` (one
untimed warm-up of each on one sequence first; the checkpoint's load timed apart); the baselines on this host's
CPU as `pipeline.baseline` runs them (`baselines.replay` + the run's summary). Neither side stores a run here (no
DuckDB step). Random weights: the drafter's tau means nothing, its time is what is measured.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
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
    ap.add_argument("--shape", choices=["27b", "small"], default=None, help="the drafter at bench_replay's shapes")
    ap.add_argument("--device", default=None, help="with --shape: default cuda (27b), cpu (small)")
    ap.add_argument("--chunk", type=int, default=256, help="with --shape: blocks per batched every-anchor call")
    ap.add_argument("--budget", type=int, default=8, help="with --shape: DDTree budget")
    return ap.parse_args()


def corpus() -> str:
    import argparse as m1
    import dataclasses as m2
    import json.decoder as m3
    import textwrap as m4

    return "".join(inspect.getsource(m) for m in (m1, m2, m3, m4))


METHODS = (("ngram", "prompt_lookup_min=2,prompt_lookup_max=5"), ("sglang-ngram", None), ("suffix", None))
P = 64  # prompt tokens before each completion


def completions(tok, n: int, L: int) -> list[dict]:
    """n records of a P-token prompt and an L-token completion cut in turn from `corpus()` tokenized by `tok`."""
    ids = tok.encode(corpus(), add_special_tokens=False)
    need = n * (P + L)
    if len(ids) < need:
        raise SystemExit(f"--prompts x --tokens: the corpus holds {len(ids)} tokens, {need} needed; ask for fewer")
    recs = []
    for i in range(n):
        chunk = ids[i * (P + L) : (i + 1) * (P + L)]
        recs.append({"id": f"p{i}", "prompt": tok.decode(chunk[:P]), "prompt_ids": chunk[:P],
                     "output": tok.decode(chunk[P:]), "output_ids": chunk[P:]})  # fmt: skip
    return recs


def main():
    a = args_()
    sys.path.insert(0, str(ROOT))
    from transformers import AutoTokenizer

    from tools import tiny

    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="dflash-baselines-"))
    note(f"work folder {work}; {os.cpu_count()} CPUs")
    if a.shape:
        tok = AutoTokenizer.from_pretrained(tiny.write_tokenizer(work / "tokenizer", vocab_size=512))
        return on_device(a, work, completions(tok, a.prompts, a.tokens))
    from dflash_dash import ops, pipeline
    from dflash_dash.store import Store

    models = work / "models"
    target = tiny.write_target(models / "target", tiny.TinyTarget())
    tiny.write_tokenizer(target, vocab_size=512)
    ck = tiny.write_drafter(models / "ckpt", tiny.TinyDrafter(seed=1))
    tok = AutoTokenizer.from_pretrained(target)
    L = a.tokens
    recs = completions(tok, a.prompts, L)
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
    for method, settings in METHODS:
        name = "baseline_" + method.replace("-", "_")
        timed(name, lambda: pipeline.baseline(st, ops.Baseline(method=method, completions="code", settings=settings)))
        if a.chain:
            figs[f"{name}_over_drafter_chain"] = figs[f"{name}_s"] / figs["drafter_replay_chain_s"]
        figs[f"{name}_over_drafter_every"] = figs[f"{name}_s"] / figs["drafter_replay_every_s"]
    report(figs)


def on_device(a, work: Path, recs: list[dict]) -> None:
    """--shape: the drafter at bench_replay's shapes from cache files on --device, the baselines on the CPU."""
    import torch
    from _common import suffixed, sync
    from bench_replay import FULL, SMALL, write_inputs

    from dflash_dash import baselines, cache, drafters as dr, metrics, replay as rp, target as tg

    dev = a.device or ("cuda" if a.shape == "27b" else "cpu")
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    T = P + a.tokens
    figs: dict = {"prompts": len(recs), "completion_tokens": a.tokens}
    try:
        if dev.startswith("cuda"):
            note(f"device {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
        t0 = time.perf_counter()
        ck, tgt, _ = write_inputs(work / "drafter", FULL if a.shape == "27b" else SMALL, len(recs), T, dev, dtype)
        figs["write_inputs_s"] = time.perf_counter() - t0  # checkpoint, head and features p0.. (random values)
        sync(dev)
        t0 = time.perf_counter()
        d, head = dr.load(ck, dtype, dev), tg.load_head(tgt, dev, dtype)
        sync(dev)
        figs["drafter_load_s"] = time.perf_counter() - t0
        tokens = [(r["id"], torch.tensor(r["prompt_ids"] + r["output_ids"])) for r in recs]

        def read(n: int | None = None) -> list:  # the features from the cache, as the replay's worker reads them
            got = tokens[:n]
            width = d.c.K * d.c.hidden_size
            feats = cache.read_many(work / "drafter" / "features", "bench", [(i, T) for i, _ in got], width, dev)
            return [rp.Sequence(i, t, P, f) for (i, t), f in zip(got, feats)]

        modes = {
            "every": lambda seqs: rp.every_anchor(d, head, seqs, a.budget, a.chunk),
            "chain": lambda seqs: rp.chain_only(d, head, seqs, a.budget),
        }
        for mode, fn in modes.items():
            fn(read(1))  # warm-up: kernels, allocator
            sync(dev)
            t0 = time.perf_counter()
            _, summary = fn(read())
            sync(dev)
            figs[f"drafter_replay_{mode}_s"] = time.perf_counter() - t0
            figs[f"drafter_replay_{mode}_tau_macro"] = summary["tau_macro"]
        seqs = [(r["id"], r["prompt_ids"] + r["output_ids"], P) for r in recs]
        for method, settings in METHODS:
            name = "baseline_" + method.replace("-", "_")
            t0 = time.perf_counter()
            prop = baselines.make(method, settings)
            res = [x.prompt for x in baselines.replay(prop, seqs)]
            summary = metrics.summarize(res, prop.width + 1, 0)
            figs[f"{name}_s"] = time.perf_counter() - t0
            figs[f"{name}_tau_macro"] = summary["tau_macro"]
            for mode in modes:
                figs[f"{name}_over_drafter_{mode}"] = figs[f"{name}_s"] / figs[f"drafter_replay_{mode}_s"]
    finally:
        report(suffixed(figs, f"{a.shape}_{torch.device(dev).type}"))
        if not a.work:  # the 27B checkpoint and head: 9 GB
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
