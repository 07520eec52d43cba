"""Calibration metrics of the registry (metrics) on a hand-made run with hand-computed answers, and the
analysis and render tables built from them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dflash_dash import metrics
from dflash_dash.analysis.calibration import calibration
from dflash_dash.render.analysis_figures import reliability_fig
from dflash_dash.render.formats import csv_text

B = 3  # two drafted slots per block


def lp(*ps: float) -> list[float]:
    return [math.log(p) for p in ps]


def hand_prompts() -> list[metrics.Prompt]:
    """X: P=2, T=8, accepted(p) = [2,0,0,1,0,0]: rounds at anchors 2 (2 accepted, 3 committed) and 5 (1 accepted,
    2 committed, 2 tokens left). Y: P=1, T=4, nothing accepted: rounds at anchors 1 and 2 (1 token left)."""
    x = metrics.Prompt(
        "x",
        2,
        [2, 0, 0, 1, 0, 0],
        [3, 2],
        draft_logp=lp(0.88, 0.62, 0.5, 0.5, 0.5, 0.5, 0.82, 0.32, 0.5, 0.5, 0.5, 0.5),
    )
    y = metrics.Prompt("y", 1, [0, 0, 0], [1, 1], draft_logp=lp(0.15, 0.5, 0.35, 0.5, 0.5, 0.5))
    return [x, y]


def test_samples_follow_the_chain_walk_and_the_completion():
    x, y = hand_prompts()
    ctx = metrics.Ctx(B, 0)
    got = [(k, round(q, 6), ok) for k, q, ok in metrics.cal_samples(x, ctx)]
    assert got == [(1, 0.88, True), (2, 0.62, True), (1, 0.82, True), (2, 0.32, False)]
    # y: anchor 1 rejects d_1, so d_2 is never reached; anchor 2 has one token left, so only slot 1 counts
    assert [(k, round(q, 6), ok) for k, q, ok in metrics.cal_samples(y, ctx)] == [(1, 0.15, False), (1, 0.35, False)]


def test_reliability_bins_and_ece_by_hand():
    ps, ctx = hand_prompts(), metrics.Ctx(B, 0)
    rel = metrics.reliability(ps, ctx)
    full = {round(b["lo"], 1): (b["n"], round(b["predicted"], 6), b["observed"]) for b in rel["pooled"] if b["n"]}
    assert full == {0.1: (1, 0.15, 0.0), 0.3: (2, 0.335, 0.0), 0.6: (1, 0.62, 1.0), 0.8: (2, 0.85, 1.0)}
    assert sum(b["n"] for b in rel["pooled"]) == 6 and len(rel["pooled"]) == 10
    # ECE = (1*.15 + 2*.335 + 1*.38 + 2*.15) / 6 = 0.25
    assert metrics.calibration_ece(ps, ctx) == pytest.approx(0.25)
    # depth 1: .88 T, .82 T, .15 F, .35 F -> (.15 + .35 + 2*.15) / 4; depth 2: .62 T, .32 F -> (.38 + .32) / 2
    assert metrics.calibration_ece_depth(ps, ctx) == pytest.approx([0.2, 0.35])
    assert metrics.confidence_depth(ps, ctx) == pytest.approx([0.55, 0.47])
    assert [b["n"] for b in rel["by_depth"][1] if b["n"]] == [1, 1]


def test_expected_tau_by_hand():
    ps, ctx = hand_prompts()[:], metrics.Ctx(B, 0)
    x, y = ps
    # x: anchor 2: 1 + .88 + .88*.62; anchor 5 (2 tokens left: only slot 1 can add): 1 + .82
    assert metrics.expected_rounds(x, ctx) == pytest.approx([2.4256, 1.82])
    # y: anchor 1 (2 left): 1 + .15; anchor 2 (1 left): exactly 1, as committed is capped there too
    assert metrics.expected_rounds(y, ctx) == pytest.approx([1.15, 1.0])
    s = metrics.summarize(ps, B, 0)
    assert s["expected_tau"] == pytest.approx(((2.4256 + 1.82) / 2 + (1.15 + 1.0) / 2) / 2)
    assert s["expected_tau_pooled"] == pytest.approx((2.4256 + 1.82 + 1.15 + 1.0) / 4)
    assert s["tau_macro"] == pytest.approx((2.5 + 1) / 2)
    assert s["calibration_ece"] == pytest.approx(0.25)


def test_runs_without_draft_logp_are_not_recorded():
    ps = [metrics.Prompt(p.id, p.prompt_len, p.accepted_at, p.rounds) for p in hand_prompts()]
    s = metrics.summarize(ps, B, 0)
    for key in ("calibration_ece", "expected_tau", "expected_tau_pooled", "calibration_ece_depth", "confidence_depth"):
        assert s[key] is None, key
    assert metrics.reliability(ps, metrics.Ctx(B, 0)) is None
    cal = calibration(
        [
            metrics.Prompt.from_row(
                {
                    "prompt_id": p.id,
                    "prompt_len": p.prompt_len,
                    "accepted_at": p.accepted_at.tolist(),
                    "rounds": p.rounds,
                    "draft_logp": None,
                }
            )
            for p in ps
        ],
        B,
    )
    assert cal["recorded"] is False and cal["reliability"] == [] and cal["per_prompt"] == []


def test_store_rows_give_the_same_answer_and_tables():
    rows = [
        {
            "prompt_id": p.id,
            "prompt_len": p.prompt_len,
            "accepted_at": p.accepted_at.tolist(),
            "rounds": p.rounds,
            "draft_logp": p.draft_logp.tolist(),
            "tree_rounds": [],
        }
        for p in hand_prompts()
    ]
    cal = calibration([metrics.Prompt.from_row(r) for r in rows], B)
    assert cal["recorded"] and cal["calibration_ece"] == pytest.approx(0.25)
    assert [r["depth"] for r in cal["reliability"]] == ["pooled"] * 10 + [1] * 10 + [2] * 10
    assert cal["by_depth"] == [
        {"depth": 1, "rounds": 4, "mean_p": 0.55, "observed": 0.5, "ece": 0.2},
        {"depth": 2, "rounds": 2, "mean_p": 0.47, "observed": 0.5, "ece": 0.35},
    ]
    assert [(r["prompt"], r["tau"], r["expected_tau"]) for r in cal["per_prompt"]] == [
        ("x", 2.5, round((2.4256 + 1.82) / 2, 4)),
        ("y", 1.0, 1.075),
    ]
    csv = csv_text(cal["reliability"])
    assert csv.splitlines()[0] == "depth,lo,hi,n,predicted,observed" and len(csv.splitlines()) == 31
    fig = reliability_fig({"run": cal["reliability"]}, 1)
    assert "depth 1" in fig.layout.title.text


def test_chain_only_rows_give_the_same_answer():
    """A chain-only replay stores NaN log-probabilities (and -1 acceptance) at the anchors its walks skip."""
    nan = float("nan")
    x, y = hand_prompts()
    for p, visited in ((x, {0, 3}), (y, {0, 1})):
        p.draft_logp = np.array([v if i // (B - 1) in visited else nan for i, v in enumerate(p.draft_logp)])
        p.accepted_at = np.array([a if i in visited else -1 for i, a in enumerate(p.accepted_at)])
    s = metrics.summarize([x, y], B, 0)
    assert s["calibration_ece"] == pytest.approx(0.25)
    assert s["expected_tau_pooled"] == pytest.approx((2.4256 + 1.82 + 1.15 + 1.0) / 4)
