"""Engine conformance metrics: engine tau beside replay tau, per prompt (rows of `conformance.compare`).

Contract: not replay metrics, so not in REGISTRY (summarize never sees them): each entry's `run(rows, threshold)`
is over the compared prompts; `conformance.summary` applies this block; `show`/`label` know the keys (the
registry's BY_KEY holds them too).
"""

from __future__ import annotations

from .base import Metric, _mean


def _of(rows: list[dict], key: str) -> list[float]:
    return [r[key] for r in rows if r.get(key) is not None]


def _conf_pooled(rows: list[dict], thr: float) -> tuple[float | None, float | None]:
    """(engine, replay) pooled over the prompts where both exist: all committed / all verify steps (rounds)."""
    both = [r for r in rows if r.get("engine_tau") is not None and r.get("replay_tau") is not None]
    v, n = sum(r["verify_steps"] for r in both), sum(r["completion_tokens"] - 1 for r in both)
    rounds, committed = sum(r["rounds"] for r in both), sum(r["committed"] for r in both)
    return (n / v if v else None), (committed / rounds if rounds else None)


CONFORMANCE: list[Metric] = [
    Metric(
        "engine_tau",
        "engine tau (macro)",
        "mean over prompts of (completion_tokens - 1) / verify_steps: committed tokens per verify step, the "
        "prefill's first token left out (like the replay)",
        lambda rows, thr: _mean(_of(rows, "engine_tau")),
        lambda r, thr: r.get("engine_tau"),
        headline=True,
    ),
    Metric(
        "replay_tau",
        "replay tau (macro)",
        "mean over the same prompts of the replay's committed / rounds (chain walk, bonus included)",
        lambda rows, thr: _mean(_of(rows, "replay_tau")),
        lambda r, thr: r.get("replay_tau"),
        headline=True,
    ),
    Metric(
        "conformance_gap",
        "gap (macro)",
        "mean over prompts of engine tau - replay tau (negative: the engine falls short)",
        lambda rows, thr: _mean(_of(rows, "gap")),
        lambda r, thr: r.get("gap"),
        headline=True,
    ),
    Metric(
        "conformance_flagged",
        "flagged prompts",
        "prompts with replay tau - engine tau > threshold x replay tau (more than numeric noise)",
        lambda rows, thr: sum(bool(r.get("flagged")) for r in rows),
        lambda r, thr: bool(r.get("flagged")),
        kind="count",
        headline=True,
        fmt="{}",
    ),
    Metric(
        "engine_tau_pooled",
        "engine tau (pooled)",
        "all (completion_tokens - 1) / all verify steps",
        lambda rows, thr: _conf_pooled(rows, thr)[0],
    ),
    Metric(
        "replay_tau_pooled",
        "replay tau (pooled)",
        "all committed / all rounds of the replay, same prompts",
        lambda rows, thr: _conf_pooled(rows, thr)[1],
    ),
    Metric(
        "sglang_accept_length",
        "SGLang spec_accept_length (macro)",
        "mean over prompts of completion_tokens / verify_steps, as SGLang reports it (prefill token included: "
        "not like with like, shown for reference)",
        lambda rows, thr: _mean(_of(rows, "sglang_accept_length")),
        lambda r, thr: r.get("sglang_accept_length"),
    ),
    Metric(
        "conformance_prompts",
        "prompts compared",
        "prompts with both engine stats and a replay row",
        lambda rows, thr: len(rows),
        kind="count",
        fmt="{}",
    ),
]
