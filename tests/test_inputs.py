"""Inputs that cannot crash or escape: every bad input is refused in one line naming the file or the field
and the fix, with nothing stored (no run, extraction, set or job row, no file in the workspace).

The damaged files are made by transforming good ones (the prepared drafter's model.safetensors cut short, its
config.json cut mid-JSON, a feature file cut, a SpecForge training_state.pt cut), never by product code. The CLI
runs in-process (`cli.main`: its exit code, its stderr); the job runs as a real process; the Fetch form through
AppTest.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from apptest import app, by_label
from waiting import wait_job

from dflash_dash import cache, cli, ops
from dflash_dash.jobs import lifecycle
from dflash_dash.store import Store
from tools import tiny

PATHS = ["../escape", "a/../../b", "my set/../x", "tab\there", "back\\slash"]  # names with path parts (or hidden
# characters): each must be refused wherever a name is accepted


def stored(ws: Path) -> tuple:
    """What a workspace holds: its rows (runs, extractions, sets with their sizes, jobs) and its files (the DuckDB
    files and locks left out: opening the store may touch them)."""
    st = Store(ws)
    files = sorted(
        str(p.relative_to(ws)) for p in ws.rglob("*") if p.is_file() and not p.name.startswith("dflash.duckdb")
    )
    return (
        [r["id"] for r in st.runs()],
        [e["id"] for e in st.extractions()],
        [(s["name"], s["prompts"]) for s in st.sets()],
        [j["id"] for j in st.jobs()],
        files,
    )


def refused(capsys, ws: Path, *args: str) -> str:
    """Run the CLI on `ws`; it must exit 2 with exactly one error line (its last line) and no traceback. Returns
    that line."""
    rc = cli.main(["--workspace", str(ws), *args])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and err.rstrip().endswith(errors[0]), (rc, err)
    assert "Traceback" not in err
    return errors[0]


def cut(src: Path, dst: Path, keep: float) -> Path:
    """`dst`: the first `keep` fraction of file `src`'s bytes (a copy cut short)."""
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * keep)])
    return dst


@pytest.fixture
def damaged(prepared, tmp_path) -> dict[str, Path]:
    """Copies of the prepared drafter A: `weights` with model.safetensors cut to half its bytes, `config` with
    config.json cut mid-JSON; each also alone in a training folder (`weights_train`, `config_train`)."""
    good = prepared.drafters[0]
    out = {}
    for what in ("weights", "config"):
        ck = tmp_path / f"{what}_train" / "epoch_0_step_100"
        shutil.copytree(good, ck)
        if what == "weights":
            cut(good / "model.safetensors", ck / "model.safetensors", 0.5)
        else:
            text = (good / "config.json").read_text()
            (ck / "config.json").write_text(text[: len(text) // 2])
        out[what], out[f"{what}_train"] = ck, ck.parent
    return out


@pytest.mark.parametrize("what,file", [("weights", "model.safetensors"), ("config", "config.json")])
def test_a_damaged_checkpoint_is_one_line_naming_the_file_in_replay_and_sweep(
    prepared, workspace_copy, damaged, capsys, what, file
):
    before = stored(workspace_copy)
    name = str(damaged[what] / file)
    line = refused(capsys, workspace_copy, "replay", "--drafter", str(damaged[what]))
    assert line.count(name) == 1, line  # the path once (it was printed twice for a config)
    assert ("truncated" if what == "weights" else "not valid JSON") in line
    line = refused(capsys, workspace_copy, "sweep", "--checkpoints", str(damaged[f"{what}_train"]))
    assert line.count(name) == 1, line
    assert stored(workspace_copy) == before


def test_a_damaged_checkpoint_fails_its_job_naming_the_file_without_a_traceback(prepared, workspace_copy, damaged):
    st = Store(workspace_copy)
    runs = stored(workspace_copy)[0]
    job_id = lifecycle.start(st, ops.Replay(drafter=str(damaged["weights"]), extraction=prepared.extraction))
    job = wait_job(workspace_copy, "replay")
    assert job["id"] == job_id and job["status"] == "failed"
    assert job["error"].startswith(str(damaged["weights"] / "model.safetensors") + ": truncated"), job["error"]
    assert "Traceback" not in job["error"] and "traceback in" not in job["error"]
    assert len(job["error"].splitlines()) == 1
    assert "Traceback" not in Path(job["log_path"]).read_text()
    assert stored(workspace_copy)[0] == runs


def test_a_cut_runtime_checkpoint_is_named(prepared, workspace_copy, tmp_path, capsys):
    """A SpecForge training_state.pt copied short (its zip archive's directory, at the end, is gone)."""
    folder = tiny.write_runtime(tmp_path / "out", tiny.weights(tiny.TinyDrafter(seed=1)), 100, "r1")
    shutil.copy(prepared.drafters[0] / "config.json", tmp_path / "out" / "config.json")
    state = folder / "training_state.pt"
    cut(state, state, 0.9)
    before = stored(workspace_copy)
    line = refused(capsys, workspace_copy, "replay", "--drafter", str(folder))
    assert line.startswith(f"error: {state}: truncated"), line
    assert stored(workspace_copy) == before


def test_a_cut_feature_file_is_named(prepared, workspace_copy, capsys):
    st = Store(workspace_copy)
    pid = st.items(prepared.extraction)[0]["prompt_id"]
    f = cache.path(workspace_copy / "features", prepared.extraction, pid)
    cut(f, f, 0.8)
    before = stored(workspace_copy)
    line = refused(capsys, workspace_copy, "replay", "--drafter", str(prepared.drafters[0]), "--force")
    assert f"feature file {f} is truncated" in line, line
    assert stored(workspace_copy) == before


@pytest.mark.parametrize("damage", ["config", "weights"])
def test_a_damaged_target_is_named_before_any_disk_plan(prepared, workspace_copy, tmp_path, capsys, damage):
    target = tmp_path / "target"
    shutil.copytree(prepared.target, target)
    if damage == "config":
        text = (prepared.target / "config.json").read_text()
        (target / "config.json").write_text(text[: len(text) // 2])
    else:
        cut(prepared.target / "model.safetensors", target / "model.safetensors", 0.5)
    before = stored(workspace_copy)
    args = ["extract", "--target", str(target), "--completions", prepared.set_name, "--layers", "1"]
    line = refused(capsys, workspace_copy, *args)
    assert f" {target / ('config.json' if damage == 'config' else 'model.safetensors')}: " in line, line
    assert stored(workspace_copy) == before


def test_extracting_a_missing_set_errors_before_any_disk_plan(prepared, workspace_copy, capsys):
    before = stored(workspace_copy)
    args = ["extract", "--target", str(prepared.target), "--completions", "nosuchset", "--layers", "1"]
    rc = cli.main(["--workspace", str(workspace_copy), *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip().splitlines() == [err.strip()], err  # the error alone: no "disk: writes ..."
    assert err.startswith("error: completions 'nosuchset': no completions in that set") and prepared.set_name in err
    assert stored(workspace_copy) == before


@pytest.mark.parametrize("bad", PATHS)
def test_names_with_path_parts_are_refused_for_sets_runs_and_extractions(
    prepared, workspace_copy, tmp_path, capsys, bad
):
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text(json.dumps({"id": "a", "prompt_ids": [1, 2], "output_ids": [3, 4]}) + "\n")
    before = stored(workspace_copy)
    cases = [  # (command line, the field the error names)
        (["import-completions", str(jsonl), "--name", bad], "name"),
        (["fetch", "--prompt-set", "coding-10", "--name", bad, "--server", "http://127.0.0.1:9"], "name"),
        (["replay", "--drafter", str(prepared.drafters[0]), "--name", bad], "name"),
        (["replay", "--drafter", str(prepared.drafters[0]), "--extraction", bad], "extraction"),
        (["sweep", "--checkpoints", str(prepared.train), "--extraction", bad], "extraction"),
        (["attribute", "--run", bad], "run"),
        (["extract", "--target", str(prepared.target), "--completions", bad, "--layers", "1"], "completions"),
        (["import-engine-stats", str(jsonl), "--completions", bad, "--engine", "vllm"], "completions"),
    ]
    for args, field in cases:
        line = refused(capsys, workspace_copy, *args)
        assert line.startswith(f"error: {field} {bad.strip()!r}: a name holds no /"), (args, line)
    for field in ("completions", "extraction_id"):  # a job record (a rerun) is checked as the command line is
        with pytest.raises(ops.InputError, match="a name holds no /") as e:
            ops.of("extract", {"target": "t", "completions": "s", "layers": [1]} | {field: bad})
        assert e.value.field == field
    assert stored(workspace_copy) == before


def test_a_stream_over_a_folder_skips_and_lists_what_is_not_a_checkpoint(prepared, workspace_copy, tmp_path, capsys):
    folder = tmp_path / "outputs"
    shutil.copytree(prepared.drafters[0], folder / "epoch_0_step_100")
    shutil.copytree(prepared.target, folder / "target")  # a causal LM, not a drafter
    (folder / "logs").mkdir()
    cut(prepared.drafters[1] / "model.safetensors", folder / "logs" / "events.safetensors", 1.0)  # no config
    (folder / "README.txt").write_text("training notes\n")
    (folder / "empty").mkdir()
    args = ["sweep", "--stream", "--checkpoints", str(folder), "--target", str(prepared.target)]
    rc = cli.main(["--workspace", str(workspace_copy), *args, "--completions", prepared.set_name])
    out, err = capsys.readouterr()
    assert rc == 0, err
    runs = out.split()
    assert len(runs) == 1 and Store(workspace_copy).run_row(runs[0])["checkpoint"].endswith("epoch_0_step_100")
    note = next(line for line in err.splitlines() if line.startswith(f"note: not checkpoints under {folder}: "))
    assert note.count(": skipped (") == 4, note  # each entry once, with why
    assert "logs: skipped (weights without a config.json" in note and "target: skipped (architectures" in note
    assert "README.txt: skipped (not a checkpoint)" in note and "empty: skipped (not a checkpoint folder)" in note


def test_the_fetch_form_refuses_a_bad_url_before_a_job_in_the_forms_words(prepared, workspace_copy, monkeypatch):
    before = stored(workspace_copy)
    at = app(workspace_copy, monkeypatch, "completions")
    by_label(at.text_input, "completion set name").input("new-set")
    by_label(at.text_input, "server URL").input("htp://nope")
    by_label(at.button, "Fetch").click().run()
    assert not at.exception
    errs = [e.value for e in at.error]
    assert errs == [
        "Server URL 'htp://nope': expected the server's http:// or https:// URL, like http://127.0.0.1:30000"
    ]
    by_label(at.text_input, "server URL").input("http://127.0.0.1:9")
    by_label(at.text_input, "completion set name").input("../escape")
    by_label(at.button, "Fetch").click().run()
    errs = [e.value for e in at.error]
    assert len(errs) == 1 and errs[0].startswith("Completion set name '../escape': a name holds no /"), errs
    assert "--" not in " ".join(errs)  # no CLI flag in the browser
    assert stored(workspace_copy) == before  # no job, no set, no upload
