"""Cost-table benchmark: the product's `profile` of the 27B target and the 27B DFlash drafter (SPEC section 8).

The target is bench_extract's Qwen3_5TextConfig model (64 layers, every 4th full attention, hidden 5120, vocab
248320) with random bf16 weights built on the GPU, handed to the profile in place of `replay.profile.load_target`'s
load from disk (its kernels bound as that function binds them: fla on CUDA, asserted), so what is timed is the
profile itself, not a 54 GB load. The drafter is bench_replay's 27B DFlash shape (5 layers, block 16, ids
[1, 16, 31, 46, 61]) written as a checkpoint folder of random bf16 weights and loaded by the profile
(`drafters.load`). Then `replay.profile.profile` (what `profile --target DIR --drafter CKPT --device cuda` runs,
`pipeline.speed` keeping its table) times the target's forward of q new tokens after c cached tokens for each
--contexts and --sizes (q = 1..16 from the drafter's block, plus the sizes asked for) and the drafter's block (and
a DDTree of --tree-budget) at each c. Each target row prints as soon as its context is done (SIGINT: the rows so
far); then the drafter's.

    python benchmarks/bench_profile.py             # CUDA, 27B shapes (about 60 GB of GPU memory)
    python benchmarks/bench_profile.py --small     # tiny shapes on the CPU (a smoke test)

Figures: target_c{c}_q{q}_ms (median forward), draft_c{c}_ms (one block), tree_b{b}_c{c}_ms,
speedup_per_tau_c{c} (t_target(1) / (t_draft + t_target(B)): the predicted speedup is tau times it, `costs.speedup_at`
at tau 1), verify_q16_over_q1_c{c}, profile_backend, build_s, profile_s.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from _common import note, peak_gib, report
from bench_extract import FULL as TARGET, SMALL as TARGET_SMALL, backend, build
from bench_replay import FULL as DRAFTER, rand_weights
from safetensors.torch import save_file

from dflash_dash import costs, drafters as dr
from dflash_dash.replay import profile as prof
from tools import tiny

# the small drafter: bench_extract's SMALL target's hidden size and vocabulary, 8 target layers
DRAFTER_SMALL = DRAFTER | dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    num_target_layers=8,
    target_layer_ids=[1, 5],
    mask_token_id=500,
)


def args_():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes on the CPU (smoke test)")
    ap.add_argument("--contexts", default=None, help="context lengths c (default 512,2048,8192; 64,256 small)")
    ap.add_argument("--sizes", default="32,64", help="new-token counts q beside 1..B (the drafter's block)")
    ap.add_argument("--repeats", type=int, default=5, help="timed forwards per point (their median)")
    ap.add_argument("--tree-budget", type=int, default=8, help="DDTree budget timed (0: none)")
    ap.add_argument("--work", default=None, help="folder for the checkpoint (default: a temporary folder)")
    return ap.parse_args()


def checkpoint(root: Path, shp: dict, device: str, dtype) -> Path:
    """A DFlash checkpoint folder of random weights at shapes `shp` (bench_replay's drafter)."""
    cfg = tiny.drafter_config(tiny.TinyDrafter(**shp))
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    ck = root / "drafter"
    ck.mkdir(parents=True, exist_ok=True)
    w = rand_weights(dr.shapes(dr.parse_config(cfg)), device, dtype, 1)
    save_file({k: v.cpu().contiguous() for k, v in w.items()}, str(ck / "model.safetensors"))
    (ck / "config.json").write_text(json.dumps(cfg))
    return ck


def main():
    a = args_()
    dev = "cpu" if a.small else "cuda:0"
    dtype = torch.float32 if a.small else torch.bfloat16
    tshp, dshp = (TARGET_SMALL, DRAFTER_SMALL) if a.small else (TARGET, DRAFTER)
    contexts = tuple(int(x) for x in (a.contexts or ("64,256" if a.small else "512,2048,8192")).split(","))
    sizes = tuple(int(x) for x in a.sizes.split(",") if x)
    figs: dict = {}
    try:
        t0 = time.perf_counter()
        model = build(tshp, tshp["num_hidden_layers"], dev, dtype, tokens=max(contexts) + max((*sizes, 64)))
        bound = backend(dev)
        figs["build_s"] = time.perf_counter() - t0
        if not a.small:
            note(f"device {torch.cuda.get_device_name(0)}; torch {torch.__version__}; backend {bound}")
        prof.load_target = lambda *args, **kw: (model, bound)  # the built model, not a 54 GB load from disk
        inner = prof.context_times

        def rows(model_, ids, c, sizes_, repeats):  # each context's rows printed as soon as they are timed
            got = inner(model_, ids, c, sizes_, repeats)
            report({f"target_c{c}_q{q}_ms": s * 1e3 for c, q, s in got})
            return got

        prof.context_times = rows
        with tempfile.TemporaryDirectory(dir=a.work) as tmp:
            ck = checkpoint(Path(tmp), dshp, dev, dtype)
            (Path(tmp) / "target").mkdir()
            t0 = time.perf_counter()
            tab = prof.profile(
                Path(tmp) / "target", ck, dev, str(dtype).removeprefix("torch."), contexts, sizes, a.repeats,
                a.tree_budget,
            )  # fmt: skip
            figs["profile_s"] = time.perf_counter() - t0
        B = int(tab.meta["block_size"])
        for c, s in tab.draft:
            figs[f"draft_c{c}_ms"] = s * 1e3
        for b, c, s in tab.tree:
            figs[f"tree_b{b}_c{c}_ms"] = s * 1e3
        for c in contexts:
            figs[f"speedup_per_tau_c{c}"] = costs.speedup_at(tab, 1.0, c, B)
            figs[f"verify_q{B}_over_q1_c{c}"] = tab.t_target(B, c) / tab.t_target(1, c)
        figs["profile_backend"] = tab.backend
        figs["profile_device"] = tab.device
        if not a.small:
            figs["peak_gib"] = peak_gib(dev)
    finally:
        report(figs)


if __name__ == "__main__":
    main()
