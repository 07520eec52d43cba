"""Acceptance page section for a run replayed at a temperature: tau beside the expected tau at T with its top-K
truncation bound, the verify rule and the formula, labelled teacher-forced. A helper of pages/acceptance.py, not a
page: it reads the run's summary (the metric registry's entries) and draws it."""

from __future__ import annotations

import streamlit as st

from dflash_dash import metrics
from dflash_dash.render.formats import ci, fmt

RULES = {  # each verify rule as an engine runs it, named with its source
    "target-sample": "drafts are the drafter's greedy tokens, accepted while the target's sample at T equals them "
    "(SGLang's DFlash verify: accept while candidates[1:] == target_sampled[:-1]); alpha_j = p_T(d_j | prefix)",
    "rejection": "drafts sampled from the drafter at T, each accepted with min(1, p/q) (Leviathan et al. 2023, "
    "engines that sample drafts); alpha_j = sum_x min(p_T(x), q_T(x))",
}


def shown(s: dict) -> None:
    """Nothing for a run replayed without a temperature."""
    if s.get("temperature") is None:
        return
    t, rule = s["temperature"], s.get("verify", "target-sample")
    st.markdown(f"**At temperature T = {t:g}** (verify rule **{rule}**), teacher-forced along the stored completion")
    c = st.columns(2)
    c[0].metric(metrics.label("tau_macro", s), fmt(s.get("tau_macro")))
    c[0].caption("greedy: " + metrics.BY_KEY["tau_macro"].formula)
    c[1].metric(
        f"{metrics.label('tau_expected', s)} [low, high]", ci(s.get("tau_expected"), s.get("tau_expected_bound"))
    )
    c[1].caption(f"{metrics.BY_KEY['tau_expected'].formula}. {RULES.get(rule, rule)}. {s.get('expected_basis', '')}")
