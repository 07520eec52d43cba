"""Statistics to trust: bootstrap intervals of tau over prompts, the median, Tukey outliers, the chain
at the DDTree budget and the rounds behind each per-depth point; each checked against an independent computation
(a plain numpy loop with the same seed, or numbers worked out by hand in the comments). Then the Acceptance page
and the export carrying them."""

from __future__ import annotations

import numpy as np
import pytest
from apptest import app, clean

from dflash_dash import metrics, pipeline
from dflash_dash.metrics import Ctx, Prompt
from dflash_dash.render import formats
from dflash_dash.render.figures import depth_fig
from dflash_dash.render.formats import acceptance_link, fmt, prob
from dflash_dash.render.tables import outlier_links, prompt_table, summary_rows
from dflash_dash.store import Store


def walk(acc: list[int], P: int, B: int) -> list[int]:
    """Committed per round of the chain walk of block B, by hand (like walks.chain_walk)."""
    out, a, T = [], P, P + len(acc)
    while a < T - 1:
        c = min(min(acc[a - P], B - 1) + 1, T - 1 - a)
        out.append(c)
        a += c
    return out


def prompt(pid: str, rounds: list[int]) -> Prompt:
    """A prompt known by its rounds only (enough for tau and the statistics over prompts)."""
    return Prompt(pid, 1, [0] * (sum(rounds) + 1), rounds)


# tau = 1.0, 2.5, 2.5, 2.75, 3.0, 3.0, 3.25, 9.0
HAND = [
    ("lo", [1, 1]),
    ("a", [2, 3]),
    ("b", [3, 2]),
    ("c", [3, 3, 3, 2]),
    ("d", [3]),
    ("e", [1, 5]),
    ("f", [3, 3, 3, 4]),
    ("hi", [9]),
]


def spread(n: int, seed: int) -> list[Prompt]:
    rng = np.random.default_rng(seed)
    return [prompt(f"p{i}", rng.integers(1, 9, size=int(rng.integers(2, 12))).tolist()) for i in range(n)]


# ---------------------------------------------------------------------------
# bootstrap


def test_bootstrap_matches_an_independent_loop_with_the_same_seed():
    ps = spread(12, 3)
    ctx = Ctx(16, 0)
    taus = np.array([sum(p.rounds) / len(p.rounds) for p in ps])
    com = np.array([sum(p.rounds) for p in ps], dtype=float)
    rnd = np.array([len(p.rounds) for p in ps], dtype=float)
    idx = np.random.default_rng(0).integers(0, len(ps), size=(1000, len(ps)))
    macro = [taus[i].mean() for i in idx]
    pooled = [com[i].sum() / rnd[i].sum() for i in idx]
    s = metrics.summarize(ps, 16, 0)
    assert s["tau_macro_ci"] == pytest.approx(list(np.percentile(macro, [2.5, 97.5])), rel=1e-12)
    assert s["tau_pooled_ci"] == pytest.approx(list(np.percentile(pooled, [2.5, 97.5])), rel=1e-12)
    assert s["tau_macro_ci"] == metrics.tau_macro_ci(ps, ctx)  # seeded: the same every time


def test_interval_contains_the_estimate_and_narrows_with_more_prompts():
    ps = spread(10, 5)
    ctx = Ctx(16, 0)
    for ci, point in (
        (metrics.tau_macro_ci, metrics.macro(metrics.tau)),
        (metrics.tau_pooled_ci, metrics.pooled("rounds")),
    ):
        lo, hi = ci(ps, ctx)
        assert lo < point(ps, ctx) < hi
        many = [prompt(f"{p.id}-{j}", p.rounds) for j in range(4) for p in ps]  # same spread, 4x the prompts
        lo4, hi4 = ci(many, ctx)
        assert lo4 <= point(many, ctx) <= hi4
        assert hi4 - lo4 < 0.75 * (hi - lo)  # about half (1/sqrt(4))
    assert metrics.tau_macro_ci([], ctx) is None and metrics.tau_pooled_ci([prompt("x", [])], ctx) is None
    assert metrics.tau_macro_ci([prompt("x", [3, 1])], ctx) == [2.0, 2.0]  # one prompt: no spread


# ---------------------------------------------------------------------------
# median and outliers


def test_median_and_tukey_outliers_by_hand():
    ps, ctx = [prompt(i, r) for i, r in HAND], Ctx(16, 0)
    # sorted tau 1, 2.5, 2.5, 2.75, 3, 3, 3.25, 9: median (2.75 + 3) / 2
    assert metrics.tau_median(ps, ctx) == pytest.approx(2.875)
    # Q1 at rank 1.75 = 2.5; Q3 at rank 5.25 = 3 + 0.25 * 0.25 = 3.0625; IQR 0.5625; 1.5 IQR = 0.84375
    assert metrics.fences(ps, ctx) == pytest.approx([1.65625, 3.90625])
    assert metrics.outliers(ps, ctx) == {"lo": "low", "hi": "high"}
    assert metrics.tau_macro_trimmed(ps, ctx) == pytest.approx((2.5 + 2.5 + 2.75 + 3 + 3 + 3.25) / 6)
    s = metrics.summarize(ps, 16, 0)
    assert s["tau_outliers"] == ["hi", "lo"] and s["tau_outlier_count"] == 2
    assert s["tau_macro"] == pytest.approx(27.0 / 8) and s["tau_median"] == pytest.approx(2.875)
    assert metrics.show("tau_outliers", s["tau_outliers"]) == "hi, lo"
    assert metrics.show("tau_fences", s["tau_fences"]) == "[1.66, 3.91]"
    # under 4 prompts: no fences, no outliers
    assert metrics.fences(ps[:3], ctx) is None and metrics.outliers(ps[:3], ctx) == {}
    assert metrics.show("tau_outliers", []) == "none"


def test_prompt_table_marks_outlier_rows():
    rows = [
        {
            "prompt_id": i,
            "tau": sum(r) / len(r),
            "tree_tau": None,
            "rounds": r,
            "accepted_at": [0] * (sum(r) + 1),
            "prompt_len": 1,
        }
        for i, r in HAND
    ]
    ps = [Prompt.from_row(r) for r in rows]
    table = prompt_table(metrics.prompt_rows(ps, 4, 0), {})
    assert [t["prompt"] for t in table][0] == "lo" and table[-1]["prompt"] == "hi"
    assert {t["prompt"]: t["outlier"] for t in table if t["outlier"]} == {"lo": "low", "hi": "high"}
    assert next(t for t in table if t["prompt"] == "c")["tau"] == 2.75
    assert next(t for t in table if t["prompt"] == "f")["tau"] == 3.25  # 2 decimals
    s = metrics.summarize(ps, 16, 0)
    links = outlier_links(s, rows, "run-1")
    assert [(o["prompt"], o["side"], o["tau"]) for o in links] == [("lo", "low", 1.0), ("hi", "high", 9.0)]
    assert links[0]["link"] == acceptance_link("run-1", "lo")


# ---------------------------------------------------------------------------
# chain at the DDTree budget


def test_chain_at_budget_by_hand():
    # P = 5, T = 16. Budget N = 2 (block 3): anchor 5 acc 3 -> min(3,2)+1 = 3; anchor 8 acc 5 -> 3; anchor 11
    # acc 0 -> 1; anchor 12 acc 2 -> 3 (3 tokens left); anchor 15 = T-1: stop.
    acc = [3, 0, 2, 5, 1, 4, 0, 2, 1, 0, 0]
    p = Prompt("x", 5, acc, walk(acc, 5, 8))
    ctx = Ctx(8, 2)
    assert metrics.budget_rounds(p, ctx) == [3, 3, 1, 3]
    assert metrics.chain_tau_at_budget(p, ctx) == pytest.approx(10 / 4)
    # a budget covering all B-1 drafts: the chain itself
    assert metrics.budget_rounds(p, Ctx(8, 7)) == p.rounds == walk(acc, 5, 8)
    assert metrics.budget_rounds(p, Ctx(8, 0)) is None  # no tree
    # an anchor of the budget walk that a chain-only replay did not compute: unknown, not a biased mean
    gap = Prompt("y", 5, [3, 0, 2, -1, 1, 4, 0, 2, 1, 0, 0], p.rounds)
    assert metrics.budget_rounds(gap, ctx) is None
    # run level: macro and pooled over two prompts (N = 2: q has acc 1, 1, 1 -> rounds 2, 1)
    q = Prompt("q", 0, [1, 1, 1, 0], walk([1, 1, 1, 0], 0, 8))
    assert metrics.budget_rounds(q, ctx) == [2, 1]
    s = metrics.summarize([p, q], 8, 2)
    assert s["chain_tau_at_budget"] == pytest.approx((2.5 + 1.5) / 2)
    assert s["chain_tau_at_budget_pooled"] == pytest.approx((10 + 3) / 6)
    assert metrics.summarize([p, gap], 8, 2)["chain_tau_at_budget"] is None
    assert metrics.label("chain_tau_at_budget", s) == "chain tau at the DDTree-2 budget (macro)"
    rows = summary_rows(s | {"tree_budget": 0})
    assert not any("DDTree" in r["metric"] for r in rows)  # tree metrics only for a run with a tree
    assert any(r["metric"] == "chain tau at the DDTree-2 budget (macro)" for r in summary_rows(s))


# ---------------------------------------------------------------------------
# per-depth counts


def two_prompts() -> list[Prompt]:
    a, b = [2, 0, 3, 1, 0, 0], [0, 0, 2, 0, 0]
    return [Prompt("a", 2, a, walk(a, 2, 5)), Prompt("b", 1, b, walk(b, 1, 5))]


def test_depth_counts_by_hand():
    # B = 5. a: P=2, T=8, rounds at anchors 2 (acc 2, slots 1..4 inside) and 5 (acc 1, slots 1..2).
    # b: P=1, T=6, anchors 1 (acc 0, slots 1..4), 2 (acc 0, slots 1..3), 3 (acc 2, slots 1..2).
    # inside per depth 1..4: 5, 5, 3, 2; reached (d_1..d_{k-1} accepted): 5, 3, 1, 0; hit: 3, 2, 0, 0.
    ps = two_prompts()
    assert [p.round_anchors for p in ps] == [[2, 5], [1, 2, 3]]
    s = metrics.summarize(ps, 5, 0)
    assert s["depth_rounds"] == [5, 5, 3, 2]
    assert s["depth_samples"] == [5, 3, 1, 0]
    assert s["depth_conditional"][:3] == pytest.approx([3 / 5, 2 / 3, 0.0]) and s["depth_conditional"][3] is None
    assert s["depth_marginal"] == pytest.approx([3 / 5, 2 / 5, 0.0, 0.0])


def test_depth_figure_states_counts_and_marks_empty_depths():
    s = metrics.summarize(two_prompts(), 5, 0)
    f = depth_fig({"run": s})
    by = {t.name: t for t in f.data}
    cond, marg = by["run: P(d_k | d_<k)"], by["run: P(d_1..d_k)"]
    assert list(cond.customdata) == [5, 3, 1, 0] and "n = %{customdata}" in cond.hovertemplate
    assert list(marg.customdata) == [5, 5, 3, 2]
    assert list(by["run: rounds behind P(d_k | d_<k)"].y) == [5, 3, 1, 0]
    assert cond.y[3] is None  # a gap, not a made-up value
    empty = next(t for n, t in by.items() if "n = 0" in n)
    assert list(empty.x) == [4] and list(empty.text) == ["n = 0"]
    # a summary from before the counts were stored: '?' in the hover, no bars, the gap still announced
    old = {k: s[k] for k in ("depth_conditional", "depth_marginal")}
    g = depth_fig({"old": old})
    assert list(g.data[0].customdata) == ["?"] * 4 and any("n = 0" in t.name for t in g.data)
    assert not any(t.type == "bar" for t in g.data)


def test_formats_are_one_per_kind():
    assert fmt(2.34567) == "2.35" and prob(0.123456) == "0.123"
    assert formats.ci(2.2, [1.954, 2.466]) == "2.20 [1.95, 2.47]" and formats.ci(None, None) == "—"
    assert metrics.show("tau_macro", 2.34567) == fmt(2.34567)
    assert metrics.show("expected_tau", 2.34567) == fmt(2.34567)
    assert metrics.show("calibration_ece", 0.123456) == prob(0.123456)
    assert metrics.show("depth_conditional", [0.5, None]) == "0.500, —"
    assert metrics.show("tau_macro_ci", [1.954, 2.466]) == "[1.95, 2.47]"


def test_complete_fills_a_summary_made_before_the_statistics():
    ps = [prompt(i, r) for i, r in HAND]
    full = metrics.summarize(ps, 16, 0)
    old = {k: v for k, v in full.items() if not k.startswith(("tau_", "chain_", "depth_rounds"))} | {"tau_macro": -1}
    got = metrics.complete(old, ps)
    assert got["tau_macro"] == -1  # stored values are kept
    for k in ("tau_macro_ci", "tau_pooled_ci", "tau_median", "tau_outliers", "tau_macro_trimmed", "depth_rounds"):
        assert got[k] == full[k], k
    assert metrics.complete(old, []) is old


# ---------------------------------------------------------------------------
# the page and the export


def test_acceptance_page_and_export_carry_the_statistics(prepared, monkeypatch):
    st_ = Store(prepared.workspace)
    rid = prepared.runs[0]
    B, budget = st_.run_row(rid)["summary"]["block_size"], st_.run_row(rid)["tree_budget"]
    want = metrics.summarize(st_.prompts(rid), B, budget)
    exp = pipeline.export(st_, rid)
    for k in (
        "tau_macro_ci",
        "tau_pooled_ci",
        "tau_median",
        "tau_outliers",
        "tau_macro_trimmed",
        "chain_tau_at_budget",
        "depth_rounds",
    ):
        assert exp["summary"][k] == (pytest.approx(want[k]) if isinstance(want[k], float) else want[k]), k
        assert k in {m["key"] for m in exp["metrics"]}
    assert "chain_tau_at_budget" in exp["prompts"][0]["metrics"]
    at = app(prepared.workspace, monkeypatch, "acceptance", run=rid)
    clean(at)
    s = st_.run_row(rid)["summary"]
    m = {x.label: x.value for x in at.metric}
    assert m["tau (macro), 95% CI"] == formats.ci(s["tau_macro"], s["tau_macro_ci"])
    assert m["tau (pooled), 95% CI"] == formats.ci(s["tau_pooled"], s["tau_pooled_ci"])
    assert m["tau (median)"] == fmt(s["tau_median"])
    assert m["tau (macro) without outliers"] == fmt(s["tau_macro_trimmed"])
    assert m[f"chain tau at the DDTree-{budget} budget (macro)"] == fmt(s["chain_tau_at_budget"])
    captions = " ".join(c.value for c in at.caption)
    assert metrics.TUKEY_RULE in captions and metrics.BY_KEY["tau_macro_ci"].formula in captions
    assert f"commits at most {budget} + 1 = {budget + 1} tokens" in captions
    assert any(f"Outlier prompts: {s['tau_outlier_count']}" in x.value for x in at.markdown)
    table = next(d.value for d in at.dataframe if "outlier" in d.value.columns)
    assert "chain_tau_at_budget" in table.columns
    odd = metrics.outliers(st_.prompts(rid), metrics.Ctx(B, budget))
    assert {p: o for p, o in zip(table["prompt"], table["outlier"]) if o} == odd
