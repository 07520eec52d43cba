"""Target-layer attribution (pipeline.attribute, CLI `attribute`, the export's "attribution" entry): a drafter
that ignores one tap loses no tau when that tap is replaced by its mean; the other taps cost tau."""

from __future__ import annotations

import json

import pytest

from dflash_dash import cli, ops, pipeline
from dflash_dash.store import Store
from tools import tiny

H = tiny.TinyDrafter().hidden_size


@pytest.fixture
def blind(prepared, tmp_path):
    """Drafter A of the prepared workspace with fc.weight[:, 0:H] = 0: it never reads tap 0 (target layer 1)."""
    cfg = tiny.TinyDrafter(seed=1)
    state = tiny.weights(cfg)
    state["fc.weight"][:, 0:H] = 0
    return tiny.write_drafter(tmp_path / "blind-tap0", cfg, state)


def test_a_tap_the_drafter_ignores_costs_nothing(prepared, workspace_copy, blind, capsys, tmp_path):
    from prepared import drafted

    st = Store(workspace_copy)
    # a completion made of the blind drafter's own blocks (partly accepted), extracted in the workspace copy
    prompt = st.completions(prepared.set_name)[1]["prompt_ids"]
    rec = {"id": "blind-drafted", "prompt_ids": prompt, "output_ids": drafted(prepared.target, blind, prompt, 40, 3)}
    (tmp_path / "blind.jsonl").write_text(json.dumps(rec) + "\n")
    pipeline.import_completions(st, tmp_path / "blind.jsonl", "blind")
    ex = pipeline.extract(st, ops.Extract(target=str(prepared.target), completions="blind", layers=[1, 4]))
    run = pipeline.replay(st, ops.Replay(drafter=str(blind), extraction=ex, tree_budget=0))["id"]
    out = pipeline.attribute(st, ops.Attribute(run=run))
    assert [t["layer_id"] for t in out["taps"]] == [1, 4]
    s = st.run_row(run)["summary"]  # base = the run itself (same checkpoint, features, device, dtype)
    assert out["base_tau_macro"] == pytest.approx(s["tau_macro"]) and out["base_tau_pooled"] == pytest.approx(
        s["tau_pooled"]
    )
    assert s["tau_macro"] > 1.5
    t0, t1 = out["taps"]
    assert t0["tau_macro"] == out["base_tau_macro"] and t0["tau_pooled"] == out["base_tau_pooled"]  # exactly: no loss
    lost = out["base_tau_macro"] - t1["tau_macro"]
    assert lost > 0.2, out
    stored = st.attributions(run)
    assert [(r["tap"], r["layer_id"], r["tau_macro"], r["base_tau_macro"]) for r in stored] == [
        (t["tap"], t["layer_id"], t["tau_macro"], t["base_tau_macro"]) for t in out["taps"]
    ]
    # the export carries it, as tau lost per tap
    exp = pipeline.export(st, run)
    assert [(a["tap"], a["layer_id"], a["tau_lost_macro"]) for a in exp["attribution"]] == [
        (0, 1, 0.0),
        (1, 4, round(lost, 4)),
    ]
    # again from the CLI: replaces the stored rows, prints the same JSON
    capsys.readouterr()
    assert cli.main(["--workspace", str(workspace_copy), "attribute", "--run", run]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["taps"] == out["taps"] and len(st.attributions(run)) == 2


def test_export_has_calibration_and_patterns_and_no_attribution_before_one(prepared):
    exp = pipeline.export(Store(prepared.workspace), prepared.runs[0])
    assert "attribution" not in exp
    cal = exp["calibration"]
    assert cal["recorded"] and 0 <= cal["calibration_ece"] <= 1 and cal["expected_tau"] >= 1
    assert {r["prompt"] for r in cal["per_prompt"]} == {"html-script", "code-add", "drafted"}
    pat = exp["patterns"]
    assert pat["decoded_tokens"] is True
    assert sum(r["rounds"] for r in pat["by_class"]) == exp["summary"]["rounds"]
    assert all(s["link"].startswith(f"acceptance?run={prepared.runs[0]}&prompt=") for s in pat["worst_spans"])
    json.dumps(exp)


def test_attribute_names_a_missing_run(workspace_copy, capsys):
    assert cli.main(["--workspace", str(workspace_copy), "attribute", "--run", "run-nope"]) == 2
    assert "no run with id 'run-nope'" in capsys.readouterr().err
