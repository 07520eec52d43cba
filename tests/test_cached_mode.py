"""Cached mode: replay, export and the listings read the store and the feature cache only. Every socket
connection and name lookup is blocked in this process while they run (API, CLI and a replay job body)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request

import pytest

from dflash_dash import cli, ops, pipeline
from dflash_dash.jobs import dispatch
from dflash_dash.store import Store


class NetworkCall(AssertionError):
    pass


@pytest.fixture
def offline(monkeypatch):
    """Block every outgoing connection and DNS lookup; the attempts are recorded."""
    attempts = []

    def refuse(*a, **k):
        if threading.current_thread().name.startswith("health "):  # pollers an earlier AppTest left running
            raise NetworkCall("health poller in a test process")
        attempts.append(a[1:] if a and isinstance(a[0], socket.socket) else a)
        raise NetworkCall(f"network call in cached mode: {a!r}")

    for name in ("connect", "connect_ex", "sendto"):
        monkeypatch.setattr(socket.socket, name, refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts


def test_the_block_works(offline):
    with pytest.raises(NetworkCall):
        urllib.request.urlopen("http://127.0.0.1:9/health", timeout=1)
    assert offline


def test_replay_and_export_make_no_network_call(prepared, workspace_copy, offline, capsys):
    store = Store(workspace_copy)
    out = pipeline.replay(
        store, ops.Replay(drafter=str(prepared.drafters[1]), extraction=prepared.extraction, tree_budget=4)
    )
    assert out["summary"]["extraction"] == prepared.extraction
    exported = pipeline.export(store, out["id"])
    assert exported["run"]["id"] == out["id"] and len(exported["prompts"]) == 3

    ws = str(workspace_copy)
    assert (
        cli.main(
            [
                "--workspace",
                ws,
                "replay",
                "--drafter",
                str(prepared.drafters[0]),
                "--extraction",
                prepared.extraction,
                "--tree-budget",
                "0",
            ]
        )
        == 0
    )
    run_id = json.loads(capsys.readouterr().out)["id"]
    assert cli.main(["--workspace", ws, "export", "--run", run_id]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["id"] == run_id
    assert cli.main(["--workspace", ws, "runs"]) == 0
    assert run_id in {r["id"] for r in json.loads(capsys.readouterr().out)}
    assert cli.main(["--workspace", ws, "extractions"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["id"] == prepared.extraction
    assert cli.main(["--workspace", ws, "export-completions", "--name", prepared.set_name]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3

    # the body of a replay job, run in this process
    store.add_job(
        "job-r",
        "replay",
        {"drafter": str(prepared.drafters[0]), "extraction": prepared.extraction, "tree_budget": 2},
        str(workspace_copy / "r.log"),
    )
    assert dispatch.execute(store, "job-r") == 0, store.job("job-r")
    assert store.job("job-r")["result"]["run"] in {r["id"] for r in store.runs()}
    assert offline == []
