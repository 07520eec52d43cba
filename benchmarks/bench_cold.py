"""What a fresh process pays before the chain-only replay runs at speed (a sweep's first checkpoint).

Run in a process of its own (nothing compiled or planned before): times the imports, building the 27B-shaped drafter
(`bench_replay.FULL`, random bf16 weights, fused element-wise kernels), the stacked context K/V of `--rows` sequences
(`replay.lockstep.Lockstep`), and then lockstep steps whose shapes are new, each against a second step of the same
shape: one per key length a walk meets (`drafters.kernels.KEY_ALIGN` apart) at the full row count, then at the row
counts the walk drops to (`replay.lockstep.DROP_AT`). The difference is the per-shape first-call cost (kernel compiles,
attention plans).

    python3 benchmarks/bench_cold.py [--rows 200] [--fetch]     # CUDA only
"""

import argparse
import sys
import time

t_start = time.perf_counter()
import torch  # noqa: E402
from _common import note, report  # noqa: E402

from dflash_dash import (
    drafters as dr,  # noqa: E402
    replay as rp,
    target as tg,
)
from dflash_dash.drafters import dflash, kernels
from dflash_dash.drafters.dflash import DFlash

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--rows", type=int, default=200)
ap.add_argument("--lengths", type=int, default=10, help="new key lengths timed at the full row count")
ap.add_argument(
    "--fetch",
    action="store_true",
    help="first time the sweep worker's checkpoint fetch by phase (read, "
    "RoPE, kernels, copies; the drafter written to disk first): the drafter init below is then warm",
)
a = ap.parse_args()
if not torch.cuda.is_available():
    sys.exit(f"bench_cold.py: needs a CUDA device (CUDA only by design); torch {torch.__version__} sees none")
dev, dtype = "cuda", torch.bfloat16
torch.zeros(1, device=dev)
figs = {"cold_import_s": time.perf_counter() - t_start}

from bench_replay import FULL, rand_weights  # noqa: E402

from tools import tiny  # noqa: E402

c = dr.parse_config(tiny.drafter_config(tiny.TinyDrafter(**FULL)))
w = rand_weights(dr.shapes(c), dev, dtype, 1)
if (
    a.fetch
):  # the sweep worker's first checkpoint (`pipeline.device_io.fetch_checkpoint`, on its loader thread), phase by phase
    import tempfile
    from pathlib import Path

    from bench_sweep import write_drafter

    from dflash_dash import ops
    from dflash_dash.pipeline import device_io

    folder = Path(tempfile.mkdtemp(prefix="dflash-cold-")) / "ck"
    write_drafter(folder, tiny.drafter_config(tiny.TinyDrafter(**FULL)), w)  # not timed
    phases: dict[str, float] = {}

    def timed_fn(owner, name: str, label: str) -> None:
        real = getattr(owner, name)

        def wrapped(*args, **kw):
            t = time.perf_counter()
            try:
                return real(*args, **kw)
            finally:
                phases[label] = phases.get(label, 0.0) + time.perf_counter() - t

        setattr(owner, name, wrapped)

    timed_fn(dflash, "checked", "read")  # safetensors tensors, checked (mapped; `device_io.upload_weights` copies them)
    timed_fn(kernels.Rope, "__init__", "rope")  # RoPE tables (transformers imported for scaled types only)
    timed_fn(dflash, "kernels_for", "kernels")  # Triton, Inductor: the fused element-wise ops (`DFlash.__init__`)
    side = torch.cuda.Stream()
    for first in (True, False):
        phases.clear()
        t0 = time.perf_counter()
        got, _ = device_io.fetch_checkpoint(ops.CheckpointSpec(str(folder)), dtype, dev, side)
        t1 = time.perf_counter()
        tag = "cold_fetch" if first else "next_fetch"
        figs |= {f"{tag}_s": t1 - t0} | {f"{tag}_{k}_s": v for k, v in phases.items()}
        figs[f"{tag}_rest_s"] = t1 - t0 - sum(phases.values())  # the pinned-chunk upload (upload_weights)
        del got
V, H = FULL["vocab_size"], FULL["hidden_size"]
hw = rand_weights({"e": (V, H), "l": (V, H)}, dev, dtype, 2)
head = tg.Head(hw["e"], hw["l"])
t0 = time.perf_counter()
d = DFlash(c, dr.Weights.from_named(c, w))  # Rope (transformers), fused ops (Triton/Inductor import)
torch.cuda.synchronize()
figs["cold_drafter_init_s"] = time.perf_counter() - t0
S, T, P = a.rows, 2560, 512
g = torch.Generator(device=dev).manual_seed(3)
seqs = [
    rp.Sequence(f"p{i}", torch.randint(0, V, (T,)), P, torch.randn(T, c.K * H, device=dev, generator=g).to(dtype))
    for i in range(S)
]


def timed(fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


with torch.inference_mode():
    st = None

    def init():
        global st
        st = rp.lockstep.Lockstep(d, head, seqs, rp.ROUND_TOPK, staged=True)

    figs["cold_context_kv_first_s"] = timed(init)
    figs["cold_context_kv_second_s"] = timed(init)
    rec = torch.ones(S, dtype=torch.bool, device=dev)
    first, second = [], []
    for i in range(a.lengths):  # new key lengths at S rows
        anchors = torch.full((S,), P + 8 + i * kernels.KEY_ALIGN, device=dev).clamp(max=T - 2)
        top = int(anchors.max())
        first.append(timed(lambda: st.step(anchors, rec, top)))
        second.append(timed(lambda: st.step(anchors, rec, top)))
    note(
        "first/second step per new key length (ms): "
        + ", ".join(f"{x * 1e3:.0f}/{y * 1e3:.0f}" for x, y in zip(first, second))
    )
    figs |= {
        "cold_step_first_ms": first[0] * 1e3,
        "cold_step_warm_ms": sum(second) / len(second) * 1e3,
        "cold_new_length_extra_ms": (sum(first[1:]) - sum(second[1:])) / max(1, len(first) - 1) * 1e3,
    }
    drops, n = [], S
    while n > 1:  # the row counts the walk keeps after each drop
        n = max(1, int(n * rp.lockstep.DROP_AT))
        st.keep(torch.arange(n, device=dev))
        anchors = torch.full((n,), top, device=dev)  # the last key length above: only the row count is new
        x = timed(lambda: st.step(anchors, rec[:n], top))
        y = timed(lambda: st.step(anchors, rec[:n], top))
        drops.append(x - y)
        if len(drops) == 8:
            break
    figs |= {
        "cold_new_rows_extra_ms": sum(drops) / len(drops) * 1e3,
        "cold_first_ckpt_total_s": time.perf_counter() - t_start,
    }
from torch._dynamo.utils import counters  # noqa: E402

figs |= {f"inductor_{k}": v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
report(figs)
