"""Loaded at start-up by a benchmark's worker process (`bench_sweep.py --trace` puts this folder first on the
workers' PYTHONPATH): traces its chain-only walks into $DFLASH_BENCH_TRACE (`_trace.install`)."""

import os
import sys

if os.environ.get("DFLASH_BENCH_TRACE"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/ (_trace)
    import _trace

    _trace.install(os.environ["DFLASH_BENCH_TRACE"])
