"""Replay benchmark: the 27B-shaped drafter of a family (DFlash by default) in bf16 over 10 sequences x 2,560 tokens.

Random weights and features at the reference shapes (`FULL`; speed does not depend on their values).
Measures, in one process:
  1. the bf16 matrix rate (8192-cube products) of this device: the ceiling the fractions refer to;
  2. steady-state drafting per chunk size and the LM head's share (informative);
  3. `replay_total_s`: the product's replay steps from files, as `pipeline.replay` runs them -- load the checkpoint
     (`drafters.load`), the target's embedding and LM head (`target.load_head`), the cached features (`cache.read_many`:
     to the device, as the product's worker reads a pass), then `replay.every_anchor` (every-anchor drafts, top-k for
     DDTree, scoring) -- the DuckDB insert of the run is left out;
  4. the one-block-per-forward loop (context K/V cached, as a speculative decoder runs it) and the plain
     reference loop (`replay.draft_loop`, context recomputed) on sampled anchors, with their drafts compared
     to the every-anchor ones.
FLOPs counted: linear layers, attention over the visible keys, LM head, and the per-sequence context
projections (fc, k, v). Usage:

    python benchmarks/bench_replay.py                 # CUDA, reference shapes
    python benchmarks/bench_replay.py --small         # tiny shapes on the CPU (a smoke test)
    python benchmarks/bench_replay.py --family dspark  # DSpark, DFlash2 or Domino at their published 27B configs
                                                      # (figures named with a _dspark suffix)
    python benchmarks/bench_replay.py --quick --tokens 32768 --seqs 2   # long contexts (figures named _32k; _128k
                                                      # for 131072); --path groups|long forces an every-anchor path
    python benchmarks/bench_replay.py --family all --quick --seqs 4 --loop-anchors 16   # the four families in one
                                                      # process against one measured peak (every figure suffixed
                                                      # _dflash, _dspark, ...; a summary block at the end)

DFlash2 also times its plain reference path on the same sequence (`draft_chunkN_reference_*`: the tap-by-tap
convolution and fp32 candidate transform, one block per chunk block; `_reference_kernels_*`: those kernels with
the blocks stacked; `_unstacked_*`: the fast kernels without stacking) and checks fast == reference at fp32 on the
device (`check_fp32_dflash2_*`: the fused convolution and the Triton top-k on CUDA).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import (
    Clock,
    length_suffix,
    matmul_tflops,
    note,
    peak_gib,
    profile,
    report,
    suffixed,
    sync,
    tokens_name,
)
from safetensors.torch import save_file

from dflash_dash import cache, drafters as dr, replay as rp, target as tg
from dflash_dash.drafters import attention
from tools import tiny

# the reference shapes: like the 27B DFlash drafter and its Qwen3.6-27B target
FULL = dict(
    hidden_size=5120,
    intermediate_size=17408,
    num_hidden_layers=5,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=248320,
    block_size=16,
    num_target_layers=64,
    target_layer_ids=[1, 16, 31, 46, 61],
    mask_token_id=248070,
)
# each family's published Qwen3.6-27B config over FULL (SpecForge configs/qwen3.6-27b-{dspark,domino-full-attention,
# dflash2}.json); `small`: the same fields at SMALL's scale
FAMILIES = {
    "dflash": ({}, {}),
    "dspark": (
        dict(
            architecture="DSparkDraftModel",
            target_layer_ids=[2, 17, 32, 47, 62],
            family_fields=dict(
                projector_type="dspark",
                markov_rank=256,
                markov_head_type="vanilla",
                enable_confidence_head=True,
                confidence_head_with_markov=True,
            ),
        ),
        dict(markov_rank=16),
    ),
    "domino": (
        dict(
            family_fields=dict(
                projector_type="domino", pure_draft_prefix_len=1, emb_dim=256, gru_hidden_dim=1024, shift_label=False
            )
        ),
        dict(emb_dim=32, gru_hidden_dim=64),
    ),
    "dflash2": (
        dict(
            architecture="DFlash2DraftModel",
            block_size=8,
            target_layer_ids=[5, 19, 33, 47, 61],
            layer_types=["sliding_attention"] * 5,
            sliding_window=2048,
            family_fields=dict(conv_kernel_size=2, conv_group_size=16, selector_rank=256, selector_top_k=16),
        ),
        dict(selector_rank=16),
    ),
}


def family_shapes(shp: dict, family: str, small: bool) -> dict:
    """`shp` with a family's published fields (at SMALL's scale with `small`); layer lists cut to shp's layers."""
    over, small_fields = FAMILIES[family]
    out = shp | {k: v for k, v in over.items() if k != "family_fields"}
    if "family_fields" in over:
        out["family_fields"] = over["family_fields"] | (small_fields if small else {})
    n, N = out["num_hidden_layers"], out["num_target_layers"]
    if "layer_types" in out:
        out["layer_types"] = out["layer_types"][:n]
    out["target_layer_ids"] = [min(i, N - 1) for i in out["target_layer_ids"]][: max(n, 2)]
    return out


SMALL = dict(
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=4096,
    block_size=16,
    num_target_layers=8,
    target_layer_ids=[1, 5],
    mask_token_id=4000,
)


def args_():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes on the CPU (smoke test)")
    ap.add_argument("--device", default=None, help="default: cuda, or cpu with --small")
    ap.add_argument("--seqs", type=int, default=None, help="sequences (default 10; 3 with --small)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per sequence (default 2560; 160 small)")
    ap.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 512; 32 small)")
    ap.add_argument("--chunk", type=int, default=256, help="blocks per batched call in the timed replay")
    ap.add_argument("--budget", type=int, default=8, help="DDTree budget (top-k per slot)")
    ap.add_argument("--loop-anchors", type=int, default=None, help="anchors timed one block per call")
    ap.add_argument("--profile", action="store_true", help="print the top kernels of one chunk")
    ap.add_argument("--quick", action="store_true", help="steady state at --chunk only (no chunk/backend sweep)")
    ap.add_argument(
        "--prefix-attention",
        default=attention.PREFIX,
        choices=["flash", "cudnn"],
        help="the long path's unmasked prefix kernel (drafters.attention.PREFIX; cudnn: tiles of --tile keys)",
    )
    ap.add_argument("--tile", type=int, default=8192, help="keys per cuDNN call with --prefix-attention cudnn")
    ap.add_argument(
        "--steady-tokens",
        type=int,
        default=None,
        help="time the steady state on the first N tokens of one sequence (default: all; figures named _atNk): "
        "a 131,072-token run then drafts its blocks once cold at N, not twice at full length before the replay",
    )
    ap.add_argument("--work", default=None, help="folder for the checkpoint, head and features")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument(
        "--family",
        default="dflash",
        choices=[*FAMILIES, "all"],
        help="drafter family (published config); all: the four in one process, one after the other",
    )
    ap.add_argument(
        "--path",
        default="auto",
        choices=["auto", "groups", "long"],
        help="every-anchor path: the product's choice by length (auto), the replicated groups, or blocks_run",
    )
    return ap.parse_args()


# ---------------------------------------------------------------------------
# inputs on disk


def rand_weights(shapes: dict, device, dtype, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        t = torch.randn(shape, device=device, dtype=torch.float32, generator=g)
        out[name] = (1.0 + 0.1 * t if len(shape) == 1 else t / shape[-1] ** 0.5).to(dtype)
    return out


def write_inputs(work: Path, shp: dict, n_seq: int, T: int, device, dtype) -> tuple[Path, Path, list]:
    """Checkpoint folder, target folder (config + embedding + LM head only), features in the cache."""
    cfg = tiny.drafter_config(tiny.TinyDrafter(**shp))
    cfg["torch_dtype"] = "bfloat16"
    if shp.get("architecture") == "DFlash2DraftModel":
        cfg["is_causal"] = False  # the released DFlash2: bidirectional blocks in every (sliding) layer
    c = dr.parse_config(cfg)
    ck = work / "drafter"
    ck.mkdir(parents=True)
    w = rand_weights(dr.shapes(c), device, dtype, 1)
    save_file({k: v.cpu().contiguous() for k, v in w.items()}, str(ck / "model.safetensors"))
    (ck / "config.json").write_text(json.dumps(cfg))
    del w
    tgt = work / "target"
    tgt.mkdir()
    V, H = shp["vocab_size"], shp["hidden_size"]
    hw = rand_weights({"model.embed_tokens.weight": (V, H), "lm_head.weight": (V, H)}, device, dtype, 2)
    save_file({k: v.cpu() for k, v in hw.items()}, str(tgt / "model.safetensors"))
    (tgt / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3_5_text",
                "hidden_size": H,
                "vocab_size": V,
                "num_hidden_layers": shp["num_target_layers"],
                "tie_word_embeddings": False,
            }
        )
    )
    del hw
    g = torch.Generator(device=device).manual_seed(3)
    seqs = []
    for i in range(n_seq):
        feats = torch.randn(T, c.K * H, device=device, generator=g).to(dtype)
        cache.write(work / "features", "bench", f"p{i}", feats, {"bench": True})
        seqs.append((f"p{i}", torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(i))))
    return ck, tgt, seqs


# ---------------------------------------------------------------------------
# FLOPs


def ctx_flops(c: dr.DrafterConfig, T: int) -> float:
    """fc over the features and each layer's context k, v projections of one sequence."""
    H = c.hidden_size
    return 2 * T * c.K * H * H + c.num_hidden_layers * 2 * T * H * 2 * c.num_key_value_heads * c.head_dim


def run_flops(c: dr.DrafterConfig, T: int, P: int, n_seq: int) -> float:
    per_seq = sum(dr.flops_per_block(c, p, c.vocab_size) for p in range(P, T)) + ctx_flops(c, T)
    return n_seq * per_seq


# ---------------------------------------------------------------------------
# the one-block loop (cached context) and the plain reference loop


@torch.inference_mode()
def loop_blocks(d, head, feats, tokens, anchors, topk):
    """One block per forward over cached context K/V, drafts read back per block (a decoder's loop)."""
    kv = d.context_kv(feats.to(d.device))
    out = []
    for p in anchors:
        a = torch.tensor([p])
        h = d.blocks(kv, a, rp.head.embed_blocks(d, head, tokens, a))
        out.append([t.cpu() for t in rp.head.read_out(d, head, h, tokens[a], topk)])
    return [torch.cat([o[i] for o in out]) for i in range(3)]


@torch.inference_mode()
def reference_blocks(d, head, feats, tokens, anchors, topk):
    """`replay.draft_loop`'s body (Drafter.block: context recomputed per block) at the given anchors."""
    out = []
    feats = feats.to(d.device)
    for p in anchors:
        emb = rp.head.embed_blocks(d, head, tokens, torch.tensor([p]))[0]
        h = d.block(feats, p, emb)
        out.append([t.cpu() for t in rp.head.read_out(d, head, h[None], tokens[p : p + 1], topk)])
    return [torch.cat([o[i] for o in out]) for i in range(3)]


def agreement(batched: rp.Drafts, P: int, anchors, got) -> dict:
    """Draft agreement of a loop's (drafts, ids, logp) with the every-anchor drafts at `anchors`."""
    rows = torch.tensor(anchors) - P
    ref_tok, ref_lp = batched.tokens[rows], batched.top_logp[rows]
    same = (got[0] == ref_tok).float()
    gap = (ref_lp[..., 0] - ref_lp[..., 1]) if ref_lp.shape[-1] > 1 else torch.full(ref_tok.shape, 1e9)
    decisive = gap > 0.05  # top-1 ahead of top-2 by more than bf16 noise
    return {
        "tokens": same.mean().item(),
        "decisive": same[decisive].mean().item() if decisive.any() else 1.0,
        "max_logp_diff": (got[2] - ref_lp).abs().max().item() if ref_lp.numel() else 0.0,
    }


# ---------------------------------------------------------------------------


def check_fp32(dev, figs: dict) -> None:
    """On this device in fp32 (tiny drafter, sliding layer, uneven chunks): every-anchor == one-block loop."""
    with tempfile.TemporaryDirectory() as tmp:
        ck = tiny.write_drafter(
            Path(tmp) / "d",
            tiny.TinyDrafter(layer_types=["full_attention", "sliding_attention"], sliding_window=5, seed=3),
        )
        m = dr.load(ck, torch.float32, dev)
    g = torch.Generator().manual_seed(0)
    head = tg.Head(torch.randn(512, 64, generator=g).to(dev), torch.randn(512, 64, generator=g).to(dev))
    tokens, feats = torch.randint(0, 512, (70,), generator=g), torch.randn(70, 128, generator=g)
    a = rp.draft_all(m, head, feats, tokens, 9, topk=4, chunk=7)
    b = rp.draft_loop(m, head, feats, tokens, 9, topk=4)
    figs["check_fp32_batched_equals_loop"] = float(
        torch.equal(a.tokens, b.tokens)
        and torch.equal(a.top_ids, b.top_ids)
        and torch.allclose(a.top_logp, b.top_logp, atol=1e-4)
    )
    figs["check_fp32_max_logp_diff"] = (a.top_logp - b.top_logp).abs().max().item()


def check_fp32_dflash2(dev, figs: dict) -> None:
    """On this device in fp32 (tiny block-8 DFlash2, bidirectional sliding layers, uneven chunks): the fast path
    (the fused convolution and one-pass top-k on CUDA, blocks stacked) == the reference path == the one-block loop."""
    from dflash_dash.drafters import dflash2

    fields = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 6}
    d = tiny.TinyDrafter(
        block_size=8,
        layer_types=["sliding_attention"] * 2,
        sliding_window=6,
        seed=4,
        architecture="DFlash2DraftModel",
        family_fields=fields,
    )
    with tempfile.TemporaryDirectory() as tmp:
        m = dr.load(tiny.write_drafter(Path(tmp) / "d", d), torch.float32, dev, sliding_block="bidirectional")
    ref = dflash2.DFlash2(m.c, m.w, m.path, m.sliding_block)
    ref.fast, ref.stack = False, 1
    g = torch.Generator().manual_seed(1)
    head = tg.Head(torch.randn(512, 64, generator=g).to(dev), torch.randn(512, 64, generator=g).to(dev))
    tokens, feats = torch.randint(0, 512, (70,), generator=g), torch.randn(70, 128, generator=g)
    a = rp.draft_all(m, head, feats, tokens, 9, topk=8, chunk=7)
    b = rp.draft_all(ref, head, feats, tokens, 9, topk=8, chunk=7)
    c = rp.draft_loop(ref, head, feats, tokens, 9, topk=8)
    figs["check_fp32_dflash2_fast_equals_reference"] = float(
        all(torch.equal(a.tokens, x.tokens) and torch.equal(a.top_ids, x.top_ids) for x in (b, c))
        and all(torch.allclose(a.top_logp, x.top_logp, atol=1e-4) for x in (b, c))
    )
    live = torch.isfinite(a.top_logp)  # past selector_top_k: padded with -inf on every path
    figs["check_fp32_dflash2_max_logp_diff"] = max((a.top_logp - x.top_logp)[live].abs().max().item() for x in (b, c))


def reference_paths(d, head, feats, tok, P: int, chunk: int, budget: int, per_seq: float, peak: float, dev, figs):
    """DFlash2's steady state on the paths the fast one replaced, the same sequence and chunk, timed in turn (best
    of REPS each, so a busy machine slows every path alike): the fast path as the replay runs it, the reference
    (tap-by-tap convolution, fp32 candidate transform, one block per chunk block), the reference kernels with the
    blocks stacked, the fast kernels without; and the fast drafts' bf16 agreement with the reference's. On the CPU
    also the counted FLOPs per CPU second of this process (`_gflops_per_cpu_s`: what other processes on a busy
    machine take does not count; `--threads 1` makes it the work of one core)."""
    paths = {"fast": (True, d.stack), "reference": (False, 1), "reference_kernels": (False, d.stack)}
    paths["unstacked"] = (True, 1)
    best, out, saved = dict.fromkeys(paths, float("inf")), {}, (d.fast, d.stack)
    cpu = dict.fromkeys(paths, float("inf"))
    try:
        for rep in range(1 + (REPS if dev != "cpu" else 3 * REPS)):  # round 0 warms each path: its cold time
            for name, (d.fast, d.stack) in paths.items():
                c0 = time.process_time()
                with Clock(dev) as clk:
                    out[name] = rp.draft_all(d, head, feats, tok, P, topk=budget, chunk=chunk)
                if rep == 0:
                    figs[f"draft_chunk{chunk}_{name}_cold_s"] = clk.s
                else:
                    best[name] = min(best[name], clk.s)
                    cpu[name] = min(cpu[name], time.process_time() - c0)
    finally:
        d.fast, d.stack = saved
    for name, s in best.items():
        figs[f"draft_chunk{chunk}_{name}_blocks_per_s"] = (len(tok) - P) / s
        figs[f"draft_chunk{chunk}_{name}_fraction_of_peak"] = per_seq / s / 1e12 / peak
        if dev == "cpu":
            figs[f"draft_chunk{chunk}_{name}_gflops_per_cpu_s"] = per_seq / cpu[name] / 1e9
    fast, ref = out["fast"], out["reference"]
    figs["fast_vs_reference_token_agreement"] = (fast.tokens == ref.tokens).float().mean().item()
    figs["fast_vs_reference_max_logp_diff"] = (fast.top_logp[..., 0] - ref.top_logp[..., 0]).abs().max().item()


REPS = 3  # timed rounds of each DFlash2 path in `reference_paths` (3x on the CPU: a busy machine's noise)


def prefix_kernels(shp: dict, T: int, tile: int, dev: str, figs: dict) -> None:
    """The long path's prefix attention at one chunk's shape (256 blocks' queries, grouped-query heads folded into
    rows, over T/2 keys): flash against cuDNN in tiles, their difference and each one's time."""
    nkv, hd = shp["num_key_value_heads"], shp["head_dim"]
    rows = 256 * shp["block_size"] * shp["num_attention_heads"] // nkv
    g = torch.Generator(device=dev).manual_seed(9)
    q, k, v = (
        torch.randn(1, nkv, n, hd, generator=g, device=dev, dtype=torch.bfloat16) for n in (rows, T // 2, T // 2)
    )
    ref = attention.attend(q, k, v)
    got = attention.prefix(q, k, v)
    figs["prefix_cudnn_max_abs_err"] = (got[0].float() - ref[0].float()).abs().max().item()
    figs["prefix_cudnn_lse_max_abs_err"] = (got[1] - ref[1]).abs().max().item()
    for name, fn in (("flash", attention.attend), ("cudnn", attention.prefix)):
        fn(q, k, v)
        with Clock(dev) as c:
            for _ in range(5):
                fn(q, k, v)
        figs[f"prefix_{name}_ms"] = c.s / 5 * 1e3
        figs[f"prefix_{name}_tflops"] = 4 * nkv * rows * (T // 2) * hd / (c.s / 5) / 1e12


def measure(a, figs: dict, family: str, peak: float | None = None) -> None:
    """One family's figures into `figs`; `peak`: the device's measured matrix rate (measured here, with the tiny
    fp32 checks, when None)."""
    if a.path != "auto":  # the product picks by length (`replay.every.LONG`); force one path
        rp.every.LONG = 0 if a.path == "long" else 1 << 40
    attention.PREFIX, attention.TILE = a.prefix_attention, a.tile
    shp = family_shapes(SMALL if a.small else FULL, family, a.small)
    dev = a.device or ("cpu" if a.small else "cuda")
    n_seq, T = a.seqs or (3 if a.small else 10), a.tokens or (160 if a.small else 2560)
    P = a.prompt or (32 if a.small else 512)
    n_loop = a.loop_anchors or (8 if a.small else 96)
    dtype = torch.bfloat16
    if peak is None:
        peak = device_checks(a, figs, dev, [family])

    base = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="dflash-replay-", dir=scratch()))
    work = base / "w"
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.perf_counter()
    ck, tgt, items = write_inputs(work, shp, n_seq, T, dev, dtype)
    note(f"inputs written to {work} in {time.perf_counter() - t0:.1f} s (not timed)")
    c = dr.read_config(ck)
    flops = run_flops(c, T, P, n_seq)
    blocks = n_seq * (T - P)

    if a.prefix_attention == "cudnn" and dev.startswith("cuda"):
        prefix_kernels(shp, T, a.tile, dev, figs)

    # -- 2. steady state per chunk size (also warms kernels, cuBLAS and the Triton LSE) ----------------
    d = dr.load(ck, dtype, dev)
    head = tg.load_head(tgt, dev, dtype)
    Ts = min(a.steady_tokens or T, T)  # the steady state's length
    feats0 = cache.read(work / "features", "bench", "p0", T, c.K * c.hidden_size)[:Ts]
    tok0 = items[0][1][:Ts]
    per_seq = run_flops(c, Ts, P, 1)
    at = "" if Ts == T else f"_at{tokens_name(Ts)}"
    best = None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    variants = [(c, None) for c in ([16, 64] if a.small else [64, 128, 256, 512])]
    variants += [(a.chunk, SDPBackend.EFFICIENT_ATTENTION)] if not a.small else []
    if a.quick:
        variants = [(a.chunk, None)]
    for chunk, backend in variants:
        name = f"draft_chunk{chunk}" + (f"_{backend.name.lower()}" if backend else "") + at
        with sdpa_kernel([backend]) if backend else contextlib.nullcontext():
            with Clock(dev) as cold:  # first call at these shapes: kernel selection, plans, compilation
                rp.draft_all(d, head, feats0, tok0, P, topk=a.budget, chunk=chunk)
            with Clock(dev) as clk:
                rp.draft_all(d, head, feats0, tok0, P, topk=a.budget, chunk=chunk)
        figs[f"{name}_cold_s"] = cold.s
        figs[f"{name}_blocks_per_s"] = (T - P) / clk.s
        figs[f"{name}_fraction_of_peak"] = per_seq / clk.s / 1e12 / peak
        best = max(best or (0, 0), (figs[f"{name}_fraction_of_peak"], name))
    if hasattr(d, "fast"):  # DFlash2: the paths the fast one replaced
        reference_paths(d, head, feats0, tok0, P, a.chunk, a.budget, per_seq, peak, dev, figs)
    with torch.inference_mode():  # the LM head's share at the timed chunk size (blocks stacked as the replay does)
        anchors = torch.arange(P, min(P + a.chunk * d.stack, Ts))
        emb = rp.head.embed_blocks(d, head, tok0, anchors)
        kv = d.context_kv(feats0.to(dev))
        h = d.blocks(kv, anchors, emb)
        with Clock(dev) as cb:
            for _ in range(3):
                h = d.blocks(kv, anchors, emb)
        with Clock(dev) as ch:
            for _ in range(3):
                rp.head.read_out(d, head, h, tok0[anchors], a.budget)
        figs["chunk_blocks_ms"], figs["chunk_head_ms"] = cb.s / 3 * 1e3, ch.s / 3 * 1e3
        if a.profile:
            profile(  # bound now: these are deleted below
                lambda d=d, head=head, kv=kv, emb=emb: rp.head.read_out(
                    d, head, d.blocks(kv, anchors, emb), tok0[anchors], a.budget
                ),
                dev,
            )
        drafted = h[:64, c.first_slot : c.first_slot + c.drafts]  # fused top-k kernel vs torch
        logits = drafted.reshape(-1, c.hidden_size) @ head.lm_head.T
        am, ids, lp = rp.top_logp(logits, a.budget)
        top = logits.topk(a.budget, dim=-1)
        ref_lp = top.values.float() - torch.logsumexp(logits.float(), -1)[:, None]
        figs["topk_argmax_equal"] = float(torch.equal(am, logits.argmax(-1)))
        figs["topk_ids_agreement"] = (ids == top.indices).float().mean().item()  # torch orders ties freely
        srt = torch.sort(logits.float(), dim=-1, descending=True, stable=True)
        figs["topk_equals_stable_sort"] = float(torch.equal(ids, srt.indices[:, : a.budget]))
        del srt
        figs["topk_logp_max_abs_err"] = (lp - ref_lp).abs().max().item()
    note(f"best steady-state chunk: {best[1]}")
    del d, head, kv, h, emb, logits, top
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)

    # -- 3. the product's replay, from files ---------------------------------------------------------
    sync(dev)
    t0 = time.perf_counter()
    d = dr.load(ck, dtype, dev)
    sync(dev)
    t1 = time.perf_counter()
    head = tg.load_head(tgt, dev, dtype)
    sync(dev)
    t2 = time.perf_counter()
    feats = cache.read_many(work / "features", "bench", [(pid, T) for pid, _ in items], c.K * c.hidden_size, dev)
    seqs = [rp.Sequence(pid, tok, P, f) for (pid, tok), f in zip(items, feats)]  # on the device, as the worker reads
    sync(dev)
    t3 = time.perf_counter()
    results, summary = rp.every_anchor(d, head, seqs, budget=a.budget, chunk=a.chunk)
    sync(dev)
    t4 = time.perf_counter()
    figs |= {
        "replay_total_s": t4 - t0,
        "replay_load_drafter_s": t1 - t0,
        "replay_load_head_s": t2 - t1,
        "replay_read_features_s": t3 - t2,
        "replay_run_s": t4 - t3,
        "replay_chunk": a.chunk,
        "replay_blocks": blocks,
        "replay_blocks_per_s": blocks / (t4 - t3),
        "replay_tflops": flops / (t4 - t3) / 1e12,
        "replay_fraction_of_peak": flops / (t4 - t3) / 1e12 / peak,
        "replay_peak_mem_gib": peak_gib(dev),
    }
    assert len(results) == n_seq and summary["rounds"] > 0

    # -- 4. loops on sampled anchors, drafts compared with the every-anchor ones ---------------------
    batched = rp.draft_all(d, head, seqs[0].features, seqs[0].tokens, P, topk=a.budget, chunk=a.chunk)
    anchors = np.linspace(P, T - 1, n_loop).round().astype(int).tolist()
    loop_blocks(d, head, seqs[0].features, seqs[0].tokens, anchors, a.budget)  # warm-up: every shape once
    with Clock(dev) as cl:
        got = loop_blocks(d, head, seqs[0].features, seqs[0].tokens, anchors, a.budget)
    ag = agreement(batched, P, anchors, got)
    figs |= {
        "loop_blocks_per_s": n_loop / cl.s,
        "loop_ms_per_block": cl.s / n_loop * 1e3,
        "loop_fraction_of_peak": sum(dr.flops_per_block(c, p, c.vocab_size) for p in anchors) / cl.s / 1e12 / peak,
        "replay_speedup_vs_loop": figs["replay_blocks_per_s"] / (n_loop / cl.s),
        "loop_token_agreement": ag["tokens"],
        "loop_decisive_agreement": ag["decisive"],
        "loop_max_logp_diff": ag["max_logp_diff"],
    }
    t = time.perf_counter()
    rp.score("s", batched, seqs[0].tokens.numpy(), P, a.budget)
    figs["score_one_sequence_s"] = time.perf_counter() - t
    ref_anchors = anchors[:: max(1, len(anchors) // 8)][:8]
    reference_blocks(d, head, seqs[0].features, seqs[0].tokens, ref_anchors[:1], a.budget)  # warm-up
    with Clock(dev) as cr:
        got = reference_blocks(d, head, seqs[0].features, seqs[0].tokens, ref_anchors, a.budget)
    ag = agreement(batched, P, ref_anchors, got)
    figs |= {
        "reference_loop_blocks_per_s": len(ref_anchors) / cr.s,
        "replay_speedup_vs_reference_loop": figs["replay_blocks_per_s"] / (len(ref_anchors) / cr.s),
        "reference_token_agreement": ag["tokens"],
        "reference_decisive_agreement": ag["decisive"],
        "reference_max_logp_diff": ag["max_logp_diff"],
    }
    if not a.work:
        shutil.rmtree(base, ignore_errors=True)
    note(
        f"{n_seq} x {T} tokens (prompt {P}), {blocks} blocks, budget {a.budget}, "
        f"{flops / 1e15:.3f} PFLOP counted; drafter {shp['hidden_size']}x{shp['num_hidden_layers']} layers; "
        f"every-anchor path {'long (blocks_run)' if T > rp.every.LONG else 'groups (blocks_in_place)'}"
        + (f", prefix attention cudnn in tiles of {a.tile} keys" if a.prefix_attention == "cudnn" else "")
        + (f"; kernels that failed: {sorted(attention._FAILED)}" if attention._FAILED else "")
    )


def device_checks(a, figs: dict, dev: str, families: list[str]) -> float:
    """The device's measured bf16 matrix rate (the ceiling every fraction refers to) and the tiny fp32 checks."""
    if dev.startswith("cuda"):
        note(f"device {torch.cuda.get_device_name(dev)}; torch {torch.__version__}")
    peak = matmul_tflops(dev, 1024 if a.small else 8192)
    figs["matmul_bf16_tflops"] = peak
    check_fp32(dev, figs)
    if "dflash2" in families:
        check_fp32_dflash2(dev, figs)
    return peak


SUMMARY = (  # figures repeated in the summary block of --family all
    "replay_fraction_of_peak",
    "replay_run_s",
    "replay_blocks_per_s",
    "draft_chunk{chunk}_fraction_of_peak",
    "draft_chunk{chunk}_reference_fraction_of_peak",
)


def scratch() -> str | None:
    """Where the inputs are written: /dev/shm (page-cache speed) when it has room for a family's at the reference
    shapes, else the system's temporary folder."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and shutil.disk_usage(shm).free > 16 << 30 else None


def measure_all(a) -> int:
    """Every family in this process, one after the other, against one measured peak: each family's figures
    printed as it finishes (suffixed with its name), then a summary block; 1 if a family failed."""
    dev = a.device or ("cpu" if a.small else "cuda")
    shared: dict = {}
    peak = device_checks(a, shared, dev, list(FAMILIES))
    report(shared)
    summary, failed = {}, 0
    root = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="dflash-replay-", dir=scratch()))
    for family in FAMILIES:
        figs: dict = {}
        t0 = time.perf_counter()
        one = argparse.Namespace(**(vars(a) | {"work": str(root / family)}))  # each family's inputs apart
        stop = False
        try:
            measure(one, figs, family, peak)
        except KeyboardInterrupt:  # a timeout's SIGINT: this family's figures so far and the summary, then stop
            note(f"{family} interrupted")
            failed, stop = 1, True
        except Exception as e:  # noqa: BLE001  (the next family still runs; this one's figures so far are printed)
            note(f"{family} failed: {type(e).__name__}: {e}")
            failed = 1
        finally:
            if not a.work:  # 6 GB of inputs a family at the reference shapes
                shutil.rmtree(root / family, ignore_errors=True)
        figs["family_wall_s"] = time.perf_counter() - t0
        figs = suffixed(figs, family)
        if length := length_suffix(a.tokens, a.small):
            figs = suffixed(figs, length)
        report(figs)
        summary |= {k: v for k, v in figs.items() if k.startswith(tuple(n.format(chunk=a.chunk) for n in SUMMARY))}
        if stop:
            break
        if dev.startswith("cuda"):
            torch.cuda.empty_cache()
    if dev.startswith("cuda") and not stop:
        summary["matmul_bf16_tflops_after"] = matmul_tflops(dev, 8192)  # the peak again: did the clock drift?
    if not a.work:
        shutil.rmtree(root, ignore_errors=True)
    note("summary: every family on this device in this process")
    report(summary)
    return failed


def main():
    figs: dict = {}
    a = args_()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.family == "all":
        raise SystemExit(measure_all(a))
    try:
        measure(a, figs, a.family)
    finally:
        if a.family != "dflash":  # the family's figures beside DFlash's in RESULTS
            figs = suffixed(figs, a.family)
        if length := length_suffix(a.tokens, a.small):  # a long run's figures beside 2,560's
            figs = suffixed(figs, length)
        report(figs)  # what was measured, also when a later stage failed


if __name__ == "__main__":
    main()
