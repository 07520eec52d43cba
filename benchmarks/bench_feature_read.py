"""Writing and reading cached features (`cache.write`: the file written straight from the tensor, fsynced;
`cache.read`: safetensors load plus the validation of shape, dtype and finiteness), the extraction's last step and
the step before a replay or sweep's first checkpoint: 200 files of 2,560 tokens at 27B shapes are 26 GB.

Times `cache.write` of `--files` feature files of `--tokens` x K*H bf16 (random) against safetensors' own
`save_file` + fsync (what it replaced: a serialised copy of the payload first), then `cache.read` of each, the files
in the page cache (as right after an extraction), and the finiteness check apart.

    python benchmarks/bench_feature_read.py [--files 8] [--tokens 2560] [--width 25600]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from _common import note, report  # (puts the repository root on sys.path)
from safetensors.torch import save_file

from dflash_dash import cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=2560)
    ap.add_argument("--width", type=int, default=25600, help="K*H (27B shapes: 5 layers x 5120)")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="dflash-read-")
    try:
        t = torch.randn(a.tokens, a.width, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
        t0 = time.perf_counter()
        for i in range(a.files):
            cache.write(root, "ex", f"p{i}", t, {})
        wrote = (time.perf_counter() - t0) / a.files
        t0 = time.perf_counter()
        for i in range(a.files):
            f = Path(root) / f"st{i}.safetensors"
            save_file({cache.KEY: t}, str(f), metadata={"meta": "{}"})
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        saved = (time.perf_counter() - t0) / a.files
        cache.read(root, "ex", "p0", a.tokens, a.width)  # warm
        t0 = time.perf_counter()
        for i in range(a.files):
            x = cache.read(root, "ex", f"p{i}", a.tokens, a.width)
        dt = (time.perf_counter() - t0) / a.files
        t0 = time.perf_counter()
        for _ in range(a.files):
            cache.finite(x)
        check = (time.perf_counter() - t0) / a.files
        note(
            f"{a.files} files of {a.tokens} x {a.width} bf16 ({t.numel() * 2 / 1e6:.0f} MB each), "
            f"{torch.get_num_threads()} torch threads"
        )
        report(
            {
                "feature_write_ms_per_file": wrote * 1e3,
                "feature_write_gb_per_s": t.numel() * 2 / wrote / 1e9,
                "feature_write_save_file_ms_per_file": saved * 1e3,
                "feature_read_ms_per_file": dt * 1e3,
                "feature_read_gb_per_s": t.numel() * 2 / dt / 1e9,
                "feature_finite_check_ms_per_file": check * 1e3,
            }
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
