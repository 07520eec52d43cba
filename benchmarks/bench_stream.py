"""Streaming benchmark: `sweep --stream` (no feature file) against extract-then-sweep, through the product.

Builds a workspace (`bench_ray.build`: a random target, `--checkpoints` seeded drafter checkpoints in one training
folder, `--prompts` completions of `--tokens` tokens) and times, in this process, the two ways of evaluating every
checkpoint on every completion:
  - extract then sweep: `pipeline.extract` (the target's features written to feature files) and `pipeline.sweep`
    over the extraction (chain-only anchors, the sweep's default; features read once for all checkpoints);
  - stream: `pipeline.sweep` with `stream` (the target over each pass of sequences, every checkpoint replayed on
    the features while they are in memory; nothing written).
Both ways run once untimed first on the first `--warm-prompts` completions cut to `--warm-tokens` (kernels compiled
and tuned, weights cached by the OS; a chain replay's rounds grow with the tokens, so a full-length warm-up would
cost as much as the timed run), then timed on all of them. The runs are compared (`same_results`: every run's
prompts equal between the two ways). Each part prints its seconds as it ends.

    python benchmarks/bench_stream.py            # CUDA: 200 x 2,560 tokens, hidden 2048, 8 target layers, 4 checkpoints
    python benchmarks/bench_stream.py --small    # the CPU: 6 prompts of 128 tokens, tiny shapes

Figures: extract_s, sweep_s, extract_then_sweep_s, stream_sweep_s, stream_over_extract_then_sweep (below 1: streaming
is faster), feature_file_bytes (what extract-then-sweep wrote; streaming writes none), same_results.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from _common import note, report
from bench_ray import build, sizes, taps, timed

from dflash_dash import ops, pipeline
from dflash_dash.store import Store


def args_():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CPU, tiny shapes (a smoke test)")
    ap.add_argument("--prompts", type=int, default=None, help="completions (default 200; 6 small)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per completion (default 2560; 128 small)")
    ap.add_argument("--hidden", type=int, default=None, help="hidden size of target and drafters (2048; 64 small)")
    ap.add_argument("--layers", type=int, default=8, help="target layers")
    ap.add_argument("--checkpoints", type=int, default=4, help="checkpoints in the swept folder")
    ap.add_argument("--warm-prompts", type=int, default=8, help="completions of the untimed first run of both ways")
    ap.add_argument(
        "--warm-tokens",
        type=int,
        default=256,
        help="their tokens: enough to compile and tune (a chain replay's rounds grow with the tokens, not the prompts)",
    )
    ap.add_argument("--work", default=None, help="folder for the workspace (default: a temporary folder)")
    return ap.parse_args()


def ways(st: Store, target: Path, folder: Path, layers: int, dev: str, dtype: str, name: str = "bench") -> dict:
    """Both ways once over completion set `name`; returns their seconds, run ids and the feature bytes written."""
    ex_op = ops.Extract(target=str(target), completions=name, layers=taps(layers), device=dev, dtype=dtype)
    t_ex, ex = timed(lambda: pipeline.extract(st, ex_op))
    note(f"{name}: extract {t_ex:.1f} s")  # each part as it ends: a run cut short still says where it was
    sw = ops.Sweep(checkpoints=str(folder), extraction=ex, device=dev, dtype=dtype, tree_budget=0)
    t_sw, runs = timed(lambda: pipeline.sweep(st, sw))
    note(f"{name}: sweep {t_sw:.1f} s")
    written = sum(f.stat().st_size for f in pipeline.features_root(st).rglob("*") if f.is_file())
    streaming = replace(sw, extraction="latest", stream=True, target=str(target), completions=name)
    t_st, streamed = timed(lambda: pipeline.sweep(st, streaming))
    note(f"{name}: stream {t_st:.1f} s")
    return {"extract": t_ex, "sweep": t_sw, "stream": t_st, "runs": runs, "streamed": streamed, "bytes": written}


def shorter(line: str, tokens: int) -> str:
    """One completion's JSON line cut to `tokens` tokens in all (its prompt kept whole)."""
    c = json.loads(line)
    c["output_ids"] = c["output_ids"][: max(1, tokens - len(c["prompt_ids"]))]
    return json.dumps(c) + "\n"


def main() -> None:
    a = args_()
    cuda = sizes(a, (6, 128, 64), (200, 2560, 2048))
    dev, dtype = ("cuda", "bfloat16") if cuda else ("cpu", "float32")
    base = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="bench-stream-"))
    try:
        st, target, first = build(base, a, a.checkpoints)
        folder = first.parent
        note(f"{a.prompts} x {a.tokens} tokens, hidden {a.hidden}, {a.layers} target layers, {a.checkpoints} "
             f"checkpoints, {dev} {dtype}")  # fmt: skip
        warm = base / "warm.jsonl"  # the first completions: the untimed run compiles, tunes and caches
        warm.write_text(
            "".join(
                shorter(line, a.warm_tokens) for line in (base / "c.jsonl").read_text().splitlines()[: a.warm_prompts]
            )
        )
        pipeline.import_completions(st, warm, "warm")
        ways(st, target, folder, a.layers, dev, dtype, "warm")
        shutil.rmtree(base / "ws", ignore_errors=True)  # a fresh store: nothing reused from the warm-up
        st2 = Store(base / "ws")
        pipeline.import_completions(st2, base / "c.jsonl", "bench")
        got = ways(st2, target, folder, a.layers, dev, dtype)
        same = len(got["runs"]) == len(got["streamed"]) == a.checkpoints and all(
            st2.prompts(x) == st2.prompts(y) for x, y in zip(got["runs"], got["streamed"])
        )
        both = got["extract"] + got["sweep"]
        report(
            {
                "extract_s": got["extract"],
                "sweep_s": got["sweep"],
                "extract_then_sweep_s": both,
                "stream_sweep_s": got["stream"],
                "stream_over_extract_then_sweep": got["stream"] / both,
                "feature_file_bytes": got["bytes"],
                "same_results": int(same),
            }
        )
        assert same, "the streamed runs differ from extract-then-sweep's"
    finally:
        if not a.work:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
