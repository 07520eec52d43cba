"""The `cpu-continue` step of the demo asset build (CPU): continue a drafter's training on the CPU, on torch-path
features of the same training sequences, when the GPU time ran out before the drafters were trained enough.

Contract: `cpu_continue(src, which, assets, ...)` replaces the `which` checkpoint in `assets` with the continued
one and writes its record to src/cpu-<which>.json (merged into MANIFEST.json by `finish`). Coding-10 is replayed
after each chunk to show progress only; it is never trained on.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

from dflash_dash import demo
from dflash_dash.demo import ASSETS, CHECKPOINTS, FLA, LAYER_IDS, SERIES, TARGET
from dflash_dash.drafters import step_of

from .common import SEED, log


def cpu_continue(
    src: Path,
    which: str = "final",
    assets: Path = ASSETS,
    minutes: float = 20.0,
    chunk_minutes: float = 5.0,
    n_seqs: int = 1024,
) -> dict:
    """Continue training the `which` drafter (final: the healthy run's last snapshot, or buggy-: the first bug
    checkpoint of MANIFEST.json's list) on the CPU, on torch-path features of the
    same training sequences (the buggy one with its bug), in chunks of `chunk_minutes`, each followed by a
    coding-10 replay on a torch extraction (progress only: coding-10 is never trained on). Replaces the
    checkpoint in `assets` and writes the record to `src/cpu-<which>.json` (merged by `finish`)."""
    import torch

    from dflash_dash import replay, target as target_mod
    from dflash_dash.drafters import load

    from ..tiny import TinyDrafter
    from . import train_drafter as td

    t_all = time.perf_counter()
    target_mod.use_backend("torch")
    tgt = assets / TARGET
    cks = demo.checkpoints(assets / CHECKPOINTS, json.loads((assets / "MANIFEST.json").read_text()))
    old = demo.final(cks).path if which == "final" else next(c.path for c in cks if c.role == "bug")
    prev = json.loads((old / "training.json").read_text())
    d = TinyDrafter(**prev["drafter"])
    bug = prev["training"].get("bug")
    ts = json.loads((src / "train_seqs.json").read_text())
    order = list(range(len(ts["seqs"])))
    random.Random(SEED + 2).shuffle(order)
    order = order[:n_seqs]
    decoder, _ = target_mod.load(str(tgt), LAYER_IDS, "cpu", torch.float32)
    head = target_mod.load_head(str(tgt))
    t0 = time.perf_counter()
    feats = td.features(decoder, decoder.layers, [ts["seqs"][i] for i in order], LAYER_IDS, "cpu", batch=32)
    data = [(f, torch.tensor(ts["seqs"][i]), ts["prompt_lens"][i]) for f, i in zip(feats, order)]
    t_feat = time.perf_counter() - t0
    log(f"{which}: cpu features of {len(data)} sequences in {t_feat:.0f} s")
    c10 = [json.loads(line) for line in (assets / FLA / "completions.jsonl").read_text().splitlines() if line]
    evals = []
    for c in c10:
        ids = torch.tensor(c["prompt_ids"] + c["output_ids"])
        evals.append(
            replay.Sequence(
                c["id"], ids, len(c["prompt_ids"]), target_mod.extract(decoder, ids, LAYER_IDS).to(torch.bfloat16)
            )
        )
    del decoder
    name = old.name.rsplit("-step", 1)[0] + "-step{step}"
    step0, init, chunks, k = prev["step"], old, [], 0
    work = Path(os.environ.get("DEMO_WORK", "/tmp/demo-cpu")) / which
    while time.perf_counter() - t_all < minutes * 60:
        t = td.DrafterTraining(
            steps=100_000,
            budget_s=chunk_minutes * 60,
            lr=5e-4,
            warmup=10,
            probe=5,
            seqs_per_step=4,
            anchors_per_seq=48,
            seed=10 + k,
            log_every=20,
            bug=bug,
        )
        rec = td.train(data, head, d, t, work / f"chunk{k}", name, "cpu", log, init=init, step0=step0)[-1]
        init, step0 = work / f"chunk{k}" / rec["name"], rec["step"]
        _, summ = replay.every_anchor(load(init), head, evals, budget=0)
        rec["coding10_tau_macro_torch"] = summ["tau_macro"]
        rec["coding10_tau_pooled_torch"] = summ["tau_pooled"]
        chunks.append(rec)
        log(
            f"{which} chunk {k}: {rec['name']} coding-10 tau macro {summ['tau_macro']:.3f} "
            f"pooled {summ['tau_pooled']:.3f}"
        )
        k += 1
    shutil.rmtree(old)  # the healthy run's last snapshot moves to its new step; a bug keeps its folder
    step = step_of(init.name)
    shutil.copytree(init, old.parent / f"step{step:04d}" if old.parent.name == SERIES and step is not None else old)
    out = {
        "what": f"training continued on the CPU from the GPU checkpoint {old.name}, on torch-path features of "
        f"{len(data)} of the same training sequences (a fresh AdamW per chunk)",
        "from": old.name,
        "to": init.name,
        "feature_seconds": round(t_feat, 1),
        "seconds": round(time.perf_counter() - t_all, 1),
        "torch_threads": torch.get_num_threads(),
        "chunks": [
            {
                k2: c[k2]
                for k2 in (
                    "name",
                    "step",
                    "seconds",
                    "loss",
                    "coding10_tau_macro_torch",
                    "coding10_tau_pooled_torch",
                    "training",
                    "loss_curve",
                )
            }
            for c in chunks
        ],
        "command": f"OMP_NUM_THREADS=1 python -m tools.demo.make_assets cpu-continue --src <gpu out> "
        f"--which {which} --minutes {minutes} --chunk-minutes {chunk_minutes} --seqs {n_seqs}",
    }
    (src / f"cpu-{which}.json").write_text(json.dumps(out, indent=1))
    return out
