"""Background jobs as real OS processes: cancel, death detection (SIGKILL), errors, the CLI, throttled progress.

The jobs here are fetch jobs against a port nobody listens on: they sit in the readiness wait (a real
running job) until cancelled or killed, with no model involved."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from serving import free_port, status_now, stop_jobs, until

from dflash_dash import cli, ops, pipeline
from dflash_dash.jobs import dispatch, lifecycle
from dflash_dash.store import Store


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "config.toml").write_text(f'[server]\nurl = "http://127.0.0.1:{free_port()}"\nreadiness_timeout = 600\n')
    st = Store(ws)
    yield st
    stop_jobs(st)


def waiting_job(store: Store) -> str:
    """A fetch job that is running and waiting for the (absent) server."""
    job = lifecycle.start(store, "fetch", {"prompt_set": "coding-10", "name": "w", "max_new_tokens": 4})
    until(lambda: (store.job(job)["step"] or "").startswith("waiting for"), 90, what="the job to wait for /health")
    assert store.job(job)["status"] == "running"
    return job


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_cancel_turned_into_a_library_error_still_ends_the_job_cancelled(store, monkeypatch, tmp_path, capsys):
    """SIGTERM raises `Cancelled` in the job's main thread; inside DuckDB's execute it surfaces as DuckDB's own
    RuntimeError ("Query interrupted"). The job still ends cancelled (exit 130), not failed."""

    def interrupted(store_, op, rep):
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises Cancelled here, as in a library's C call
            time.sleep(5)  # not reached: the signal is handled at once
        except lifecycle.Cancelled:
            raise RuntimeError("Query interrupted") from None
        raise AssertionError("the signal handler did not run")

    monkeypatch.setattr(dispatch, "run", interrupted)
    store.add_job("job-x", "fetch", {"prompt_set": "coding-10", "name": "w"}, str(tmp_path / "x.log"))
    before = signal.getsignal(signal.SIGTERM)
    assert dispatch.execute(store, "job-x") == 130
    row = store.job("job-x")
    assert row["status"] == "cancelled" and row["error"] == "cancelled by user"
    assert signal.getsignal(signal.SIGTERM) == before  # the job's handler is gone again
    log = capsys.readouterr().out  # the job's log is its stdout
    assert "cancelled (SIGTERM); it surfaced as RuntimeError: Query interrupted" in log  # a plain cancel's words first


def test_a_cancel_that_surfaced_as_another_error_leaves_the_extraction_cancelled(
    prepared, workspace_copy, tmp_path, monkeypatch
):
    """The same cancel mid-extraction (a Ray task's or DuckDB's error in place of `Cancelled`): the job ends
    cancelled, and so does the extraction it leaves (it read failed: the orchestration looked for `Cancelled`)."""
    st = Store(workspace_copy)
    real = pipeline.perform

    def perform(store_, op, progress, runner=None):
        def tick(done, total, msg):
            progress(done, total, msg)
            if done:  # an item is in: cancel now (the handler raises Cancelled here)
                os.kill(os.getpid(), signal.SIGTERM)

        try:
            return real(store_, op, tick, runner)
        except lifecycle.Cancelled:
            raise RuntimeError("Query interrupted") from None

    op = ops.Extract(target=str(prepared.target), completions=prepared.set_name, layers=[1, 4], device="cpu")
    st.add_job("job-e", "extract", op.to_args(), str(tmp_path / "e.log"))
    monkeypatch.setattr(pipeline, "perform", perform)
    assert dispatch.execute(st, "job-e") == 130
    assert st.job("job-e")["status"] == "cancelled"
    ex = st.job("job-e")["result"]["extraction"]
    assert st.extraction(ex)["status"] == "cancelled" and 1 <= len(st.items(ex)) < 3


def test_cancel_stops_the_job_process(store):
    job = waiting_job(store)
    pid = store.job(job)["pid"]
    t0 = time.monotonic()
    row = lifecycle.cancel(store, job)
    assert time.monotonic() - t0 < lifecycle.GRACE_S  # ended by SIGTERM, no SIGKILL needed
    assert row["status"] == "cancelled" and row["error"] == "cancelled by user"
    assert not alive(pid)
    assert "cancelled (SIGTERM)" in lifecycle.log_tail(store, job)
    assert lifecycle.active(store) == []
    with pytest.raises(ValueError, match="only queued or running jobs can be cancelled"):
        lifecycle.cancel(store, job)


def test_sigkilled_job_is_marked_failed_not_left_running(store):
    a, b = waiting_job(store), waiting_job(store)
    # a: started by this process (its exit status is known)
    os.killpg(store.job(a)["pid"], signal.SIGKILL)
    # b: as if another process had started it: an unreaped zombie whose exit status this process cannot read
    proc_b = lifecycle._CHILDREN.pop(b)
    os.killpg(proc_b.pid, signal.SIGKILL)
    until(lambda: open(f"/proc/{proc_b.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", 30, what="zombie")

    until(lambda: status_now(store, a) == "failed", 30, what="refresh to see the killed job")
    ra, rb = store.job(a), store.job(b)
    assert ra["error"].startswith("process died (killed by signal 9 SIGKILL); see the log")
    assert rb["status"] == "failed" and rb["error"].startswith("process died (exit status unknown)")
    assert {j["id"]: j["status"] for j in lifecycle.recent(store)} == {a: "failed", b: "failed"}
    proc_b.wait()


def test_job_errors_are_recorded(store, tmp_path, capsys):
    # a user error, in a real job process: its message, no traceback
    job = lifecycle.start(store, "fetch", {"prompt_set": str(tmp_path / "missing.jsonl"), "name": "x"})
    until(lambda: store.job(job)["status"] not in lifecycle.ACTIVE, 90, what="the job to end")
    row = store.job(job)
    assert row["status"] == "failed"
    assert row["error"].startswith(f"prompt set {str(tmp_path / 'missing.jsonl')!r}: neither a built-in set (")
    assert "\n" not in row["error"] and "nor an existing file" in row["error"]
    assert "Traceback" not in lifecycle.log_tail(store, job) and "error: prompt set" in lifecycle.log_tail(store, job)
    # an unexpected error (run in this process): a one-line error in the store, the traceback in the output
    store.add_job("job-bad", "fetch", {"prompt_set": "coding-10", "name": "x"}, "x.log")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(pipeline.TABLE, ops.Fetch, lambda *a, **k: int("many"))  # a bug inside the operation
        assert dispatch.execute(store, "job-bad") == 1
    row = store.job("job-bad")
    assert row["status"] == "failed" and row["error"].startswith("ValueError: invalid literal for int()")
    assert "(traceback in x.log)" in row["error"] and "\n" not in row["error"]
    assert "Traceback (most recent call last)" in capsys.readouterr().out


def test_jobs_cli(store, capsys):
    job = waiting_job(store)
    ws = str(store.workspace)
    assert cli.main(["--workspace", ws, "jobs"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["id"] == job and row["status"] == "running" and row["kind"] == "fetch"
    assert row["args"] == ops.Fetch(prompt_set="coding-10", name="w", max_new_tokens=4).to_args()  # every field
    assert row["args"]["max_new_tokens"] == 4 and row["args"]["chat"] is False and row["args"]["server"] is None
    assert cli.main(["--workspace", ws, "jobs", "logs", job, "--lines", "50"]) == 0
    assert "waiting for http://127.0.0.1:" in capsys.readouterr().out
    assert cli.main(["--workspace", ws, "jobs", "rerun", job]) == 2
    assert "still running; cancel it" in capsys.readouterr().err
    assert cli.main(["--workspace", ws, "jobs", "cancel", job]) == 0
    assert capsys.readouterr().out.strip() == "cancelled"
    assert cli.main(["--workspace", ws, "jobs", "cancel", job]) == 2
    assert "error: job" in capsys.readouterr().err
    assert cli.main(["--workspace", ws, "jobs", "logs"]) == 2
    assert "needs a job id" in capsys.readouterr().err
    assert cli.main(["--workspace", ws, "jobs", "cancel", "job-nope"]) == 2
    assert "no job with id 'job-nope'" in capsys.readouterr().err
    assert "job-run" not in cli.parser().format_help()  # internal command stays hidden


def test_progress_is_throttled_but_final_state_written(store, monkeypatch):
    store.add_job("job-p", "fetch", {}, "p.log")
    writes = []
    real = store.update_job
    monkeypatch.setattr(store, "update_job", lambda *a, **k: (writes.append(k), real(*a, **k)))
    rep = lifecycle.Reporter(store, "job-p")
    t0 = time.monotonic()
    for i in range(200):
        rep(i, 200, f"item {i}")
    elapsed = time.monotonic() - t0
    assert len(writes) <= 2 + elapsed / lifecycle.THROTTLE_S
    rep(200, 200, "all done")
    row = store.job("job-p")
    assert row["progress"] == 1.0 and row["step"] == "all done"
    rep(0, 0, "waiting for /health: refused (1 s)")  # total 0: a step without a fraction
    rep.flush()
    assert store.job("job-p")["progress"] == 1.0


def test_unknown_kind_and_bad_args_are_refused(store):
    with pytest.raises(ValueError, match="unknown job kind 'nope'"):
        lifecycle.start(store, "nope", {})
    with pytest.raises(ValueError, match="plain JSON data"):
        lifecycle.start(store, "fetch", {"x": object()})
    assert store.jobs() == []
