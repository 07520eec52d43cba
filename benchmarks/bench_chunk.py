"""Where the every-anchor replay's device time goes (the goal: `replay_fraction_of_peak` >= 0.70).

27B-shaped drafter (`bench_replay.FULL`), bf16, random weights, one sequence of 2,560 tokens (prompt 512) drafted at
every anchor as `replay.draft_all` does it (context K/V once, then chunks of `--chunk` blocks, LM head and top-k).
Prints, in one process so that the variants share one machine:
  1. the bf16 matrix rate (8192-cube products): the ceiling the fractions refer to;
  2. each matrix product of a chunk at its own shape (`gemm_*`: TFLOP/s), and the chunk's products alone
     (`chunk_gemm_floor_ms`): what the chunk would take if nothing but its products ran;
  3. `draft_all` of the sequence per variant (`seq_<variant>_fraction_of_peak`, FLOPs as bench_replay counts
     them): the product as it is (`base`); the context concatenated per call instead of computed once (`concat`); the
     element-wise kernels compiled with every dim dynamic, the last included (`dynamic_compile`); the top-k over
     tiles of 8,192 logits (`top8192`); the memory-efficient attention kernel instead of cuDNN (`efficient`);
     then ten sequences back to back (`sustained10`) and `replay.every_anchor` over the same ten (`run10`), also with
     Python's thread switch interval at 100 us (`run10_switch100us`) and with scoring left out (`run10_noscore`);
  4. with `--profile`: the device kernels of one `draft_all` grouped by kind, and the device's busy share.

    python3 benchmarks/bench_chunk.py [--profile] [--reps 3]      # CUDA only
"""

import argparse
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from _common import Clock, matmul_tflops, note, report  # noqa: E402
from bench_replay import FULL, rand_weights, run_flops  # noqa: E402

from dflash_dash import (
    drafters as dr,  # noqa: E402
    replay as rp,
    target as tg,
)
from dflash_dash.drafters import kernels, readout
from dflash_dash.drafters.dflash import DFlash
from tools import tiny  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--chunk", type=int, default=256)
ap.add_argument("--reps", type=int, default=3, help="timed draft_all calls per variant (after one warm call)")
ap.add_argument("--profile", action="store_true")
a = ap.parse_args()
if not torch.cuda.is_available():
    sys.exit(f"bench_chunk.py: needs a CUDA device (CUDA only by design); torch {torch.__version__} sees none")
dev, dtype = "cuda", torch.bfloat16
figs: dict = {"matmul_bf16_tflops": matmul_tflops(dev, 8192)}
peak = figs["matmul_bf16_tflops"]
c = dr.parse_config(tiny.drafter_config(tiny.TinyDrafter(**FULL)))
H, I, V, nh, nkv, hd, B = (
    c.hidden_size,
    c.intermediate_size,
    c.vocab_size,
    c.num_attention_heads,
    c.num_key_value_heads,
    c.head_dim,
    c.block_size,
)
T, P = 2560, 512
M = a.chunk * B  # rows of a chunk's products


# -- 2. the chunk's matrix products at their shapes -------------------------------------------------------


def gemm_ms(m, n, k, reps=10):
    x, w = torch.randn(m, k, device=dev, dtype=dtype), torch.randn(n, k, device=dev, dtype=dtype)
    for _ in range(3):
        x @ w.T
    with Clock(dev) as clk:
        for _ in range(reps):
            x @ w.T
    ms = clk.s / reps * 1e3
    figs[f"gemm_{m}x{n}x{k}_tflops"] = 2 * m * n * k / ms / 1e9
    return ms


layer = {
    "q": (M, nh * hd, H),
    "k": (M, nkv * hd, H),
    "v": (M, nkv * hd, H),
    "o": (M, H, nh * hd),
    "gate": (M, I, H),
    "up": (M, I, H),
    "down": (M, H, I),
}
ms_layers = sum(gemm_ms(*s) for s in layer.values()) * c.num_hidden_layers
rows = a.chunk * (B - 1)
ms_head = sum(gemm_ms(min(readout.HEAD_ROWS, rows - r), V, H) for r in range(0, rows, readout.HEAD_ROWS))
gemm_ms(V, readout.HEAD_ROWS, H)  # the LM head transposed (vocabulary rows): informative
figs |= {"chunk_layers_gemm_ms": ms_layers, "chunk_head_gemm_ms": ms_head, "chunk_gemm_floor_ms": ms_layers + ms_head}
report(figs)
figs.clear()

# -- 3. draft_all per variant -----------------------------------------------------------------------------

w = rand_weights(dr.shapes(c), dev, dtype, 1)
hw = rand_weights({"e": (V, H), "l": (V, H)}, dev, dtype, 2)
head = tg.Head(hw["e"], hw["l"])
g = torch.Generator(device=dev).manual_seed(3)
feats = torch.randn(T, c.K * H, device=dev, generator=g).to(dtype)
toks = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(0))
flops = run_flops(c, T, P, 1)
d = DFlash(c, dr.Weights.from_named(c, w))
del w


def concat_draft(d, head, features, tokens, prompt_len, topk, chunk):
    """The every-anchor path without the context computed once: each call concatenates [context ; blocks] per group
    of 16."""
    kv, parts = d.context_kv(features), []
    for s in range(prompt_len, len(tokens), chunk):
        e = min(s + chunk, len(tokens))
        anchors = torch.arange(s, e, device=dev)
        emb = rp.head.embed_blocks(d, head, tokens, anchors)
        h = d.blocks(kv, anchors, emb, max_anchor=e - 1)
        parts.append(rp.head.read_out(d, head, h, tokens.to(anchors.device)[anchors], topk))
    return rp.head.to_host(parts)


def timed(name, d, ctx=contextlib.nullcontext, fn=None):
    fn = fn or (lambda: rp.draft_all(d, head, feats, toks, P, topk=8, chunk=a.chunk))
    with ctx(), torch.inference_mode():
        with Clock(dev) as first:
            out = fn()  # warm: every shape once
        with Clock(dev) as clk:
            for _ in range(a.reps):
                fn()
    cold, s = first.s, clk.s / a.reps
    figs[f"seq_{name}_ms"] = s * 1e3
    figs[f"seq_{name}_cold_s"] = cold
    figs[f"seq_{name}_fraction_of_peak"] = flops / s / 1e12 / peak
    report(figs)
    figs.clear()
    return out


from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

ref = timed("base", d)
other = timed("concat", d, fn=lambda: concat_draft(d, head, feats, toks, P, 8, a.chunk))
figs["tail_vs_concat_draft_agreement"] = (ref.tokens == other.tokens).float().mean().item()
saved_ops = d.ops
d.ops = kernels.Kernels(False)
d.ops.rmsnorm, d.ops.norm_rope, d.ops.silu_mul, d.ops.add_norm = (  # every dim dynamic, the last included
    torch.compile(f, dynamic=True, options={"deterministic": True})
    for f in (kernels.rmsnorm, kernels.norm_rope, kernels.silu_mul, kernels.add_norm)
)
timed("dynamic_compile", d)
d.ops = saved_ops
readout.TOP_BLOCK, readout.TOP_WARPS = 8192, 16
other = timed("top8192", d)
figs["top8192_equal_ids"] = float(torch.equal(ref.top_ids, other.top_ids))
readout.TOP_BLOCK, readout.TOP_WARPS = 4096, 8
timed("efficient", d, ctx=lambda: sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]))

# sustained: ten sequences back to back (clocks under a long load), then replay.every_anchor over the same ten
n = 10
seqs = [
    rp.Sequence(f"p{i}", torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(i)), P, feats)
    for i in range(n)
]
with torch.inference_mode(), Clock(dev) as clk:
    for sq in seqs:
        rp.draft_all(d, head, sq.features, sq.tokens, P, topk=8, chunk=a.chunk)
figs["sustained10_seq_ms"] = clk.s / n * 1e3


def run10(name):
    with Clock(dev) as clk:
        rp.every_anchor_results(d, head, seqs, budget=8, chunk=a.chunk)
    dt = clk.s
    figs.update({f"{name}_seq_ms": dt / n * 1e3, f"{name}_fraction_of_peak": flops * n / dt / 1e12 / peak})


run10("run10")
switch = sys.getswitchinterval()
sys.setswitchinterval(1e-4)
run10("run10_switch100us")
sys.setswitchinterval(switch)
score = rp.every.score  # what `every_anchor` calls (looked up in `replay.every`)
rp.every.score = lambda *args: None
run10("run10_noscore")
rp.every.score = score
report(figs)
figs.clear()

# -- 4. profile ------------------------------------------------------------------------------------------

if a.profile:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pr:
        t0 = time.perf_counter()
        rp.draft_all(d, head, feats, toks, P, topk=8, chunk=a.chunk)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    kinds: dict[str, float] = {}
    busy = 0.0
    for e in pr.key_averages():
        us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if not us or e.device_type.name != "CUDA":
            continue
        n = e.key.lower()
        kind = (
            "gemm"
            if any(s in n for s in ("gemm", "sm90", "cutlass", "nvjet", "xmma"))
            else "attention"
            if any(s in n for s in ("cudnn", "fmha", "attention", "flash"))
            else "top_rows"
            if "top_rows" in n
            else "triton_fused"
            if "triton" in n
            else "copy"
            if any(s in n for s in ("copy", "cat", "memcpy", "memset"))
            else "other"
        )
        kinds[kind] = kinds.get(kind, 0.0) + us / 1e3
        busy += us / 1e3
    figs |= {f"profile_{k}_ms": v for k, v in sorted(kinds.items())}
    figs |= {"profile_wall_ms": wall * 1e3, "profile_device_busy_ms": busy}
    print(pr.key_averages().table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=90), flush=True)
note(f"chunk {a.chunk}, {T} tokens (prompt {P}), {flops / 1e12:.1f} TFLOP counted per sequence")
report(figs)
