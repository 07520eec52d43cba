"""The metrics: one registry of every run and per-prompt metric, and the math behind it, by topic.

Contract: plain per-round data in, numbers out (no torch, no store, no Streamlit). `registry` holds THE registry
(`REGISTRY`, `BY_KEY`, `summarize`, `show`, `label`, ...): adding a metric is one entry there, its function in
its topic's module (`core`: tau and acceptance by depth; `calibration`; `spread`: statistics over prompts;
`budget`: a chain at the DDTree budget; `lag`: one-position draft lag; `engine`: engine conformance;
`engine_tau`: each serving engine's numbers as the replay's tau) and its
test. `base` holds what every metric reads (`Prompt`, `Ctx`) and the `Metric` entry. This package's public API is
the names below: callers write `metrics.X`.
"""

from __future__ import annotations

from .base import (
    PROB,
    TAU,
    Ctx,
    Metric,
    Prompt,
)
from .budget import (
    budget_rounds,
    chain_tau_at_budget,
    chain_tau_at_budget_pooled,
    chain_tau_at_budget_run,
)
from .calibration import (
    CAL_BINS,
    cal_arrays,
    cal_samples,
    calibration_ece,
    calibration_ece_depth,
    confidence_depth,
    ece_of,
    expected_rounds,
    expected_tau,
    expected_tau_pooled,
    expected_tau_run,
    recorded,
    reliability,
)
from .confidence import THRESHOLDS, confidence_reliability, stop_curve
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
from .engine import (
    CONFORMANCE,
)
from .engine_tau import (
    REPLAY_FORMULA as ENGINE_TAU_FORMULA,
    EngineTau,
    convert as convert_engine_tau,
    replay_tau as engine_replay_tau,
)
from .headroom import MISSED
from .lag import (
    LAG_FORMULA,
    lag_counts,
    lag_pool,
    lag_rate,
)
from .registry import (
    BY_KEY,
    HEADLINE,
    PER_PROMPT,
    REGISTRY,
    RELIABILITY_FORMULA,
    complete,
    label,
    per_prompt,
    prompt_rows,
    show,
    summarize,
    tree_only,
)
from .spread import (
    BOOT_LEVEL,
    BOOT_N,
    BOOT_SEED,
    TUKEY_K,
    TUKEY_MIN,
    TUKEY_RULE,
    bootstrap,
    bootstrap_sums,
    fences,
    fences_of,
    outliers,
    outliers_of,
    tau_macro_ci,
    tau_macro_trimmed,
    tau_median,
    tau_pooled_ci,
)

__all__ = [
    "BOOT_LEVEL",
    "BOOT_N",
    "BOOT_SEED",
    "BY_KEY",
    "CAL_BINS",
    "CONFORMANCE",
    "Ctx",
    "ENGINE_TAU_FORMULA",
    "EngineTau",
    "HEADLINE",
    "LAG_FORMULA",
    "MISSED",
    "Metric",
    "PER_PROMPT",
    "PROB",
    "Prompt",
    "REGISTRY",
    "RELIABILITY_FORMULA",
    "TAU",
    "THRESHOLDS",
    "TUKEY_K",
    "TUKEY_MIN",
    "TUKEY_RULE",
    "accept_hist",
    "bootstrap",
    "bootstrap_sums",
    "budget_rounds",
    "cal_arrays",
    "cal_samples",
    "calibration_ece",
    "calibration_ece_depth",
    "chain_tau_at_budget",
    "chain_tau_at_budget_pooled",
    "chain_tau_at_budget_run",
    "complete",
    "confidence_reliability",
    "convert_engine_tau",
    "confidence_depth",
    "depth_conditional",
    "depth_counts",
    "depth_marginal",
    "depth_samples",
    "ece_of",
    "engine_replay_tau",
    "every_anchor",
    "every_anchor_run",
    "expected_rounds",
    "expected_tau",
    "expected_tau_pooled",
    "expected_tau_run",
    "fences",
    "fences_of",
    "label",
    "lag_counts",
    "lag_pool",
    "lag_rate",
    "macro",
    "outliers",
    "outliers_of",
    "per_prompt",
    "pooled",
    "prompt_rows",
    "recorded",
    "reliability",
    "show",
    "stop_curve",
    "summarize",
    "tau",
    "tau_macro_ci",
    "tau_macro_trimmed",
    "tau_median",
    "tau_pooled_ci",
    "tree_only",
    "tree_tau",
]
