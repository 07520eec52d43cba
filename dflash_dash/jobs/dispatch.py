"""Running one recorded job in this process: what the job process (`python -m dflash_dash.jobs`) does.

Contract: `execute(store, job_id)` marks the job running, rebuilds its operation (`ops.of`) and runs it (`run`),
with progress and step written to the store through a `lifecycle.Reporter`, and ends it done (with a result
dict), failed (a user error as its message, exit code 2; anything else with the traceback in the log and one line
in the store, exit code 1) or cancelled (SIGTERM/SIGINT, exit code 130). `run` is the one dispatch: an extraction
with its GPU orchestration (`orchestrate.run_extract`, which performs it inside), everything else through
`pipeline.perform` (the demo build and the backend parity registered there by `commands`), sharded over worker
processes when the op names several devices, or over a Ray cluster's workers when it names one (`workers.placed`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback

from .. import ops, pipeline
from ..errors import UserError
from ..store import Store
from . import commands  # noqa: F401  (registers the demo, jobs and parity handlers with pipeline.perform)
from .lifecycle import STOPS, Cancelled, Reporter
from .orchestrate import run_extract
from .workers import placed


def execute(store: Store, job_id: str) -> int:
    """Run job `job_id` in this process (what the job process's entry calls); returns its exit code."""
    job = store.job(job_id)
    rep = Reporter(store, job_id)

    stopped = STOPS  # the signal that cancelled the job: a library that turns the raised Cancelled into an error of
    # its own (DuckDB's "Query interrupted") still ends the job cancelled
    stopped.clear()  # a job run in-process after another

    def stop(signum, frame):
        stopped.append(signal.Signals(signum).name)
        raise Cancelled(stopped[-1])

    try:
        old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:  # not the main thread (in-process use): no cancellation by signal
        old = {}
    try:
        store.update_job(job_id, status="running", pid=os.getpid(), step="starting")
        rep.note(f"job {job_id}: {job.kind} {json.dumps(job.args)} (pid {os.getpid()})")
        result = run(store, ops.of(job.kind, job.args), rep)
    except Cancelled as e:
        rep.note(f"cancelled ({e})")
        store.settle_job(job_id, "cancelled", "cancelled by user")
        return 130
    except UserError as e:
        rep.note(f"error: {e}")
        rep.flush()
        store.settle_job(job_id, "failed", str(e))
        return 2
    except Exception as e:  # noqa: BLE001  (any failure ends the job as failed, traceback in the log)
        if stopped:
            # the same first words as a plain cancel's: the log reads "cancelled (SIGTERM)" either way
            rep.note(f"cancelled ({stopped[-1]}); it surfaced as {type(e).__name__}: {str(e)[:200]}")
            store.settle_job(job_id, "cancelled", "cancelled by user")
            return 130
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
        rep.flush()
        store.settle_job(
            job_id,
            "failed",
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} (traceback in {job.log_path})",
        )
        return 1
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    rep.flush()
    store.update_job(job_id, progress=1.0, step="done", result=result)
    store.settle_job(job_id, "done", None)
    rep.note(f"done: {json.dumps(result)}")
    return 0


def run(store: Store, op: ops.Op, rep: Reporter) -> dict:
    """Run operation `op` with `rep` as its progress; returns the job's result dict. Extract, replay and sweep
    with several `gpus` shard their prompts over worker processes (`workers.pool`), with `ray` over a Ray
    cluster's workers (`cluster`)."""
    if isinstance(op, ops.Extract):
        return run_extract(store, op, rep)
    op, runner = placed(store, op)
    return pipeline.perform(store, op, rep, runner)
