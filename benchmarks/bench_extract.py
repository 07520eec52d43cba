"""Extraction benchmark: the 27B-shaped qwen3_5_text target in bf16 over 10 x 2,560 tokens.

Random weights at the reference shapes (Qwen3.6-27B), built on the GPU from a Qwen3_5TextConfig (nothing is
downloaded; speed does not depend on the values). fla kernels are asserted on CUDA. One GPU:
  - plain:   `model(input_ids)` of the whole model (LM head and full logits included), the needed layers'
             hidden states kept by hooks (as `output_hidden_states=True` keeps them, without all 64 held);
  - product: the model cut after the last needed layer without LM head, exactly as `target.load` leaves
             it, through `target.extract_stream` with `cache.write` as the writer -- features copied to
             pinned memory and written (bf16 safetensors, fsync, rename) while the next sequence runs --
             i.e. `pipeline.extract`'s loop without the DuckDB rows;
  - forward only: `target.extract` per sequence with nothing copied or written (informative).
With --gpus 2 (needs two GPUs): one process per GPU, each with its own copy of the cut model; GPU 0 first
extracts the whole set alone, then both extract half each; the scaling is the ratio of the two walls.
FLOPs counted: every linear layer that runs (LM head in the plain forward) and the causal attention of
the full-attention layers; the Gated DeltaNet recurrence and the convolutions are not counted (< 1%).

    python benchmarks/bench_extract.py              # one GPU
    python benchmarks/bench_extract.py --gpus 2     # two GPUs
    python benchmarks/bench_extract.py --small      # tiny shapes on the CPU (a smoke test)
    python benchmarks/bench_extract.py --tokens 32768 --seqs 4    # long contexts: figures named _32k (_128k)
    python benchmarks/bench_extract.py --first-call --tokens 131072   # a fresh process's first extraction vs warm
    python benchmarks/bench_extract.py --first-call --tokens 131072 --no-pin   # ... with fla's norms re-tuned
--first-call compiles into a fresh Triton cache (TRITON_CACHE_DIR, unless set), so an earlier run's kernels on
this machine do not hide the first call's compiles. With TRITON_CACHE_DIR set to the folder of an earlier run, it is
a returning user's new process instead: the kernels and fla's tunings (fla keeps them on disk, FLA_CACHE_RESULTS)
come from that cache; `triton_cache_files_at_start` says which of the two a run was (0: cold).
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path

import torch
from _common import Clock, length_suffix, matmul_tflops, note, peak_gib, profile, report, suffixed, sync

from dflash_dash import cache, target as tg

LAYER_IDS = [1, 16, 31, 46, 61]
FULL = dict(
    vocab_size=248320,
    hidden_size=5120,
    intermediate_size=17408,
    num_hidden_layers=64,
    num_attention_heads=24,
    num_key_value_heads=4,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=48,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
)
SMALL = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
)
SMALL_IDS = [1, 3, 5]


def args_():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes on the CPU (smoke test)")
    ap.add_argument("--gpus", type=int, default=1, help="1, or 2 for the data-parallel scaling run")
    ap.add_argument("--seqs", type=int, default=None, help="sequences (default 10; 4 with --small)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per sequence (default 2560; 64 small)")
    ap.add_argument("--depth", type=int, default=2, help="file writes in flight")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="print the top kernels of one cut forward (of the first call, with --first-call)",
    )
    ap.add_argument(
        "--first-call",
        action="store_true",
        help="only the product's first extraction in this fresh process against its warm one (same sequence)",
    )
    ap.add_argument(
        "--no-pin",
        action="store_true",
        help="leave fla's length-bucketed norm tuners to re-tune at each new length (`target.pin_buckets` off)",
    )
    ap.add_argument(
        "--lean",
        action="store_true",
        help="only the plain forward and the product's extraction (extract_speedup_vs_plain): no product-kernel "
        "plain forward, forward-only, no-write or fp32 runs (a short device budget)",
    )
    ap.add_argument("--work", default="/tmp/dflash-bench-extract", help="workspace the features go to")
    return ap.parse_args()


# ---------------------------------------------------------------------------
# model


def config(shp: dict, layers: int, tokens: int = 0):
    from transformers import AutoConfig

    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    return AutoConfig.for_model(
        "qwen3_5_text",
        **(shp | {"num_hidden_layers": layers}),
        layer_types=types,
        linear_conv_kernel_dim=4,
        max_position_embeddings=max(32768, tokens),  # covers the run's sequences
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
    )


def build(shp: dict, layers: int, device: str, dtype=torch.bfloat16, tokens: int = 0):
    """A random qwen3_5_text causal LM built directly on `device`, its positions covering `tokens`."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config(shp, layers, tokens), dtype=dtype)
    return model.eval()


def transformers_kernels() -> None:
    """Rebind what transformers itself bound at import (undoes `target.use_backend`)."""
    tg.restore_import_bindings()


def cut(model, layer_ids: list[int]):
    """What `target.load` returns: the decoder cut after max(layer_ids), the LM head gone."""
    keep = max(layer_ids) + 1
    text = model.config
    text.num_hidden_layers, text.layer_types = keep, text.layer_types[:keep]
    decoder = model.get_decoder()
    decoder.layers = decoder.layers[:keep]
    del model.lm_head
    assert len(tg._layers(decoder)) == keep
    return decoder


def backend(device: str) -> str:
    """Bind the kernels as `target.load` does; on CUDA fla must really be bound."""
    got = tg.use_backend(tg.pick_backend(device))
    if device.startswith("cuda"):
        assert got == "fla", f"fla kernels not bound (got {got})"
    return got


def flops(layers, T: int, lm_head=None) -> float:
    """Linear layers (+ LM head) over T tokens plus causal attention of the full-attention layers."""
    total = 0.0
    for layer in layers:
        for m in layer.modules():
            if isinstance(m, torch.nn.Linear):
                total += 2 * T * m.in_features * m.out_features
        attn = getattr(layer, "self_attn", None)
        if attn is not None:
            nh = attn.config.num_attention_heads
            total += 2 * T * (T + 1) * attn.head_dim * nh
    if lm_head is not None:
        total += 2 * T * lm_head.in_features * lm_head.out_features
    return total


# ---------------------------------------------------------------------------
# the product's extraction


def product(decoder, seqs, layer_ids, root: Path, name: str, meta: dict, depth: int):
    """target.extract_stream with cache.write as the writer; returns (files, seconds spent writing)."""
    spent = []

    def write(key, feats):
        t = time.perf_counter()
        f = cache.write(root, name, key, feats, meta)
        spent.append(time.perf_counter() - t)
        return f

    files = [f for _, f in tg.extract_stream(decoder, seqs, layer_ids, write, depth=depth)]
    return files, sum(spent)


def payload_bytes(f: Path) -> int:
    """Tensor bytes of a safetensors file: size - 8 - header length."""
    with open(f, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
    return f.stat().st_size - 8 - n


def fs_type(path: Path) -> str:
    best = ("", "?")
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if str(path.resolve()).startswith(parts[1]) and len(parts[1]) > len(best[0]):
            best = (parts[1], parts[2])
    return f"{best[1]} at {best[0]}"


def inputs(shp: dict, n: int, T: int):
    g = torch.Generator().manual_seed(0)
    return [(f"p{i}", torch.randint(0, shp["vocab_size"], (T,), generator=g)) for i in range(n)]


# ---------------------------------------------------------------------------
# one GPU


def transformers_default_gdn(device: str) -> str:
    """What transformers bound at import for the gated delta rule (the plain forward runs with that)."""
    import importlib

    mod = importlib.import_module("transformers.models.qwen3_5.modeling_qwen3_5")
    got = tg.kernel_of(mod.torch_chunk_gated_delta_rule)
    if device.startswith("cuda"):
        assert got == "fla", "transformers did not bind fla's gated delta rule"
    return got


def plain(model, seqs, dev, keep=None):
    """Timed plain forwards; returns (seconds, hidden states of the first sequence at `keep` layers, on the CPU).

    The whole model runs, LM head and full logits included, as `model(ids, output_hidden_states=True)`; the
    layers' outputs are kept at `keep` only (`target.outputs`: forward hooks, references as output_hidden_states
    keeps them, no copy): the same kernels and work, without every layer's states held to the end, which at
    32,768 tokens of the 27B shape (21 GB) would not fit beside the weights and logits on a 78 GiB card."""
    with torch.inference_mode(), tg.outputs(model.model.layers, keep or []) as got:
        if len(seqs[0][1]) > 2 * tg.WARM_TOKENS:  # fla tunes on a short input first, as the product does
            model(seqs[0][1][None, : tg.WARM_TOKENS].to(dev))
        model(seqs[0][1][None].to(dev))  # warm-up (fla autotune)
        ref = None
        with Clock(dev) as c:
            for j, (_, x) in enumerate(seqs):
                out = model(x[None].to(dev))
                if j == 0 and keep:
                    ref = [got[i][0] for i in keep]
                del out
                got.clear()
                sync(dev)
    return c.s, [r.cpu() for r in ref] if ref is not None else None


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def one(a, shp, ids, dev, figs: dict):
    n, T = (a.seqs or (4 if a.small else 10)), (a.tokens or (64 if a.small else 2560))
    peak = matmul_tflops(dev, 1024 if a.small else 8192)
    figs["matmul_bf16_tflops"] = peak
    t0 = time.perf_counter()
    model = build(shp, shp["num_hidden_layers"], dev, tokens=T)
    note(
        f"model built in {time.perf_counter() - t0:.1f} s, {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B "
        f"params; fla {tg.fla_version()}"
    )
    seqs = inputs(shp, n, T)
    tokens = n * T
    f_plain = n * flops(model.model.layers, T, model.lm_head)

    # plain forward of the whole model, kernels as transformers binds them (fla gated delta rule)
    if not dev.startswith("cuda"):
        tg.force_torch_kernels()  # fla cannot run on a CPU (transformers binds it wherever it imports)
    note(f"plain forward: transformers' own kernels (gated delta rule: {transformers_default_gdn(dev)})")
    s_plain, ref0 = plain(model, seqs, dev, ids)
    figs |= {
        "plain_s": s_plain,
        "plain_tokens_per_s": tokens / s_plain,
        "plain_tflops": f_plain / s_plain / 1e12,
        "plain_fraction_of_peak": f_plain / s_plain / 1e12 / peak,
        "plain_peak_mem_gib": peak_gib(dev),
    }
    note(f"product backend: {backend(dev)} (target.use_backend, as target.load binds it)")
    s_pk, ref = (None, None) if a.lean else plain(model, seqs, dev, ids)
    if s_pk:
        figs["plain_product_kernels_tokens_per_s"] = tokens / s_pk

    # the product's extraction: cut model, stream with overlapped copies and writes
    decoder = cut(model, ids)
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    f_cut = n * flops(tg._layers(decoder), T)
    if not a.lean:
        informative(a, decoder, seqs, ids, dev, figs)
    root = Path(a.work)
    shutil.rmtree(root, ignore_errors=True)
    meta = {"bench": True, "layer_ids": ids}
    product(decoder, seqs[:1], ids, root, "warm", meta, a.depth)
    with Clock(dev) as ce:
        files, wrote = product(decoder, seqs, ids, root, "bench", meta, a.depth)
    per_tok = sum(payload_bytes(f) for f in files) / tokens
    H = shp["hidden_size"]
    assert per_tok == len(ids) * H * 2, (per_tok, len(ids) * H * 2)
    got = cache.read(root, "bench", seqs[0][0], T, len(ids) * H)  # the written file, validated
    errs = [rel_l2(got[:, j * H : (j + 1) * H], r) for j, r in enumerate(ref or [])]
    errs0 = [rel_l2(got[:, j * H : (j + 1) * H], r) for j, r in enumerate(ref0)]
    figs |= {
        "extract_s": ce.s,
        "extract_tokens_per_s": tokens / ce.s,
        "extract_tflops": f_cut / ce.s / 1e12,
        "extract_fraction_of_peak": f_cut / ce.s / 1e12 / peak,
        "extract_speedup_vs_plain": (tokens / ce.s) / (tokens / s_plain),
        "extract_bytes_per_token": per_tok,
        "extract_expected_bytes_per_token": len(ids) * H * 2,
        "extract_file_bytes_per_token": sum(f.stat().st_size for f in files) / tokens,
        "extract_write_mb_per_s": sum(f.stat().st_size for f in files) / wrote / 1e6,
        "extract_vs_plain_transformers_kernels_max_rel_l2": max(errs0),
        "extract_peak_mem_gib": peak_gib(dev),
    }
    if s_pk:  # the same kernels as the product: its features must equal the plain forward's bit for bit
        figs["extract_speedup_vs_plain_product_kernels"] = (tokens / ce.s) / (tokens / s_pk)
        figs["extract_vs_plain_same_kernels_max_rel_l2"] = max(errs)
    note(
        f"{n} x {T} tokens; features to {root} ({fs_type(root)}); counted {f_plain / n / T / 1e9:.2f} "
        f"GFLOP/token plain, {f_cut / n / T / 1e9:.2f} cut; per-layer rel L2 vs plain, same kernels: "
        + (", ".join(f"{e:.2e}" for e in errs) if s_pk else "not run (--lean)")
        + "; vs transformers' kernels: "
        + ", ".join(f"{e:.2e}" for e in errs0)
    )
    shutil.rmtree(root, ignore_errors=True)
    del model, decoder, ref, ref0
    if not a.lean:
        check_fp32(dev, figs)


def informative(a, decoder, seqs, ids, dev, figs: dict) -> None:
    """The extraction's parts: the cut forwards alone, then with the host copies but no writes."""
    tokens = sum(len(x) for _, x in seqs)
    tg.extract(decoder, seqs[0][1], ids)  # warm-up
    with Clock(dev) as cf:
        for _, x in seqs:
            tg.extract(decoder, x, ids)
            sync(dev)
    figs["forward_only_tokens_per_s"] = tokens / cf.s
    if a.profile:
        profile(lambda: tg.extract(decoder, seqs[0][1], ids), dev)
    with Clock(dev) as cn:
        list(tg.extract_stream(decoder, seqs, ids, lambda k, f: None, depth=a.depth))
    figs["extract_nowrite_tokens_per_s"] = tokens / cn.s


def first_call(a, shp, ids, dev: str, figs: dict) -> None:
    """The product's extraction of one sequence (cut model, product kernels, `extract_stream` writing the feature
    file) as the first thing this process runs on the GPU (kernel compiles and autotuning, the allocator's growth,
    pinned buffers, and the product's short warm-up, `target.WARM_TOKENS`), then the same call warm."""
    T = a.tokens or (64 if a.small else 2560)
    model = build(shp, shp["num_hidden_layers"], dev, tokens=T)
    decoder = cut(model, ids)
    note(f"product backend: {backend(dev)}; first call at {T} tokens")
    cuda = dev.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    seqs = inputs(shp, 1, T)
    root = Path(a.work)
    shutil.rmtree(root, ignore_errors=True)
    meta = {"bench": True, "layer_ids": ids}
    if a.no_pin:
        tg.pin_buckets = lambda: 0
    first = lambda: product(decoder, seqs, ids, root, "first", meta, a.depth)  # noqa: E731
    with Clock(dev) as c1:  # --profile: where the first call's time goes (host ops first: compiles, tuning)
        _, w1 = (
            profile(first, dev, by=("self_cpu_time_total",) + (("cuda_time_total",) if cuda else ()))
            if a.profile
            else first()
        )
    figs["extract_first_peak_mem_gib"] = peak_gib(dev)
    with Clock(dev) as c2:
        _, w2 = product(decoder, seqs, ids, root, "warm", meta, a.depth)
    figs |= {
        "extract_first_call_s": c1.s,
        "extract_warm_call_s": c2.s,
        "extract_first_over_warm": c1.s / c2.s,
        "extract_first_write_s": w1,  # the feature file's writes within each call
        "extract_warm_write_s": w2,
        "extract_peak_mem_gib": peak_gib(dev),
        "extract_pinned_tuners": len(tg._PINNED),  # fla's length-bucketed tuners pinned after the warm-up
    }
    shutil.rmtree(root, ignore_errors=True)


def check_fp32(dev: str, figs: dict) -> None:
    """Kernel parity in fp32 on a small random model: features of the product's kernels (fla gated delta
    rule + fla causal conv) against output_hidden_states with transformers' own (fla + torch conv) and
    with the torch reference path."""
    shp = dict(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
    )
    ids = [1, 3, 6]
    x = torch.randint(0, 512, (300,), generator=torch.Generator().manual_seed(1))
    model = build(shp, 8, dev, torch.float32)
    refs = {}
    binds = [("transformers", transformers_kernels)] if dev.startswith("cuda") else []  # fla: CUDA only
    for name, bind in binds + [("torch", tg.force_torch_kernels)]:
        bind()
        with torch.inference_mode():
            hs = model(x[None].to(dev), output_hidden_states=True).hidden_states
        refs[name] = torch.cat([hs[l + 1][0] for l in ids], -1)
    backend(dev)
    got = tg.extract(cut(model, ids), x, ids)
    for name, r in refs.items():
        figs[f"check_fp32_product_vs_{name}_kernels_rel_l2"] = rel_l2(got, r)
    return figs


# ---------------------------------------------------------------------------
# two GPUs: one process per GPU


def worker(rank, world, a, shp, ids, dev, barrier, q):
    try:
        if dev.startswith("cuda"):
            torch.cuda.set_device(dev)
        n, T = (a.seqs or (4 if a.small else 10)), (a.tokens or (64 if a.small else 2560))
        if rank == 0:
            q.put(("peak", matmul_tflops(dev, 1024 if a.small else 8192)))
        decoder = cut(build(shp, max(ids) + 1, dev, tokens=T), ids)
        backend(dev)
        seqs = inputs(shp, n, T)
        root = Path(a.work) / f"r{rank}"
        meta = {"bench": True, "layer_ids": ids}
        product(decoder, seqs[:1], ids, root, "warm", meta, a.depth)  # warm-up (fla autotune)
        barrier.wait()
        if rank == 0:  # the whole set on one GPU
            with Clock(dev) as c1:
                product(decoder, seqs, ids, root, "one", meta, a.depth)
            q.put(("one", c1.s))
        barrier.wait()
        mine = seqs[rank::world]
        barrier.wait()
        sync(dev)
        t0 = time.monotonic()
        product(decoder, mine, ids, root, "two", meta, a.depth)
        sync(dev)
        q.put(("two", rank, t0, time.monotonic(), len(mine) * T))
    except BaseException as e:  # noqa: BLE001  (reported by the parent)
        q.put(("error", rank, repr(e)))
        barrier.abort()
        raise


def two(a, shp, ids):
    import torch.multiprocessing as mp

    world = 2
    devs = ["cpu"] * world if a.small else [f"cuda:{r}" for r in range(world)]
    if not a.small:
        assert torch.cuda.device_count() >= world, f"needs {world} GPUs, found {torch.cuda.device_count()}"
    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(world), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, a, shp, ids, devs[r], barrier, q)) for r in range(world)]
    for p in procs:
        p.start()
    got, ends = {}, []
    while len(ends) < world:
        m = q.get(timeout=900)
        if m[0] == "error":
            raise RuntimeError(f"worker {m[1]} failed: {m[2]}")
        if m[0] == "two":
            ends.append(m)
        else:
            got[m[0]] = m[1]
    for p in procs:
        p.join()
    wall2 = max(e[3] for e in ends) - min(e[2] for e in ends)
    tokens = sum(e[4] for e in ends)
    shutil.rmtree(a.work, ignore_errors=True)
    return {
        "matmul_bf16_tflops": got["peak"],
        "extract_1gpu_s": got["one"],
        "extract_2gpu_s": wall2,
        "extract_2gpu_tokens_per_s": tokens / wall2,
        "extract_1gpu_tokens_per_s": tokens / got["one"],
        "extract_2gpu_scaling": got["one"] / wall2,
    }


def main():
    a = args_()
    if a.first_call and "TRITON_CACHE_DIR" not in os.environ:  # read when Triton first compiles
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-first-call-")
    cached = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    cached = sum(1 for f in cached.rglob("*") if f.is_file()) if cached.is_dir() else 0
    shp, ids = (SMALL, SMALL_IDS) if a.small else (FULL, LAYER_IDS)
    if not a.small:
        note(f"device {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}; torch {torch.__version__}")
    figs: dict = {}
    try:
        if a.first_call:
            figs["triton_cache_files_at_start"] = cached  # 0: a cold first call; else a returning user's process
            first_call(a, shp, ids, "cpu" if a.small else "cuda:0", figs)
        elif a.gpus == 1:
            one(a, shp, ids, "cpu" if a.small else "cuda:0", figs)
        else:
            figs |= two(a, shp, ids)
        import transformers

        note(f"transformers {transformers.__version__}, fla {tg.fla_version()}, pid {os.getpid()}")
    finally:
        if length := length_suffix(a.tokens, a.small):  # a long run's figures beside 2,560's
            figs = suffixed(figs, length)
        report(figs)  # what was measured, also when a later stage failed


if __name__ == "__main__":
    main()
