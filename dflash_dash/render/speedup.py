"""Predicted speedup and the "what to serve" advisor, shaped for eyes: table rows with readable headers, and the
captions that state the formula and the cost table's device (CPU costs labelled as such).

Contract: takes what `analysis.speedup.predict` / `advise` return and the kept cost tables (`costs.to_dict` with
their id); computes nothing a stored number depends on. Rows keep None where a value is missing (the pages draw a
dash); run names are not model output (no escaping needed: they go through st.dataframe as text).
"""

from __future__ import annotations

from ..analysis import rounded

WHAT_TO_SERVE = "What to serve"  # the section's stable title (the browser test finds it)
PREDICTED = "Predicted speedup"  # the metric's stable label


def table_label(t: dict) -> str:
    """One kept cost table in a selectbox: its id, device and backend (CPU costs said so)."""
    where = "CPU costs" if t.get("device") == "cpu" else t.get("device", "?")
    return f"{t['id']} · {where} · {t.get('backend', '?')} · {t.get('meta', {}).get('dtype', '?')}"


def predicted_caption(got: dict, table_id: str) -> str:
    """The formula, the verify size and the cost table it was priced on."""
    return (
        f"{got['formula']}; verify = {got['verify']} tokens (the block); cost table `{table_id}` measured on "
        f"{got['costs']}. Plain decoding on it: {_rate(got.get('plain_tokens_per_s'))} tokens/s; speculative: "
        f"{_rate(got.get('tokens_per_s'))} tokens/s (predicted)."
    )


def measured_caption(m: dict | None) -> str:
    """The engine's own throughput over the set, or why there is none."""
    if not m:
        return "Measured: the engine reported no timings for these completions (imported, or an engine without them)."
    return (
        f"Measured by the engine: {_rate(m['tokens_per_s'])} tokens/s over {m['completions']} completions "
        f"({m['how']}); a prediction on another device or backend does not compare directly."
    )


def advice_rows(advice: dict) -> list[dict]:
    """One row per setting: setting, k drafts, verify size, temperature, tau, predicted speedup, tokens/s, best."""
    return [
        {
            "setting": r["setting"],
            "best": "★ best" if r["best"] else "",
            "drafts k": r["k"],
            "verify tokens": r["verify"],
            "T": r["temperature"],
            "tau": rounded(r["tau"], 3),
            "predicted speedup": rounded(r["speedup"], 3),
            "predicted tokens/s": rounded(r["tokens_per_s"], 1),
            "run": r["run"],
        }
        for r in advice["rows"]
    ]


def advice_caption(advice: dict) -> str:
    return (
        f"{advice['formula']}. Drafts k = 1..{advice['block_size'] - 1}: {advice['capped']}. DDTree-b: the run's tree "
        f"rounds, a tree drafted and verified as b + 1 tokens. Temperature rows: {advice['temperature_rule']} "
        f"(tau_expected, teacher-forced). Costs: {advice['costs']}."
    )


def _rate(x: float | None) -> str:
    return "—" if x is None else f"{x:,.1f}"
