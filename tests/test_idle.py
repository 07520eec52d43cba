"""Idle is idle: the fragments that follow jobs (the sidebar's running jobs, each page's job panel) ask the
browser for auto-reruns only while a job of theirs is queued or running, so an idle tab costs the server nothing.

Read from what a script run sends the browser: Streamlit's `auto_rerun` messages (streamlit/runtime/fragment.py sends
one per fragment declared with `run_every`; the frontend drops every timer at the next full run). The readiness badges
(`server_view.HEALTH_S`) are left out here: they redraw slowly whatever runs.
"""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import local_script_runner

from dflash_dash.store import Store
from pages.jobs_view import PANEL_S, SIDEBAR_S
from tests.apptest import PAGES, app, clean


@pytest.fixture
def reruns(monkeypatch) -> list[float]:
    """The auto-rerun intervals (seconds) of the last script run, job-following fragments only (filled as AppTest
    runs: its script runner is wrapped to read its messages, which it keeps, after each run)."""
    from pages.server_view import HEALTH_S

    seen: list[float] = []
    run = local_script_runner.LocalScriptRunner.run

    def reading(self, *a, **kw):
        try:
            return run(self, *a, **kw)
        finally:
            msgs = [m for m in self.forward_msgs() if m.WhichOneof("type") == "auto_rerun"]
            seen[:] = sorted(m.auto_rerun.interval for m in msgs if m.auto_rerun.interval not in HEALTH_S)

    monkeypatch.setattr(local_script_runner.LocalScriptRunner, "run", reading)
    return seen


def test_fragments_poll_only_while_a_job_of_theirs_runs(workspace_copy, monkeypatch, reruns):
    for page in [None, *PAGES]:
        clean(app(workspace_copy, monkeypatch, page))
        assert reruns == [], f"{page or 'overview'}: polls with no job running: {reruns}"

    store = Store(workspace_copy)
    # a job just recorded (its process not started yet: queued, which counts as running for 120 s)
    store.add_job("job-idle-test", "replay", {}, str(workspace_copy / "logs" / "job-idle-test.log"))
    clean(app(workspace_copy, monkeypatch, "acceptance"))  # the Replay form's panel follows replays
    assert reruns == sorted([PANEL_S, SIDEBAR_S])
    clean(app(workspace_copy, monkeypatch, "completions"))  # its panel follows fetches: only the sidebar polls
    assert reruns == [SIDEBAR_S]

    assert store.settle_job("job-idle-test", "cancelled", "cancelled by the test")
    clean(app(workspace_copy, monkeypatch, "acceptance"))
    assert reruns == []


def test_a_failed_jobs_error_is_labelled_and_shown_only_by_its_own_panel(workspace_copy, monkeypatch):
    """A failed job's error names its job and when it ended (an old failure must not read as the latest click's),
    and shows only in the panel that follows its kind: a failed replay under the Replay form, not under Fetch."""
    store = Store(workspace_copy)
    store.add_job("job-old-fail", "replay", {}, str(workspace_copy / "logs" / "job-old-fail.log"))
    assert store.settle_job("job-old-fail", "failed", "drafter folder /x: no config.json")
    at = app(workspace_copy, monkeypatch, "acceptance")
    said = [e.value for e in at.error if "no config.json" in e.value]
    assert len(said) == 1 and said[0].startswith("replay job `job-old-fail` failed at "), said
    assert "min ago: drafter folder /x: no config.json" in said[0]
    at = app(workspace_copy, monkeypatch, "completions")
    assert not [e.value for e in at.error if "no config.json" in e.value]
