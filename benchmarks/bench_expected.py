"""Expected-acceptance benchmark: what the pass at temperature T adds to a replay's time (at most 10 %).

The same drafter, head and sequences replayed every-anchor (and chain-only) without a temperature, then with
`--temperature` under each verify rule (`target-sample`: p_T of the drafts from the stored top-K; `rejection`: the
overlap of the drafter's whole distribution with the target's, on the device in each batch). Random weights,
features and target top-K (speed does not depend on their values); the figures are the best of `--reps` runs.

    python benchmarks/bench_expected.py --small          # tiny shapes on the CPU
    python benchmarks/bench_expected.py                  # CUDA, the 27B reference shapes (bench_replay's FULL)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import note, report, sync
from bench_replay import FAMILIES, FULL, SMALL, family_shapes

from dflash_dash import drafters as dr, replay as rp, sampling, target as tg
from dflash_dash.replay.expect import Sampling
from tools import tiny


def args_():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes on the CPU")
    ap.add_argument("--device", default=None, help="default: cuda, or cpu with --small")
    ap.add_argument("--family", default="dflash", choices=list(FAMILIES))
    ap.add_argument("--seqs", type=int, default=None, help="sequences (default 10; 2 with --small)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per sequence (default 2560; 160 small)")
    ap.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 512; 32 small)")
    ap.add_argument("--topk", type=int, default=64, help="the target's top-K kept per position")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--budget", type=int, default=8, help="DDTree budget")
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2)
    return ap.parse_args()


SPAN = 4096  # ids a random target distribution spreads over (the rest of a larger vocabulary: no mass)


def tops(rng, n: int, P: int, T: int, K: int, V: int) -> sampling.Top:
    """A random target top-K per completion position over SPAN random ids of the vocabulary (all of it when smaller):
    sorting the whole 248,320-id vocabulary at every position takes minutes a sequence, and the replay's time does
    not depend on the values."""
    cols = np.arange(V) if V <= SPAN else np.sort(rng.choice(V, SPAN, replace=False))
    logits = rng.normal(size=(T - P, len(cols))).astype(np.float32) * 3
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    ids = np.argsort(-logp, 1)[:, :K]
    kept = np.take_along_axis(logp, ids, 1)
    return sampling.Top(cols[ids].astype(np.int32), kept, (1 - np.exp(kept).sum(1)).clip(0), P, V)


def main():
    figs: dict = {}
    try:
        measure(args_(), figs)
    finally:
        report(figs)  # what was measured, also when stopped (SIGINT at tools/device_session.sh's timeout)


def measure(a, figs: dict) -> None:
    small = a.small
    dev = a.device or ("cpu" if small else "cuda")
    n, T, P = a.seqs or (2 if small else 10), a.tokens or (160 if small else 2560), a.prompt or (32 if small else 512)
    shp = family_shapes(SMALL if small else FULL, a.family, small)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with tempfile.TemporaryDirectory() as work:
        ck = tiny.write_drafter(Path(work) / "d", tiny.TinyDrafter(**shp, init_scale=1.0))
        d = dr.load(ck, dtype, dev)
    V, H, K = shp["vocab_size"], shp["hidden_size"], len(shp["target_layer_ids"])
    g = torch.Generator().manual_seed(0)
    head = tg.Head(
        (torch.randn(V, H, generator=g) * 0.02).to(dev, dtype), (torch.randn(V, H, generator=g) * 0.02).to(dev, dtype)
    )
    rng = np.random.default_rng(0)
    seqs = [
        rp.Sequence(
            f"p{i}",
            torch.randint(0, V, (T,), generator=g),
            P,
            torch.randn(T, K * H, generator=g).to(dev, torch.bfloat16),
            tops(rng, i, P, T, a.topk, V),
        )
        for i in range(n)
    ]
    note(f"{a.family} on {dev}: {n} sequences x {T} tokens (prompt {P}), top-{a.topk}, T = {a.temperature}")
    for mode in ("every", "chain"):
        for rule in (None, *sampling.RULES):
            how = None if rule is None else Sampling(a.temperature, rule)
            best = float("inf")
            for _ in range(a.reps):
                sync(dev)
                t0 = time.perf_counter()
                if mode == "every":
                    rp.every_anchor_results(d, head, seqs, a.budget, a.chunk, sampling=how)
                else:
                    rp.chain_only_results(d, head, seqs, a.budget, sampling=how)
                sync(dev)
                best = min(best, time.perf_counter() - t0)
            figs[f"replay_{mode}_{rule or 'plain'}_s"] = best
        for rule in sampling.RULES:
            figs[f"expected_{mode}_{rule}_overhead"] = (
                figs[f"replay_{mode}_{rule}_s"] / figs[f"replay_{mode}_plain_s"] - 1
            )


if __name__ == "__main__":
    main()
