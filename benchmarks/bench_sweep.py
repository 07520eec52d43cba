"""Sweep benchmark: chain-only replay against every-anchor, and a 20-checkpoint sweep through the
product (`pipeline.sweep`: store, feature files on disk, checkpoint loading included).

Completions are planted from the 27B-shaped drafter's own drafts (random bf16 weights at the reference shapes of
`bench_replay.FULL`): at each anchor the next tokens are the drafter's block, cut after a random number of drafts
(binomial, mean `--accept`) and followed by a different token, so a replay sees realistic acceptance (tau about
`--accept` + 1). The planting is the product's own lockstep walk writing the completion as it goes (`Planter`), so a
chain-only replay of the same batch runs the same steps and measures the planted acceptance exactly; random weights have
so many near ties that drafting in any other shapes loses about a quarter of the tau in bf16 (measured: a planting in
other shapes, 6 planted, replayed at 4.4). The sweep's checkpoints are that drafter in a few distinct weight files
linked into 20 step folders (the machine's disk holds 64 GB), by default with its weights unchanged, so each checkpoint
replays at the planted tau as the goal asks; `--perturb` changes them a little (random weights have many near ties, so
even 2e-4 of a tensor's std drops tau from 6 to about 4).

    python benchmarks/bench_sweep.py            # CUDA, reference shapes
    python benchmarks/bench_sweep.py --small    # tiny shapes on the CPU (a smoke test)
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import Clock, matmul_tflops, note, peak_gib, profile, report, sync
from bench_replay import FULL, SMALL, rand_weights
from safetensors.torch import save_file

from dflash_dash import cache, drafters as dr, ops, pipeline, replay as rp, target as tg
from dflash_dash.drafters import kernels
from dflash_dash.store import Store
from tools import tiny


def args_():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--device", default=None)
    ap.add_argument("--tokens", type=int, default=None, help="tokens per sequence (default 2560; 200 small)")
    ap.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 512; 32 small)")
    ap.add_argument("--accept", type=float, default=5.0, help="mean planted accepted drafts per round")
    ap.add_argument("--speed-seqs", type=int, default=None, help="sequences of the chain/every comparison (10)")
    ap.add_argument("--sweep-seqs", type=int, default=None, help="sequences of the sweep (200; 6 small)")
    ap.add_argument("--checkpoints", type=int, default=20)
    ap.add_argument("--distinct", type=int, default=4, help="distinct weight files among the checkpoints")
    ap.add_argument("--budget", type=int, default=8, help="DDTree budget of the DDTree-on comparison")
    ap.add_argument("--sweep-budget", type=int, default=None, help="DDTree budget of the sweep (default --budget)")
    ap.add_argument(
        "--perturb",
        type=float,
        default=0.0,
        help="checkpoint k's weights: base + perturb * std * noise (0: the planted drafter's, tau as "
        "planted; 2e-4 already drops it to about 4)",
    )
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="sweep in this process (default: one worker process, as `sweep --gpus 0`: the parent's "
        "store step of a run overlaps the next checkpoint's replay)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="profile one chain-only replay (host time by function); with --in-process the sweep's time "
        "by phase (load, context K/V, walk, results, store) and the device kernels of one walk",
    )
    ap.add_argument(
        "--trace",
        action="store_true",
        help="the worker traces its walks (`trace_site/sitecustomize.py`); printed after the sweep: its first "
        "checkpoint's walk against the same weights' walk later, step by step (`_trace.excess`)",
    )
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--skip-speed", action="store_true", help="only the sweep")
    ap.add_argument("--work", default=None)
    return ap.parse_args()


class Planter(rp.lockstep.Lockstep):
    """The product's lockstep walk (`replay.lockstep.walk_device`) writing its own completion: at each round the tokens
    after the anchor are the block's drafts up to a random count (binomial, mean `accept`), then a token it did not
    draft. The replay of these sequences in one batch runs the very same steps (rows, anchors, key bounds, shapes), so
    it reproduces every draft bit for bit and measures the planted tau. (Drafting the same blocks in other shapes flips
    bf16 near ties, and random weights have many: a completion planted at tau 6 replayed at 4.4.)"""

    def __init__(self, d: dr.Drafter, head: tg.Head, seqs: list[rp.Sequence], accept: float, seed: int):
        super().__init__(d, head, seqs, rp.ROUND_TOPK, staged=True)
        self.p, self.V = min(1.0, accept / self.D), head.embed.shape[0]
        self.gen = torch.Generator(device=d.device).manual_seed(seed)

    def step(self, anchors, record, top):
        R, dev = len(anchors), anchors.device
        self.at = anchors
        self.n = (torch.rand(R, self.D, device=dev, generator=self.gen) < self.p).sum(1)  # [R] drafts kept
        self.shift = torch.randint(1, self.V, (R, self.D), device=dev, generator=self.gen)  # other = draft + shift
        return super().step(anchors, record, top)

    def follow(self, nxt, d_tok, inside, upto):
        j, n = self.slot, self.n[:, None]
        write = inside & (j <= n) & (j < upto)  # [R, D] slots planted by now
        new = torch.where(j < n, d_tok, (d_tok + self.shift) % self.V)
        r, k = write.nonzero().unbind(1)  # each written position once
        self.tok[self.rows[r], self.at[r] + 1 + k] = new[r, k]
        return torch.where(write, new, nxt)


@torch.inference_mode()
def plant(d: dr.Drafter, head: tg.Head, feats, P: int, accept: float, seed: int) -> torch.Tensor:
    """Tokens [S, T] following the drafter's own blocks over features [S, T, K*H] (or a list of S [T, K*H]), all S
    in one lockstep batch (`Planter`): replayed as one batch, they give back the planted acceptance exactly."""
    S, T = len(feats), feats[0].shape[0]
    toks = torch.randint(0, head.embed.shape[0], (S, T), generator=torch.Generator().manual_seed(seed))
    pl = Planter(d, head, [rp.Sequence(f"p{i}", toks[i], P, feats[i]) for i in range(S)], accept, seed)
    rp.lockstep.walk_device(pl)
    return pl.tok[:, :T].cpu()


def needed_flops(c: dr.DrafterConfig, anchor: int, V: int, acc: int, T: int, budget: int) -> float:
    """FLOPs of the block at `anchor` that the walks need: its layers, plus the LM head of every drafted slot
    with DDTree on, else of the slots the chain walk reads (up to the first rejected draft, inside the
    completion): the arithmetic floor of the chain-only replay."""
    D = c.block_size - 1
    slots = D if budget else min(acc + 1, D, T - 1 - anchor)
    return dr.flops_per_block(c, anchor, 0) + 2 * slots * c.hidden_size * V


PLANT = 100  # sweep features drawn at once ([PLANT, T, K*H] on the device)


def write_drafter(folder: Path, cfg: dict, w: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.cpu().contiguous() for k, v in w.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))


def measure(a, figs: dict) -> None:
    shp = SMALL if a.small else FULL
    dev = a.device or ("cpu" if a.small else "cuda")
    T, P = a.tokens or (200 if a.small else 2560), a.prompt or (32 if a.small else 512)
    n_speed, n_sweep = a.speed_seqs or (3 if a.small else 10), a.sweep_seqs or (6 if a.small else 200)
    dtype = torch.bfloat16
    if dev.startswith("cuda"):
        note(f"device {torch.cuda.get_device_name(dev)}; torch {torch.__version__}")
    peak = matmul_tflops(dev, 1024 if a.small else 8192)
    figs["matmul_bf16_tflops"] = peak
    base = Path(a.work or tempfile.mkdtemp(prefix="dflash-sweep-"))
    shutil.rmtree(base, ignore_errors=True)
    cfg = tiny.drafter_config(tiny.TinyDrafter(**shp)) | {"torch_dtype": "bfloat16"}
    c = dr.parse_config(cfg)
    w0 = rand_weights(dr.shapes(c), dev, dtype, 1)
    write_drafter(base / "base", cfg, w0)
    tgt = base / "target"
    tgt.mkdir()
    V, H = shp["vocab_size"], shp["hidden_size"]
    hw = rand_weights({"model.embed_tokens.weight": (V, H), "lm_head.weight": (V, H)}, dev, dtype, 2)
    save_file({k: v.cpu() for k, v in hw.items()}, str(tgt / "model.safetensors"))
    (tgt / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3_5_text",
                "hidden_size": H,
                "vocab_size": V,
                "num_hidden_layers": shp["num_target_layers"],
            }
        )
    )
    del hw
    d = dr.load(base / "base", dtype, dev)
    head = tg.load_head(tgt, dev, dtype)

    if not a.skip_speed:
        speed(a, d, head, c, T, P, n_speed, dev, peak, figs)
        report(figs)  # printed now: a later stage may run out of time
        figs.clear()
    if a.skip_sweep:
        return
    sweep(a, d, head, c, cfg, w0, base, tgt, T, P, n_sweep, dev, dtype, peak, figs)


def speed(a, d, head, c, T, P, n_speed, dev, peak, figs) -> None:
    """Chain-only against every-anchor on the same planted sequences, with DDTree off (budget 0: the chain
    walk's anchors only) and on (`--budget`: the chain walk's and the DDTree walk's anchors)."""
    H, V, dtype = c.hidden_size, c.vocab_size, d.dtype
    g = torch.Generator(device=dev).manual_seed(3)
    feats = torch.randn(n_speed, T, c.K * H, device=dev, generator=g).to(dtype)
    t0 = time.perf_counter()
    toks = plant(d, head, feats, P, a.accept, 0)
    note(f"planted {n_speed} x {T} tokens in {time.perf_counter() - t0:.1f} s")
    seqs = [rp.Sequence(f"p{i}", toks[i], P, feats[i]) for i in range(n_speed)]
    for b in sorted({0, a.budget}):  # warm-up (kernels, plans, the Triton top-k at each k)
        rp.chain_only(d, head, seqs[:2], b)
        rp.every_anchor(d, head, seqs[:1], b, chunk=256)
    note("warm")
    figs |= {"every_blocks": n_speed * (T - P)}
    for b in sorted({0, a.budget}):  # suffix _budget0: DDTree off (chain walk only); _budget8: DDTree on
        # the replay as a worker runs it: results without the run's summary (the parent's store step makes that),
        # (`every_anchor_results`, `chain_only_results`: what `pipeline.device_io.replay_work` runs)
        with Clock(dev) as ce:
            every = rp.every_anchor_results(d, head, seqs, b, chunk=256)
        note(f"budget {b}: every-anchor {ce.s:.1f} s")
        with Clock(dev) as cc:
            chain = rp.chain_only_results(d, head, seqs, b, batch=len(seqs))
        note(f"budget {b}: chain {cc.s:.1f} s")
        s_every, s_chain = rp.summarize(every, c.block_size, b), rp.summarize(chain, c.block_size, b)
        same = all((x.rounds, x.tree_rounds) == (y.rounds, y.tree_rounds) for x, y in zip(every, chain))
        blocks = sum(int((r.accepted_at >= 0).sum()) for r in chain)
        flops = sum(
            needed_flops(c, p, V, v, T, b) for r in chain for p, v in enumerate(r.accepted_at.tolist(), P) if v >= 0
        )
        # the chain replay runs the planting's steps (`Planter`): its tau is the planted one; every-anchor drafts
        # in other shapes, where bf16 near ties of random weights flip
        figs |= {"planted_tau_pooled": s_chain["tau_pooled"], "every_tau_pooled": s_every["tau_pooled"]} | (
            {"planted_ddtree_tau": s_every["ddtree_tau"]} if b else {}
        )
        figs |= {
            f"{k}_budget{b}": v
            for k, v in {
                "every_anchor_s": ce.s,
                "chain_s": cc.s,
                "chain_speedup_vs_every": ce.s / cc.s,
                "chain_blocks": blocks,
                "chain_anchor_share": blocks / (n_speed * (T - P)),
                "chain_blocks_per_s": blocks / cc.s,
                "chain_rounds_equal_every": float(same),
                "chain_rounds_differing_prompts": sum(
                    (x.rounds, x.tree_rounds) != (y.rounds, y.tree_rounds) for x, y in zip(every, chain)
                ),
                "chain_fraction_of_peak": flops / cc.s / 1e12 / peak,
            }.items()
        }
        report(figs)
        figs.clear()
    if a.profile:  # where the chain-only replay's host time goes (DDTree off)
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        rp.chain_only_results(d, head, seqs, 0, batch=len(seqs))
        sync(dev)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(14)


def sweep(a, d, head, c, cfg, w0, base, tgt, T, P, n_sweep, dev, dtype, peak, figs) -> None:
    H, V = c.hidden_size, c.vocab_size
    # -- 2. the product's sweep: 20 checkpoints x n_sweep sequences, from files ----------------------
    ws = base / "ws"
    st = Store(ws)
    t0 = time.perf_counter()
    gen = torch.Generator(device=dev).manual_seed(5)
    st.add_set("bench", "bench")
    ex = "ex-bench"
    st.add_extraction(
        dict(
            id=ex,
            set_name="bench",
            target_path=str(tgt.resolve()),
            layer_ids=c.target_layer_ids,
            hidden_size=H,
            device=dev,
            dtype="bfloat16",
            backend="fla",
            versions={},
            config_hash="-",
        )
    )
    feats, paths = [], []
    for b0 in range(0, n_sweep, PLANT):  # features PLANT sequences at a time, kept on the device for the planting
        f = torch.randn(min(PLANT, n_sweep - b0), T, c.K * H, device=dev, generator=gen).to(dtype)
        for i in range(len(f)):
            feats.append(f[i])
            paths.append(cache.write(pipeline.features_root(st), ex, f"q{b0 + i}", f[i], {"bench": True}))
        del f
    tk = torch.cat(
        [
            plant(d, head, feats[b0 : b0 + rp.lockstep.CHAIN_BATCH], P, a.accept, 100 + b0)  # batches as replayed
            for b0 in range(0, n_sweep, rp.lockstep.CHAIN_BATCH)
        ]
    )
    del feats
    for i in range(n_sweep):
        st.add_completion(
            "bench",
            {
                "id": f"q{i}",
                "idx": i,
                "prompt_ids": tk[i, :P].tolist(),
                "output_ids": tk[i, P:].tolist(),
                "finish_reason": "length",
            },
        )
        st.add_item(ex, f"q{i}", T, str(paths[i]))
    st.set_status("extractions", ex, "done")
    figs["sweep_setup_s"] = time.perf_counter() - t0
    note(f"sweep inputs written in {figs['sweep_setup_s']:.1f} s")
    train = base / "train"
    distinct = []
    for k in range(a.distinct):  # base weights, perturbed if asked: later "training steps"
        folder = base / f"w{k}"
        if k == 0 or not a.perturb:
            wk = w0
        else:
            gk = torch.Generator(device=dev).manual_seed(10 + k)
            wk = {
                n: (t.float() + a.perturb * t.float().std() * torch.randn(t.shape, device=dev, generator=gk)).to(dtype)
                for n, t in w0.items()
            }
        write_drafter(folder, cfg, wk)
        distinct.append(folder)
    for i in range(a.checkpoints):
        step = train / f"run-step{(i + 1) * 1000}"
        step.mkdir(parents=True)
        os.link(distinct[i % len(distinct)] / "model.safetensors", step / "model.safetensors")
        shutil.copy(distinct[0] / "config.json", step / "config.json")
    del d, head, w0
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    reads = []
    real = cache.read
    cache.read = lambda root, e, pid, *x, **k: reads.append(pid) or real(root, e, pid, *x, **k)
    sync(dev)
    t0 = time.perf_counter()
    budget = a.budget if a.sweep_budget is None else a.sweep_budget
    from dflash_dash.jobs import workers

    trace = base / "trace.jsonl"
    if a.trace and not a.in_process:  # the worker loads trace_site/sitecustomize.py at start-up
        os.environ["DFLASH_BENCH_TRACE"] = str(trace)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(Path(__file__).parent / "trace_site")] + [p for p in [os.environ.get("PYTHONPATH")] if p]
        )
    runner = None if a.in_process else workers.pool(st, [dev])  # reads features in its own process
    last = [0.0]

    said = []

    def progress(i, n, m):  # a line every 5 s at most, and every message that is not a replay count (each
        # checkpoint's "loaded in ..., replayed in ..." is, from the worker's clock)
        said.append(m)
        t = time.perf_counter() - t0
        if t - last[0] > 5 or "replayed" not in m or "replayed in" in m:
            last[0] = t
            note(f"{t:.1f} s: [{i}/{n}] {m}")

    phases = phase_timers(dev) if a.profile and runner is None else None
    replaying = importlib.import_module("dflash_dash.pipeline.replay")  # the module (`pipeline.replay`: the handler)
    steps, store_run = [], replaying.store_run

    def timed_store_run(*x, **k):  # the parent's store step of each checkpoint, on the sweep's clock
        t = time.perf_counter()
        out = store_run(*x, **k)
        steps.append((t - t0, time.perf_counter() - t0))
        return out

    replaying.store_run = timed_store_run
    ids = pipeline.sweep(
        st,
        ops.Sweep(checkpoints=str(train), extraction=ex, device=dev, dtype="bfloat16", tree_budget=budget),
        progress=progress,
        runner=runner,
    )
    sync(dev)
    dt = time.perf_counter() - t0
    replaying.store_run = store_run
    report({f"sweep_{a.checkpoints}x{n_sweep}_s": dt})  # printed now: the counts below take a while
    if steps:  # after the last store step: the worker's exit (the parent waits for it) and the sweep's return
        note(
            f"store steps (parent): {', '.join(f'{e - b:.2f}' for b, e in steps)} s; the last one ran "
            f"{steps[-1][0]:.1f}-{steps[-1][1]:.1f} s, the sweep returned at {dt:.1f} s"
        )
    if phases:
        report({f"sweep_phase_{k}_s": v for k, v in phases.items()})
    if a.trace and trace.exists():
        report_trace(trace, len(distinct) if a.checkpoints > len(distinct) else None)
    cache.read = real
    runs = {r["id"]: r for r in st.runs()}
    taus = [runs[i]["summary"]["tau_pooled"] for i in ids]
    report({"sweep_tau_pooled_min": min(taus), "sweep_tau_pooled_max": max(taus)})  # now: the counts take a while
    blocks = 0
    flops = 0.0
    for i in ids:
        for p in st.run_prompts(i):
            acc = np.asarray(p["accepted_at"])
            at = np.flatnonzero(acc >= 0)
            blocks += len(at)
            flops += sum(
                needed_flops(c, p["prompt_len"] + int(q), V, int(acc[q]), p["prompt_len"] + len(acc), budget)
                for q in at
            )
    if runner is not None:  # the worker's feature reads, as its progress lines count them
        reads = [None] * sum(
            int(m.group(1)) for m in re.finditer(r"read the features of (\d+) prompts", "\n".join(said))
        )
    figs |= {
        f"sweep_{a.checkpoints}x{n_sweep}_s": dt,
        "sweep_checkpoints": len(ids),
        "sweep_feature_reads_per_sequence": len(reads) / n_sweep,
        "sweep_blocks": blocks,
        "sweep_blocks_per_s": blocks / dt,
        "sweep_fraction_of_peak": flops / dt / 1e12 / peak,
        "sweep_tau_pooled_min": min(taus),
        "sweep_tau_pooled_max": max(taus),
        "sweep_peak_mem_gib": peak_gib(dev),
    }
    figs["sweep_budget"] = budget
    note(
        f"sweep: {len(ids)} checkpoints x {n_sweep} sequences x {T} tokens, budget {budget}, "
        f"{len(distinct)} distinct weight files"
    )
    if not a.work:
        shutil.rmtree(base, ignore_errors=True)


def report_trace(path: Path, again: int | None) -> None:
    """The worker's traced walks (`--trace`): each checkpoint's replay (`chain_only_results`), its walk and the context
    K/V before it; the first checkpoint's walk against checkpoint `again`'s (the same weight file) step by step."""
    import _trace

    lines = [json.loads(x) for x in path.read_text().splitlines()]
    walks = [x for x in lines if "trace" in x]
    chains = [x for x in lines if "chain_s" in x]
    for n, (w, c) in enumerate(zip(walks, chains), 1):
        note(
            f"checkpoint {n}: replay {c['chain_s']:.2f} s = before the walk {w['start'] - c['start']:.2f} s (context "
            f"K/V queued in {w['ctx_host_s']:.2f} s) + walk {w['end'] - w['start']:.2f} s "
            f"({len(w['trace']) - 1} steps) + after {c['start'] + c['chain_s'] - w['end']:.2f} s"
        )
    if again is not None and len(walks) > again:
        figs, notes = _trace.excess(walks[0], walks[again], kernels.KEY_ALIGN)
        for line in notes:
            note(line)
        report({f"trace_{k}": v for k, v in figs.items()})


def phase_timers(dev) -> dict:
    """Wrap the sweep's steps (in this process) so that their wall time, device synchronised, adds up by phase;
    the second walk also prints its device kernels (torch.profiler)."""
    phases: dict = {}
    walks = [0]

    def wrap(owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def timed(*args, **kw):
            sync(dev)
            t, key = time.perf_counter(), label
            try:
                if label == "walk":
                    walks[0] += 1
                    if walks[0] == 2:  # timed apart: the profiler slows the launches
                        key = "walk_profiled"
                        return profile(lambda: fn(*args, **kw), dev, rows=30)
                return fn(*args, **kw)
            finally:
                sync(dev)
                phases[key] = phases.get(key, 0.0) + time.perf_counter() - t

        setattr(owner, name, timed)

    wrap(dr, "load", "load_drafter")
    wrap(rp.lockstep.Lockstep, "__init__", "context_kv")
    wrap(rp.lockstep, "walk_device", "walk")  # looked up in `replay.lockstep` by `_chain_batch`
    wrap(rp.lockstep, "_chain_batch", "chain_batch")  # context_kv + walk + the results' arrays
    wrap(importlib.import_module("dflash_dash.pipeline.replay"), "store_run", "store_run")
    return phases


def main():
    figs: dict = {}
    try:
        measure(args_(), figs)
    finally:
        report(figs)


if __name__ == "__main__":
    main()
