"""Where a fresh process's first chain-only walk loses time against the same walk run again (the sweep's
first checkpoint replays in about 22 s, the next ones in about 10.7 s).

A child process plants completions at tau about `--accept` + 1 (`bench_sweep.plant`: the product's own walk) and saves
the tokens; this process, fresh, builds the same drafter, target head and features from the same seeds and walks the
same batch three times (`replay.lockstep.Lockstep` + `replay.lockstep.walk_device`, as the sweep worker does), each
step's start time, row count and key bound recorded (no extra device synchronisation). The walks run the very same
steps, so step i of walk 1 against step i of walk 2 is the first-call cost of that step; it is summed by the kind of
step: the first ones, a new row count (after a drop), a new key length (`drafters.kernels.KEY_ALIGN`), a new staged-head
row count, or none of these.

    python3 benchmarks/bench_walk_cold.py [--rows 200] [--small]      # CUDA (or --small on the CPU)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _trace
import torch
from _common import note, report
from bench_replay import FULL, SMALL, rand_weights

from dflash_dash import drafters as dr, replay as rp, target as tg
from dflash_dash.drafters import kernels
from dflash_dash.drafters.dflash import DFlash
from tools import tiny

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--rows", type=int, default=200, help="sequences in the lockstep batch")
ap.add_argument("--accept", type=float, default=5.0, help="mean planted accepted drafts per round")
ap.add_argument("--small", action="store_true", help="tiny shapes on the CPU (a smoke run)")
ap.add_argument("--walks", type=int, default=3)
ap.add_argument(
    "--sdpa",
    choices=("default", "efficient"),
    default="default",
    help="efficient: cuDNN attention off in this process (no per-shape cuDNN graphs)",
)
ap.add_argument(
    "--beside",
    action="store_true",
    help="during walks 1 and 2 a loader thread loads a checkpoint onto "
    "the device on a side stream (`pipeline.device_io.fetch_checkpoint`), as the sweep worker does beside each "
    "replay; walk 3 runs alone",
)
ap.add_argument("--plant", help=argparse.SUPPRESS)  # child: plant, save the tokens here, exit
a = ap.parse_args()
dev = "cpu" if a.small else "cuda"
dtype = torch.float32 if a.small else torch.bfloat16
T, P = (160, 32) if a.small else (2560, 512)


def build():
    """The drafter, head and features [S, T, K*H] (device), from fixed seeds: the same in both processes."""
    shp = SMALL if a.small else FULL
    c = dr.parse_config(tiny.drafter_config(tiny.TinyDrafter(**shp)))
    d = DFlash(c, dr.Weights.from_named(c, rand_weights(dr.shapes(c), dev, dtype, 1)))
    hw = rand_weights({"e": (c.vocab_size, c.hidden_size), "l": (c.vocab_size, c.hidden_size)}, dev, dtype, 2)
    g = torch.Generator(device=dev).manual_seed(3)
    feats = torch.randn(a.rows, T, c.K * c.hidden_size, device=dev, generator=g).to(dtype)
    return d, tg.Head(hw["e"], hw["l"]), feats


if a.sdpa == "efficient":  # the planting child too: both walk the same steps
    torch.backends.cuda.enable_cudnn_sdp(False)
if a.plant:
    from bench_sweep import plant

    d, head, feats = build()
    torch.save(plant(d, head, feats, P, a.accept, 0), a.plant)
    sys.exit(0)

# -- 1. plant in a child process (its compiles fill Inductor's disk cache, as the sweep's planting does) -----------
tmp = Path(tempfile.mkdtemp(prefix="dflash-walk-")) / "tokens.pt"
t0 = time.perf_counter()
subprocess.run(
    [sys.executable, __file__, "--plant", str(tmp), "--rows", str(a.rows), "--accept", str(a.accept), "--sdpa", a.sdpa]
    + (["--small"] if a.small else []),
    check=True,
)
note(f"planted {a.rows} x {T} tokens in a child process in {time.perf_counter() - t0:.1f} s")
toks = torch.load(tmp)

# -- 2. this process: the same walk, traced ------------------------------------------------------------------------
t0 = time.perf_counter()
d, head, feats = build()
seqs = [rp.Sequence(f"p{i}", toks[i], P, feats[i]) for i in range(a.rows)]
figs = {"walk_build_s": time.perf_counter() - t0}
if a.beside:  # a checkpoint on disk for the loader thread (not timed)
    from bench_sweep import write_drafter

    from dflash_dash import ops
    from dflash_dash.pipeline import device_io

    ck = tmp.parent / "ck"
    write_drafter(ck, tiny.drafter_config(tiny.TinyDrafter(**(SMALL if a.small else FULL))), d.w.named())
    fetched: dict = {}
    side = torch.cuda.Stream() if dev == "cuda" else None

    def fetch(n: int) -> None:
        got, fetched[n] = device_io.fetch_checkpoint(ops.CheckpointSpec(str(ck)), dtype, dev, side)
        del got  # its device memory goes back to the side stream's pool, as in the worker


traced = _trace.install()  # each walk: step start times, row counts, key bounds; staged-head row counts
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
walks = []
with torch.inference_mode():
    for n in range(a.walks):
        sync()
        t0 = time.perf_counter()
        st = rp.lockstep.Lockstep(d, head, seqs, rp.ROUND_TOPK, staged=True)
        sync()
        t1 = time.perf_counter()
        loader = threading.Thread(target=fetch, args=(n,)) if a.beside and n < 2 else None
        if loader:
            loader.start()
        rp.lockstep.walk_device(st)
        sync()
        t2 = time.perf_counter()
        if loader:
            loader.join()
            figs[f"walk{n + 1}_fetch_beside_s"] = fetched[n]
        acc = st.acc.cpu()
        walks.append(dict(traced[-1], ctx=t1 - t0, walk=t2 - t1, acc=acc))
        note(f"walk {n + 1}: context K/V {t1 - t0:.2f} s, walk {t2 - t1:.2f} s, {len(walks[-1]['trace']) - 1} steps")
for n, w in enumerate(walks, 1):
    figs |= {f"walk{n}_context_kv_s": w["ctx"], f"walk{n}_s": w["walk"], f"walk{n}_steps": len(w["trace"]) - 1}
w1, w2 = walks[0], walks[1]
got, notes = _trace.excess(w1, w2, kernels.KEY_ALIGN)
figs |= got
figs["walks_same_steps"] = int(got["walks_same_steps"] and torch.equal(w1["acc"], w2["acc"]))
recorded = w1["acc"][w1["acc"] >= 0]
figs["walk_tau"] = float((recorded.clamp(max=d.c.block_size - 1) + 1).float().mean()) if len(recorded) else 0.0
for line in notes:
    note(line)
report(figs)
