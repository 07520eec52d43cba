"""Job records and their life: a job is long work (fetch, extraction, replay, sweep, demo) run as a separate OS
process whose status lives only in the store.

Contract:
- `start(store, op)` records the job (its kind and `op.to_args()`, status queued; an `ops` dataclass, or a kind
  and args dict validated through `ops.of`) and spawns `python -m dflash_dash.jobs --workspace W ID` in its own
  session (process group), output to `W/logs/ID.log`; it returns the job id at once. That process runs
  `dispatch.execute`, which reports through a `Reporter` (progress and step to the store, throttled; a line per
  step to the log) and ends the job done, failed or cancelled (`Cancelled`, raised by SIGTERM).
- `refresh` marks a queued/running job whose process is gone as failed ("process died ..."), so nothing is left
  "running" forever; `active` and `recent` refresh first. `cancel` stops the process group (SIGTERM, SIGKILL
  after a grace period); `rerun` starts a new job with the same args that continues where the old one stopped
  (fetch skips stored prompts; extract resumes the old job's partial extraction). `recent(..., dismissed=False)`
  leaves out the failed/cancelled jobs a user dismissed (the jobs panel). `log_tail` reads the end of a log.
- Listing, cancelling and dismissing jobs never import torch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from .. import ops
from ..store import Job, Store, new_id

ACTIVE = ("queued", "running")
THROTTLE_S = 0.3  # at most one progress write per this many seconds
GRACE_S = 10.0  # cancel: SIGTERM, then SIGKILL after this long
_CHILDREN: dict[str, subprocess.Popen] = {}  # jobs started by this process (reaped by refresh)


class Cancelled(BaseException):
    """Raised in a job process by SIGTERM/SIGINT (a BaseException so library code does not swallow it)."""


STOPS: list[str] = []  # the cancel signals this job process received (SIGTERM, SIGINT), as `dispatch` records them:
# a cancel a library turned into an error of its own (DuckDB's "Query interrupted", a Ray task's error) is still a
# cancel, for the job and for the extraction it leaves


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


def child_env() -> dict[str, str]:
    """The environment of a job or worker process: this one's, unbuffered (the package is installed, so the child
    imports it from any folder)."""
    return dict(os.environ, PYTHONUNBUFFERED="1")


def start(store: Store, op: ops.Op | str, args: dict | None = None) -> str:
    """Record a job (its kind and `op.to_args()`) and spawn its process; returns the job id at once. `op` is an
    operation (`ops.Replay(...)`), or a kind with its args dict, validated through `ops.of`."""
    if isinstance(op, str):
        try:
            json.dumps(args)
        except (TypeError, ValueError) as e:
            raise ops.InputError(f"job arguments must be plain JSON data: {e}") from None
        op = ops.of(op, args)
    job_id = new_id("job")
    log = store.workspace.resolve() / "logs" / f"{job_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    store.add_job(job_id, op.kind, op.to_args(), str(log))
    try:
        with open(log, "ab") as f:
            p = subprocess.Popen(
                [sys.executable, "-m", "dflash_dash.jobs", "--workspace", str(store.workspace.resolve()), job_id],
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=child_env(),
            )
    except OSError as e:
        store.settle_job(job_id, "failed", f"could not start the job process: {e}")
        raise
    _CHILDREN[job_id] = p
    store.update_job(job_id, pid=p.pid)
    return job_id


def exit_text(rc: int) -> str:
    """How a process ended, from its return code: its exit code or the signal that killed it."""
    if rc < 0:
        try:
            return f"killed by signal {-rc} {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def _gone(job: Job) -> str | None:
    """None while the job's process runs; else how it ended."""
    p = _CHILDREN.get(job.id)
    if p is not None:
        rc = p.poll()
        return None if rc is None else exit_text(rc)
    pid = job.pid
    if not pid:
        created = job.created
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
        if job.id.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return "exit status unknown; its pid now belongs to another process"
    except (OSError, IndexError):
        pass
    return None


def refresh(store: Store) -> None:
    """Mark queued/running jobs whose process is gone as failed."""
    for job in store.jobs():
        if job.status not in ACTIVE:
            continue
        how = _gone(job)
        if how is not None:
            store.settle_job(job.id, "failed", f"process died ({how}); see the log {job.log_path}")
            _CHILDREN.pop(job.id, None)


def active(store: Store) -> list[Job]:
    refresh(store)
    return [j for j in store.jobs() if j.status in ACTIVE]


def recent(store: Store, n: int = 20, dismissed: bool = True) -> list[Job]:
    """The `n` newest jobs (dead ones settled first); `dismissed=False`: without those a user dismissed."""
    refresh(store)
    return store.jobs(dismissed=dismissed)[:n]


def cancel(store: Store, job_id: str, grace: float = GRACE_S) -> Job:
    """Stop a queued/running job's process group (SIGTERM, SIGKILL after `grace` s); returns the job row."""
    refresh(store)
    job = store.job(job_id)
    if job.status not in ACTIVE:
        raise ops.InputError(f"job {job_id} is {job.status}; only queued or running jobs can be cancelled")
    killed = False
    if job.pid and _gone(job) is None:
        _signal(job.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _gone(job) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if _gone(job) is None:
            step = store.job(job_id).step or ""
            _signal(job.pid, signal.SIGKILL)
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
    if job.status in ACTIVE:
        raise ops.InputError(f"job {job_id} is still {job.status}; cancel it or wait for it to end")
    op = ops.of(job.kind, job.args)
    if isinstance(op, ops.Extract) and job.status in ("failed", "cancelled"):
        ex = (job.result or {}).get("extraction") or op.extraction_id
        if ex:
            op = replace(op, extraction_id=ex)
    return start(store, op)


def log_tail(store: Store, job_id: str, lines: int = 200) -> str:
    """The last `lines` lines of the job's log ('' before it has any)."""
    path = Path(store.job(job_id).log_path or "")
    if not path.is_file():
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 4 * 1024 * 1024))
        tail = deque(f, maxlen=lines)
    return b"".join(tail).decode("utf-8", "replace")
