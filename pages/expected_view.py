"""Acceptance page section for a run replayed at a temperature: tau beside the expected tau at T with its top-K
truncation bound, the verify rule and the formula, labelled teacher-forced. A helper of pages/acceptance.py, not a
page: it reads the run's summary (the metric registry's entries) and draws it."""

from __future__ import annotations

import streamlit as st

from dflash_dash import metrics
from dflash_dash.render.formats import ci, fmt

RULES = {  # each verify rule as an engine runs it, named with its source, and its per-slot acceptance
    "target-sample": "drafts are the drafter's greedy tokens, accepted while the target's sample at T equals them "
    "(SGLang's DFlash verify: accept while candidates[1:] == target_sampled[:-1]); alpha_j = p_T(d_j | prefix)",
    "rejection": "drafts sampled from the drafter at T, each accepted with min(1, p/q) (Leviathan et al. 2023, "
    "engines that sample drafts); alpha_j = sum_x min(p_T(x), q_T(x))",
}
PER_ANCHOR = (
    "tau_expected = mean over completion anchors p (a chain run: its rounds' anchors) of 1 + sum_{k=1}^{B-1} "
    "prod_{j<=k} alpha_j"
)


def shown(s: dict) -> None:
    """Nothing for a run replayed without a temperature."""
    if s.get("temperature") is None:
        return
    t, rule = s["temperature"], s.get("verify", "target-sample")
    st.markdown(
        f"**At temperature T = {t:g}** · verify rule **{rule}** · an estimate, teacher-forced (along the stored "
        "completion, not a live decode)"
    )
    c = st.columns(2)
    c[0].metric(f"{metrics.label('tau_macro', s)}, greedy", fmt(s.get("tau_macro")))
    c[0].caption("greedy (T = 0): " + metrics.BY_KEY["tau_macro"].formula)
    c[1].metric(
        f"{metrics.label('tau_expected', s)} [low, high]", ci(s.get("tau_expected"), s.get("tau_expected_bound"))
    )
    basis = s.get("expected_basis") or "teacher-forced along the stored completion"
    c[1].caption(
        f"{PER_ANCHOR} (slots past the completion count 0). Verify {rule}: {RULES.get(rule, rule)}. "
        f"{metrics.BY_KEY['tau_expected_bound'].formula}. {basis[:1].upper()}{basis[1:]}."
    )
