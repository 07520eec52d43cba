"""The live loop as a command and on the Acceptance page: `live` decodes a stored set's prompts both ways
over seeds and keeps the result beside the replays of the same checkpoint on that set; the page's "Live loop vs
estimate" section shows it per prompt with the difference; a missing set is refused in one line.

Models: the prepared workspace's tiny hybrid target and its two replayed drafters (tests/conftest.py `prepared`)."""

from __future__ import annotations

import json

from apptest import app, clean
from speculative import run_cli

from dflash_dash import pipeline
from dflash_dash.store import Store


def test_live_command_keeps_per_prompt_results_beside_the_replay(prepared, workspace_copy, monkeypatch):
    ws, (da, db) = workspace_copy, prepared.drafters
    args = ["--target", str(prepared.target), "--completions", prepared.set_name, "--max-new", "10"]
    rc, out, err = run_cli("--workspace", str(ws), "live", "--drafter", str(da), *args, "--temperature", "0.8",
                           "--seeds", "2", "--seed", "3")  # fmt: skip
    assert rc == 0, err
    got = json.loads(out)
    assert got["temperature"] == 0.8 and got["seeds"] == [3, 4] and got["verify"] == "target-sample"
    assert got["device"] == "cpu" and got["backend"] == "torch"
    s = got["summary"]
    assert s["same_tokens"] and s["plain_tokens_s"] > 0 and s["spec_tokens_s"] > 0 and s["speedup"] > 0
    assert s["accept_length_lo"] <= s["accept_length"] <= s["accept_length_hi"]
    st = Store(ws)
    runs = {r["checkpoint"]: r for r in st.runs()}
    run_a, run_b = (next(r for c, r in runs.items() if c.endswith(d.name)) for d in (da, db))
    kept = pipeline.live_for(st, run_a)
    assert len(kept) == 1 and set(kept[0]["prompts"]) == {c["prompt_id"] for c in st.completions(prepared.set_name)}
    for p in kept[0]["prompts"].values():
        assert [r["seed"] for r in p["seeds"]] == [3, 4] and all(1 <= r["accept_length"] <= 4 for r in p["seeds"])
        assert all(r["tokens"] == 10 for r in p["seeds"])  # each prompt decoded to --max-new
    assert pipeline.live_for(st, run_b) == []  # another checkpoint: not its live result

    at = app(ws, monkeypatch, "acceptance", run=run_a["id"])
    clean(at)
    assert "Live loop vs estimate" in [h.value for h in at.subheader]
    table = next(d.value for d in at.dataframe if "live" in d.value.columns)
    assert len(table) == 3 and set(table.columns) >= {"prompt", "live", "estimate", "difference", "speedup"}
    for _, r in table.iterrows():
        assert abs(r["difference"] - (r["live"] - r["estimate"])) < 1e-9
    assert any("T=0.8" in c.value and "CPU timings" in c.value for c in at.caption)
    at = app(ws, monkeypatch, "acceptance", run=run_b["id"])
    clean(at)
    assert "Live loop vs estimate" not in [h.value for h in at.subheader]


def test_live_refuses_a_missing_set_in_one_line(prepared, workspace_copy):
    rc, out, err = run_cli("--workspace", str(workspace_copy), "live", "--target", str(prepared.target), "--drafter",
                           str(prepared.drafters[0]), "--completions", "nosuch")  # fmt: skip
    assert rc == 2 and "completions 'nosuch'" in err and len(err.strip().splitlines()) == 1 and not out
