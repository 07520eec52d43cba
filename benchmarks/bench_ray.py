"""Ray benchmark: what the Ray path (`--ray`, jobs.cluster) costs over the one-host pool (`--gpus`, jobs.workers) on
one device: the same extraction and the same replay through each runner, one worker each, on a local Ray cluster.

A seeded target and drafter (tools.tiny shapes, widened by `--hidden`/`--layers`) over `--prompts` random
completions of `--tokens` tokens. Each runner extracts the set once and replays it `--reps` times (a fresh store
step each: `force`); the pool starts its worker process every call (as a job does), while Ray keeps its worker
process between calls of one driver, so the first Ray call (worker start and imports) is reported apart from the
warm ones. The cluster's start (`ray_start_s`) is not in either figure: a cluster runs before jobs connect to it.
Both runs must be equal (`same_results: 1`), or the benchmark fails.

    python benchmarks/bench_ray.py                # CUDA: one GPU, --prompts 64 --tokens 2560 --hidden 1024
    python benchmarks/bench_ray.py --small        # the CPU: 8 prompts of 256 tokens, tiny shapes

Figures: ray_start_s, pool_extract_s, ray_extract_s, pool_replay_s, ray_replay_first_s, ray_replay_s (median of
the warm calls), ray_overhead_vs_pool_1gpu (or _1cpu: ray_replay_s / pool_replay_s), ray_extract_overhead_vs_pool
(ray_extract_s / pool_extract_s, the Ray worker's first call), same_results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import report

from dflash_dash import ops, pipeline
from dflash_dash.jobs import cluster, workers
from dflash_dash.store import Store
from tools import tiny


def args_():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CPU, tiny shapes (a smoke test; CI figures)")
    ap.add_argument("--prompts", type=int, default=None, help="completions (default 64; 8 small)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per completion (default 2560; 256 small)")
    ap.add_argument("--hidden", type=int, default=None, help="hidden size of target and drafter (1024; 64 small)")
    ap.add_argument("--layers", type=int, default=8, help="target layers")
    ap.add_argument("--reps", type=int, default=3, help="replays per runner (the warm Ray figure is their median)")
    return ap.parse_args()


def taps(layers: int) -> list[int]:
    """The target layers the benchmark drafters read, of a target of `layers` layers."""
    return [1, layers // 2, layers - 2]


def sizes(a, small: tuple[int, int, int], full: tuple[int, int, int]) -> bool:
    """Fill `a.prompts`, `a.tokens`, `a.hidden` left unset from the run's size defaults (prompts, tokens, hidden):
    `small` on the CPU (--small), else `full` on CUDA (asserted present). True on CUDA."""
    cuda = not a.small
    if cuda:
        import torch

        assert torch.cuda.is_available(), "no CUDA device: run with --small on the CPU"
    n, t, h = small if a.small else full
    a.prompts, a.tokens, a.hidden = a.prompts or n, a.tokens or t, a.hidden or h
    return cuda


def build(base: Path, a, checkpoints: int = 1) -> tuple[Store, Path, Path]:
    """A workspace with the completions imported; the target folder and the first drafter checkpoint (of
    `checkpoints`, seeded apart, under base/checkpoints/stepNNNN: a sweep's folder)."""
    h, vocab = a.hidden, 512 if a.small else 32000
    heads = max(4, h // 64)
    target = tiny.write_target(
        base / "target",
        tiny.TinyTarget(vocab_size=vocab, hidden_size=h, intermediate_size=2 * h, num_hidden_layers=a.layers,
                        num_attention_heads=heads, num_key_value_heads=max(2, heads // 4), head_dim=h // heads),
    )  # fmt: skip
    drafters = [
        tiny.write_drafter(
            base / "checkpoints" / f"step{i:04d}",
            tiny.TinyDrafter(
                hidden_size=h,
                intermediate_size=2 * h,
                num_attention_heads=heads,
                num_key_value_heads=max(2, heads // 4),
                head_dim=h // heads,
                vocab_size=vocab,
                block_size=8 if not a.small else 4,
                num_target_layers=a.layers,
                target_layer_ids=taps(a.layers),
                seed=i,
            ),
        )  # fmt: skip
        for i in range(checkpoints)
    ]
    g = np.random.default_rng(0)
    f = base / "c.jsonl"
    f.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"p{i}",
                    "prompt_ids": g.integers(4, vocab, 32).tolist(),
                    "output_ids": g.integers(4, vocab, a.tokens - 32).tolist(),
                }
            )
            + "\n"
            for i in range(a.prompts)
        )  # fmt: skip
    )
    st = Store(base / "ws")
    pipeline.import_completions(st, f, "bench")
    return st, target, drafters[0]


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    a = args_()
    cuda = sizes(a, (8, 256, 64), (64, 2560, 1024))
    dev = "cuda:0" if cuda else "cpu"
    threads = str(os.cpu_count() or 1)
    os.environ.setdefault("OMP_NUM_THREADS", threads)  # the pool's worker and Ray's get the same threads
    import ray

    base = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    try:
        st, target, drafter = build(base, a)
        ex_op = ops.Extract(target=str(target), completions="bench", drafter=[str(drafter)], device=dev)
        pool = workers.pool(st, [dev])
        t_pool_ex, ex_pool = timed(lambda: pipeline.extract(st, ex_op, None, pool))

        t, _ = timed(
            lambda: ray.init(num_cpus=int(threads), num_gpus=1 if cuda else 0, include_dashboard=False,
                             log_to_driver=False, _temp_dir=tmp, logging_level="WARNING")
        )  # fmt: skip
        figures = {"ray_start_s": t}
        plan = cluster.plan(ray.get_runtime_context().gcs_address, 1 if cuda else None, None if cuda else 1)
        assert plan.workers == 1, plan
        over_ray = cluster.runner(st, plan)
        t_ray_ex, ex_ray = timed(lambda: pipeline.extract(st, ex_op, None, over_ray))

        op = ops.Replay(drafter=str(drafter), extraction=ex_pool, device=dev, force=True)
        pool_s, ray_s, runs = [], [], {}
        for _ in range(a.reps):
            s, out = timed(lambda: pipeline.replay(st, op, None, workers.pool(st, [dev])))
            pool_s.append(s)
            runs["pool"] = out["id"]
            s, out = timed(lambda: pipeline.replay(st, op, None, over_ray))
            ray_s.append(s)
            runs["ray"] = out["id"]
        same = all(x == y for x, y in zip(st.prompts(runs["pool"]), st.prompts(runs["ray"])))
        same = same and len(st.prompts(runs["ray"])) == a.prompts
        items = {e: {i["prompt_id"]: i["tokens"] for i in st.items(e)} for e in (ex_pool, ex_ray)}
        same = same and items[ex_pool] == items[ex_ray]
        warm = statistics.median(ray_s[1:]) if len(ray_s) > 1 else ray_s[0]
        pool_med = statistics.median(pool_s)
        figures |= {
            "pool_extract_s": t_pool_ex,
            "ray_extract_s": t_ray_ex,
            "pool_replay_s": pool_med,
            "ray_replay_first_s": ray_s[0],
            "ray_replay_s": warm,
            f"ray_overhead_vs_pool_1{'gpu' if cuda else 'cpu'}": warm / pool_med,
            "ray_extract_overhead_vs_pool": t_ray_ex / t_pool_ex,
            "same_results": int(same),
        }
        report(figures)
        assert same, "the Ray run differs from the pool's"
    finally:
        ray.shutdown()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
