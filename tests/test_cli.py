"""The CLI as a demanding user works it: records never left running, quiet pipes, no workspace created by a
read-only command, `latest` named, a target folder passed as --drafter named as such."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from serving import ROOT

from dflash_dash import cli
from dflash_dash.store import Store


def test_cli_extraction_stopped_by_bad_input_is_failed_not_running(prepared, tmp_path, capsys):
    ws = tmp_path / "ws"
    f = tmp_path / "c.jsonl"
    f.write_text(
        json.dumps({"id": "ok", "prompt_ids": [5, 6], "output_ids": [7, 8]})
        + "\n"
        + json.dumps({"id": "oov", "prompt_ids": [5, 6], "output_ids": [7, 9999]})
        + "\n"
    )
    assert cli.main(["--workspace", str(ws), "import-completions", str(f), "--name", "s"]) == 0
    rc = cli.main(
        ["extract", "--workspace", str(ws), "--target", str(prepared.target), "--completions", "s", "--layers", "1,4"]
    )
    assert rc == 2 and "token id 9999 is outside the target's vocabulary" in capsys.readouterr().err
    [ex] = Store(ws).extractions()
    assert ex["status"] == "failed" and ex["prompts"] == 1  # the good prompt is kept for a rerun


def test_export_into_a_closed_pipe_ends_quietly(prepared):
    cmd = (
        f"{sys.executable} -m dflash_dash --workspace {prepared.workspace} export --run {prepared.runs[0]} | head -c 10"
    )
    p = subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert len(p.stdout) == 10 and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr


def test_read_only_commands_do_not_create_a_workspace(tmp_path, capsys):
    ws = tmp_path / "typo"
    assert cli.main(["--workspace", str(ws), "runs"]) == 2
    assert "no dflash-dash workspace there" in capsys.readouterr().err and not ws.exists()


def test_replay_names_the_extraction_latest_resolved_to(prepared, workspace_copy, capsys):
    assert (
        cli.main(
            ["--workspace", str(workspace_copy), "replay", "--drafter", str(prepared.drafters[0]), "--tree-budget", "0"]
        )
        == 0
    )
    out = capsys.readouterr()
    latest = Store(workspace_copy).extractions()[-1]["id"]
    assert f"extraction latest = {latest}" in out.err
    assert json.loads(out.out)["id"].startswith("run-")  # stdout is one JSON document: machine-readable


def test_target_folder_as_drafter_is_named(prepared, workspace_copy, capsys):
    rc = cli.main(["--workspace", str(workspace_copy), "replay", "--drafter", str(prepared.target)])
    assert rc == 2 and "this is a target model folder" in capsys.readouterr().err


def test_replay_again_with_the_same_settings_reuses_the_run_unless_forced(prepared, workspace_copy, capsys):
    """A second `replay` of the same checkpoint, extraction and settings stored a duplicate run silently.
    It names the run it reuses on stderr (stdout stays one JSON document), and --force stores a new one."""
    ws, drafter = str(workspace_copy), str(prepared.drafters[0])
    before = [r["id"] for r in Store(workspace_copy).runs()]
    same = [r for r in Store(workspace_copy).runs() if r["checkpoint"] == str(prepared.drafters[0].resolve())]
    assert cli.main(["--workspace", ws, "replay", "--drafter", drafter, "--extraction", prepared.extraction]) == 0
    out = capsys.readouterr()
    got = json.loads(out.out)
    assert got["id"] == same[-1]["id"] and got["reused"] is True
    assert f"run {got['id']} already replayed" in out.err and "--force" in out.err
    assert [r["id"] for r in Store(workspace_copy).runs()] == before
    argv = ["--workspace", ws, "replay", "--drafter", drafter, "--extraction", prepared.extraction, "--force"]
    assert cli.main(argv) == 0
    forced = json.loads(capsys.readouterr().out)
    assert forced["reused"] is False and forced["id"] not in before
    assert [r["id"] for r in Store(workspace_copy).runs()] == [*before, forced["id"]]
    # another setting (the tree budget) is another run, not a duplicate
    assert cli.main(["--workspace", ws, "replay", "--drafter", drafter, "--tree-budget", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["reused"] is False


def test_progress_keeps_whole_messages(capsys, monkeypatch):
    """Progress lines were cut mid-path at a fixed column. Off a terminal every new message is one whole
    line; on one, a message is fitted to the width by cutting its middle, so a path keeps its end."""
    path = "/a/very/long/workspace/folder/name/that/goes/on/demo/target/and/ends/here/config.json"
    cli.progress(0, 2, f"loading {path}")
    cli.progress(0, 2, f"loading {path}")  # the same message again: no second line
    cli.progress(2, 2, "done")
    assert capsys.readouterr().err == f"[0/2] loading {path}\n[2/2] done\n"
    short = cli.fit(f"loading {path}", 40)
    assert len(short) == 40 and short.endswith("here/config.json") and short.startswith("loading") and "…" in short
    assert cli.fit("short", 40) == "short"


def retrained(folder: Path) -> None:
    """`folder`'s checkpoint retrained in place: its model.safetensors rewritten at the same path with one tensor
    (the projection of the target's features) changed, every name and shape kept."""
    from safetensors.torch import load_file, save_file

    f = folder / "model.safetensors"
    state = load_file(f)
    state["fc.weight"] = -state["fc.weight"]
    save_file(state, str(f))


def drafts_of(st: Store, run_id: str) -> dict:
    return {r["prompt_id"]: r["drafts"] for r in st.run_prompts(run_id)}


def counted(monkeypatch) -> dict[str, int]:
    """Checkpoint identities computed (a full read of the weights each), by checkpoint path."""
    from dflash_dash.drafters import identity as ident_mod
    from dflash_dash.pipeline import runs, served

    seen: dict[str, int] = {}

    def counting(path, draft_config=None):
        got = ident_mod.identity(path, draft_config)
        seen[got["path"]] = seen.get(got["path"], 0) + 1
        return got

    monkeypatch.setattr(runs, "identity", counting)
    monkeypatch.setattr(served, "identity", counting)
    return seen


def test_replay_of_a_checkpoint_overwritten_in_place_is_not_reused(prepared, workspace_copy, tmp_path, capsys):
    """A checkpoint folder retrained or re-exported in place (same path, new weights) was "reused": the old weights'
    run was returned for the new weights. A run is reused only when the checkpoint's fingerprint (config + weights)
    is the one kept with it; an untouched checkpoint still is, and each replay reads its weights' hash once."""
    ws = str(workspace_copy)
    st = Store(workspace_copy)
    ck = shutil.copytree(prepared.drafters[0], tmp_path / "out" / "final")
    original = (ck / "model.safetensors").read_bytes()

    def replay(name: str) -> dict:
        argv = ["--workspace", ws, "replay", "--drafter", str(ck), "--extraction", prepared.extraction, "--name", name]
        assert cli.main(argv) == 0
        return json.loads(capsys.readouterr().out)

    a = replay("a")
    assert a["reused"] is False
    assert replay("a2") == a | {"reused": True}  # untouched: the same run
    retrained(ck)
    with pytest.MonkeyPatch.context() as mp:
        seen = counted(mp)
        b = replay("b")
    assert b["reused"] is False and b["id"] != a["id"]  # the new weights are replayed, not answered by the old run
    assert seen == {str(ck.resolve()): 1}  # the reuse check's hash is the one kept with the new run
    assert drafts_of(st, b["id"]) != drafts_of(st, a["id"])
    assert replay("b2") == b | {"reused": True}
    (ck / "model.safetensors").write_bytes(original)  # the old weights back: their run answers again
    assert replay("a3") == a | {"reused": True}


def test_sweep_replays_only_the_checkpoints_overwritten_in_place(prepared, workspace_copy, tmp_path, capsys):
    """A sweep over a folder reuses the runs of its untouched checkpoints and replays the one retrained in place;
    each checkpoint's weights are hashed at most once per sweep."""
    ws, st = str(workspace_copy), Store(workspace_copy)
    train = tmp_path / "train"
    for d in prepared.drafters:
        shutil.copytree(d, train / d.name)

    def sweep() -> list[str]:
        argv = ["--workspace", ws, "sweep", "--checkpoints", str(train), "--extraction", prepared.extraction]
        assert cli.main(argv) == 0
        return capsys.readouterr().out.split()

    first = sweep()
    assert len(first) == 2 and sweep() == first  # untouched: every run reused
    retrained(train / prepared.drafters[1].name)
    with pytest.MonkeyPatch.context() as mp:
        seen = counted(mp)
        second = sweep()
    assert second[0] == first[0] and second[1] not in first  # only the overwritten checkpoint replayed
    assert max(seen.values()) == 1 and len(seen) == 2
    assert drafts_of(st, second[1]) != drafts_of(st, first[1])
    assert sweep() == second


def test_runtime_checkpoint_overwritten_in_place_is_not_reused(prepared, workspace_copy, tmp_path):
    """A SpecForge runtime checkpoint has no weights hash (its file holds optimizer state): its run is reused while
    training_state.pt keeps its size and mtime, and replayed again once the file is rewritten."""
    from dflash_dash import ops, pipeline
    from tools import tiny

    st = Store(workspace_copy)
    cfg = tmp_path / "draft.json"
    cfg.write_text((prepared.drafters[0] / "config.json").read_text())
    step = tiny.write_runtime(tmp_path / "out", tiny.weights(tiny.TinyDrafter(seed=1)), 300, "r1")
    op = ops.Replay(drafter=str(step), draft_config=str(cfg), extraction=prepared.extraction)
    a = pipeline.replay(st, op)
    assert pipeline.replay(st, op) == a | {"reused": True}
    state = step / "training_state.pt"
    before = state.stat().st_mtime_ns
    tiny.write_runtime(tmp_path / "out", tiny.weights(tiny.TinyDrafter(seed=2)), 300, "r1")
    if state.stat().st_mtime_ns == before:  # a file system of coarse times: the rewrite made visible
        os.utime(state, ns=(before + 10**9, before + 10**9))
    b = pipeline.replay(st, op)
    assert b["reused"] is False and b["id"] != a["id"] and drafts_of(st, b["id"]) != drafts_of(st, a["id"])


def test_same_weights_needs_what_it_compares():
    """A run without a kept identity (stored before identities were kept), or a runtime run kept without its
    files' stamps, cannot be told to have replayed these weights: never reused."""
    from dflash_dash.pipeline.runs import same_weights

    hf = {"fingerprint": "f1", "config_hash": "c", "files": [["model.safetensors", 10, 1]]}
    assert same_weights(hf, hf) and not same_weights(hf, hf | {"fingerprint": "f2"})
    assert not same_weights(None, hf) and not same_weights({}, hf)
    rt = {"fingerprint": None, "config_hash": "c", "files": [["training_state.pt", 10, 1]]}
    assert same_weights(rt, rt) and not same_weights(rt, rt | {"files": [["training_state.pt", 10, 2]]})
    assert not same_weights(rt | {"config_hash": "d"}, rt) and not same_weights(rt | {"files": None}, rt)
    assert not same_weights(hf, rt)  # a runtime checkpoint where an HF folder was: another checkpoint
