"""Background jobs: long work (fetch, extraction, replay, sweep, demo) as a separate OS process.

Contract:
- `start(store, op)` records the job (its kind and `op.to_args()`, status queued; an `ops` dataclass, or a kind
  and args dict validated through `ops.of`) and spawns `python -m dflash_dash.jobs --workspace W ID` in its own
  session (process group), output to `W/logs/ID.log`; it returns the job id at once. The child runs
  `execute`, which marks the job running, rebuilds the operation (`ops.of`) and runs it (`run`: one dispatch,
  `pipeline.perform`) with progress/step written to the store (throttled), and ends done (with a result
  dict), failed (user errors as their message; anything else with the traceback in the log and one line in
  the store) or cancelled (SIGTERM).
- GPUs: an extract/replay/sweep naming several `gpus` runs its per-prompt work in one worker process per
  device (`workers`: `python -m dflash_dash.jobs --worker`, in the job's process group); the job process alone
  writes the store, progress is the workers' sum, a worker that fails or dies fails the job with the end of
  its stderr and stops the others, cancel stops them all, and a rerun resumes (an extraction keeps its items).
- Status lives only in the store: `refresh` marks a queued/running job whose process is gone as failed
  ("process died ..."), so nothing is left "running" forever. `cancel` stops the process group (SIGTERM,
  SIGKILL after a grace period); `rerun` starts a new job with the same args that continues where the
  old one stopped (fetch skips stored prompts; extract resumes the old job's partial extraction).
- Extraction jobs orchestrate the GPU as visible steps: free the SGLang server's memory (memory-release
  API, or the stop command of `W/config.toml`), check free GPU memory against the target's weights
  (naming the processes that hold memory), extract, then restore the server and wait for /health 200
  before reporting done; the server is restored also when the extraction fails or is cancelled.
- Before an extraction starts, `check_extract` (torch-free, over `devices()`) refuses a device this machine lacks
  and names the existing extractions it would duplicate; the Extraction page and `extract` on the CLI both call it.
  `recent(..., dismissed=False)` leaves out the failed/cancelled jobs a user dismissed (the jobs panel).
Shell commands come only from the workspace config, run without a shell, and are logged before they run.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from dataclasses import fields, is_dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import config as config_mod
from . import lazy, ops, pipeline, sglang
from .errors import UserError
from .store import Store, new_id

if TYPE_CHECKING:  # loads on first use: listing and dismissing jobs never import torch
    from . import target as target_mod
else:
    target_mod = lazy.module("dflash_dash.target")

ACTIVE = ("queued", "running")
THROTTLE_S = 0.3  # at most one progress write per this many seconds
GRACE_S = 10.0  # cancel: SIGTERM, then SIGKILL after this long
STOP_TIMEOUT_S = 120.0  # a stop command and the server going down must finish within this
MEMORY_WAIT_S = 30.0  # released GPU memory may take this long to show as free
IDLE_WAIT_S = 120.0  # before a memory release, wait this long for the server's requests to finish
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
_CHILDREN: dict[str, subprocess.Popen] = {}  # jobs started by this process (reaped by refresh)


class OrchestrationError(UserError, RuntimeError):
    """The GPU or the server could not be prepared or restored; the message names what and the fix."""


class Cancelled(BaseException):
    """Raised in a job process by SIGTERM/SIGINT (a BaseException so library code does not swallow it)."""


# ---------------------------------------------------------------------------
# progress


class Reporter:
    """The `progress(done, total, message)` callback of a job: writes progress/step to the store at most
    every THROTTLE_S seconds, and a line per step to the job log (stdout of the job process)."""

    def __init__(self, store: Store, job_id: str):
        self.store, self.job_id = store, job_id
        self.pending: tuple[float | None, str] | None = None
        self.written = 0.0
        self.logged: tuple = (None, 0.0)  # ((done, total), when)

    def __call__(self, done: int, total: int, msg: str) -> None:
        self.pending = (min(1.0, done / total) if total else None, msg)  # total 0: progress unchanged
        now = time.monotonic()
        if now - self.written >= THROTTLE_S or (total and done >= total):
            self.flush()
        if self.logged[0] != (done, total) or now - self.logged[1] >= 5.0:
            self.note(msg)
            self.logged = ((done, total), now)

    def flush(self) -> None:
        if self.pending is not None:
            frac, msg = self.pending
            fields = {"step": msg[:500]} if frac is None else {"progress": frac, "step": msg[:500]}
            self.store.update_job(self.job_id, **fields)
            self.pending = None
            self.written = time.monotonic()

    def step(self, msg: str) -> None:
        """A visible step: written at once, logged."""
        self.flush()
        self.store.update_job(self.job_id, step=msg[:500])
        self.written = time.monotonic()
        self.note(msg)

    def note(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def result(self, result: dict) -> None:
        self.store.update_job(self.job_id, result=result)


# ---------------------------------------------------------------------------
# running an operation: one generic dispatch (pipeline.perform); demo and the extraction's orchestration here


def run(store: Store, op: ops.Op, rep: Reporter) -> dict:
    """Run operation `op` with `rep` as its progress; returns the job's result dict. Extract, replay and sweep
    with several `gpus` shard their prompts over worker processes (`workers`)."""
    if isinstance(op, ops.Demo):
        from . import demo

        out = demo.build(store.workspace, rep)
        return out if isinstance(out, dict) else {"value": out}
    if isinstance(op, ops.Extract):
        return run_extract(store, op, rep)
    return pipeline.perform(store, op, rep, runner_for(store, op))


def runner_for(store: Store, op: ops.Op) -> pipeline.Runner | None:
    """`workers` over the op's GPUs when it names several; None (work in this process) otherwise."""
    devs = op.devices()
    return workers(store, devs) if len(devs) > 1 else None


def run_extract(store: Store, op: ops.Extract, rep: Reporter) -> dict:
    cfg = config_mod.load(store.workspace)
    layers = pipeline.layer_ids_of(op.drafter, op.layers)
    info = target_mod.describe(op.target)  # fail on a bad target/set before touching the server
    target_mod.check_layers(info, layers)
    if not store.completion_ids(op.completions):
        raise pipeline.InputError(f"no completions in set {op.completions!r}; fetch or import them first")
    ex_id = op.extraction_id or new_id("ex")
    op = replace(op, target=info.path, layers=layers, drafter=None, extraction_id=ex_id)
    rep.result({"extraction": ex_id})  # known from the start, so a rerun resumes it
    known = {e["id"]: e["status"] for e in store.extractions()}
    if known.get(ex_id) not in (None, "done"):
        store.set_status("extractions", ex_id, "running")
    runner = runner_for(store, op)  # devices checked before the server is touched
    client = sglang.for_workspace(cfg, op.server)
    freed = None
    try:
        freed = free_gpu(client, cfg, op.orchestrate, rep)
        for dev in dict.fromkeys(op.devices()):
            check_memory(info.path, dev, cfg.gpu_memory_margin_gb, rep)
        rep.step(f"loading target {info.path} on {', '.join(op.devices())}")

        def progress(done: int, total: int, msg: str) -> None:
            rep(done, total, f"extracting {done}/{total}: {msg}" if done else msg)

        ex_id = pipeline.perform(store, op, progress, runner)["extraction"]
    except BaseException as e:
        if any(x["id"] == ex_id and x["status"] != "done" for x in store.extractions()):
            store.set_status("extractions", ex_id, "cancelled" if isinstance(e, Cancelled) else "failed")
        if freed:
            rep.note(f"extraction stopped ({type(e).__name__}: {e}); restoring the server first")
            try:
                restore(client, cfg, freed, rep)
            except Exception as r:  # noqa: BLE001  (report both failures)
                raise OrchestrationError(f"{e}; restoring the server failed too: {r}") from e
        raise
    if freed:
        restore(client, cfg, freed, rep)
    return {"extraction": ex_id}


# ---------------------------------------------------------------------------
# workers: the per-prompt work of one operation sharded over one process per GPU


class WorkerError(UserError, RuntimeError):
    """A worker process failed or died; the message names it, its device and the end of its stderr."""


WORKER_STOP_S = 5.0  # a worker that outlives its run gets SIGTERM, then SIGKILL after this long


def check_devices(devs: list[str]) -> None:
    """Refuse worker devices this machine lacks, naming them and the fix."""
    cuda = [d for d in devs if d.startswith("cuda")]
    if not cuda:
        return
    have = devices()  # the one torch-free list of what this machine has (as check_extract)
    n = len(have) - 1  # every entry but cpu is cuda:i
    bad = [d for d in cuda if _device(d) not in have]
    if bad:
        raise pipeline.InputError(
            f"gpus: {', '.join(bad)} not on this machine ({n} CUDA device(s)"
            f"{f': 0..{n - 1}' if n else ''}); give GPU indices that exist, or cpu,cpu"
        )


def workers(store: Store, devs: list[str]) -> pipeline.Runner:
    """A pipeline Runner over one worker process per device of `devs`: the prompt ids are dealt round-robin into
    shards, worker i runs `pipeline.work` on shard i with device devs[i] (`python -m dflash_dash.jobs --worker`,
    spec on stdin, events and progress as JSON lines on stdout, stderr to W/logs/workers/), and its events are
    yielded here as they arrive, progress summed over the workers. A worker that fails or dies stops the others
    and raises WorkerError with the end of its stderr; leaving the iteration early (an error, a cancel) stops them
    all too. Workers stay in this process's group, so cancelling a job's group stops them as well."""
    check_devices(devs)
    logs = store.workspace.resolve() / "logs" / "workers"
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
    )
    ncpu = sum(d == "cpu" for d in devs)
    if ncpu and "OMP_NUM_THREADS" not in os.environ:  # CPU workers share the cores instead of oversubscribing
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // ncpu))

    def runner(kind: str, args: dict, ids: list, progress: pipeline.Progress) -> Iterator[dict]:
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
                p.stdin.write(json.dumps({"kind": kind, "args": args | {"device": dev}, "prompts": shard}).encode())
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
                    yield _unpacked(msg["event"])
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
    print(f"{who} ended with {_exit_text(rc)}; its stderr ({err}) ends:\n" + "\n".join(lines[-30:]), flush=True)
    return (
        f"{who} died ({_exit_text(rc)}) after {state[0]} of {state[1]} prompts; its stderr ends: {tail[-600:]} "
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
    """A worker process's entry: read the spec {"kind", "args", "prompts"} on stdin, run `pipeline.work`, write
    {"progress": [done, total, msg]} and {"event": ...} lines on stdout. Exit 2 with `error: ...` on stderr for
    a user error; anything else ends it with a traceback on stderr. The lines are packed and written by a
    writer thread (`_Writer`), so a checkpoint's results travel while the next one replays."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever else prints goes to stderr, never into the event stream
    spec = json.load(sys.stdin)
    w = _Writer(out)
    try:
        for ev in pipeline.work(
            Store(workspace),
            spec["kind"],
            spec["args"],
            spec["prompts"],
            lambda d, t, m: w.emit({"progress": [d, t, m]}),
        ):
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


class _Writer:
    """The worker's event lines, packed (`_plain`) and written in order by one thread. A failure there (a result
    that is not JSON data, a closed pipe) is raised by the next `emit` or by `close`."""

    def __init__(self, out):
        self.out, self.q, self.error = out, queue.Queue(), None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (obj := self.q.get()) is not None:
            if self.error is None:  # after a failure the rest is dropped, never written out of order
                try:
                    self.out.write(json.dumps(obj, default=_plain) + "\n")
                except BaseException as e:  # noqa: BLE001  (raised in the producing thread)
                    self.error = e

    def emit(self, obj: dict) -> None:
        if self.error is not None:
            raise self.error
        self.q.put(obj)

    def close(self, check: bool = True) -> None:
        """Write what is queued, end the thread; `check`: raise its failure."""
        self.q.put(None)
        self.thread.join()
        if check and self.error is not None:
            raise self.error


def _plain(o):
    """JSON for the worker's events: dataclasses (PromptResult) as dicts, their number lists packed (`pack`)."""
    if is_dataclass(o):
        return {f.name: pack(getattr(o, f.name)) for f in fields(o)}
    raise TypeError(f"{type(o).__name__} is not JSON data")


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(a.tobytes()).decode("ascii")


def _fill(dtype: np.dtype):
    """The value of an empty row: NaN (floats), -1 (integers: an anchor or slot not computed)."""
    return np.nan if dtype.kind == "f" else -1


def pack(v):
    """A numpy array or rectangular list of numbers as {"packed": [dtype, shape, base64 of its bytes]}, or, when
    most rows of a 2-D+ array are empty (all -1 or all NaN: the anchors a chain-only replay did not compute),
    [dtype, shape, base64 of the other rows, base64 of their indices]; anything else as it is.
    JSON text would cost the worker about 0.3 s and the parent 0.05 s per 2,560-token prompt (drafts and
    log-probabilities at every anchor), more than the prompt's replay; sending a chain-only prompt's empty rows
    would make its message about six times longer than its results."""
    if isinstance(v, np.ndarray) or (isinstance(v, list) and v):
        try:
            a = np.ascontiguousarray(v)
        except ValueError:  # ragged
            return v
        if a.dtype.kind == "i" and a.size and -(2**31) <= a.min() and a.max() < 2**31:
            a = a.astype(np.int32)  # lossless: token ids, counts
        if a.dtype.kind in "if":
            head = [a.dtype.str, list(a.shape)]
            if a.ndim >= 2 and a.size:
                flat = a.reshape(len(a), -1)  # [rows, rest]
                empty = (np.isnan(flat) if a.dtype.kind == "f" else flat == -1).all(1)  # [rows]
                if 2 * int(empty.sum()) > len(a):
                    rows = np.flatnonzero(~empty).astype(np.int32)
                    return {"packed": head + [_b64(a[rows]), _b64(rows)]}
            return {"packed": head + [_b64(a)]}
    return v


def unpack(v):
    """The inverse of `pack`: a list again where it was 1-D, else a numpy array (the store step reads both:
    lists of a prompt's 30,000 drafts and log-probabilities would cost the parent more than storing them)."""
    if isinstance(v, dict) and set(v) == {"packed"}:
        dt, shape, b, *rows = v["packed"]
        a = np.frombuffer(base64.b64decode(b), dtype=dt)
        if rows:  # only the non-empty rows travelled
            at = np.frombuffer(base64.b64decode(rows[0]), dtype=np.int32)
            out = np.full(shape, _fill(a.dtype), dtype=dt)
            out[at] = a.reshape(len(at), *shape[1:])
            return out
        a = a.reshape(shape)
        return a.tolist() if a.ndim == 1 else a
    return v


def _unpacked(ev: dict) -> dict:
    """A worker's event with the packed fields of its dict values (a result) unpacked."""
    return {k: {f: unpack(x) for f, x in v.items()} if isinstance(v, dict) else v for k, v in ev.items()}


# ---------------------------------------------------------------------------
# GPU orchestration


def free_gpu(client: sglang.Client, cfg: config_mod.WorkspaceConfig, mode: str, rep: Reporter) -> str | None:
    """Free the GPU the server holds: "release" (memory-release API), "command" (stop command) or None."""
    if mode == "none":
        rep.note("orchestrate none: the server is left as it is")
        return None
    cmds = config_mod.describe_commands(cfg)
    rep.note(f"server {client.url}; configured commands: {'; '.join(cmds) if cmds else 'none'}")
    if mode == "release":
        ok, state = client.health()
        if not ok and not state[:1].isdigit():
            raise OrchestrationError(
                f"the server at {client.url} is not reachable ({state}), so its memory "
                "cannot be released; start it, or extract with orchestrate none"
            )
        if cfg.memory_release and client.supports_memory_release():
            wait_idle(client, cfg, rep)
            rep.step("releasing server memory (POST /release_memory_occupation)")
            try:
                client.release_memory()
            except sglang.ServerError as e:
                raise OrchestrationError(
                    f"the server at {client.url} did not release its memory: {e}. If a "
                    "request started meanwhile, extract again once it has finished"
                ) from None
            return "release"
        why = (
            "memory_release = false in config.toml"
            if not cfg.memory_release
            else "the server does not report enable_memory_saver (start SGLang with --enable-memory-saver)"
        )
        if not cfg.stop_command:
            raise OrchestrationError(
                f"cannot free the GPU: {why}, and [server] stop_command is not set in "
                f"{config_mod.path_of(rep.store.workspace)}; configure stop_command and "
                "start_command, or extract with orchestrate none"
            )
        rep.note(f"{why}; using the stop command instead")
    if not cfg.stop_command or not cfg.start_command:
        raise OrchestrationError(
            f"orchestrate command needs stop_command and start_command under [server] in "
            f"{config_mod.path_of(rep.store.workspace)}"
        )
    rep.step(f"stopping server: {shlex.join(cfg.stop_command)}")
    try:
        rc = subprocess.run(cfg.stop_command, stdin=subprocess.DEVNULL, timeout=STOP_TIMEOUT_S).returncode
    except FileNotFoundError:
        raise OrchestrationError(
            f"stop command {cfg.stop_command[0]!r} not found; fix [server] stop_command in config.toml"
        ) from None
    except subprocess.TimeoutExpired:
        raise OrchestrationError(f"stop command did not finish within {STOP_TIMEOUT_S:g} s") from None
    if rc != 0:
        raise OrchestrationError(
            f"stop command `{shlex.join(cfg.stop_command)}` exited with {rc}; see the job "
            "log; the server was not stopped"
        )
    rep.step("waiting for the server to stop")
    deadline = time.monotonic() + min(STOP_TIMEOUT_S, cfg.readiness_timeout)
    while True:
        ok, state = client.health()
        if not ok and not state[:1].isdigit() and state != "timeout":  # no connection: the process is gone
            return "command"
        if time.monotonic() > deadline:
            raise OrchestrationError(f"the server at {client.url} still answers ({state}) after the stop command")
        time.sleep(0.2)


def wait_idle(
    client: sglang.Client,
    cfg: config_mod.WorkspaceConfig,
    rep: Reporter,
    timeout: float = IDLE_WAIT_S,
    poll: float = 0.25,
) -> None:
    """Before a memory release: SGLang asserts its scheduler is idle, so never release under load. Raises
    OrchestrationError when a fetch job of this workspace runs against the server, or when the server still
    reports running/waiting requests after `timeout` seconds (or cannot report them at all)."""
    url = client.url.rstrip("/")
    fetching = [
        j["id"]
        for j in active(rep.store)
        if j["kind"] == "fetch" and ((j["args"] or {}).get("server") or cfg.server_url).rstrip("/") == url
    ]
    if fetching:
        raise OrchestrationError(
            f"fetch job {', '.join(fetching)} is running against {url}; its memory cannot be "
            "released under load. Wait for the fetch to finish or cancel it (Completions page, "
            "or `jobs cancel ID`), then extract again"
        )
    rep.step("waiting for the server to be idle (GET /v1/loads)")
    t0 = time.monotonic()
    while True:
        try:
            n = client.running_requests()
        except sglang.ServerError as e:
            raise OrchestrationError(f"cannot tell whether {url} is idle: {e}") from None
        if n is None:
            raise OrchestrationError(
                f"the server at {url} reports no load (neither GET /v1/loads nor /get_load), "
                "so it is unknown whether requests run, and SGLang may release memory only "
                "when idle; upgrade SGLang, or extract with orchestrate command"
            )
        if n == 0:
            rep.note("server idle: no running or waiting requests")
            return
        waited = time.monotonic() - t0
        if waited >= timeout:
            raise OrchestrationError(
                f"the server at {url} still has {n} running or waiting request(s) after "
                f"{timeout:g} s; SGLang releases memory only when idle, so nothing was "
                "released. Let those requests finish (or stop their client) and extract "
                "again, or use orchestrate command"
            )
        rep(0, 0, f"waiting for the server to be idle: {n} request(s) running or waiting ({waited:.0f} s)")
        time.sleep(min(poll, timeout - waited))


def restore(client: sglang.Client, cfg: config_mod.WorkspaceConfig, freed: str, rep: Reporter) -> None:
    """Give the server its GPU back and wait for /health 200 (SIGTERM is ignored meanwhile)."""
    proc = None
    if freed == "command":  # spawned before SIGTERM is ignored: the server must not inherit SIG_IGN
        rep.step(f"restoring server: {shlex.join(cfg.start_command)}")
        try:
            proc = subprocess.Popen(cfg.start_command, stdin=subprocess.DEVNULL, start_new_session=True)
        except FileNotFoundError:
            raise OrchestrationError(
                f"start command {cfg.start_command[0]!r} not found; fix [server] "
                "start_command in config.toml and start the server by hand"
            ) from None
    try:
        old = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:  # not the main thread
        old = None
    try:
        if freed == "release":
            rep.step("restoring server (POST /resume_memory_occupation)")
            client.resume_memory()
        rep.step("waiting for /health")

        def progress(elapsed: float, state: str) -> None:
            rep(0, 0, f"waiting for /health: {state} ({elapsed:.0f} s)")
            if proc is not None and proc.poll() not in (None, 0):
                raise OrchestrationError(
                    f"start command `{shlex.join(cfg.start_command)}` exited with {proc.returncode}; see the job log"
                )

        client.wait_ready(cfg.readiness_timeout, progress=progress)
        rep.step("server ready")
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def weights_bytes(model_dir: str | Path) -> int:
    """Bytes of the target's weight files (safetensors, else .bin)."""
    files = list(Path(model_dir).glob("*.safetensors")) or list(Path(model_dir).glob("*.bin"))
    return sum(f.stat().st_size for f in files)


def _smi(query: str, what: str) -> list[list[str]]:
    """Rows of `nvidia-smi --query-<what>=<query> --format=csv,noheader,nounits`; [] when unavailable."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-{what}={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def _processes() -> list[dict]:
    procs = []
    for row in _smi("gpu_uuid,pid,process_name,used_memory", "compute-apps"):
        if len(row) >= 4:
            try:
                procs.append({"gpu_uuid": row[0], "pid": int(row[1]), "name": row[2], "used": int(row[3]) << 20})
            except ValueError:
                continue
    return procs


def gpu_memory() -> list[dict]:
    """Per GPU: index, name, total, free (bytes), processes [{pid, name, used}]; [] without CUDA.

    Reads nvidia-smi when present (creates no CUDA context, so the app can call it); else torch."""
    gpus = []
    for row in _smi("index,name,memory.total,memory.free,uuid", "gpu"):
        try:
            gpus.append(
                {
                    "index": int(row[0]),
                    "name": row[1],
                    "total": int(row[2]) << 20,
                    "free": int(row[3]) << 20,
                    "uuid": row[4],
                }
            )
        except (ValueError, IndexError):
            continue
    if not gpus:
        import torch

        if not torch.cuda.is_available():
            return []
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            gpus.append({"index": i, "name": torch.cuda.get_device_name(i), "total": total, "free": free, "uuid": None})
    procs = _processes()
    for g in gpus:
        g["processes"] = [
            {k: p[k] for k in ("pid", "name", "used")}
            for p in procs
            if p["gpu_uuid"] == g["uuid"] or (g["uuid"] is None and len(gpus) == 1)
        ]
    return gpus


def devices() -> list[str]:
    """The devices an extraction can use on this machine, the default first: cuda:0..N-1 for the GPUs nvidia-smi
    (else the driver's /proc entry) shows, as many as CUDA_VISIBLE_DEVICES lets through, then cpu. Torch-free: no
    CUDA context, so the app can call it."""
    n = len(_smi("index", "gpu"))
    if not n:
        proc = Path("/proc/driver/nvidia/gpus")
        n = len(list(proc.iterdir())) if proc.is_dir() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # CUDA stops at the first empty or invalid entry ("" or "-1" hide every GPU)
        shown = 0
        for x in visible.split(","):
            if not x.strip() or x.strip().startswith("-"):
                break
            shown += 1
        n = min(n, shown)
    return [f"cuda:{i}" for i in range(n)] + ["cpu"]


def _device(device: str) -> str:
    return "cuda:0" if device == "cuda" else device


def check_extract(
    store: Store, target: str, set_name: str, layers: list[int], device: str, dtype: str, resume: str | None = None
) -> list[str]:
    """Check an extraction's device and dtype before anything starts (the Extraction page and `extract` on the
    CLI both call this, so both say the same): raises pipeline.InputError naming the field and the fix for a
    device this machine lacks (`cuda` without a CUDA GPU) or an unknown dtype. Returns one warning per existing
    extraction (done or running, `resume` excepted) the new one would duplicate: same completion set, target,
    layers, device (so backend) and dtype."""
    if dtype not in pipeline.DTYPES:
        raise pipeline.InputError(f"dtype {dtype!r}: expected one of {', '.join(pipeline.DTYPES)}")
    dev = _device(device.strip())
    if dev != "cpu" and not (dev.startswith("cuda:") and dev[5:].isdigit()):
        raise pipeline.InputError(f"device {device!r}: expected cpu, cuda or cuda:N (N = the GPU's index)")
    have = devices()
    if dev not in have:
        if have == ["cpu"]:
            raise pipeline.InputError(
                f"device {device!r}: this machine has no CUDA GPU (nvidia-smi shows none); set device to cpu "
                "(extraction then uses the torch path of the linear-attention kernels), or extract on a GPU machine"
            )
        raise pipeline.InputError(
            f"device {device!r}: this machine has no such GPU; set device to one of {', '.join(have)}"
        )
    path = str(Path(target).resolve())
    same = [
        e
        for e in store.extractions()
        if e["id"] != resume
        and e["status"] in ("done", "running")
        and e["set_name"] == set_name
        and e["target_path"] == path
        and list(e["layer_ids"] or []) == list(layers)
        and _device(e["device"]) == dev
        and e["dtype"] == dtype
    ]
    return [
        f"extraction {e['id']} ({e['status']}, backend {e['backend']}) already holds set {set_name!r} from this "
        f"target at layers {','.join(map(str, layers))} on {e['device']} in {e['dtype']}: a new one would "
        "duplicate it"
        for e in same
    ]


def check_memory(model_dir: str, device: str, margin_gb: float, rep: Reporter) -> None:
    """Wait (up to MEMORY_WAIT_S) until the device has the target's weight bytes + margin free; else raise
    OrchestrationError naming the processes that hold memory. Skipped (with a note) off CUDA."""
    rep.step("checking GPU memory")
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        rep.note(f"device {device}: no CUDA device in use, GPU memory check skipped")
        return
    idx = int(device.split(":", 1)[1]) if ":" in device else 0
    need = weights_bytes(model_dir) + int(margin_gb * (1 << 30))
    deadline = time.monotonic() + MEMORY_WAIT_S
    while True:
        free, total = torch.cuda.mem_get_info(idx)
        if free >= need:
            rep.note(
                f"cuda:{idx}: {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB; the target needs "
                f"about {need / 2**30:.1f} GiB (weights + {margin_gb:g} GiB margin)"
            )
            return
        if time.monotonic() > deadline:
            break
        time.sleep(1.0)
    uuid = str(getattr(torch.cuda.get_device_properties(idx), "uuid", "") or "")
    procs = [p for p in _processes() if not uuid or p["gpu_uuid"].removeprefix("GPU-") == uuid.removeprefix("GPU-")]
    held = (
        ", ".join(
            f"pid {p['pid']} {p['name']} ({p['used'] / 2**30:.1f} GiB{', this job' if p['pid'] == os.getpid() else ''})"
            for p in procs
        )
        or "unknown"
    )
    raise OrchestrationError(
        f"cuda:{idx} has {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB, but the target needs about "
        f"{need / 2**30:.1f} GiB (weights + {margin_gb:g} GiB margin); processes holding GPU memory: {held}. "
        "Free the GPU (orchestrate release or command) or stop those processes"
    )


# ---------------------------------------------------------------------------
# lifecycle


def start(store: Store, op: ops.Op | str, args: dict | None = None) -> str:
    """Record a job (its kind and `op.to_args()`) and spawn its process; returns the job id at once. `op` is an
    operation (`ops.Replay(...)`), or a kind with its args dict, validated through `ops.of`."""
    if isinstance(op, str):
        try:
            json.dumps(args)
        except (TypeError, ValueError) as e:
            raise pipeline.InputError(f"job arguments must be plain JSON data: {e}") from None
        op = ops.of(op, args)
    job_id = new_id("job")
    log = store.workspace.resolve() / "logs" / f"{job_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    store.add_job(job_id, op.kind, op.to_args(), str(log))
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
    )
    try:
        with open(log, "ab") as f:
            p = subprocess.Popen(
                [sys.executable, "-m", "dflash_dash.jobs", "--workspace", str(store.workspace.resolve()), job_id],
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
    except OSError as e:
        store.settle_job(job_id, "failed", f"could not start the job process: {e}")
        raise
    _CHILDREN[job_id] = p
    store.update_job(job_id, pid=p.pid)
    return job_id


def execute(store: Store, job_id: str) -> int:
    """Run job `job_id` in this process (what the job process's entry `main` calls); returns its exit code."""
    job = store.job(job_id)
    rep = Reporter(store, job_id)

    def stop(signum, frame):
        raise Cancelled(signal.Signals(signum).name)

    try:
        old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:  # not the main thread (in-process use): no cancellation by signal
        old = {}
    try:
        store.update_job(job_id, status="running", pid=os.getpid(), step="starting")
        rep.note(f"job {job_id}: {job['kind']} {json.dumps(job['args'])} (pid {os.getpid()})")
        result = run(store, ops.of(job["kind"], job["args"]), rep)
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
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
        rep.flush()
        store.settle_job(
            job_id,
            "failed",
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} (traceback in {job['log_path']})",
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


def _exit_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by signal {-rc} {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def _gone(job: dict) -> str | None:
    """None while the job's process runs; else how it ended."""
    p = _CHILDREN.get(job["id"])
    if p is not None:
        rc = p.poll()
        return None if rc is None else _exit_text(rc)
    pid = job["pid"]
    if not pid:
        created = job.get("created")
        young = isinstance(created, datetime) and abs((datetime.now() - created).total_seconds()) < 120
        return None if young else "the job process never started"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "exit status unknown"
    except PermissionError:
        return None
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state in ("Z", "X"):
            return "exit status unknown"
        if job["id"].encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return "exit status unknown; its pid now belongs to another process"
    except (OSError, IndexError):
        pass
    return None


def refresh(store: Store) -> None:
    """Mark queued/running jobs whose process is gone as failed."""
    for job in store.jobs():
        if job["status"] not in ACTIVE:
            continue
        how = _gone(job)
        if how is not None:
            store.settle_job(job["id"], "failed", f"process died ({how}); see the log {job['log_path']}")
            _CHILDREN.pop(job["id"], None)


def active(store: Store) -> list[dict]:
    refresh(store)
    return [j for j in store.jobs() if j["status"] in ACTIVE]


def recent(store: Store, n: int = 20, dismissed: bool = True) -> list[dict]:
    """The `n` newest jobs (dead ones settled first); `dismissed=False`: without those a user dismissed."""
    refresh(store)
    return store.jobs(dismissed=dismissed)[:n]


def cancel(store: Store, job_id: str, grace: float = GRACE_S) -> dict:
    """Stop a queued/running job's process group (SIGTERM, SIGKILL after `grace` s); returns the job row."""
    refresh(store)
    job = store.job(job_id)
    if job["status"] not in ACTIVE:
        raise pipeline.InputError(f"job {job_id} is {job['status']}; only queued or running jobs can be cancelled")
    killed = False
    if job["pid"] and _gone(job) is None:
        _signal(job["pid"], signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _gone(job) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if _gone(job) is None:
            step = store.job(job_id)["step"] or ""
            _signal(job["pid"], signal.SIGKILL)
            killed = step.startswith(("restoring server", "waiting for /health"))
            deadline = time.monotonic() + 5.0
            while _gone(job) is None and time.monotonic() < deadline:
                time.sleep(0.05)
    store.settle_job(
        job_id,
        "cancelled",
        "cancelled by user"
        + (" while the server was being restored: check that it is up (GET /health)" if killed else ""),
    )
    _CHILDREN.pop(job_id, None)
    return store.job(job_id)


def _signal(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the job leads its own session, so its group id is its pid
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def rerun(store: Store, job_id: str) -> str:
    """A new job with the old one's operation (a record from before a field existed gets its default); a
    failed/cancelled extraction resumes its partial extraction."""
    refresh(store)
    job = store.job(job_id)
    if job["status"] in ACTIVE:
        raise pipeline.InputError(f"job {job_id} is still {job['status']}; cancel it or wait for it to end")
    op = ops.of(job["kind"], job["args"])
    if isinstance(op, ops.Extract) and job["status"] in ("failed", "cancelled"):
        ex = (job["result"] or {}).get("extraction") or op.extraction_id
        if ex:
            op = replace(op, extraction_id=ex)
    return start(store, op)


def log_tail(store: Store, job_id: str, lines: int = 200) -> str:
    """The last `lines` lines of the job's log ('' before it has any)."""
    path = Path(store.job(job_id)["log_path"])
    if not path.is_file():
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 4 * 1024 * 1024))
        tail = deque(f, maxlen=lines)
    return b"".join(tail).decode("utf-8", "replace")


# ---------------------------------------------------------------------------
# the job process's entry: python -m dflash_dash.jobs --workspace W ID


def main(argv: list[str] | None = None) -> int:
    import argparse

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


if __name__ == "__main__":  # run through the imported module, so its classes are the ones everyone catches
    from dflash_dash import jobs as _jobs

    sys.exit(_jobs.main())
