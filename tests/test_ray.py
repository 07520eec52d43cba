"""Ray as the engine across machines, on a local Ray cluster of CPU workers (started once for this module): an
extraction, a replay and a sweep over `--ray` give the one-process features bit for bit and the same runs; a worker
lost mid-job is re-run by Ray and the job completes with the same results; `replay --stream` over Ray equals
extract-then-replay over Ray; a job over Ray reports its workers' progress and a cancel stops its workers; bad
input (an address that does not answer, a host without the workspace, a GPU count that is not the cluster's) is
refused before any work, naming the fix."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from serving import free_port, stop_jobs, until
from stored import features

from dflash_dash import cli, ops, pipeline
from dflash_dash.jobs import cluster, lifecycle
from dflash_dash.store import Store

ray = pytest.importorskip("ray")

CPUS = 2  # CPU workers of the local cluster (this machine's cores)


@pytest.fixture(scope="module")
def address():
    """A local Ray cluster of CPU slots, for this module; its GCS address (a job process connects to it)."""
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    ray.init(num_cpus=CPUS, include_dashboard=False, log_to_driver=False, _temp_dir=tmp, logging_level="WARNING")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def run(ws: Path, *args: str) -> tuple[int, str, str]:
    """The CLI's (exit code, stdout, stderr), captured here."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["--workspace", str(ws), *args])
    return rc, out.getvalue(), err.getvalue()


def same_features(st: Store, a: str, b: str) -> None:
    fa, fb = features(st, a), features(st, b)
    assert sorted(fa) == sorted(fb) and len(fa) == 3
    assert all(torch.equal(fa[k], fb[k]) for k in fa)


def same_runs(st: Store, a: str, b: str) -> None:
    """Runs `a` and `b` hold the same per-prompt rows and the same summary (but for the extraction they name)."""
    pa, pb = st.prompts(a), st.prompts(b)
    assert [p.id for p in pa] == [p.id for p in pb] and len(pa) == 3
    for x, y in zip(pa, pb):
        assert x == y, x.id
        assert np.array_equal(x.accepted_at, y.accepted_at) and np.array_equal(x.drafts, y.drafts)
    sa, sb = dict(st.run_row(a)["summary"]), dict(st.run_row(b)["summary"])
    sa.pop("extraction"), sb.pop("extraction")
    assert sa == sb
    ra, rb = st.run_row(a), st.run_row(b)
    assert (ra["checkpoint"], ra["device"], ra["dtype"]) == (rb["checkpoint"], rb["device"], rb["dtype"])


@pytest.fixture(scope="module")
def over_ray(prepared, address, tmp_path_factory):
    """The prepared workspace copied, then extracted and replayed (drafter A) over the cluster by the CLI:
    (workspace, extraction id, run id, the extract command's stderr)."""
    ws = tmp_path_factory.mktemp("ray") / "ws"
    shutil.copytree(prepared.workspace, ws, ignore=shutil.ignore_patterns("*.lock"))
    da = str(prepared.drafters[0])
    rc, out, err = run(
        ws, "extract", "--target", str(prepared.target), "--completions", prepared.set_name, "--drafter", da,
        "--ray", "auto", "--ray-cpus", str(CPUS),
    )  # fmt: skip
    assert rc == 0, err
    ex = out.strip()
    rc, out, err2 = run(ws, "replay", "--drafter", da, "--extraction", ex, "--ray", "auto", "--ray-cpus", str(CPUS))
    assert rc == 0, err2
    return ws, ex, json.loads(out)["id"], err + err2


def test_extract_replay_and_sweep_over_ray_equal_the_one_process_run(prepared, over_ray):
    ws, ex, run_id, err = over_ray
    assert "[worker 1," in err and "[worker 2," in err  # both workers had prompts, and their progress came back
    st = Store(ws)
    one, two = st.extraction(prepared.extraction), st.extraction(ex)
    assert (two["status"], two["backend"], two["layer_ids"], two["device"]) == (
        "done", one["backend"], one["layer_ids"], one["device"],
    )  # fmt: skip
    same_features(st, prepared.extraction, ex)  # bit for bit
    same_runs(st, prepared.runs[0], run_id)
    rc, out, err = run(ws, "sweep", "--checkpoints", str(prepared.train), "--extraction", ex, "--ray", "auto",
                       "--ray-cpus", str(CPUS))  # fmt: skip
    assert rc == 0, err
    swept = out.split()
    assert len(swept) == 2 and swept[0] == run_id  # drafter A's run is kept; drafter B's is made by the workers
    ref = pipeline.replay(st, ops.Replay(drafter=str(prepared.drafters[1]), extraction=ex, anchors="chain"))["id"]
    same_runs(st, ref, swept[1])  # the one-process replay with the sweep's settings


def test_replay_stream_over_ray_equals_extract_then_replay_over_ray(prepared, over_ray):
    ws, ex, run_id, _ = over_ray
    before = set((ws / "features").rglob("*"))
    rc, out, err = run(
        ws, "replay", "--stream", "--target", str(prepared.target), "--completions", prepared.set_name,
        "--drafter", str(prepared.drafters[0]), "--ray", "auto", "--ray-cpus", str(CPUS),
    )  # fmt: skip
    assert rc == 0, err
    st = Store(ws)
    streamed = json.loads(out)["id"]
    same_runs(st, run_id, streamed)
    assert set((ws / "features").rglob("*")) == before  # no feature file written by any worker
    sx = st.extraction(st.run_row(streamed)["extraction_id"])
    assert sx["versions"]["streamed"] and (sx["backend"], sx["device"]) == (
        st.extraction(ex)["backend"], st.extraction(ex)["device"],
    )  # fmt: skip


def dying_once(marker: Path, after: int):
    """A worker body (`cluster.shard` wrapped) whose worker 1 hands over `after` events, then dies (os._exit) on
    its first attempt; the marker file says the attempt happened, so Ray's retry runs it through."""

    def body(workspace, spec, i, board=None):
        for k, text in enumerate(cluster.shard(workspace, spec, i, board)):
            if i == 0 and k == after and not marker.exists():
                marker.write_text(str(os.getpid()))
                os._exit(1)
            yield text

    return body


def test_a_worker_lost_mid_job_is_rerun_and_the_job_completes(prepared, workspace_copy, address, tmp_path):
    st = Store(workspace_copy)
    plan = cluster.plan(address, None, CPUS)
    assert (plan.device, plan.workers) == ("cpu", CPUS)
    lost = tmp_path / "extract-lost"
    op = ops.Extract(target=str(prepared.target), completions=prepared.set_name, layers=[1, 4], device="cpu")
    ex = pipeline.extract(st, op, None, cluster.runner(st, plan, dying_once(lost, 2)))  # backend and 1 item out
    assert lost.exists()  # the first attempt died mid-shard
    assert st.extraction(ex)["status"] == "done" and len(st.items(ex)) == 3  # every item once
    same_features(st, prepared.extraction, ex)

    lost = tmp_path / "replay-lost"
    op = ops.Replay(drafter=str(prepared.drafters[0]), extraction=prepared.extraction, force=True)
    out = pipeline.replay(st, op, None, cluster.runner(st, plan, dying_once(lost, 1)))  # 1 of its 2 results out
    assert lost.exists()
    same_runs(st, prepared.runs[0], out["id"])


def test_a_job_over_ray_reports_its_workers_progress_and_a_cancel_stops_them(prepared, workspace_copy, address):
    """A job (its own process, connecting to the cluster by address) shows the workers' progress on its step line
    as a local job does; a cancel from the pages (SIGTERM to the job) mid-extraction cancels its Ray tasks and
    leaves the extraction cancelled, never done with prompts missing."""
    st = Store(workspace_copy)
    g = np.random.default_rng(5)
    f = workspace_copy / "long.jsonl"
    n = 40  # long enough that the workers are busy when the cancel lands
    ids = [(g.integers(0, 512, 20).tolist(), g.integers(0, 512, 1500).tolist()) for _ in range(n)]
    rows = [{"id": f"p{i}", "prompt_ids": p, "output_ids": o} for i, (p, o) in enumerate(ids)]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pipeline.import_completions(st, f, "long")
    try:
        job = lifecycle.start(
            st, ops.Extract(target=str(prepared.target), completions="long", layers=[1, 4], ray=address, ray_cpus=CPUS)
        )
        ex = until(lambda: (st.job(job)["result"] or {}).get("extraction"), 240, what="the extraction id")

        def seen():  # the job's row once an item is in and a worker's progress is on its step line (or it ended)
            r = st.job(job)
            busy = "[worker" in (r["step"] or "") and any(e["id"] == ex for e in st.extractions()) and st.items(ex)
            return r if busy or r["status"] not in lifecycle.ACTIVE else None

        row = until(seen, 240, 0.05, "the workers' first item and progress")
        assert row["status"] == "running", (row["error"], lifecycle.log_tail(st, job))
        assert "[worker 1, " in row["step"] or "[worker 2, " in row["step"]  # a worker's own line, from the cluster
        lifecycle.cancel(st, job)
        until(lambda: st.job(job)["status"] not in lifecycle.ACTIVE, 60, 0.1, "the cancel")
        assert st.job(job)["status"] == "cancelled", lifecycle.log_tail(st, job)
        assert "cancelled (SIGTERM)" in lifecycle.log_tail(st, job)  # the job's own cancel, not Ray's handler
        assert st.extraction(ex)["status"] == "cancelled" and 1 <= len(st.items(ex)) < n
        until(lambda: ray.available_resources().get("CPU") == CPUS, 60, 0.1, "the job's Ray workers to stop")
    finally:
        stop_jobs(st)


def test_bad_input_is_refused_before_any_work(prepared, workspace_copy, address):
    ws, da = workspace_copy, str(prepared.drafters[0])
    st = Store(ws)
    before = (len(st.extractions()), len(st.runs()))
    replay = ["replay", "--drafter", da, "--extraction", prepared.extraction, "--force"]

    port = free_port()  # nothing listens there
    rc, _, err = run(ws, *replay, "--ray", f"127.0.0.1:{port}", "--ray-cpus", "2")
    assert rc == 2 and f"ray 127.0.0.1:{port}: nothing answers at that address" in err and "ray start --head" in err
    rc, _, err = run(ws, *replay, "--ray", "auto", "--ray-gpus", "2")
    assert rc == 2 and "ray_gpus 2: the cluster at" in err and "has no GPUs" in err and "--ray-cpus N" in err
    rc, _, err = run(ws, *replay, "--ray", "auto")
    assert rc == 2 and "ray_cpus: the cluster at" in err and "give --ray-cpus N to run N CPU workers" in err
    rc, _, err = run(ws, *replay, "--ray", "auto", "--ray-cpus", "64")
    assert rc == 2 and "ray_cpus 64: the cluster at" in err and f"has {CPUS} CPUs" in err
    gpus = [{"Alive": True, "NodeManagerAddress": h, "Resources": {"GPU": 2.0, "CPU": 16.0}} for h in ("a", "b")]
    with pytest.raises(cluster.ClusterError, match=r"ray_gpus 8: the cluster at X has 4 GPUs \(a: 2, b: 2\); give "):
        cluster.plan("X", 8, None, gpus)
    assert cluster.plan("X", 4, None, gpus) == cluster.Plan("X", "cuda", 4, {"a": 2, "b": 2})

    def blind(path, token):  # a host that does not see the driver's workspace at its path
        return socket.gethostname(), False

    with pytest.raises(cluster.ClusterError, match="is not shared with host") as e:
        cluster.probe(ws, blind)
    assert str(ws.resolve()) in str(e.value) and "mount it at the same path on every host" in str(e.value)
    assert not list(ws.glob(cluster.PROBE_FILE + "*"))  # the token file is removed
    assert cluster._sees(str(ws / "nowhere"), "t")[1] is False

    for args, msg in [
        ({"ray": "ray://head:10001"}, "a ray:// address is a Ray Client's"),
        ({"ray": "head"}, "ray 'head': expected auto"),
        ({"ray_cpus": 2}, "ray_cpus: it sizes a Ray cluster's workers; add --ray auto"),
        ({"ray": "auto", "gpus": "0,1"}, "gpus: it names this host's devices; with --ray the cluster's GPUs"),
        ({"ray": "auto", "ray_gpus": 0}, "ray_gpus 0: expected a positive number"),
    ]:
        with pytest.raises(ops.InputError, match=msg.replace("(", r"\(")):
            ops.Replay.from_args({"drafter": da} | args)
    assert (len(st.extractions()), len(st.runs())) == before  # nothing was started


def test_a_streaming_sweep_from_the_extraction_page_runs_on_the_cluster(prepared, workspace_copy, address, monkeypatch):
    """The pages start a job on a Ray cluster as the CLI does (the forms' Ray cluster and CPU workers fields): the
    Extraction page's streaming form over the training folder is a `sweep --stream --ray ADDRESS --ray-cpus 2` job
    whose workers' progress reaches its log, and its runs equal the one-process stream's."""
    from apptest import app, by_label, clean
    from waiting import wait_job

    at = app(workspace_copy, monkeypatch, "extraction")
    form = [w for w in at.text_input if w.key and w.key.startswith("stream_")]
    by_label(form, "checkpoint folder, or a training").input(str(prepared.train))
    by_label(form, "Ray cluster").input(address)
    by_label([w for w in at.number_input if w.key.startswith("stream_")], "Ray CPU workers").set_value(CPUS)
    by_label(at.button, "Stream").click().run()
    clean(at)
    job = wait_job(workspace_copy, "sweep")
    st = Store(workspace_copy)
    assert job["status"] == "done", (job["error"], lifecycle.log_tail(st, job["id"]))
    want = ops.Sweep(
        checkpoints=str(prepared.train), stream=True, target=str(prepared.target), completions=prepared.set_name,
        ray=address, ray_cpus=CPUS,
    )  # fmt: skip
    assert job["args"] == want.to_args()
    log = lifecycle.log_tail(st, job["id"])
    assert "[worker " in log  # the cluster workers' own progress lines, through the job
    runs = job["result"]["runs"]
    ref = pipeline.sweep(st, ops.Sweep(checkpoints=str(prepared.train), stream=True, target=str(prepared.target),
                                       completions=prepared.set_name))  # fmt: skip
    for a, b in zip(runs, ref, strict=True):  # a chain sweep's decisions (its log-probabilities move by about 1e-6
        pa, pb = st.prompts(a), st.prompts(b)  # with the batch's composition, as over the one-host pool)
        assert [p.id for p in pa] == [p.id for p in pb] and len(pa) == 3
        for x, y in zip(pa, pb):
            assert np.array_equal(x.accepted_at, y.accepted_at) and np.array_equal(x.drafts, y.drafts), x.id
            assert (x.tau, x.tree_tau) == (y.tau, y.tree_tau), x.id
    assert all(st.extraction(st.run_row(r)["extraction_id"])["versions"]["streamed"] for r in runs)
