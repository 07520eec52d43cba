"""Shared pieces of the benchmarks: the measured bf16 matrix rate, timing, and `name: value` output.

Contract: nothing here knows the product; each benchmark prints its figures through `report`, one
`name: value` line each, so that RESULTS.md and CI logs can be grepped.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/bench_x.py` from the repository root
    sys.path.insert(0, str(ROOT))


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Wall-clock seconds of a block, the device synchronised on entry and exit."""

    def __init__(self, device):
        self.device, self.s = device, 0.0

    def __enter__(self):
        sync(self.device)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        sync(self.device)
        self.s = time.perf_counter() - self.t0


def matmul_tflops(device, n: int = 8192, dtype=torch.bfloat16, reps: int = 10) -> float:
    """Measured dense matrix rate: n-cube products on random data, 3 warm-ups, mean of `reps` timed."""
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    for _ in range(3):
        a @ b
    with Clock(device) as c:
        for _ in range(reps):
            a @ b
    return 2 * n**3 * reps / c.s / 1e12


def peak_gib(device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if torch.device(device).type == "cuda" else 0.0


SHARED = ("matmul_bf16_tflops", "check_fp32")  # figures of the device or a tiny check, never suffixed


def suffixed(figures: dict, suffix: str) -> dict:
    """`figures` with `_suffix` added to every name but the SHARED ones (a family's, a length's: _32k)."""
    return {(k if k.startswith(SHARED) else f"{k}_{suffix}"): v for k, v in figures.items()}


def tokens_name(tokens: int) -> str:
    """A token count as figures name it: 32k, 128k from 1,024 up, else the count (512)."""
    return f"{round(tokens / 1024)}k" if tokens >= 1024 else str(tokens)


def length_suffix(tokens: int | None, small: bool) -> str | None:
    """The figures' suffix of a run at `tokens` per sequence: _32k, _128k; None at the reference 2,560 (or small)."""
    return tokens_name(tokens) if tokens and tokens != 2560 and not small else None


def report(figures: dict) -> None:
    """Print `name: value` lines (floats with 4 significant digits, whole numbers exactly)."""
    for k, v in figures.items():
        if isinstance(v, float) and v.is_integer() and abs(v) < 1e12:
            v = int(v)  # byte counts and flags print exactly
        print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}", flush=True)


def profile(fn, device, rows: int = 25, by: tuple[str, ...] = ()):
    """Print the top ops of one call of `fn` (torch.profiler; by device time, else CPU time, or by each key of
    `by`), for finding where time goes; returns what `fn` returns."""
    from torch.profiler import ProfilerActivity, profile as prof

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else [])
    with prof(activities=acts) as p:
        out = fn()
        sync(device)
    keys = by or ("cuda_time_total" if torch.device(device).type == "cuda" else "cpu_time_total",)
    for key in keys:
        print(f"# top ops by {key}", flush=True)
        print(p.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=70), flush=True)
    return out


def note(msg: str) -> None:
    print(f"# {msg}", flush=True)
