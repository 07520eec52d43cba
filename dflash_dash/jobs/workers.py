"""The worker pool: the per-prompt work of one operation (extract, replay, sweep, and both with --stream)
sharded over one worker process per device.

Contract: `pool(store, devs)` is a pipeline Runner: the prompt ids are dealt round-robin into shards, worker i runs
`pipeline.work` on shard i with the operation's worker spec (`ops.ExtractWork`, `ops.ReplayWork`, or
`ops.StreamWork`: the target's features computed in the worker's memory, no file written) set to device devs[i]
(`python -m dflash_dash.jobs --worker`, entry `work_main`), and its events come back in the `wire` format.
The calling process alone writes the store; progress is the workers' sum. A worker that fails or dies stops the
others and raises WorkerError with the end of its stderr; leaving the iteration early (an error, a cancel) stops
them all too, and what finished is kept, so a rerun resumes. Workers stay in the caller's process group, so
cancelling a job's group stops them as well. `runner_for(store, op)` picks the pool when the op names several
devices, and `check_devices` refuses devices this machine lacks first; `placed` picks the Ray cluster's workers
instead (jobs.cluster) when the op names one (`--ray`).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from .. import ops, pipeline
from ..errors import UserError
from ..store import Store, new_id
from . import gpu, wire
from .failure import WorkerError
from .lifecycle import child_env, exit_text

WORKER_STOP_S = 5.0  # a worker that outlives its run gets SIGTERM, then SIGKILL after this long


def runner_for(store: Store, op: ops.Op) -> pipeline.Runner | None:
    """`pool` over the GPUs of the op's placement when it names several; None (work in this process) otherwise."""
    p = op.placement
    devs = p.devices() if p else []
    return pool(store, devs) if len(devs) > 1 else None


def placed(store: Store, op: ops.Op) -> tuple[ops.Op, pipeline.Runner | None]:
    """(the op as it runs, its runner), as its placement (`op.placement`) says: with `ray`, the Ray cluster's
    workers (`cluster.placed`: connected, sized and checked before any work, `device` set to the workers' kind);
    else `runner_for`'s."""
    p = op.placement
    if p and p.ray:
        from . import cluster

        return cluster.placed(store, op, p)
    return op, runner_for(store, op)


def check_devices(devs: list[str]) -> None:
    """Refuse worker devices this machine lacks, naming them and the fix."""
    cuda = [d for d in devs if d.startswith("cuda")]
    if not cuda:
        return
    have = gpu.devices()  # the one torch-free list of what this machine has (as check_extract)
    n = len(have) - 1  # every entry but cpu is cuda:i
    bad = [d for d in cuda if gpu.normalize(d) not in have]
    if bad:
        raise ops.InputError(
            f"gpus: {', '.join(bad)} not on this machine ({n} CUDA device(s)"
            f"{f': 0..{n - 1}' if n else ''}); give GPU indices that exist, or cpu,cpu"
        )


def pool(store: Store, devs: list[str]) -> pipeline.Runner:
    """A pipeline Runner over one worker process per device of `devs` (see the module's contract): spec on each
    worker's stdin, events and progress as JSON lines on its stdout, its stderr to W/logs/workers/."""
    check_devices(devs)
    logs = store.workspace.resolve() / "logs" / "workers"
    env = child_env()
    ncpu = sum(d == "cpu" for d in devs)
    if ncpu and "OMP_NUM_THREADS" not in os.environ:  # CPU workers share the cores instead of oversubscribing
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // ncpu))

    def runner(spec: ops.Work, ids: list, progress: pipeline.Progress) -> Iterator[dict]:
        shards = [ids[i :: len(devs)] for i in range(len(devs))]
        logs.mkdir(parents=True, exist_ok=True)
        tag = new_id("w")
        q: queue.Queue = queue.Queue()
        procs: dict[int, tuple[subprocess.Popen, str, Path]] = {}
        state: dict[int, tuple[int, int]] = {}
        try:
            for i, (dev, shard) in enumerate(zip(devs, shards)):
                if not shard:
                    continue
                err = logs / f"{tag}-{i}.err"
                with open(err, "wb") as f:
                    p = subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "dflash_dash.jobs",
                            "--workspace",
                            str(store.workspace.resolve()),
                            "--worker",
                        ],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=f,
                        env=env,
                    )
                procs[i], state[i] = (p, dev, err), (0, len(shard))
                p.stdin.write(wire.encode_spec(replace(spec, device=dev), shard))
                p.stdin.close()
                threading.Thread(target=_pump, args=(i, p.stdout, q), daemon=True).start()
            live = set(procs)
            if procs:
                _tick_workers(progress, state, f"started {len(procs)} workers on {', '.join(devs[i] for i in procs)}")
            while live:
                try:
                    i, msg = q.get(timeout=0.5)
                except queue.Empty:
                    continue
                if msg is None:  # its stdout closed: it ended
                    live.discard(i)
                    p, dev, err = procs[i]
                    rc = p.wait()
                    if rc != 0:
                        raise WorkerError(_worker_failed(i, len(devs), dev, rc, err, state[i]))
                elif "progress" in msg:
                    d, t, m = msg["progress"]
                    state[i] = (d, t or state[i][1])
                    _tick_workers(progress, state, f"{m} [worker {i + 1}, {procs[i][1]}]")
                else:
                    yield wire.unpacked(msg["event"])
        finally:
            _stop([p for p, _, _ in procs.values()])

    return runner


def _tick_workers(progress: pipeline.Progress, state: dict[int, tuple[int, int]], msg: str) -> None:
    if progress:
        progress(sum(d for d, _ in state.values()), sum(t for _, t in state.values()), msg)


def _pump(i: int, stream, q: queue.Queue) -> None:
    """Forward a worker's JSON lines to the queue, then None at its end."""
    try:
        for line in stream:
            try:
                q.put((i, json.loads(line)))
            except ValueError:
                continue  # not ours (a library printing to stdout before it was redirected)
    finally:
        q.put((i, None))


def _worker_failed(i: int, n: int, dev: str, rc: int, err: Path, state: tuple[int, int]) -> str:
    lines = [ln.strip() for ln in err.read_text(errors="replace").splitlines() if ln.strip()]
    said = [ln.removeprefix("error: ") for ln in lines if ln.startswith("error: ")]
    who = f"worker {i + 1} of {n} ({dev})"
    if rc == 2 and said:  # a user error: its message is the job's
        return f"{who}: {said[-1]}"
    tail = " | ".join(lines[-4:]) or "(nothing)"
    print(f"{who} ended with {exit_text(rc)}; its stderr ({err}) ends:\n" + "\n".join(lines[-30:]), flush=True)
    return (
        f"{who} died ({exit_text(rc)}) after {state[0]} of {state[1]} prompts; its stderr ends: {tail[-600:]} "
        f"(all of it: {err}). What finished is kept: rerun to continue"
    )


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM the workers still running, SIGKILL those left after WORKER_STOP_S."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + WORKER_STOP_S
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def work_main(workspace: str) -> int:
    """A worker process's entry: read its spec (`wire.decode_spec`) on stdin, run `pipeline.work`, write
    {"progress": [done, total, msg]} and {"event": ...} lines on stdout. Exit 2 with `error: ...` on stderr for
    a user error; anything else ends it with a traceback on stderr. The lines are packed and written by a
    writer thread (`wire.Writer`), so a checkpoint's results travel while the next one replays."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever else prints goes to stderr, never into the event stream
    spec, prompts = wire.decode_spec(sys.stdin)
    w = wire.Writer(out)
    try:
        for ev in pipeline.work(Store(workspace), spec, prompts, lambda d, t, m: w.emit({"progress": [d, t, m]})):
            w.emit({"event": ev})
    except UserError as e:
        w.close()
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except BaseException:
        w.close(check=False)
        raise
    w.close()
    out.flush()
    return 0
