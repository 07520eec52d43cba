"""Chain-only lockstep step on the device: one step's time by variant, and the every-anchor chunk.

27B-shaped drafter (the reference shapes of `bench_replay.FULL`), bf16, `--rows` planted sequences x 2,560 tokens
stacked as `replay.lockstep.Lockstep` does; one block per sequence per step, anchors in the middle of the completion,
planted acceptance (mean 5 drafts). Variants: the LM head of every slot or staged (`replay.lockstep.HEAD_STAGES`: only
the slots the walk reads), element-wise work eager or fused (`kernels.Kernels(True)`, torch.compile). Prints per variant
the step's wall and host (launch) time, its fraction of the measured matmul peak on the FLOPs the walk needs (layers +
LM head of the slots read), and the every-anchor chunk (256 blocks of one sequence, every slot) eager and fused, with
the fused states' largest difference from eager.

    python3 benchmarks/bench_chain_step.py [--rows 200]     # CUDA only
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from _common import matmul_tflops, note, report
from bench_replay import FULL, rand_weights
from bench_sweep import needed_flops, plant

from dflash_dash import drafters as dr, replay as rp, target as tg
from dflash_dash.drafters import kernels
from dflash_dash.drafters.dflash import DFlash
from tools import tiny

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--rows", type=int, default=200)
ap.add_argument("--steps", type=int, default=10)
a = ap.parse_args()
if not torch.cuda.is_available():
    sys.exit(f"bench_chain_step.py: needs a CUDA device (CUDA only by design); torch {torch.__version__} sees none")
dev, dtype = "cuda", torch.bfloat16
figs = {"matmul_bf16_tflops": matmul_tflops(dev, 8192)}
peak = figs["matmul_bf16_tflops"]
cfg = tiny.drafter_config(tiny.TinyDrafter(**FULL))
c = dr.parse_config(cfg)
w = rand_weights(dr.shapes(c), dev, dtype, 1)
V, H = FULL["vocab_size"], FULL["hidden_size"]
hw = rand_weights({"e": (V, H), "l": (V, H)}, dev, dtype, 2)
head = tg.Head(hw["e"], hw["l"])
S, T, P = a.rows, 2560, 512
eager = DFlash(c, dr.Weights.from_named(c, w))
feats = torch.randn(S, T, c.K * H, device=dev, generator=torch.Generator(device=dev).manual_seed(3)).to(dtype)
toks = plant(eager, head, feats, P, 5.0, 0)
seqs = [rp.Sequence(f"p{i}", toks[i], P, feats[i]) for i in range(S)]
anchors = torch.full((S,), 1500, device=dev)  # the furthest anchor (`top`) of every step below
rec = torch.zeros(S, dtype=torch.bool, device=dev)


def steps(st, n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        out = st.step(anchors, rec, 1500)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e3, (time.perf_counter() - t0) / n * 1e3, out[0]


fused = DFlash(c, dr.Weights.from_named(c, w))
fused.ops = kernels.Kernels(True)
for name, d in [("eager", eager), ("fused", fused)]:
    for staged in (False, True):
        st = rp.lockstep.Lockstep(d, head, seqs, 4, staged=staged)
        t0 = time.perf_counter()
        steps(st, 2)  # warm (the fused variant compiles here)
        note(f"{name} staged={staged}: warm in {time.perf_counter() - t0:.1f} s")
        host, wall, acc = steps(st, a.steps)
        acc = acc.tolist()
        flops = sum(needed_flops(c, 1500, V, x, T, 0 if staged else 1) for x in acc)
        key = f"step{S}_{name}_{'staged' if staged else 'all'}"
        figs |= {f"{key}_ms": wall, f"{key}_host_ms": host, f"{key}_fraction_of_peak": flops / wall * 1e3 / 1e12 / peak}
        figs[f"step{S}_mean_accepted"] = sum(acc) / len(acc)
        del st
    report(figs)
    figs.clear()

# every-anchor: 256 blocks of one sequence, every slot (the replay's chunk)
kv_e, kv_f = eager.context_kv(feats[0]), fused.context_kv(feats[0])
anc = torch.arange(1280, 1536, device=dev)
emb = rp.head.embed_blocks(eager, head, toks[0], anc)
for name, d, kv in [("eager", eager, kv_e), ("fused", fused, kv_f)]:
    for _ in range(2):
        h = d.blocks(kv, anc, emb, max_anchor=1535)
        rp.head.read_out(d, head, h, toks[0][anc], 8)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        h = d.blocks(kv, anc, emb, max_anchor=1535)
        rp.head.read_out(d, head, h, toks[0][anc], 8)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / 5
    flops = sum(dr.flops_per_block(c, int(p), V) for p in anc.tolist())
    figs |= {f"chunk256_{name}_ms": dt * 1e3, f"chunk256_{name}_fraction_of_peak": flops / dt / 1e12 / peak}
    if name == "eager":
        ref = h.float()
    else:
        figs["chunk256_fused_max_rel_diff"] = ((h.float() - ref).norm() / ref.norm()).item()
        first = toks[0][anc]
        same = rp.head.read_out(d, head, h, first, 1)[0] == rp.head.read_out(eager, head, ref.to(dtype), first, 1)[0]
        figs["chunk256_fused_argmax_agreement"] = same.float().mean().item()
report(figs)
