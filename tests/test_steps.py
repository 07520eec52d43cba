"""Round-by-round alignment and the fault ranking rule (`analysis.steps`) on synthetic per-step numbers: what the
stand-in cannot plant (its drafter has no sliding-window layers) is ranked here from made-up variant replays."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_dash.analysis import conformance, steps

REPLAY = {"a": [1, 3, 1, 2, 1], "b": [2, 2, 2, 1]}  # committed per round: completions of 9 and 8 tokens


def stats(lens: dict[str, list[int]]) -> dict[str, dict]:
    return {
        pid: {"accept_lengths": v, "verify_steps": len(v), "completion_tokens": 1 + sum(REPLAY[pid])}
        for pid, v in lens.items()
    }


def test_align_finds_the_first_differing_step_and_its_token_index():
    got = steps.align([1, 3, 2, 1, 1], [1, 3, 1, 2, 1])
    assert got["steps_equal"] == 2 and got["first_divergence"] == 1 + 1 + 3  # prefill token, then 1 + 3
    assert got["direction"] == "above" and (got["engine_step"], got["replay_step"]) == (2, 1)
    assert steps.align([1, 3, 1, 2, 1], [1, 3, 1, 2, 1])["first_divergence"] is None
    below = steps.align([1, 1, 1, 1, 1, 1, 1, 1], [1, 3, 1, 2, 1])
    assert below["direction"] == "below" and below["first_divergence"] == 2


def test_the_engines_last_step_is_cut_to_the_completion():
    # the engine counted 4 accepted drafts in its last step, past the end of the completion
    assert steps.align([1, 3, 1, 2, 5], [1, 3, 1, 2, 1])["first_divergence"] is None
    assert steps.cut([2, 5, 3], 4) == [2, 2]


def test_compare_rows_carry_the_alignment_and_the_report_the_first_divergence():
    rows = [{"prompt_id": "a", "prompt_len": 5, "rounds": REPLAY["a"], "accepted_at": [0] * 9, "tau": 1.6}]
    cmp = conformance.compare(rows, [{"id": "a"} | stats({"a": [1, 3, 2, 1, 1]})["a"]])
    rep = conformance.report("r", "sglang", 0.05, cmp)
    assert rep["prompts"][0]["first_divergence"] == 5 and rep["steps"]["above"] == 1
    assert "faults" not in rep  # no ranking: the key is absent, not null
    plain = conformance.compare(rows, [{"id": "a", "verify_steps": 5, "completion_tokens": 9}])
    assert plain[0]["first_divergence"] is None and conformance.step_summary(plain) is None


@pytest.mark.parametrize("fault", ["sliding-ignored", "sliding-bidirectional", "layer-shift"])
def test_rank_names_the_fault_whose_variant_reproduces_the_engine(fault):
    broken = {"a": [1, 1, 1, 1, 1, 1, 1, 1], "b": [1, 1, 2, 2, 1, 1]}
    other = {"a": [1, 3, 1, 1, 1, 1], "b": [2, 2, 1, 1, 1]}
    variants = {steps.CLEAN: {"steps": REPLAY}, fault: {"steps": broken}}
    variants |= {f: {"steps": other} for f in ("numerics", "draft-tokens") if f != fault}
    got = steps.rank(stats(broken), variants, {})
    assert got["mode"] == "steps" and got["faults"][0] == {"fault": fault, "param": None, "score": 1.0, "detail": ""}
    assert got["explained_by"] == fault and got["evidence"] == steps.EVIDENCE[fault]
    assert got["clean_score"] < 1.0 and got["gap"]
    assert got["margin"] == 1.0 - max(steps.score(stats(broken), other), got["clean_score"])  # over the runner-up


def test_rank_names_none_when_clean_is_as_good_or_faults_tie():
    eng = stats(REPLAY)
    got = steps.rank(eng, {steps.CLEAN: {"steps": REPLAY}, "numerics": {"steps": REPLAY}}, {"layer-shift": "why"})
    assert got["explained_by"] is None and not got["gap"] and got["evidence"] == steps.NO_GAP
    assert got["skipped"] == {"layer-shift": "why"}
    broken = {"a": [1] * 8, "b": [1] * 7}
    tie = {steps.CLEAN: {"steps": REPLAY}, "numerics": {"steps": broken}, "layer-shift": {"steps": broken}}
    assert steps.rank(stats(broken), tie, {})["explained_by"] is None
    # a fault that removes less than SHARE of the clean replay's disagreement is not named
    near = {"a": [1, 3, 1, 2, 1], "b": [2, 2, 2, 1]}
    weak = {steps.CLEAN: {"steps": near}, "numerics": {"steps": {"a": [1, 1, 1, 1, 1, 1, 1, 1], "b": [2, 2, 2, 1]}}}
    assert steps.rank(stats(broken), weak, {})["explained_by"] is None


def test_per_prompt_scoring_without_steps_uses_tau():
    eng = {pid: {"verify_steps": 8 if pid == "a" else 7, "completion_tokens": 1 + sum(r)} for pid, r in REPLAY.items()}
    assert steps.mode(eng) == "prompts"
    pre = {pid: steps.prefill_step(r) for pid, r in REPLAY.items()}
    assert steps.score(eng, {"a": [1] * 8, "b": [1] * 7}) == 1.0
    assert steps.score(eng, REPLAY) < steps.score(eng, pre) < 1.0
    got = steps.rank(eng, {steps.CLEAN: {"steps": REPLAY}, "draft-tokens": {"steps": {"a": [1] * 8, "b": [1] * 7}}}, {})
    assert got["mode"] == "prompts" and got["explained_by"] == "draft-tokens"


def test_draft_cut_walks_the_chain_with_fewer_drafts():
    acc = np.array([3, 0, 0, 0, 2, 0, 0, 0, 0])  # accepted at anchors P..T-1, P = 0, T = 9
    assert steps.draft_cut(acc, 0, 9, 15) == [4, 3, 1]
    assert steps.draft_cut(acc, 0, 9, 1) == [2, 1, 1, 2, 1, 1]


def test_each_parameter_is_a_candidate_and_the_fault_needs_a_clear_margin():
    broken = {"a": [1] * 8, "b": [1] * 7}
    near = {"a": [1] * 6 + [2], "b": [1] * 7}  # one boundary of fifteen missed
    off = [{"steps": REPLAY, "detail": "o -2", "param": -2}, {"steps": broken, "detail": "o +1", "param": 1}]
    got = steps.rank(stats(broken), {steps.CLEAN: {"steps": REPLAY}, "layer-shift": off}, {})
    assert [(c["param"], c["score"]) for c in got["candidates"]] == [(1, 1.0), (-2, got["clean_score"])]
    assert got["faults"] == [got["candidates"][0]]  # each fault once, at its best parameter
    assert got["explained_by"] == "layer-shift" and got["explained_param"] == 1 and got["runner_up"] == steps.CLEAN
    assert got["param_margin"] == 1.0 - got["clean_score"] and got["margin"] == got["param_margin"]
    # another fault almost as good: the margin is too small for a clear answer, so no fault is named
    close = {steps.CLEAN: {"steps": REPLAY}, "layer-shift": off, "numerics": {"steps": near}}
    got = steps.rank(stats(broken), close, {})
    assert got["faults"][0]["fault"] == "layer-shift" and got["runner_up"] == "numerics"
    assert 0 < got["margin"] < steps.MARGIN * (1 - got["clean_score"])
    assert got["explained_by"] is None and got["evidence"] == steps.NONE_EXPLAINS
    # two parameters equally good: the fault is named, its parameter is not
    tied = [{"steps": broken, "param": 1}, {"steps": broken, "param": 2}]
    got = steps.rank(stats(broken), {steps.CLEAN: {"steps": REPLAY}, "draft-tokens": tied}, {})
    assert got["explained_by"] == "draft-tokens" and got["explained_param"] is None
    assert got["explained_params"] == [1, 2] and got["param_margin"] == 0


def test_verdict_says_no_gap_the_fault_and_its_margin_or_why_none():
    broken = {"a": [1] * 8, "b": [1] * 7}
    one = [{"steps": broken, "detail": "layers [0] instead of [1] (offset -1)", "param": -1}]
    got = steps.rank(stats(broken), {steps.CLEAN: {"steps": REPLAY}, "layer-shift": one}, {})
    assert steps.verdict(got) == (
        f"{steps.EVIDENCE['layer-shift']}: layer-shift (layers [0] instead of [1] (offset -1)) scores 1.000, "
        f"{got['margin']:.3f} above the clean replay"
    )
    near = {"a": [1] * 6 + [2], "b": [1] * 7}
    close = steps.rank(
        stats(broken), {steps.CLEAN: {"steps": REPLAY}, "layer-shift": one, "numerics": {"steps": near}}, {}
    )
    words = steps.verdict(close)
    assert words.startswith(steps.NONE_EXPLAINS + ": the closest, layer-shift") and "above numerics" in words
    assert f"by {steps.MARGIN:g} of it" in words
    same = steps.rank(stats(REPLAY), {steps.CLEAN: {"steps": REPLAY}, "layer-shift": one}, {})
    assert steps.verdict(same) == steps.NO_GAP
    assert steps.verdict({"faults": [], "evidence": "kept before margins"}) == "kept before margins"
