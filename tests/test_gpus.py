"""GPUs as a product feature, with CPU workers standing in for GPUs: extract and replay sharded over two
worker processes (`--gpus cpu,cpu`) give the same extraction and the same run as one process; a worker killed
mid-run fails its job with the worker's exit named, and a rerun resumes (the items written are kept) and completes
with the one-process features. Job records: the operations' dataclasses round-trip through a job record, old records
(fields missing) stay readable, and a bad field is refused by name."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from serving import stop_jobs, until
from stored import features

from dflash_dash import cli, drafters, ops, pipeline
from dflash_dash.jobs import lifecycle
from dflash_dash.store import Store

PROMPTS, LEN = 16, 1200  # the kill test's set: long enough that both workers are still busy when one is killed


@pytest.fixture
def store(workspace_copy, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # inherited by the job and worker processes (2 shared cores)
    st = Store(workspace_copy)
    yield st
    stop_jobs(st)


def test_two_cpu_workers_give_the_one_process_extraction_and_run(prepared, store, capsys):
    ws = str(store.workspace)
    rc = cli.main(
        [
            "--workspace",
            ws,
            "extract",
            "--target",
            str(prepared.target),
            "--completions",
            prepared.set_name,
            "--drafter",
            str(prepared.drafters[0]),
            "--gpus",
            "cpu,cpu",
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    ex = out.out.strip()
    assert "[worker 1, cpu]" in out.err and "[worker 2, cpu]" in out.err  # both workers had prompts
    one, two = store.extraction(prepared.extraction), store.extraction(ex)
    assert (two["status"], two["backend"], two["layer_ids"]) == ("done", one["backend"], one["layer_ids"])
    a, b = features(store, prepared.extraction), features(store, ex)  # the fixture's one-process extraction
    assert sorted(a) == sorted(b) and len(a) == 3
    assert all(torch.equal(a[k], b[k]) for k in a)

    rc = cli.main(
        [
            "--workspace",
            ws,
            "replay",
            "--drafter",
            str(prepared.drafters[0]),
            "--extraction",
            prepared.extraction,
            "--gpus",
            "cpu,cpu",
            "--force",  # the fixture's run has these settings: a new one, made by the workers
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    run = json.loads(out.out)["id"]
    assert "[worker 1, cpu]" in out.err and "[worker 2, cpu]" in out.err
    mine, ref = pipeline.export(store, run), pipeline.export(store, prepared.runs[0])  # the fixture's one-process run
    assert [p["id"] for p in mine["prompts"]] == [p["id"] for p in ref["prompts"]]
    for p, q in zip(mine["prompts"], ref["prompts"]):  # token for token
        for key in ("accepted_at", "rounds", "ddtree_rounds", "drafts", "prompt_len", "tau", "ddtree_tau"):
            assert p.get(key) == q.get(key), (p["id"], key)
    for key in ("tau_macro", "tau_pooled", "rounds", "every_anchor_tau"):  # metrics recomputed over all prompts
        assert mine["summary"].get(key) == ref["summary"].get(key), key


def workers_of(pid: int) -> list[int]:
    """Pids of the worker processes a job process started (its children running `--worker`)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == pid and b"--worker" in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def test_a_killed_worker_fails_the_job_and_a_rerun_resumes(prepared, store, tmp_path):
    g = np.random.default_rng(5)
    f = tmp_path / "long.jsonl"
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
    pipeline.import_completions(store, f, "long")
    ref = features(
        store, pipeline.extract(store, ops.Extract(target=str(prepared.target), completions="long", layers=[1, 4]))
    )  # one process, here

    job = lifecycle.start(
        store, ops.Extract(target=str(prepared.target), completions="long", layers=[1, 4], gpus="cpu,cpu")
    )
    ex = until(lambda: (store.job(job)["result"] or {}).get("extraction"), 300, what="the extraction id")
    until(
        lambda: len(store.items(ex)) >= 1 or store.job(job)["status"] not in lifecycle.ACTIVE,
        300,
        0.02,
        "the first prompt extracted",
    )
    pids = workers_of(store.job(job)["pid"])
    assert len(pids) == 2 and len(store.items(ex)) < PROMPTS, "the workers ended before one could be killed"
    os.kill(pids[0], signal.SIGKILL)
    until(lambda: store.job(job)["status"] not in lifecycle.ACTIVE, 60, what="the job to notice the dead worker")
    row = store.job(job)
    assert row["status"] == "failed"
    assert row["error"].startswith("worker ") and "died (killed by signal 9 SIGKILL)" in row["error"]
    assert "its stderr ends" in row["error"] and "rerun to continue" in row["error"]
    until(lambda: not workers_of(row["pid"]), 30, what="the other worker to be stopped")
    kept = {it["prompt_id"]: Path(it["file"]).stat().st_mtime_ns for it in store.items(ex)}
    # the killed worker may have finished its shard before the kill landed (its events were in the pipe)
    assert 1 <= len(kept) <= PROMPTS and store.extraction(ex)["status"] == "failed"

    again = lifecycle.rerun(store, job)
    assert store.job(again)["args"]["extraction_id"] == ex and store.job(again)["args"]["gpus"] == ["cpu", "cpu"]
    until(lambda: store.job(again)["status"] not in lifecycle.ACTIVE, 300, what="the rerun")
    assert store.job(again)["status"] == "done", (store.job(again)["error"], lifecycle.log_tail(store, again))
    assert store.job(again)["result"]["extraction"] == ex and store.extraction(ex)["status"] == "done"
    assert all(
        Path(it["file"]).stat().st_mtime_ns == kept[it["prompt_id"]]
        for it in store.items(ex)
        if it["prompt_id"] in kept
    )  # resumed: what was written is kept
    got = features(store, ex)
    assert sorted(got) == sorted(ref) and all(torch.equal(got[k], ref[k]) for k in ref)


def test_operations_round_trip_and_refuse_bad_fields():
    op = ops.Replay(drafter="/ck", tree_budget=4, gpus="0,1")
    assert op.gpus == ["cuda:0", "cuda:1"] and op.devices() == ["cuda:0", "cuda:1"]
    assert ops.of("replay", json.loads(json.dumps(op.to_args()))) == op
    old = ops.of("extract", {"target": "/t", "completions": "s", "layers": "1,4"})  # a record from before gpus
    assert old == ops.Extract(target="/t", completions="s", layers=[1, 4], device="cpu", gpus=[])
    assert ops.of("fetch", {"prompt_set": "coding-10", "name": "x", "tokenizer": None}).max_new_tokens == 256
    assert ops.defaults(ops.Sweep)["anchors"] == "chain" and ops.defaults(ops.Replay)["anchors"] == "every"
    bad = [
        (ops.Replay, {"drafter": "/ck", "tree_budget": -1}, "tree_budget -1: expected 0 (no tree)"),
        (ops.Replay, {"drafter": "/ck", "gpus": "0,x"}, "gpus '0,x': 'x' is not a device"),
        (ops.Extract, {"target": "/t", "completions": "s"}, "layers: give a drafter checkpoint"),
        (ops.Fetch, {"prompt_set": "coding-10", "name": "x", "max_new_tokens": "many"}, "max_new_tokens 'many'"),
        (ops.Fetch, {"name": "x"}, "fetch: prompt_set is required"),
        (ops.Attribute, {"run": "r", "colour": 1}, "attribute: unknown argument colour"),
    ]
    for cls, args, msg in bad:
        with pytest.raises(ops.InputError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            cls.from_args(args)
    assert ops.SLIDING_BLOCKS == drafters.SLIDING_BLOCKS and ops.DTYPES == tuple(pipeline.DTYPES)
