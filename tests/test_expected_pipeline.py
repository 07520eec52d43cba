"""The expected acceptance at temperature T end to end: an extraction keeps the target's top-K beside its features
(stored, read back validated, stated in the disk plan), replay --temperature T --verify RULE stores tau_expected
with its bound and each prompt's expected accept length, refuses an extraction without the top-K naming the fix,
and streaming computes the same numbers as extract-then-replay."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_dash import cache, cli, metrics, ops, sampling
from dflash_dash.pipeline import disk, features_root
from dflash_dash.store import Store


def _cli(ws, *args) -> int:
    return cli.main(["--workspace", str(ws), *args])


def test_verify_rules_are_the_samplings():
    assert ops.VERIFY == sampling.RULES


def test_top_k_is_stored_beside_the_features_and_read_back_validated(prepared, workspace_copy):
    st = Store(workspace_copy)
    ex = st.extraction(prepared.extraction)
    assert ex["versions"]["target_topk"] == ops.TARGET_TOPK == 64  # the default extraction keeps it
    root = features_root(st)
    comps = {c["prompt_id"]: c for c in st.completions(prepared.set_name)}
    for pid, c in comps.items():
        P, n = len(c["prompt_ids"]), len(c["output_ids"])
        top = cache.read_top(root, ex["id"], pid, P, n, 64, 512)
        assert top.ids.shape == (n, 64) and top.start == P
        assert cache.top_path(root, ex["id"], pid).stat().st_size >= n * cache.top_bytes(64)
        np.testing.assert_allclose(np.exp(top.logp).sum(1) + top.tail, 1.0, atol=1e-5)  # the kept mass and the tail
    # a file of another prompt put in its place, and a cut file: refused, naming the fix
    a, b = list(comps)[:2]
    pa, pb = cache.top_path(root, ex["id"], a), cache.top_path(root, ex["id"], b)
    pa.write_bytes(pb.read_bytes())
    with pytest.raises(cache.CacheError, match="--target-topk"):
        cache.read_top(root, ex["id"], a, len(comps[a]["prompt_ids"]), len(comps[a]["output_ids"]), 64, 512)
    pb.write_bytes(pb.read_bytes()[:-100])
    with pytest.raises(cache.CacheError, match="--target-topk"):
        cache.read_top(root, ex["id"], b, len(comps[b]["prompt_ids"]), len(comps[b]["output_ids"]), 64, 512)


def test_disk_plan_states_the_top_k_bytes_per_token(prepared):
    st = Store(prepared.workspace)
    ex = st.extraction(prepared.extraction)
    rows = st.completions(prepared.set_name)
    tokens = sum(len(r["prompt_ids"]) + len(r["output_ids"]) for r in rows)
    completion = sum(len(r["output_ids"]) for r in rows)
    plain = disk.plan(st, prepared.set_name, ex["layer_ids"], str(prepared.target))
    top = disk.plan(st, prepared.set_name, ex["layer_ids"], str(prepared.target), topk=64)
    assert top.need - plain.need == completion * 516 + disk.margin(tokens * plain.width * 2 + completion * 516) - (
        disk.margin(tokens * plain.width * 2)
    )
    assert disk.top_bytes(64) == cache.top_bytes(64) == 516
    assert f"{completion:,} completion tokens x 516 bytes of the target's top-64" in top.line()
    assert "top-" not in plain.line()


@pytest.mark.parametrize("rule", sampling.RULES)
def test_replay_at_a_temperature_stores_tau_expected(prepared, workspace_copy, rule, monkeypatch):
    ws = workspace_copy
    assert _cli(ws, "replay", "--drafter", str(prepared.drafters[0]), "--extraction", prepared.extraction,
                "--temperature", "0.7", "--verify", rule) == 0  # fmt: skip
    st = Store(ws)
    run = st.runs()[-1]
    s = run["summary"]
    assert (s["temperature"], s["verify"]) == (0.7, rule) and "teacher-forced" in s["expected_basis"]
    lo, hi = s["tau_expected_bound"]
    assert 1.0 <= lo <= s["tau_expected"] <= hi <= s["block_size"]
    rows = st.run_prompts(run["id"])
    per = [metrics.Prompt.from_row(r) for r in rows]
    assert all(len(p.expected_at) == 2 * len(p.accepted_at) for p in per)
    lengths = [metrics.BY_KEY["expected_accept_length"].prompt(p, None) for p in per]
    assert s["expected_accept_length"] == pytest.approx(np.mean(lengths))
    # the greedy run of the same checkpoint has none
    first = st.run_row(prepared.runs[0])["summary"]
    assert first.get("tau_expected") is None and "temperature" not in first
    if rule == "rejection":  # the page: tau beside tau_expected, its bound, the rule and the teacher-forced formula
        from apptest import app, clean

        at = app(ws, monkeypatch, "acceptance", run=run["id"])
        clean(at)
        shown = {m.label: m.value for m in at.metric}
        assert shown["expected tau at temperature T [low, high]"] == f"{s['tau_expected']:.2f} [{lo:.2f}, {hi:.2f}]"
        text = " ".join(m.value for m in at.markdown) + " ".join(c.value for c in at.caption)
        assert "T = 0.7" in text and "rejection" in text and "teacher-forced" in text and "min(p_T(x), q_T(x))" in text
        greedy = app(ws, monkeypatch, "acceptance", run=prepared.runs[0])
        assert not any("temperature" in m.label for m in greedy.metric)


def test_temperature_on_an_extraction_without_top_k_is_refused(prepared, workspace_copy, capsys):
    ws = workspace_copy
    assert _cli(ws, "extract", "--target", str(prepared.target), "--completions", prepared.set_name, "--drafter",
                str(prepared.drafters[0]), "--target-topk", "0") == 0  # fmt: skip
    st = Store(ws)
    ex = st.extractions()[-1]
    assert ex["versions"]["target_topk"] == 0
    assert not list((features_root(st) / ex["id"]).glob("*.top.safetensors"))
    capsys.readouterr()
    rc = _cli(ws, "replay", "--drafter", str(prepared.drafters[0]), "--extraction", ex["id"], "--temperature", "0.7")
    err = capsys.readouterr().err
    assert rc == 2 and "--target-topk 64" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_stream_equals_extract_then_replay(prepared, workspace_copy):
    ws = workspace_copy
    common = ["--drafter", str(prepared.drafters[0]), "--temperature", "0.5", "--verify", "rejection", "--anchors",
              "chain"]  # fmt: skip
    assert _cli(ws, "replay", "--extraction", prepared.extraction, *common) == 0
    assert _cli(ws, "replay", "--stream", "--target", str(prepared.target), "--completions", prepared.set_name,
                *common) == 0  # fmt: skip
    a, b = Store(ws).runs()[-2:]
    assert a["summary"]["tau_expected"] is not None
    assert a["summary"]["tau_expected"] == pytest.approx(b["summary"]["tau_expected"], rel=1e-6)
    assert a["summary"]["tau_expected_bound"] == pytest.approx(b["summary"]["tau_expected_bound"], rel=1e-6)
