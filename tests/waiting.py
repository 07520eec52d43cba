"""Test helpers (not tests): waiting for a job the dashboard or the CLI started, through the store.

Contract: one `wait_job` for every test that starts a job (AppTest buttons, the browser, `make run`): it returns the
first job of that kind not among `before` once it has finished (done, failed or cancelled), and fails the test with
the store's job list after `timeout` seconds.
"""

from __future__ import annotations

from pathlib import Path

from serving import until

from dflash_dash.store import Store

JOB_TIMEOUT = 240.0  # a job's ceiling on 2 shared cores (a cold worker imports torch)


def wait_job(ws: Path, kind: str, before: set[str] = frozenset(), timeout: float = JOB_TIMEOUT) -> dict:
    """The first `kind` job of workspace `ws` whose id is not in `before`, once it has finished."""
    st = Store(ws)

    def finished():
        new = [j for j in st.jobs() if j["kind"] == kind and j["id"] not in before]
        return new[0] if new and new[0]["status"] not in ("queued", "running") else None

    return until(finished, timeout=timeout, every=0.2, what=f"the {kind} job to finish")


def job_ids(ws: Path) -> set[str]:
    """Ids of the workspace's jobs now (pass as `before` to wait for the next one)."""
    return {j["id"] for j in Store(ws).jobs()}
