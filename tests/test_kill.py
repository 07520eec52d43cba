"""Crash safety: an extraction or replay job SIGKILLed halfway is marked failed within seconds, no partial feature
file is ever visible, and a rerun completes with results equal to an uninterrupted run. A damaged
feature file is detected on read with a message that offers re-extraction."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import torch
from serving import stop_jobs, until

from dflash_dash import cache, cli, ops, pipeline
from dflash_dash.jobs import lifecycle
from dflash_dash.store import Store
from tools import tiny

PROMPTS, LEN = 10, 1200


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("kill")
    t = tiny.write_target(base / "target", tiny.TinyTarget())
    d = tiny.write_drafter(base / "drafter", tiny.TinyDrafter(seed=2))
    g = np.random.default_rng(1)
    f = base / "c.jsonl"
    f.write_text(
        "\n".join(
            json.dumps(
                {
                    "id": f"p{i}",
                    "prompt_ids": g.integers(0, 512, 20).tolist(),
                    "output_ids": g.integers(0, 512, LEN).tolist(),
                }
            )
            for i in range(PROMPTS)
        )
    )
    ref = Store(base / "ref")  # the uninterrupted run
    pipeline.import_completions(ref, f, "s")
    ex = pipeline.extract(ref, ops.Extract(target=str(t), completions="s", layers=[1, 4]))
    run = pipeline.replay(ref, ops.Replay(drafter=str(d), extraction=ex, tree_budget=4))
    return t, d, f, ref, ex, run["id"]


@pytest.fixture
def store(tmp_path, setup, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    st = Store(tmp_path / "ws")
    pipeline.import_completions(st, setup[2], "s")
    yield st
    stop_jobs(st)


def kill_when(store, job, ready, what):
    until(lambda: ready() or store.job(job)["status"] in ("done", "failed"), 120, 0.02, what)
    assert store.job(job)["status"] == "running", "the job ended before it could be killed halfway"
    os.killpg(store.job(job)["pid"], signal.SIGKILL)

    def failed():
        lifecycle.refresh(store)
        return store.job(job)["status"] == "failed"

    until(failed, 10, what="the killed job to be marked failed")  # within seconds
    assert "SIGKILL" in store.job(job)["error"]


def test_killed_extraction_reruns_to_the_same_features(store, setup):
    t, d, _, ref, ref_ex, _ = setup
    job = lifecycle.start(store, "extract", {"target": str(t), "completions": "s", "layers": "1,4"})
    ex = until(lambda: (store.job(job)["result"] or {}).get("extraction"), 60, what="the extraction id")
    kill_when(store, job, lambda: 2 <= len(store.items(ex)) < PROMPTS, "two prompts extracted")
    done = {r["prompt_id"] for r in store.items(ex)}
    assert 2 <= len(done) < PROMPTS
    root = pipeline.features_root(store)
    names = {f"p{i}": (cache.name(f"p{i}"), cache.top_path(root, ex, f"p{i}").name) for i in range(PROMPTS)}
    visible = {p.name for p in (root / ex).glob("*.safetensors")}
    assert visible <= {n for pair in names.values() for n in pair}  # features and the target's top-K, no temp file
    for i in range(PROMPTS):  # every visible file is whole and valid
        if cache.name(f"p{i}") in visible:
            assert cache.read(root, ex, f"p{i}", 20 + LEN, 128).shape == (20 + LEN, 128)
    assert store.extraction(ex)["status"] != "done"
    again = lifecycle.rerun(store, job)
    until(lambda: store.job(again)["status"] in ("done", "failed"), 180, what="the rerun")
    assert store.job(again)["status"] == "done", store.job(again)["error"]
    assert store.job(again)["result"]["extraction"] == ex and store.extraction(ex)["status"] == "done"
    for i in range(PROMPTS):
        a = cache.read(root, ex, f"p{i}", 20 + LEN, 128)
        b = cache.read(pipeline.features_root(ref), ref_ex, f"p{i}", 20 + LEN, 128)
        assert torch.equal(a, b)


def test_killed_replay_reruns_to_the_same_results(store, setup):
    t, d, _, ref, ref_ex, ref_run = setup
    ex = pipeline.extract(store, ops.Extract(target=str(t), completions="s", layers=[1, 4]))
    job = lifecycle.start(store, "replay", {"drafter": str(d), "extraction": ex, "tree_budget": 4})
    kill_when(
        store,
        job,
        lambda: (store.job(job)["step"] or "").startswith(("checking drafter", "loading drafter")),
        "the replay under way",
    )
    assert store.runs() == []  # nothing half-written
    again = lifecycle.rerun(store, job)
    until(lambda: store.job(again)["status"] in ("done", "failed"), 180, what="the rerun")
    assert store.job(again)["status"] == "done", store.job(again)["error"]
    a, b = pipeline.export(store, "latest"), pipeline.export(ref, ref_run)
    assert a["prompts"] == b["prompts"] and a["summary"]["tau_macro"] == b["summary"]["tau_macro"]


def test_damaged_feature_file_offers_reextraction(store, setup, capsys):
    t, d, *_ = setup
    ex = pipeline.extract(store, ops.Extract(target=str(t), completions="s", layers=[1, 4]))
    f = cache.path(pipeline.features_root(store), ex, "p3")
    f.write_bytes(f.read_bytes()[:-100])
    rc = cli.main(["--workspace", str(store.workspace), "replay", "--drafter", str(d), "--extraction", ex])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "p3" in err and "truncated" in err and "re-extract" in err


def test_app_reads_jobs_write_and_cli_exports_at_once(store, setup):
    """Sustained mixed load on one workspace: two replay job processes writing, the CLI exporting in a loop
    (separate processes) and this process reading what the pages read. No lock error, exact counts."""
    import subprocess
    import sys

    from serving import ENV, ROOT

    t, d, *_ = setup
    ex = pipeline.extract(store, ops.Extract(target=str(t), completions="s", layers=[1, 4]))
    first = pipeline.replay(store, ops.Replay(drafter=str(d), extraction=ex, tree_budget=2))[
        "id"
    ]  # something to export from the start
    a = lifecycle.start(store, "replay", {"drafter": str(d), "extraction": ex, "tree_budget": 4, "name": "A"})
    b = lifecycle.start(store, "replay", {"drafter": str(d), "extraction": ex, "tree_budget": 8, "name": "B"})
    exports, reads = [], 0
    while any(store.job(j)["status"] in ("queued", "running") for j in (a, b)) or len(exports) < 3:
        out, err = (store.workspace / f"export{len(exports)}.{x}" for x in ("json", "err"))
        with open(out, "w") as fo, open(err, "w") as fe:  # files, not pipes: the JSON outgrows a pipe
            p = subprocess.Popen(
                [sys.executable, "-m", "dflash_dash", "--workspace", str(store.workspace), "export", "--run", "latest"],
                cwd=ROOT,
                env=ENV,
                stdout=fo,
                stderr=fe,
            )
            while p.poll() is None:  # the app's reads, meanwhile
                for r in store.runs():
                    assert len(store.run_prompts(r["id"])) == PROMPTS  # a run is never seen half-written
                lifecycle.refresh(store)
                reads += 1
        assert p.returncode == 0 and "lock" not in err.read_text().lower(), err.read_text()
        exports.append(json.loads(out.read_text())["run"]["id"])
    for j in (a, b):
        assert store.job(j)["status"] == "done", store.job(j)["error"]
    runs = {r["name"]: r for r in store.runs()}
    assert set(runs) == {"drafter", "A", "B"} and reads > 0
    assert set(exports) <= {r["id"] for r in runs.values()} and first in {r["id"] for r in runs.values()}
    assert runs["A"]["summary"]["tau_macro"] == runs["B"]["summary"]["tau_macro"]  # same drafts, other tree
