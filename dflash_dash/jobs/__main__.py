"""The job process's entry: `python -m dflash_dash.jobs --workspace W ID` runs recorded job ID (`lifecycle.start`
spawns it), `python -m dflash_dash.jobs --workspace W --worker` runs one worker's shard read from stdin (the pool
in `workers` spawns it). Internal: no user runs it by hand.

Contract: a job's exit code is `dispatch.execute`'s (0 done, 2 user error, 1 any other failure, 130 cancelled); a
worker's is `workers.work_main`'s, and a worker exits without the interpreter's teardown once its lines are out.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..store import Store
from .dispatch import execute
from .workers import work_main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dflash_dash.jobs",
        description="run one recorded job, or one worker's shard with --worker (internal)",
    )
    p.add_argument("--workspace", required=True)
    p.add_argument("--worker", action="store_true", help="run the shard spec read from stdin (see `workers`)")
    p.add_argument("id", nargs="?")
    a = p.parse_args(argv)
    if a.worker:  # its lines written and flushed: exit without the interpreter's teardown (torch, Triton,
        # Inductor's compile workers), which the parent would wait for before the work ends; a failure that is not
        # a user error still ends through the traceback
        rc = work_main(a.workspace)
        sys.stdout.flush()  # fd 1 is stderr in a worker (`work_main`): what a library printed
        sys.stderr.flush()
        os._exit(rc)
    if not a.id:
        p.error("give the job id (or --worker)")
    return execute(Store(a.workspace), a.id)


if __name__ == "__main__":
    sys.exit(main())
