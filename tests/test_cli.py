"""The CLI as a demanding user works it: records never left running, quiet pipes, no workspace created by a
read-only command, `latest` named, a target folder passed as --drafter named as such."""

from __future__ import annotations

import json
import subprocess
import sys

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
    """Issue 30: a second `replay` of the same checkpoint, extraction and settings stored a duplicate run silently.
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
    """Issue 30: progress lines were cut mid-path at a fixed column. Off a terminal every new message is one whole
    line; on one, a message is fitted to the width by cutting its middle, so a path keeps its end."""
    path = "/a/very/long/workspace/folder/name/that/goes/on/demo/target/and/ends/here/config.json"
    cli.progress(0, 2, f"loading {path}")
    cli.progress(0, 2, f"loading {path}")  # the same message again: no second line
    cli.progress(2, 2, "done")
    assert capsys.readouterr().err == f"[0/2] loading {path}\n[2/2] done\n"
    short = cli.fit(f"loading {path}", 40)
    assert len(short) == 40 and short.endswith("here/config.json") and short.startswith("loading") and "…" in short
    assert cli.fit("short", 40) == "short"
