"""Replay on a trainer's feature cache, and the trainers' report shapes.

- A SpecForge capture written as `scripts/prepare_hidden_states.py` writes it (sgl-project/SpecForge @ a6b6b0230009:
  torch.save of {input_ids [1, T], loss_mask [1, T], hidden_states [1, T, K*H]} as rows_0-2000/data_i.ckpt), made
  from the prepared workspace's own extraction of the same tokens, replays token for token as the extraction does.
- A run exported as SpecForge's checkpoint report (specforge/eval/checkpoint.py @ 06cb5feb438e, read by
  specforge/eval/report.py @ 9ec462f92dca) and as AIPerf profile_export.jsonl records (MetricRecordInfo with the
  SpecDecodeAcceptanceRecord under spec_decode_acceptance), each checked against numbers computed here from the
  stored accepted(p) and drafts.
- SpecForge's own report imported and shown beside the run (Diagnostics, Trainer reports), each difference explained.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import stored
import torch

from dflash_dash import cli, ops, pipeline
from dflash_dash.audit import FeatureError
from dflash_dash.pipeline import trainers
from dflash_dash.store import Store


def capture(root: Path, st: Store, ex: str, set_name: str) -> Path:
    """A SpecForge capture of the extraction's features: the prompt unmasked, the completion loss-masked."""
    feats = stored.features(st, ex)
    d = root / "rows_0-2000"
    d.mkdir(parents=True)
    for i, c in enumerate(st.completions(set_name)):
        ids = torch.tensor(c["prompt_ids"] + c["output_ids"])[None]
        mask = torch.tensor([0] * len(c["prompt_ids"]) + [1] * len(c["output_ids"]))[None]
        torch.save(
            {"input_ids": ids, "loss_mask": mask, "hidden_states": feats[c["prompt_id"]][None]}, d / f"data_{i}.ckpt"
        )
    return root


@pytest.fixture(scope="module")
def cached(prepared, tmp_path_factory):
    """A copy of the prepared workspace, a capture of its extraction, and drafter A replayed on that capture."""
    import shutil

    base = tmp_path_factory.mktemp("trainer-cache")
    ws = base / "ws"
    shutil.copytree(prepared.workspace, ws, ignore=shutil.ignore_patterns("*.lock"))
    st = Store(ws)
    cap = capture(base / "capture", st, prepared.extraction, prepared.set_name)
    layers = st.extraction(prepared.extraction)["layer_ids"]
    op = ops.Replay(
        drafter=str(prepared.drafters[0]), features=str(cap), target=str(prepared.target), features_layers=layers
    )
    out = pipeline.replay(st, op)
    return {"ws": ws, "st": st, "cap": cap, "layers": layers, "run": out["id"], "op": op}


def test_replay_on_a_trainer_cache_equals_the_replay_on_the_extraction(prepared, cached):
    st = cached["st"]
    order = {c["prompt_id"]: c["idx"] for c in st.completions(prepared.set_name)}
    ours = sorted(st.prompts(prepared.runs[0]), key=lambda p: order[p.id])
    theirs = sorted(st.prompts(cached["run"]), key=lambda p: p.id)  # data_0, data_1, data_2: the set's order
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs):
        assert b.id.startswith("rows_0-2000/data_") and replace(b, id=a.id) == a  # every array, tau included
        assert len(b.accepted_at) and (b.accepted_at >= 0).all()
    run, ref = st.run_row(cached["run"]), st.run_row(prepared.runs[0])
    assert run["summary"]["tau_macro"] == ref["summary"]["tau_macro"]
    assert run["summary"]["every_anchor_tau"] == ref["summary"]["every_anchor_tau"]
    assert run["summary"]["source"] == f"trainer cache: {cached['cap']}" and "source" not in ref["summary"]
    ex = st.extraction(run["extraction_id"])
    assert ex["backend"] == "specforge capture" and ex["layer_ids"] == cached["layers"]
    assert [s["source"] for s in st.sets() if s["name"] == ex["set_name"]] == [f"trainer cache: {cached['cap']}"]
    again = pipeline.replay(st, cached["op"])  # the same cache: the import and the run are reused
    assert again["reused"] and again["id"] == cached["run"]


def test_layers_unknown_or_wrong_are_refused_naming_the_flag(prepared, cached, capsys):
    st, cap, da = cached["st"], str(cached["cap"]), str(prepared.drafters[0])
    with pytest.raises(FeatureError, match="--features-layers: .* does not record its target layer ids"):
        pipeline.replay(st, ops.Replay(drafter=da, features=cap, target=str(prepared.target)))
    short = cached["layers"][:-1] + [cached["layers"][-1] + 1]  # another layer than the drafter's last
    with pytest.raises(FeatureError, match="--features-layers: the drafter reads target layers"):
        pipeline.replay(st, ops.Replay(drafter=da, features=cap, target=str(prepared.target), features_layers=short))
    wide = cached["layers"] + [0]  # one layer more than the capture holds
    rc = cli.main(["--workspace", str(cached["ws"]), "replay", "--drafter", da, "--features", cap, "--target",
                   str(prepared.target), "--features-layers", ",".join(map(str, wide))])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("error: --features-layers:") and "feature values a token" in err[-1]
    with pytest.raises(ops.InputError, match="with --features, the target model folder"):
        ops.Replay(drafter=da, features=cap)


def test_a_half_written_capture_is_named(prepared, cached, tmp_path):
    import shutil

    cap = shutil.copytree(cached["cap"], tmp_path / "cut")
    f = cap / "rows_0-2000" / "data_2.ckpt"
    f.write_bytes(f.read_bytes()[:-200])
    op = replace(cached["op"], features=str(cap))
    with pytest.raises(FeatureError, match=r"data_2\.ckpt: not a complete torch file"):
        pipeline.replay(cached["st"], op)


def by_hand(st: Store, run: str) -> dict:
    """Survival and marginal accuracy at slot 1 and the accepted length, from the stored rows, independently."""
    r = st.run_row(run)
    ex = st.extraction(r["extraction_id"])
    comps = {c["prompt_id"]: c for c in st.completions(ex["set_name"])}
    blocks = hit1 = acc_sum = top1 = 0
    for p in st.prompts(run):
        toks = comps[p.id]["prompt_ids"] + comps[p.id]["output_ids"]
        for a, acc in enumerate(p.accepted_at):
            pos = p.prompt_len + a
            if pos + 1 >= len(toks):  # no slot inside the completion
                continue
            blocks, acc_sum, hit1 = blocks + 1, acc_sum + int(acc), hit1 + (acc >= 1)
            top1 += int(p.drafts.reshape(len(p.accepted_at), -1)[a, 0] == toks[pos + 1])
    return {"blocks": blocks, "survival1": hit1 / blocks, "length": 1 + acc_sum / blocks, "top1": top1 / blocks}


def test_specforge_export_has_their_shape_and_our_numbers(prepared):
    st = Store(prepared.workspace)
    rep = trainers.specforge_export(st, prepared.runs[0])
    assert rep["schema_version"] == 1 and rep["success"] and rep["examples"] == 3 and rep["optimizer_updates"] == 0
    assert {"mean", "ratio_totals", "sum_totals", "rows", "metric_scope", "checkpoint"} <= set(rep)
    for name, (n, d) in rep["ratio_totals"].items():  # report.py's rule: each mean is its pooled ratio
        assert rep["mean"][name] == pytest.approx(n / d if d else 0.0)
    B = st.run_row(prepared.runs[0])["summary"]["block_size"]
    pos = [k for k in rep["mean"] if k.startswith("position_")]
    assert sorted({int(k.split("/")[0][9:]) for k in pos}) == list(range(1, B))
    m, want = rep["mean"], by_hand(st, prepared.runs[0])
    assert rep["sum_totals"]["dflash/hard_label/block_count"] == want["blocks"]
    assert m["position_1/hard_label/unary_greedy_prefix_survival"] == pytest.approx(want["survival1"])
    assert m["position_1/hard_label/unary_top1_accuracy"] == pytest.approx(want["top1"])
    assert m["dflash/hard_label/unary_greedy_accepted_length"] == pytest.approx(want["length"])
    survival = sum(m[f"position_{j}/hard_label/unary_greedy_prefix_survival"] for j in range(1, B))
    assert m["dflash/hard_label/unary_greedy_accepted_length"] == pytest.approx(1 + survival)  # their identity
    assert m["position_1/hard_label/unary_greedy_prefix_acceptance"] == pytest.approx(want["survival1"])


def test_aiperf_records_hold_their_invariants_and_our_tau(prepared, capsys):
    st = Store(prepared.workspace)
    assert cli.main(["--workspace", str(prepared.workspace), "export-aiperf", "--run", prepared.runs[0]]) == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    taus = {p.id: p.tau for p in st.prompts(prepared.runs[0])}
    assert [r["metadata"]["conversation_id"] for r in recs] == [c["prompt_id"] for c in st.completions("tiny3")]
    for r in recs:
        a = r["spec_decode_acceptance"]
        hist = {int(k): v for k, v in a["acceptance_histogram"].items()}
        assert sum(hist.values()) == a["num_spec_steps"] == len(a["per_step_accepted"])
        assert sum(k * v for k, v in hist.items()) == a["num_accepted_draft_tokens"] == sum(a["per_step_accepted"])
        assert a["num_accepted_draft_tokens"] <= a["num_draft_tokens"] == sum(a["per_step_drafted"])
        assert a["mean_acceptance_length"] == pytest.approx(taus[r["metadata"]["conversation_id"]])
        assert set(r["metrics"]["output_sequence_length"]) == {"value", "unit"}


def their_report(run_rep: dict, checkpoint: str, shift: float) -> dict:
    """A SpecForge checkpoint report as evaluate_cached_features writes it: our counts with `shift` more accepted
    blocks at every position (so its numbers differ), means equal to their pooled ratios."""
    ratio = {}
    for name, (n, d) in run_rep["ratio_totals"].items():
        n = min(d, n + shift * d) if "prefix" in name else n
        ratio[name] = [n, d]
    B = 1 + max(int(k.split("/")[0][9:]) for k in ratio if k.startswith("position_"))
    blocks = run_rep["sum_totals"]["dflash/hard_label/block_count"]
    surv = sum(ratio[f"position_{j}/hard_label/unary_greedy_prefix_survival"][0] for j in range(1, B))
    ratio["dflash/hard_label/unary_greedy_accepted_length"] = [blocks + surv, blocks]
    mean = {k: n / d if d else 0.0 for k, (n, d) in ratio.items()} | {"loss": 2.5, "accuracy": 0.4}
    return {"schema_version": 1, "success": True, "examples": 3, "seconds": 1.0, "optimizer_updates": 0,
            "metric_scope": "teacher-forced diagnostics; not serving acceptance, speed, or answer accuracy",
            "mean": mean, "ratio_totals": ratio, "sum_totals": run_rep["sum_totals"], "rows": [],
            "checkpoint": checkpoint, "feature_index": "/data/dev_features/index.json"}  # fmt: skip


def test_specforge_report_imported_beside_the_run_with_reasons(prepared, cached, tmp_path, capsys):
    st, ws = cached["st"], str(cached["ws"])
    for run, same in ((prepared.runs[0], False), (cached["run"], True)):
        rep = their_report(trainers.specforge_export(st, run), str(prepared.drafters[0]), 0.05)
        f = tmp_path / f"eval-{run}.json"
        f.write_text(json.dumps(rep))
        assert cli.main(["--workspace", ws, "import-specforge-eval", str(f), "--run", run]) == 0
        assert json.loads(capsys.readouterr().out)["same_checkpoint"]
        got = trainers.beside(st, run)
        rows = {(r["metric"], r["position"]): r for r in got["rows"]}
        s1 = rows[("prefix survival", 1)]
        assert s1["SpecForge"] == pytest.approx(rep["mean"]["position_1/hard_label/unary_greedy_prefix_survival"])
        assert s1["difference"] == pytest.approx(s1["this product"] - s1["SpecForge"]) and s1["difference"] < 0
        length = rows[("accepted length", None)]
        assert length["SpecForge"] == pytest.approx(rep["mean"]["dflash/hard_label/unary_greedy_accepted_length"])
        assert "1 + Σ survival" in length["why"]
        said = "same features and labels" if same else "labels and features differ"
        assert all(said in r["why"] for r in got["rows"] if r["difference"] is not None)
    assert st.analysis(prepared.runs[0], trainers.SPECFORGE)["file"].endswith(f"eval-{prepared.runs[0]}.json")


def test_bad_specforge_reports_one_line_each(prepared, cached, tmp_path, capsys):
    ws, run = str(cached["ws"]), prepared.runs[0]
    good = their_report(trainers.specforge_export(cached["st"], run), str(prepared.drafters[0]), 0.0)
    length = "dflash/hard_label/unary_greedy_accepted_length"
    bad = {
        "notjson.json": "{not json",
        "disagrees.json": json.dumps(good | {"mean": good["mean"] | {length: 9.0}}),
        "eagle.json": json.dumps({"success": True, "examples": 2, "mean": {"eval/avg_acc": 0.5}, "ratio_totals": {}}),
        "failed.json": json.dumps({"success": False, "examples": 0}),
        "wider.json": json.dumps(good | {"mean": good["mean"] | {"position_99/hard_label/unary_top1_accuracy": 0.1}}),
    }  # fmt: skip
    said = {
        "notjson.json": "not readable JSON",
        "disagrees.json": "disagrees with its pooled counts",
        "eagle.json": "another strategy's report?",
        "failed.json": "expected a successful SpecForge checkpoint evaluation report",
        "wider.json": "scores draft positions up to 99",
    }
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        assert cli.main(["--workspace", ws, "import-specforge-eval", str(tmp_path / name), "--run", run]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and name in err[0] and said[name] in err[0], err


def test_the_trainers_section_shows_sources_and_the_import(prepared, cached, tmp_path, monkeypatch):
    from tests.apptest import app, clean

    st = cached["st"]
    rep = their_report(trainers.specforge_export(st, cached["run"]), str(prepared.drafters[0]), 0.05)
    (tmp_path / "eval.json").write_text(json.dumps(rep))
    trainers.import_specforge(st, tmp_path / "eval.json", cached["run"])
    at = app(cached["ws"], monkeypatch, "diagnostics", section="trainers", tr_run=cached["run"])
    clean(at)
    assert "Trainer reports" in [h.value for h in at.header]
    tables = [d.value for d in at.dataframe]
    src = next(t for t in tables if "source" in t.columns)
    assert f"trainer cache: {cached['cap']}" in list(src["source"])
    assert len(set(src["tau"])) == 1  # the same features: the same tau on the capture and on the extraction
    side = next(t for t in tables if "SpecForge" in t.columns)
    assert "prefix survival" in list(side["metric"]) and side["why"].str.contains("same features").any()
    assert np.isfinite(side["difference"].dropna().astype(float)).all()
