"""The metric registry: every metric defined once, with its key, label, formula and functions.

Contract: a metric is a `Metric` entry of `REGISTRY`: `run(prompts, ctx)` gives the run-level value stored in the
run's summary under `key`, `prompt(p, ctx)` (when the metric has one) the per-prompt value. The replay's
summary, the export, the listings, the pages, compare, the sweep chart and the downloads all read this registry,
so adding a metric is one entry here, its function (in its topic's module) and its test. `show` prints every
value with its metric's format: TAU (2 decimals) for tau-like numbers, PROB (3 decimals) for probabilities.
Metrics whose label names DDTree (`tree_only`) are about the tree walk or its budget and shown only for runs
with a tree.
"""

from __future__ import annotations

import math
from typing import Any

from .base import PROB, Ctx, Metric, Prompt
from .budget import chain_tau_at_budget, chain_tau_at_budget_pooled, chain_tau_at_budget_run
from .calibration import (
    calibration_ece,
    calibration_ece_depth,
    confidence_depth,
    expected_tau,
    expected_tau_pooled,
    expected_tau_run,
)
from .confidence import confidence_ece
from .core import (
    accept_hist,
    depth_conditional,
    depth_counts,
    depth_marginal,
    depth_samples,
    every_anchor,
    every_anchor_run,
    macro,
    pooled,
    tau,
    tree_tau,
)
from .engine import CONFORMANCE
from .expected import FORMULA as EXPECTED_FORMULA, expected_accept_length, tau_expected_bound, tau_expected_run
from .headroom import oracle_tau, oracle_tau_run, recall_depth, recall_pooled
from .spread import (
    BOOT_LEVEL,
    BOOT_N,
    BOOT_SEED,
    TUKEY_K,
    TUKEY_MIN,
    TUKEY_RULE,
    fences,
    outliers,
    tau_macro_ci,
    tau_macro_trimmed,
    tau_median,
    tau_pooled_ci,
)

REGISTRY: list[Metric] = [
    Metric(
        "tau_macro",
        "tau (macro)",
        "mean over prompts of committed / rounds (bonus token included)",
        macro(tau),
        tau,
        headline=True,
    ),
    Metric("tau_pooled", "tau (pooled)", "all committed tokens / all rounds", pooled("rounds"), headline=True),
    Metric(
        "every_anchor_tau",
        "every-anchor tau",
        "mean over completion anchors p of accepted(p) + 1",
        every_anchor_run,
        every_anchor,
        headline=True,
    ),
    Metric(
        "ddtree_tau",
        "DDTree tau (macro)",
        "tree of b nodes per round (b: the run's tree budget); mean over prompts of committed / rounds",
        macro(tree_tau),
        tree_tau,
        headline=True,
    ),
    Metric(
        "ddtree_tau_pooled",
        "DDTree tau (pooled)",
        "all committed / all rounds of the tree walk",
        pooled("tree_rounds", need_tree=True),
    ),
    Metric(
        "rounds",
        "rounds",
        "chain-walk rounds over all prompts",
        lambda ps, c: sum(len(p.rounds) for p in ps),
        lambda p, c: len(p.rounds),
        kind="count",
        fmt="{}",
    ),
    Metric(
        "committed",
        "committed tokens",
        "tokens the rounds committed (bonus included)",
        lambda ps, c: sum(sum(p.rounds) for p in ps),
        lambda p, c: sum(p.rounds),
        kind="count",
        fmt="{}",
    ),
    Metric("prompts", "prompts", "prompts replayed", lambda ps, c: len(ps), kind="count", fmt="{}"),
    Metric(
        "accept_hist",
        "acceptance histogram",
        "rounds of the chain walk by accepted drafts 0..B-1",
        accept_hist,
        kind="histogram",
    ),
    Metric(
        "depth_conditional",
        "per-depth conditional acceptance",
        "P(d_k accepted | d_1..d_{k-1} accepted), k = 1..B-1, over the rounds of the trace",
        depth_conditional,
        kind="curve",
        fmt=PROB,
    ),
    Metric(
        "depth_marginal",
        "per-depth marginal acceptance",
        "P(d_1..d_k all accepted), k = 1..B-1, over the rounds of the trace",
        depth_marginal,
        kind="curve",
        fmt=PROB,
    ),
    Metric(
        "depth_samples",
        "rounds per depth",
        "rounds behind each conditional point: d_1..d_{k-1} accepted and slot k inside the completion",
        depth_samples,
        kind="curve",
        fmt="{}",
    ),
]
# -- calibration: None for runs replayed before draft log-probabilities were stored
REGISTRY += [
    Metric(
        "calibration_ece",
        "calibration ECE (pooled over depths)",
        "sum over 10 equal-width bins b of p_k of (n_b / N) * |observed_b - predicted_b|; p_k = the drafter's "
        "probability of its top-1 draft at slot k, observed = share of those drafts accepted, over the rounds "
        "with d_1..d_{k-1} accepted and slot k in the completion",
        calibration_ece,
        fmt=PROB,
    ),
    Metric(
        "expected_tau",
        "expected tau (macro)",
        "mean over prompts of the mean over rounds of 1 + sum_{k=1}^{min(B-1, left-1)} prod_{j<=k} p_j "
        "(left = tokens left after the anchor); compare with tau (macro)",
        expected_tau_run,
        expected_tau,
    ),
    Metric(
        "expected_tau_pooled",
        "expected tau (pooled)",
        "all expected committed tokens / all rounds; compare with tau (pooled)",
        expected_tau_pooled,
    ),
    Metric(
        "calibration_ece_depth",
        "calibration ECE per depth",
        "ECE of the samples of depth k alone, k = 1..B-1",
        calibration_ece_depth,
        kind="curve",
        fmt=PROB,
    ),
    Metric(
        "confidence_depth",
        "mean draft probability per depth",
        "mean p_k over the rounds with d_1..d_{k-1} accepted and slot k in the completion; against "
        "P(d_k accepted | d_1..d_{k-1} accepted)",
        confidence_depth,
        kind="curve",
        fmt=PROB,
    ),
]
# -- statistics over prompts: how sure tau is, and DDTree against a chain of the same token budget
_BOOT = (
    f"percentile bootstrap over prompts: {BOOT_N} resamples of the prompts with replacement (seed "
    f"{BOOT_SEED}), the {(1 - BOOT_LEVEL) / 2:.1%} and {(1 + BOOT_LEVEL) / 2:.1%} quantiles of"
)
REGISTRY += [
    Metric(
        "depth_rounds",
        "rounds per depth (marginal)",
        "rounds behind each marginal point: slot k inside the completion",
        lambda ps, c: depth_counts(ps, c)[0],
        kind="curve",
        fmt="{}",
    ),
    Metric(
        "tau_macro_ci",
        f"tau (macro), {BOOT_LEVEL:.0%} CI",
        f"{_BOOT} the mean over prompts of committed / rounds",
        tau_macro_ci,
        kind="interval",
    ),
    Metric(
        "tau_pooled_ci",
        f"tau (pooled), {BOOT_LEVEL:.0%} CI",
        f"{_BOOT} all committed / all rounds of the resampled prompts",
        tau_pooled_ci,
        kind="interval",
    ),
    Metric("tau_median", "tau (median)", "median over prompts of committed / rounds", tau_median),
    Metric(
        "tau_fences",
        "tau outlier fences",
        f"[Q1 - {TUKEY_K:g}·IQR, Q3 + {TUKEY_K:g}·IQR] of per-prompt tau (at least {TUKEY_MIN} prompts)",
        fences,
        kind="interval",
    ),
    Metric("tau_outliers", "outlier prompts", TUKEY_RULE, lambda ps, c: sorted(outliers(ps, c)), kind="ids"),
    Metric(
        "tau_outlier_count",
        "outlier prompts (count)",
        TUKEY_RULE,
        lambda ps, c: len(outliers(ps, c)),
        kind="count",
        fmt="{}",
    ),
    Metric(
        "tau_macro_trimmed",
        "tau (macro) without outliers",
        "mean over the prompts inside the fences of committed / rounds",
        tau_macro_trimmed,
    ),
    Metric(
        "chain_tau_at_budget",
        "chain tau at the DDTree budget (macro)",
        "chain whose block verifies as many drafts as the tree (block N+1, N = tree budget): per round commit "
        "min(accepted(p), N) + 1 (capped to the tokens left), walking from P over the same drafts cut to N "
        "slots; mean over prompts of committed / rounds",
        chain_tau_at_budget_run,
        chain_tau_at_budget,
    ),
    Metric(
        "chain_tau_at_budget_pooled",
        "chain tau at the DDTree budget (pooled)",
        "all committed / all rounds of that block-(N+1) chain walk",
        chain_tau_at_budget_pooled,
    ),
]
# -- top-K headroom: None for chain-only runs and runs replayed before ranks were stored
_RECALL = "over the rounds with d_1..d_{k-1} accepted and slot k in the completion (the target's own path)"
REGISTRY += [
    Metric(
        "recall_top1",
        "top-1 recall",
        f"share of slots whose draft (the top-1 candidate) is the target's token, {_RECALL}",
        lambda ps, c: recall_pooled(ps, c, top1=True),
        fmt=PROB,
    ),
    Metric(
        "recall_topk",
        "top-K recall",
        f"share of slots whose top-K candidates hold the target's token (K = max(tree budget, 4, a selector's "
        f"candidate count)), {_RECALL}",
        recall_pooled,
        fmt=PROB,
    ),
    Metric(
        "recall_topk_depth",
        "top-K recall per depth",
        f"top-K recall at depth k = 1..B-1, {_RECALL}",
        recall_depth,
        kind="curve",
        fmt=PROB,
    ),
    Metric(
        "oracle_tau",
        "oracle tau over the top-K (macro)",
        "chain walk committing, per anchor, the leading slots whose top-K candidates hold the target's token, "
        "plus the bonus token: a perfect selector among the candidates (exact for DFlash; for DSpark, Domino and "
        "DFlash2, whose candidates depend on the previous draft, slots after the drafter's own first miss hold its "
        "own path's candidates); mean over prompts of committed / rounds",
        oracle_tau_run,
        oracle_tau,
    ),
]
# -- a confidence head (DSpark): None for runs without one
REGISTRY += [
    Metric(
        "confidence_head_ece",
        "confidence head ECE",
        "sum over 10 equal-width bins b of c_k of (n_b / N) * |observed_b - predicted_b|; c_k = the confidence "
        "head's predicted acceptance of draft k, observed = share of those drafts accepted, over the rounds with "
        "d_1..d_{k-1} accepted and slot k in the completion",
        confidence_ece,
        fmt=PROB,
    ),
]
# -- expected acceptance at the run's temperature: None for runs replayed without one
REGISTRY += [
    Metric(
        "tau_expected",
        "expected tau at temperature T",
        EXPECTED_FORMULA + "; the middle of the top-K truncation bound",
        tau_expected_run,
    ),
    Metric(
        "tau_expected_bound",
        "expected tau, top-K truncation bound",
        "[low, high] of tau_expected: the target's tail mass outside its stored top-K placed in the ways that "
        "give the least and the most acceptance",
        tau_expected_bound,
        kind="interval",
    ),
    Metric(
        "expected_accept_length",
        "expected accept length",
        "per prompt: " + EXPECTED_FORMULA + "; run: the mean over prompts",
        lambda ps, c: macro_of(expected_accept_length, ps, c),
        expected_accept_length,
    ),
]
RELIABILITY_FORMULA = (
    "per equal-width bin b of p_k: n_b samples, predicted_b = mean p_k, observed_b = share of "
    "those drafts accepted; pooled over depths and per depth k"
)  # metrics.reliability (not stored)


def macro_of(fn, ps: list[Prompt], c: Ctx) -> float | None:
    """Mean over prompts of a per-prompt value, the prompts without one left out (None: no prompt has one)."""
    xs = [x for x in (fn(p, c) for p in ps) if x is not None]
    return sum(xs) / len(xs) if xs else None


BY_KEY = {m.key: m for m in REGISTRY}
HEADLINE = [m for m in REGISTRY if m.headline]
PER_PROMPT = [m for m in REGISTRY if m.prompt is not None]


def tree_only(key: str) -> bool:
    """A metric of the DDTree walk or its budget (its label names DDTree): shown only for runs with a tree."""
    return "DDTree" in BY_KEY[key].label


def label(key: str, summary: dict | None = None) -> str:
    """The UI label of a metric; DDTree labels carry the run's budget (DDTree-8 tau)."""
    m = BY_KEY[key]
    if tree_only(key) and summary and summary.get("tree_budget"):
        return m.label.replace("DDTree", f"DDTree-{summary['tree_budget']}")
    return m.label


def show(key: str, value: Any) -> str:
    """A value as the UI prints it: the metric's format (TAU: 2 decimals for tau-like numbers, PROB: 3 for
    probabilities), integers as such, an interval as [lo, hi], ids comma-separated ('none' for no ids), '—' for
    missing/NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    kind = BY_KEY[key].kind if key in BY_KEY else ""
    if kind == "interval" and isinstance(value, (list, tuple)) and len(value) == 2:
        return f"[{show(key, value[0])}, {show(key, value[1])}]"
    if kind == "ids":
        return ", ".join(map(str, value)) or "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(show(key, v) for v in value)
    return BY_KEY[key].fmt.format(value) if key in BY_KEY else f"{value}"


def summarize(ps: list[Prompt], block_size: int, tree_budget: int) -> dict:
    """Every run-level metric of the registry over a run's prompts."""
    ctx = Ctx(block_size, tree_budget)
    return {m.key: m.run(ps, ctx) for m in REGISTRY} | {"block_size": block_size, "tree_budget": tree_budget}


def complete(summary: dict, ps: list[Prompt]) -> dict:
    """A stored run summary with every registry metric it lacks computed from the run's prompts (a run summarised
    before the metric existed); the stored values are kept."""
    missing = [m for m in REGISTRY if m.key not in summary]
    if not missing or not ps or not summary.get("block_size"):
        return summary
    ctx = Ctx(summary["block_size"], summary.get("tree_budget") or 0)
    return summary | {m.key: m.run(ps, ctx) for m in missing}


def per_prompt(p: Prompt, block_size: int, tree_budget: int) -> dict:
    """Every per-prompt metric of the registry for one prompt (computed once per Prompt, block size and budget: a
    run's store step asks for them twice, for its rows and for its prompts analysis)."""
    got = p.__dict__.get(("_per", block_size, tree_budget))
    if got is None:
        ctx = Ctx(block_size, tree_budget)
        got = p.__dict__[("_per", block_size, tree_budget)] = {m.key: m.prompt(p, ctx) for m in PER_PROMPT}
    return dict(got)


def prompt_rows(ps: list[Prompt], block_size: int, tree_budget: int) -> list[dict]:
    """One small row per prompt of a run (its scored Prompts in): prompt_id, tau, tree_tau, prompt_len,
    completion_tokens and every per-prompt registry metric (`rounds` the count); no token arrays."""
    return [
        {
            "prompt_id": p.id,
            "tau": p.tau,
            "tree_tau": p.tree_tau,
            "prompt_len": p.prompt_len,
            "completion_tokens": len(p.accepted_at),
            **per_prompt(p, block_size, tree_budget),
        }
        for p in ps
    ]


BY_KEY.update({m.key: m for m in CONFORMANCE})
