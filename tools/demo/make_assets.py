"""Make the demo's committed assets, reproducibly: `python -m tools.demo.make_assets STEP ...` (from the repository
root; development tooling, never imported by the app or the CLI).

Steps (each records seeds, arguments, versions, timings and losses for MANIFEST.json):
  prepare       (CPU)  synthetic corpus (tools/demo/synth.py) -> byte-level BPE tokenizer (with <|mask|>),
                       uint16 token stream, the prompts of the drafter's training data, and the coding-10
                       prompt ids exactly as `pipeline.fetch` makes them (plain text, no chat template).
  gpu           (CUDA) train the target (its Gated DeltaNet backward on the torch path: fla 0.6.0 refuses
                       its gated chunk backward on Hopper with Triton < 3.7.1); generate the drafter's training
                       data with it (its own greedy continuations) and extract their hidden states with fla;
                       train the drafters (a healthy series and one run per training bug); complete
                       coding-10 greedily on the torch path on the CPU (as the local server does) and extract
                       those completions with fla in the feature-cache format. Writes target.tar,
                       drafters.tar, fla.tar, train_seqs.json and gpu.json to --out (each stage as soon as it
                       is done; DEMO_REUSE=<earlier out> reuses a trained target). `--device cpu --smoke`
                       runs every step at toy size on the torch path (development).
  unpack        (CPU)  the tars -> dflash_dash/demo/assets/, plus MANIFEST.json with every record and sizes.
  families      (CPU)  one DSpark, Domino and DFlash2 drafter: the final checkpoint's backbone with each family's
                       head fine-tuned on the CPU (tools/demo/families.py); after unpack, before finish.
  finish        (CPU)  merge the device calls' record (gpu_runs.json) into MANIFEST.json.
  rebug         (CPU)  swap in the bug runs of a `gpu` rerun with DEMO_BUGS=<bugs> DEMO_REUSE=<earlier out>
                       (its bugs.tar and gpu.json) for the same bugs' checkpoints and records; then `families`
                       is not needed again (it reads the final checkpoint only).

Contract: this module is the command line only (`main`); each step lives in its own module (`prepare`, `gpu`,
`manifest` for unpack, finish and rebug), sharing the constants and log of `common`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dflash_dash.demo import ASSETS

from .gpu import gpu
from .manifest import finish, rebug, unpack
from .prepare import prepare


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.demo.make_assets", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="step", required=True)
    s = sub.add_parser("prepare")
    s.add_argument("--build", default=".demo-build")
    s.add_argument("--free", action="store_true", help="a writer's free choices in the corpus (tools/demo/vary.py)")
    s.add_argument("--real", action="store_true", help="mix in the standard library's functions (tools/demo/stdlib.py)")
    s.add_argument("--docs", type=int, default=160_000, help="synthetic documents in the target's corpus")
    s = sub.add_parser("gpu")
    s.add_argument("--build", default=".demo-build")
    s.add_argument("--out", required=True)
    s.add_argument("--device", default="cuda")
    s.add_argument("--smoke", action="store_true")
    s = sub.add_parser("unpack")
    s.add_argument("--src", required=True)
    s.add_argument("--build", default=".demo-build")
    s.add_argument("--assets", default=str(ASSETS))
    s.add_argument("--command", default="")
    s = sub.add_parser("families")
    s.add_argument("--assets", default=str(ASSETS))
    s = sub.add_parser("finish")
    s.add_argument("--src", required=True)
    s.add_argument("--assets", default=str(ASSETS))
    s = sub.add_parser("rebug")
    s.add_argument("--src", required=True)
    s.add_argument("--assets", default=str(ASSETS))
    s.add_argument("--command", default="")
    a = p.parse_args(argv)
    if a.step == "prepare":
        prepare(Path(a.build), n_docs=a.docs, free=a.free, real=a.real)
    elif a.step == "gpu":
        gpu(Path(a.build), Path(a.out), a.device, a.smoke)
    elif a.step == "families":
        from .families import families

        families(Path(a.assets))
    elif a.step == "finish":
        finish(Path(a.src), Path(a.assets))
    elif a.step == "rebug":
        rebug(Path(a.src), Path(a.assets), a.command)
    else:
        unpack(Path(a.src), Path(a.build), Path(a.assets), a.command)


if __name__ == "__main__":
    sys.exit(main())
