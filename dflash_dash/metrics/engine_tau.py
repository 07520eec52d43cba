"""One definition of tau across serving engines: each engine's speculative numbers turned into the replay's tau,
with the engine's own figure and its formula kept beside it.

Contract: pure arithmetic on one engine-stats row (`engines.base.stats_row`: verify_steps, accepted_tokens,
drafted_tokens, completion_tokens, accept_lengths, histogram, missing). The replay's tau (SPEC section 3) is the
tokens committed per verify round, bonus included, with the completion's first token, which comes from the
target's prefill and from no verify round, left out:

    tau = (completion_tokens - 1) / verify_steps

Each engine reports its own figure under its own definition, never compared with the replay's:
  - SGLang `spec_accept_length` = completion_tokens / spec_verify_ct: the prefill token counted too, so it sits
    above tau by 1 / verify_steps.
  - vLLM `mean_acceptance_length` = 1 + num_accepted_draft_tokens / num_spec_steps: accepted drafts counted
    before the completion is cut at max_tokens or a stop, so the last step may count drafts past the end.
  - llama.cpp reports `draft_n` (drafted) and `draft_n_accepted` (accepted) only: its figure is the acceptance
    rate draft_n_accepted / draft_n; verify steps are known only when every draft had the same length (see
    `engines.llamacpp.spec_stats`), and then its mean acceptance length is 1 + accepted / steps.
  - Any other engine (stats imported from a file): no figure of its own.
When verify steps or completion tokens are missing, tau is None and `missing` says why; nothing is guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REPLAY_FORMULA = "(completion_tokens - 1) / verify_steps: committed tokens per verify round, prefill token left out"


@dataclass(frozen=True)
class EngineTau:
    engine: str  # the engine whose numbers these are ("sglang", "vllm", "llamacpp", or an imported name)
    tau: float | None  # the replay's definition (REPLAY_FORMULA); None when the engine's numbers cannot give it
    formula: str  # how `tau` was computed from the engine's numbers
    engine_figure: float | None  # the engine's own number, under its own definition (never compared with tau)
    engine_label: str | None  # the engine's name for that number, e.g. "spec_accept_length"
    engine_formula: str | None  # how the engine computes it
    missing: list[str] = field(default_factory=list)  # what the engine did not report, and why tau is None


def replay_tau(verify_steps: int | None, completion_tokens: int | None) -> float | None:
    """(completion_tokens - 1) / verify_steps; None when either is unknown or there was no verify step."""
    if not verify_steps or completion_tokens is None:
        return None
    return (completion_tokens - 1) / verify_steps


def _ratio(num: int | None, den: int | None) -> float | None:
    return num / den if num is not None and den else None


def own_figure(engine: str, row: dict) -> tuple[float | None, str | None, str | None]:
    """(the engine's own figure, its name, its formula) from an engine-stats row."""
    v, a = row.get("verify_steps"), row.get("accepted_tokens")
    n, d = row.get("completion_tokens"), row.get("drafted_tokens")
    if engine == "sglang":
        return _ratio(n, v), "spec_accept_length", "completion_tokens / spec_verify_ct (prefill token included)"
    if engine == "vllm":
        fig = 1 + a / v if a is not None and v else None
        return fig, "mean_acceptance_length", "1 + num_accepted_draft_tokens / num_spec_steps"
    if engine == "llamacpp":
        return _ratio(a, d), "draft acceptance", "draft_n_accepted / draft_n"
    return None, None, None


def convert(engine: str, row: dict) -> EngineTau:
    """The replay's tau from engine `engine`'s stats row, its own figure beside (module docstring)."""
    v, n = row.get("verify_steps"), row.get("completion_tokens")
    missing = list(row.get("missing") or [])
    if not v and not any(m.startswith("verify_steps") for m in missing):
        missing.append("verify_steps: none reported" if v is None else "verify_steps: 0 (no verify round)")
    if n is None:
        missing.append("completion_tokens: not reported")
    fig, label, how = own_figure(engine, row)
    tau = replay_tau(v, n)
    return EngineTau(engine, tau, REPLAY_FORMULA, fig, label, how, [] if tau is not None else missing)
