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
    assert out.out.splitlines()[0].startswith("run-")  # stdout stays machine-readable


def test_target_folder_as_drafter_is_named(prepared, workspace_copy, capsys):
    rc = cli.main(["--workspace", str(workspace_copy), "replay", "--drafter", str(prepared.target)])
    assert rc == 2 and "this is a target model folder" in capsys.readouterr().err
