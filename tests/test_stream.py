"""Streaming evaluation: `replay --stream` and `sweep --stream` run the target over the completions and replay every
checkpoint on the features in memory. Their runs equal extract-then-replay's exactly (per-prompt arrays and
summary), no feature file is written, the streamed extraction row records target, backend and dtype, and a later
replay on it is refused with the command that streams again."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from prepared import drafted_set

from dflash_dash import cli, ops
from dflash_dash.pipeline import features as stream
from dflash_dash.store import Store

A_LAYERS, D_LAYERS = [1, 4], [3, 5]


def run(ws: Path, *args: str) -> tuple[int, str, str]:
    """The CLI's (exit code, stdout, stderr), captured here."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["--workspace", str(ws), *args])
    return rc, out.getvalue(), err.getvalue()


@dataclass
class Setup:
    ws: Path
    target: Path
    sweep_dir: Path  # two DFlash checkpoints reading different layers
    ck: dict[str, Path]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Setup:
    from tools import tiny

    base = tmp_path_factory.mktemp("stream")
    target = tiny.write_target(base / "target", tiny.TinyTarget())
    sweep_dir = base / "train"
    ck = {
        "a": tiny.write_drafter(sweep_dir / "epoch_0_step_100", tiny.TinyDrafter(seed=1, target_layer_ids=A_LAYERS)),
        "d": tiny.write_drafter(sweep_dir / "epoch_1_step_200", tiny.TinyDrafter(seed=4, target_layer_ids=D_LAYERS)),
    }
    jsonl = drafted_set(target, ck["a"], base / "c.jsonl")
    ws = base / "ws"
    assert run(ws, "import-completions", str(jsonl), "--name", "s")[0] == 0
    return Setup(ws, target, sweep_dir, ck)


def files(ws: Path) -> set[Path]:
    return set((ws / "features").rglob("*")) if (ws / "features").exists() else set()


def same_runs(st: Store, a: str, b: str) -> None:
    """Runs `a` and `b` hold the same per-prompt rows and the same summary (but for the extraction they name)."""
    pa, pb = st.prompts(a), st.prompts(b)
    assert [p.id for p in pa] == [p.id for p in pb] and len(pa) == 3
    for x, y in zip(pa, pb):
        assert x == y, x.id
        assert np.array_equal(x.accepted_at, y.accepted_at) and np.array_equal(x.drafts, y.drafts)
    sa, sb = st.run_row(a)["summary"], st.run_row(b)["summary"]
    assert sa.pop("extraction") != sb.pop("extraction")
    assert sa == sb


def test_replay_stream_equals_extract_then_replay_and_writes_no_feature_file(setup):
    ws, ck = setup.ws, setup.ck["a"]
    rc, out, err = run(ws, "extract", "--target", str(setup.target), "--completions", "s", "--drafter", str(ck))
    assert rc == 0, err
    ex = out.strip()
    rc, out, err = run(ws, "replay", "--drafter", str(ck), "--extraction", ex)
    assert rc == 0, err
    cached = json.loads(out)["id"]
    before = files(ws)
    rc, out, err = run(
        ws, "replay", "--stream", "--target", str(setup.target), "--completions", "s", "--drafter", str(ck)
    )
    assert rc == 0, err
    streamed = json.loads(out)["id"]
    assert files(ws) == before  # no feature file, not even a folder for the streamed extraction
    st = Store(ws)
    same_runs(st, cached, streamed)
    sx = st.extraction(st.run_row(streamed)["extraction_id"])
    cx = st.extraction(ex)
    assert f"streamed extraction = {sx['id']} (no feature files)" in err
    assert stream.is_streamed(sx) and not stream.is_streamed(cx)
    for k in ("set_name", "target_path", "layer_ids", "hidden_size", "device", "dtype", "backend", "config_hash"):
        assert sx[k] == cx[k], k  # recorded as an extraction records them
    assert sx["status"] == "done" and sx["versions"]["torch"] == cx["versions"]["torch"]
    assert [(i["prompt_id"], i["tokens"], i["file"]) for i in st.items(sx["id"])] == [
        (i["prompt_id"], i["tokens"], "") for i in st.items(ex)
    ]
    assert not (ws / "features" / sx["id"]).exists()
    # a later replay of it needs the target again: refused before any work, naming the command
    rc, out, err = run(ws, "replay", "--drafter", str(ck), "--extraction", sx["id"])
    assert rc == 0 and json.loads(out)["reused"] and json.loads(out)["id"] == streamed  # the stored run: no work
    rc, _, err = run(ws, "replay", "--drafter", str(ck), "--extraction", sx["id"], "--force")
    assert rc == 2 and "was streamed (no feature files were written)" in err
    assert f"--stream --target {setup.target.resolve()} --completions s" in err
    # and so do an attribution of the streamed run and a backend parity against its extraction
    rc, _, err = run(ws, "attribute", "--run", streamed)
    assert rc == 2 and f"so an attribution of run {streamed} needs the target again" in err
    from dflash_dash import parity

    with pytest.raises(ops.InputError, match="so backend parity needs the target again"):
        parity.compare(st, ex, sx["id"])


def test_sweep_stream_equals_extract_then_sweep_for_drafters_of_other_layers(setup):
    ws = setup.ws
    rc, out, err = run(
        ws, "extract", "--target", str(setup.target), "--completions", "s",
        "--drafter", str(setup.ck["a"]), "--drafter", str(setup.ck["d"]),
    )  # fmt: skip
    assert rc == 0, err
    rc, out, err = run(ws, "sweep", "--checkpoints", str(setup.sweep_dir), "--extraction", out.strip())
    assert rc == 0, err
    cached = out.split()
    before = files(ws)
    rc, out, err = run(
        ws, "sweep", "--stream", "--target", str(setup.target), "--completions", "s",
        "--checkpoints", str(setup.sweep_dir),
    )  # fmt: skip
    assert rc == 0, err
    streamed = out.split()
    assert len(streamed) == len(cached) == 2 and files(ws) == before
    st = Store(ws)
    for a, b in zip(cached, streamed):
        same_runs(st, a, b)
        assert st.run_row(b)["summary"]["anchors"] == "chain"
    sx = st.extraction(st.run_row(streamed[0])["extraction_id"])
    assert sx["layer_ids"] == sorted(set(A_LAYERS) | set(D_LAYERS)) and stream.is_streamed(sx)
    assert st.run_row(streamed[1])["extraction_id"] == sx["id"]  # one target pass served both checkpoints


def test_sweep_stream_over_two_pool_workers_equals_one_process(prepared, workspace_copy, monkeypatch):
    """`sweep --stream --gpus cpu,cpu` deals the prompts to two pool workers (CPU workers standing in for GPUs, as
    in test_gpus), each streaming its share; the driver alone stores runs equal to the one-process stream's and
    no feature file is written. Every-anchor mode: the chain mode stacks a pass's sequences in lockstep, so its
    log-probabilities move with the batch's make-up at float rounding (~1e-6), whichever runner deals it."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # inherited by the worker processes (2 shared cores)
    ws = workspace_copy
    args = [
        "sweep", "--stream", "--target", str(prepared.target), "--completions", prepared.set_name,
        "--checkpoints", str(prepared.train), "--anchors", "every",
    ]  # fmt: skip
    rc, out, err = run(ws, *args)
    assert rc == 0, err
    one = out.split()
    before = files(ws)
    rc, out, err = run(ws, *args, "--gpus", "cpu,cpu")
    assert rc == 0, err
    two = out.split()
    assert "[worker 1, cpu]" in err and "[worker 2, cpu]" in err  # both workers had prompts: the pool's progress
    assert len(one) == len(two) == 2 and files(ws) == before  # no feature file, not even a folder
    st = Store(ws)
    for a, b in zip(one, two):
        same_runs(st, a, b)
        assert st.run_row(a)["checkpoint"] == st.run_row(b)["checkpoint"]
    sx = st.extraction(st.run_row(two[0])["extraction_id"])
    ox = st.extraction(st.run_row(one[0])["extraction_id"])
    assert stream.is_streamed(sx) and st.run_row(two[1])["extraction_id"] == sx["id"]
    for k in ("layer_ids", "device", "dtype", "backend", "config_hash"):
        assert sx[k] == ox[k], k
    assert [i["prompt_id"] for i in st.items(sx["id"])] == [i["prompt_id"] for i in st.items(ox["id"])]
    assert not (ws / "features" / sx["id"]).exists()


def test_stream_max_prompts_and_the_options_it_needs(setup):
    ws, ck = setup.ws, setup.ck["a"]
    args = ["replay", "--stream", "--target", str(setup.target), "--completions", "s", "--drafter", str(ck)]
    rc, out, err = run(ws, *args, "--max-prompts", "2", "--anchors", "chain")
    assert rc == 0, err
    assert [p.id for p in Store(ws).prompts(json.loads(out)["id"])] == ["p0", "p1"]
    with pytest.raises(ops.InputError, match="target None: give with --stream, the target model folder"):
        ops.Replay(drafter=str(ck), stream=True, completions="s")
    with pytest.raises(ops.InputError, match="completions None: give with --stream"):
        ops.Sweep(checkpoints="x", stream=True, target="t")
    with pytest.raises(ops.InputError, match="target/completions: .*add --stream"):
        ops.Replay(drafter=str(ck), target="t")
    assert ops.Replay(drafter=str(ck), stream=True, target="t", completions="s", gpus="cpu,cpu").devices() == [
        "cpu",
        "cpu",
    ]  # over the one-host pool (test_sweep_stream_over_two_pool_workers_equals_one_process)
    op = ops.Sweep(checkpoints="x", stream=True, target="t", completions="s")
    assert ops.of("sweep", json.loads(json.dumps(op.to_args()))) == op  # a job records and rebuilds it
    rc, _, err = run(
        ws, "replay", "--stream", "--target", str(setup.target), "--completions", "nope", "--drafter", str(ck)
    )
    assert rc == 2 and "no completions in set 'nope'" in err


def test_the_pages_say_a_streamed_run_needs_the_target_again(setup, monkeypatch):
    from apptest import app, clean

    from dflash_dash.render.tables import extraction_table

    ws, ck = setup.ws, setup.ck["a"]
    rc, out, err = run(
        ws, "replay", "--stream", "--target", str(setup.target), "--completions", "s", "--drafter", str(ck)
    )
    assert rc == 0, err
    st = Store(ws)
    rid = json.loads(out)["id"]
    ex = st.run_row(rid)["extraction_id"]
    at = app(ws, monkeypatch, "acceptance", run=rid)
    clean(at)
    notes = [i.value for i in at.info if "computed by **streaming**" in i.value]
    assert len(notes) == 1 and f"A replay on extraction `{ex}` needs the target again" in notes[0]
    assert f"replay --stream --target {setup.target.resolve()} --completions s" in notes[0]
    table = {r["id"]: r for r in extraction_table(st.extractions())}
    assert table[ex]["features"] == "none: streamed"
    assert {r["features"] for i, r in table.items() if i != ex and not stream.is_streamed(st.extraction(i))} <= {
        "files"
    }
    # a streamed extraction cannot be resumed as an extraction: its prompts hold no files
    rc, _, err = run(
        ws, "extract", "--target", str(setup.target), "--completions", "s", "--layers", "1,4", "--resume", ex
    )
    assert rc == 2 and f"extraction {ex} was streamed" in err and "without --resume" in err


def test_the_replay_button_streams_again_on_a_streamed_extraction(prepared, workspace_copy, monkeypatch):
    """The Acceptance page's Replay on a streamed extraction starts a --stream job (the target runs again) whose
    run equals the streamed one it repeats."""
    from apptest import app, by_label, clean
    from waiting import wait_job

    ws, ck = workspace_copy, prepared.drafters[0]
    rc, out, err = run(
        ws, "replay", "--stream", "--target", str(prepared.target), "--completions", prepared.set_name,
        "--drafter", str(ck),
    )  # fmt: skip
    assert rc == 0, err
    first = json.loads(out)["id"]
    st = Store(ws)
    ex = st.run_row(first)["extraction_id"]
    at = app(ws, monkeypatch, "acceptance", run=first)
    by_label(at.text_input, "checkpoint folder").input(str(ck))
    by_label(at.selectbox, "extraction").set_value(ex)
    by_label(at.button, "Replay").click().run()
    clean(at)
    assert any("this replay runs the target again" in i.value for i in at.info)
    job = wait_job(ws, "replay")
    assert job["status"] == "done", job
    args = job["args"]
    assert (
        args["stream"] is True and args["target"] == str(prepared.target.resolve()) and args["completions"] == "tiny3"
    )
    again = job["result"]["run"]
    assert st.run_row(again)["extraction_id"] != ex and stream.is_streamed(
        st.extraction(st.run_row(again)["extraction_id"])
    )
    a, b = st.prompts(first), st.prompts(again)
    assert a == b
