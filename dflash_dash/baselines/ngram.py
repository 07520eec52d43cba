"""vLLM's `ngram` proposer (prompt lookup), as vLLM proposes it.

Source: vllm-project/vllm `vllm/v1/spec_decode/ngram_proposer.py` (commit 016e8ede, `NgramProposer.propose` ->
`_find_longest_matched_ngram_and_propose_tokens`), settings from `vllm/config/speculative.py`. The rule: the
longest suffix n-gram of the context with prompt_lookup_min <= n <= prompt_lookup_max that occurred earlier in the
context (prompt + output so far; the match must end before the last token); of its occurrences the EARLIEST
(vLLM's KMP over the reversed tokens keeps the position of the last `>=` update, i.e. the first occurrence in the
original order); the drafts are the up to num_speculative_tokens tokens that followed it, cut at the end of the
context (they may run into the suffix itself). No match: no drafts this step (the target decodes one token).
vLLM's max_model_len cut is not modelled (a replay never reaches the model's length).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import Proposal, Proposer, SettingsError, positive


@dataclass(frozen=True)
class NgramSettings:
    prompt_lookup_min: int = 5  # shortest suffix n-gram matched (vLLM's default when neither is given: 5)
    prompt_lookup_max: int = 5  # longest suffix n-gram matched (vLLM's default: 5)
    num_speculative_tokens: int = 15  # k: most drafts per step (vLLM requires it; 15 = a 16-token DFlash block's)

    def __post_init__(self):
        for name in ("prompt_lookup_min", "prompt_lookup_max", "num_speculative_tokens"):
            positive(name, getattr(self, name))
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise SettingsError(
                f"settings prompt_lookup_min={self.prompt_lookup_min} > prompt_lookup_max={self.prompt_lookup_max}: "
                "give a min no larger than the max"
            )


class NgramVllm(Proposer):
    method = "ngram"
    family = "baseline:ngram-vllm"
    source = "vllm/v1/spec_decode/ngram_proposer.py @ 016e8ede"

    @property
    def width(self) -> int:
        return self.settings.num_speculative_tokens

    def propose(self, context: np.ndarray) -> Proposal:
        s, T = self.settings, len(context)
        for n in range(min(s.prompt_lookup_max, T - 1), s.prompt_lookup_min - 1, -1):
            hit = earliest(context, n)
            if hit >= 0:
                start = hit + n
                return Proposal(context[start : start + s.num_speculative_tokens].copy(), start, n, "context")
        return Proposal(np.empty(0, dtype=context.dtype))


def earliest(context: np.ndarray, n: int) -> int:
    """The first start s < T - n with context[s:s+n] == context[-n:] (an occurrence ending before the last token),
    -1 when there is none."""
    T = len(context)
    if n < 1 or T - n < 1:
        return -1
    ok = context[: T - n] == context[T - n]
    for j in range(1, n):
        ok &= context[j : T - n + j] == context[T - n + j]
    hits = np.flatnonzero(ok)
    return int(hits[0]) if len(hits) else -1
