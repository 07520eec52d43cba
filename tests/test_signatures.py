"""Training-bug signatures (analysis.signatures): each signature's figure on a prompt worked out by hand, the
bootstrap of summed counts, the separation rule and the default pair; then a planted anchor-visible run against a
healthy one (tests/conftest.py `bug_pair`) separating on draft lag through the store, the CLI and the Diagnostics
section."""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stdout

import numpy as np
import pytest
from apptest import app, clean

from dflash_dash import cli, metrics, pipeline
from dflash_dash.analysis import signatures as sig
from dflash_dash.store import Run, Store

# ---------------------------------------------------------------------------
# one prompt by hand
#
# B = 3 (slots 1, 2), P = 1, T = 6: anchors p = 1..5, accepted(p) = [2, 0, 1, 0, 0].
# Chain walk: round at 1 accepts 2, commits 3 -> round at 4 (one token left) accepts 0, commits 1; stop at 5.
# Depth 1: 2 rounds reached, 1 accepted; depth 2: the first round only (the second's slot 2 is outside), accepted.
# p_k at the rounds' anchors: anchor 1: [0.8, 0.9], anchor 4: [0.6, -]. Samples (k, p, accepted): (1, .8, yes),
# (2, .9, yes), (1, .6, no). Ranks of the target's token: anchor 1: [0, 3] (top-1, then 4th), anchor 4: [-2, ...].

LOGP = np.log([[0.8, 0.9], [0.5, 0.5], [0.5, 0.5], [0.6, 0.5], [0.5, 0.5]]).astype(np.float32)
RANK = np.array([[0, 3], [0, 0], [0, 0], [-2, 0], [0, 0]])


def hand() -> metrics.Prompt:
    return metrics.Prompt("h", 1, [2, 0, 1, 0, 0], [3, 1], draft_logp=LOGP, target_rank=RANK)


LAG = {
    "h": ([2, 1], [1, 1], [1, 0])
}  # metrics.lag_counts of tests/test_compare.py's first prompt: 1 lag of 2 at slot 1


def test_each_signature_on_a_prompt_by_hand():
    kept = sig.measure([hand()], 3, LAG)
    got = {k: sig.figure(kept, k)[0] for k in kept["parts"]}
    assert got["lag_1"] == pytest.approx(1 / 2)
    assert got["accept_1"] == pytest.approx(1 / 2)
    assert got["decay"] == pytest.approx(1 / 2 - 1)  # slot 1 accepted 1/2, slot 2 (reached once) 1/1
    assert got["confidence_1"] == pytest.approx((0.8 + 0.6) / 2)
    assert got["overconfidence_1"] == pytest.approx(0.7 - 0.5)
    assert got["ece"] == pytest.approx((0.2 + 0.1 + 0.6) / 3)  # one sample per bin: |accepted - p| / 3
    assert got["headroom"] == pytest.approx(1 / 3)  # rank 3 at slot 2 of anchor 1: in the top-K, not the draft
    assert got["doubt"] == 0.0  # no draft below p = 0.5
    # the same figures the metric registry computes for the run
    s = metrics.summarize([hand()], 3, 0)
    assert got["ece"] == pytest.approx(s["calibration_ece"])
    assert got["accept_1"] == pytest.approx(s["depth_conditional"][0])
    assert got["headroom"] == pytest.approx(s["recall_topk"] - s["recall_top1"])


def test_a_run_without_the_data_is_not_measured_and_says_which():
    bare = metrics.Prompt("h", 1, [2, 0, 1, 0, 0], [3, 1])  # no log-probabilities, no ranks, no lag
    kept = sig.measure([bare], 3, None)
    assert kept["parts"]["lag_1"] is None and kept["parts"]["ece"] is None and kept["parts"]["headroom"] is None
    rows = {r["key"]: r for r in sig.compare(kept, sig.measure([hand()], 3, LAG))}
    assert rows["ece"]["separates"] is None and "draft log-probabilities" in rows["ece"]["why"]
    assert rows["lag_1"]["run"] is None and rows["lag_1"]["reference"] == 0.5
    assert rows["accept_1"]["separates"] is False and rows["accept_1"]["difference"] == 0.0


def test_what_less_training_explains_too_points_to_no_bug():
    run = {"parts": {"confidence_1": [[2.0, 1, 20]] * 20}}  # p_1 = 0.1, accepted 0.05
    ref = {"parts": {"confidence_1": [[10.0, 9, 20]] * 20}}  # p_1 = 0.5, accepted 0.45
    rows = sig.compare(run, ref)
    conf = next(r for r in rows if r["key"] == "confidence_1")
    assert conf["separates"] and conf["direction"] == "down" and sig.SOFT in conf["suggests"]
    assert sig.points_to(rows) == {}  # a soft loss, noisy labels or just an early step
    over = next(r for r in sig.compare(ref, run) if r["key"] == "overconfidence_1")
    assert over["separates"] is None  # the kept values lack its counts: not measured


def test_under_confidence_where_unsure_by_hand_and_its_verdicts():
    """Samples (k, p, accepted): (1, .4, yes), (2, .9, yes), (1, .3, no): the two below 0.5 give (1 - .4) + (0 - .3)
    over 3 drafts. Up names soft KL alone; down (wrong where it doubts) also fits less training: no verdict."""
    logp = LOGP.copy()
    logp[0, 0], logp[3, 0] = np.log(0.4), np.log(0.3)
    p = metrics.Prompt("h", 1, [2, 0, 1, 0, 0], [3, 1], draft_logp=logp, target_rank=RANK)
    kept = sig.measure([p], 3, LAG)
    assert sig.figure(kept, "doubt")[0] == pytest.approx((0.6 - 0.3) / 3)
    soft = {"parts": {"doubt": [[0.6, 40]] * 20}}  # 0.015: right where it doubts
    ref = {"parts": {"doubt": [[0.0, 40]] * 20}}
    rows = sig.compare(soft, ref)
    doubt = next(r for r in rows if r["key"] == "doubt")
    assert doubt["separates"] and doubt["direction"] == "up" and sig.SOFT in doubt["suggests"]
    assert sig.points_to(rows) == {sig.SOFT: 1}
    weak = sig.compare({"parts": {"doubt": [[0.2, 40]] * 20}}, ref)  # 0.005: below the floor
    assert not next(r for r in weak if r["key"] == "doubt")["separates"]
    rows = sig.compare({"parts": {"doubt": [[-4.0, 40]] * 20}}, ref)
    assert next(r for r in rows if r["key"] == "doubt")["direction"] == "down" and sig.points_to(rows) == {}


def test_over_confidence_names_the_shortcut_only_with_the_lag():
    """Over-confidence at slot 1 rises for the shortcut and for noisy labels: the draft lag decides which."""
    over = {"overconfidence_1": [[16.0, 4, 20]] * 20}  # p_1 = 0.8, accepted 0.2
    fine = {"overconfidence_1": [[19.0, 19, 20]] * 20}
    assert sig.points_to(sig.compare({"parts": over}, {"parts": fine})) == {sig.NOISY: 1}
    lagged = {"parts": over | kept_of([0.9] * 20)["parts"]}
    assert sig.points_to(sig.compare(lagged, {"parts": fine | kept_of([0.0] * 20)["parts"]})) == {sig.SHORTCUT: 2}


def bins(p: float, hit: float, n: int = 20) -> list[float]:
    """The ECE counts of one prompt whose `n` drafts all have probability `p`, a share `hit` of them accepted."""
    b = min(int(p * sig.BINS), sig.BINS - 1)
    row = [0.0] * (3 * sig.BINS)
    row[b], row[sig.BINS + b], row[2 * sig.BINS + b] = n, p * n, hit * n
    return row


def test_miscalibration_names_soft_kl_when_under_confident_and_noisy_labels_when_over():
    """Drafts at p 0.15 accepted 80 % of the time (a spread distribution, the soft loss) and drafts at p 0.8
    accepted 15 % (sure and wrong): both miscalibrated against a calibrated reference; the direction of the
    slot-1 over-confidence decides the bug."""
    ref = {"parts": {"ece": [bins(0.8, 0.8)] * 20, "overconfidence_1": [[16.0, 16, 20]] * 20}}
    under = {"parts": {"ece": [bins(0.15, 0.8)] * 20, "overconfidence_1": [[3.0, 16, 20]] * 20}}
    over = {"parts": {"ece": [bins(0.8, 0.15)] * 20, "overconfidence_1": [[16.0, 3, 20]] * 20}}
    assert sig.points_to(sig.compare(under, ref)) == {sig.SOFT: 2}
    assert sig.points_to(sig.compare(over, ref)) == {sig.NOISY: 2}


def test_beside_an_under_confident_reference_a_calibrated_run_is_not_over_confident():
    """A reference at p_1 0.6 accepted 85 % (under-confident, as a drafter stopped early in training is) and a run
    at p_1 0.05 accepted 5 % (calibrated, barely trained): the run's over-confidence is far above the reference's,
    but not over-confident in itself, so it names no bug; at p_1 0.5 accepted 5 % it names noisy labels."""
    ref = {"parts": {"overconfidence_1": [[12.0, 17, 20]] * 20}}
    calibrated = {"parts": {"overconfidence_1": [[1.0, 1, 20]] * 20}}
    sure = {"parts": {"overconfidence_1": [[10.0, 1, 20]] * 20}}
    rows = sig.compare(calibrated, ref)
    assert next(r for r in rows if r["key"] == "overconfidence_1")["separates"] and sig.points_to(rows) == {}
    assert sig.points_to(sig.compare(sure, ref)) == {sig.NOISY: 1}


def test_an_unsure_drafter_echoing_the_anchor_is_not_the_shortcut():
    """A draft lag far above the reference's names the shortcut when the drafter is as sure as the reference; the
    same lag from a drafter less sure at slot 1 (an under-trained one copying the anchor) names no bug."""
    ref = {"parts": kept_of([0.0] * 20)["parts"] | {"confidence_1": [[16.0, 16, 20]] * 20}}
    sure = {"parts": kept_of([0.6] * 20)["parts"] | {"confidence_1": [[17.0, 2, 20]] * 20}}
    unsure = {"parts": kept_of([0.6] * 20)["parts"] | {"confidence_1": [[3.0, 2, 20]] * 20}}
    assert sig.points_to(sig.compare(sure, ref)) == {sig.SHORTCUT: 1}
    assert sig.points_to(sig.compare(unsure, ref)) == {}


def test_attribution_on_one_tap():
    rows = [{"tau_lost_macro": 0.3}, {"tau_lost_macro": 0.1}, {"tau_lost_macro": -0.05}]
    assert sig.BY_KEY["attribution_top"].stat(rows) == pytest.approx(0.75)  # a tap that gains counts as 0
    assert sig.BY_KEY["attribution_top"].stat([]) is None
    even = [{"tau_lost_macro": 0.1}, {"tau_lost_macro": 0.1}]
    row = next(r for r in sig.compare({}, {}, rows, even) if r["key"] == "attribution_top")
    assert row["separates"] and row["direction"] == "up" and "shortcut" in row["suggests"]


def test_bootstrap_of_summed_counts_equals_the_resampled_statistic():
    parts = np.random.default_rng(3).integers(0, 20, (30, 2)) + [0, 1]
    ratio = lambda x: x[..., 0] / x[..., 1]  # noqa: E731
    plain = metrics.bootstrap(parts, lambda x: ratio(x.sum(axis=1)))
    assert metrics.bootstrap_sums(parts, ratio) == pytest.approx(plain)


def kept_of(rates: list[float], n: int = 40) -> dict:
    """A kept value whose lag counts give `rates` per prompt (n anchors each)."""
    return {"parts": {"lag_1": [[round(r * n), n] for r in rates]}}


def test_separates_only_when_the_intervals_part_and_the_floor_is_reached():
    rng = np.random.default_rng(0)
    healthy = kept_of(list(rng.uniform(0.0, 0.04, 20)))
    row = lambda run: next(r for r in sig.compare(run, healthy) if r["key"] == "lag_1")  # noqa: E731
    bad = row(kept_of(list(rng.uniform(0.3, 0.5, 20))))
    assert bad["separates"] and bad["direction"] == "up" and "anchor-visible" in bad["suggests"]
    assert bad["run_ci"][0] > bad["reference_ci"][1]
    same = row(kept_of(list(rng.uniform(0.0, 0.04, 20))))
    assert same["separates"] is False and same["suggests"] is None
    assert row(kept_of([0.0] * 20))["separates"] is False  # below the reference, by less than the floor
    back = next(r for r in sig.compare(healthy, kept_of(list(rng.uniform(0.3, 0.5, 20)))) if r["key"] == "lag_1")
    assert back["separates"] and back["direction"] == "down"  # lag has no "down" text: no bug lowers it
    assert back["suggests"] == "differs, not the way a known bug moves it"


def test_default_pair_is_the_least_and_most_healthy_run_of_the_busiest_extraction():
    def run(i, ex, tau):
        return Run(id=i, extraction_id=ex, summary={"tau_macro": tau})

    runs = [run("a", "e1", 2.0), run("b", "e1", 3.0), run("c", "e1", 1.5), run("d", "e2", 4.0), run("x", "e1", None)]
    assert sig.default_pair(runs) == ("c", "b")
    assert sig.reference_for(runs, "a") == "b" and sig.reference_for(runs, "b") == "a"
    assert sig.reference_for(runs, "d") == "b"  # alone on its extraction: the healthiest anywhere else
    assert sig.default_pair([run("a", "e1", 2.0), run("d", "e2", 4.0)]) is None


# ---------------------------------------------------------------------------
# a planted anchor-visible run against a healthy one, through the store


def test_the_anchor_visible_run_separates_on_lag_from_the_healthy_one(bug_pair):
    got = pipeline.signatures(Store(bug_pair["ws"]))  # the default pair
    assert (got["run"]["id"], got["reference"]["id"]) == (bug_pair["buggy"], bug_pair["healthy"])
    rows = {r["key"]: r for r in got["rows"]}
    lag = rows["lag_1"]
    assert lag["separates"] and lag["direction"] == "up" and "anchor-visible" in lag["suggests"]
    assert lag["run"] > 0.4 and lag["reference"] < 0.05, lag
    assert rows["overconfidence_1"]["separates"] and rows["overconfidence_1"]["direction"] == "up"
    assert rows["attribution_top"]["separates"] is None  # not attributed
    assert next(iter(got["points_to"])) == sig.SHORTCUT  # the bug most separating signatures name


def test_cli_prints_the_signatures_as_json(bug_pair):
    out = io.StringIO()
    with redirect_stdout(out):
        rc = cli.main(
            [
                "--workspace",
                str(bug_pair["ws"]),
                "signatures",
                "--run",
                bug_pair["healthy"],
                "--reference",
                bug_pair["buggy"],
            ]
        )
    assert rc == 0
    got = json.loads(out.getvalue())
    lag = next(r for r in got["rows"] if r["key"] == "lag_1")
    assert got["run"]["id"] == bug_pair["healthy"] and lag["direction"] == "down" and lag["separates"]
    assert not math.isnan(lag["difference"])


def test_diagnostics_section_shows_the_pair_from_the_url(bug_pair, monkeypatch):
    at = app(bug_pair["ws"], monkeypatch, "diagnostics", sig_run=bug_pair["buggy"], sig_ref=bug_pair["healthy"])
    clean(at)
    assert any(h.value == "Training-bug signatures" for h in at.header)
    assert any("they point to: **anchor-visible shortcut" in m.value for m in at.markdown)
    table = next(d.value for d in at.dataframe if "separates?" in d.value.columns)
    lag = table[table["signature"] == "draft lag at slot 1"].iloc[0]
    assert lag["separates?"] == "yes" and "anchor-visible" in lag["what it suggests"]
    assert lag["this run"].startswith("0.") and "[" in lag["reference"]
    assert at.query_params["sig_run"] == bug_pair["buggy"] and at.query_params["sig_ref"] == bug_pair["healthy"]
    assert any("this run against the reference" in c.proto.spec for c in at.get("plotly_chart"))
