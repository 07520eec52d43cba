"""One definition of tau across serving engines: each engine's speculative numbers turned into the replay's tau,
with the engine's own figure and its formula kept beside it.

Contract: pure arithmetic on one engine-stats row (`engines.base.stats_row`: verify_steps, accepted_tokens,
drafted_tokens, completion_tokens, accept_lengths, histogram, missing). The replay's tau (SPEC section 3) is the
tokens committed per verify round, bonus included, with the completion's first token, which comes from the
target's prefill and from no verify round, left out:

    tau = (completion_tokens - 1) / verify_steps

Each engine reports its own figure under its own definition, never compared with the replay's: the engine's spec
declares it (`engines.registry.Figure`) and the caller passes it in (`engines.tau`), e.g.
  - SGLang `spec_accept_length` = completion_tokens / spec_verify_ct: the prefill token counted too, so it sits
    above tau by 1 / verify_steps;
  - vLLM `mean_acceptance_length` = 1 + num_accepted_draft_tokens / num_spec_steps;
  - llama.cpp's acceptance rate draft_n_accepted / draft_n;
  - an engine without a registered client (stats imported from a file): no figure of its own.
When verify steps or completion tokens are missing, tau is None and `missing` says why; nothing is guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REPLAY_FORMULA = "(completion_tokens - 1) / verify_steps: committed tokens per verify round, prefill token left out"


@dataclass(frozen=True)
class EngineTau:
    engine: str  # the engine whose numbers these are (a registered engine's name, or an imported one)
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


def convert(engine: str, row: dict, own: tuple[float | None, str | None, str | None] = (None, None, None)) -> EngineTau:
    """The replay's tau from engine `engine`'s stats row, with `own`: the engine's own figure, its name and its formula
    (module docstring), beside."""
    v, n = row.get("verify_steps"), row.get("completion_tokens")
    missing = list(row.get("missing") or [])
    if not v and not any(m.startswith("verify_steps") for m in missing):
        missing.append("verify_steps: none reported" if v is None else "verify_steps: 0 (no verify round)")
    if n is None:
        missing.append("completion_tokens: not reported")
    fig, label, how = own
    tau = replay_tau(v, n)
    return EngineTau(engine, tau, REPLAY_FORMULA, fig, label, how, [] if tau is not None else missing)
