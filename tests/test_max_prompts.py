"""`--max-prompts N` on replay and sweep: only the first N prompts of the extraction (set order) are replayed,
and the run's numbers are those of the same prompts in a full replay."""

from __future__ import annotations

import json
import shutil

import pytest

from dflash_dash import cli, ops, pipeline
from dflash_dash.store import Store


def test_replay_max_prompts_replays_the_first_prompts_only(prepared, workspace_copy, capsys):
    st = Store(workspace_copy)
    order = [c["prompt_id"] for c in st.completions(prepared.set_name)]
    out = pipeline.replay(
        st, ops.Replay(drafter=str(prepared.drafters[0]), extraction=prepared.extraction, max_prompts=2)
    )
    rows = {r["prompt_id"]: r for r in st.run_prompts(out["id"])}
    assert sorted(rows) == sorted(order[:2])
    full = {r["prompt_id"]: r for r in st.run_prompts(prepared.runs[0])}  # the same drafter over every prompt
    for pid, r in rows.items():
        assert r["tau"] == pytest.approx(full[pid]["tau"])
    rc = cli.main(
        ["--workspace", str(workspace_copy), "replay", "--drafter", str(prepared.drafters[0]), "--max-prompts", "1"]
    )
    assert rc == 0
    run_id = json.loads(capsys.readouterr().out)["id"]
    assert [r["prompt_id"] for r in st.run_prompts(run_id)] == order[:1]


def test_sweep_max_prompts(prepared, workspace_copy, tmp_path, capsys):
    st = Store(workspace_copy)
    order = [c["prompt_id"] for c in st.completions(prepared.set_name)]
    train = tmp_path / "train"  # a folder no run has swept yet (runs are reused by checkpoint path)
    shutil.copytree(prepared.drafters[0], train / "epoch_0_step_100")
    rc = cli.main(["--workspace", str(workspace_copy), "sweep", "--checkpoints", str(train), "--max-prompts", "2"])
    assert rc == 0
    (run_id,) = capsys.readouterr().out.split()
    assert sorted(r["prompt_id"] for r in st.run_prompts(run_id)) == sorted(order[:2])
    # the same checkpoint swept again over every prompt is replayed again, not answered by the 2-prompt run
    rc = cli.main(["--workspace", str(workspace_copy), "sweep", "--checkpoints", str(train)])
    assert rc == 0
    (full_id,) = capsys.readouterr().out.split()
    assert full_id != run_id and sorted(r["prompt_id"] for r in st.run_prompts(full_id)) == sorted(order)
    # and each is reused by a sweep over the same prompts
    for args, want in (([], full_id), (["--max-prompts", "2"], run_id)):
        assert cli.main(["--workspace", str(workspace_copy), "sweep", "--checkpoints", str(train), *args]) == 0
        assert capsys.readouterr().out.split() == [want]


def test_max_prompts_is_checked_in_ops(prepared, workspace_copy, capsys):
    with pytest.raises(ops.InputError, match="max_prompts 0"):
        ops.Replay(drafter="x", max_prompts=0)
    rc = cli.main(
        ["--workspace", str(workspace_copy), "replay", "--drafter", str(prepared.drafters[0]), "--max-prompts", "0"]
    )
    assert rc == 2 and "max_prompts 0" in capsys.readouterr().err
