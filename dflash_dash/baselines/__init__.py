"""Model-free proposers (n-gram, suffix) replayed on stored completions as the engines propose them.

Contract: one module per engine's proposer behind `base.Proposer` (`propose(context) -> Proposal`, `accept` for
the engines that verify a tree), each with a frozen settings dataclass holding the engine's flags and defaults;
`make(method, settings)` builds one by its --method name (METHODS); `replay` walks it over sequences as a greedy
speculative decoder (chain walk of `walks`). Numpy only: no torch, no store.
- ngram: vLLM's `ngram` proposer (vllm/v1/spec_decode/ngram_proposer.py)
- sglang-ngram: SGLang's NGRAM algorithm (sglang/srt/speculative/cpp_ngram/trie_cache.cpp, ngram_worker.py)
- suffix: vLLM's `suffix` method, Arctic Inference's SuffixDecodingCache (csrc/suffix_decoding/suffix_tree.cc)
"""

from __future__ import annotations

from dataclasses import asdict

from .base import Proposal, Proposer, SettingsError, settings_of
from .ngram import NgramSettings, NgramVllm
from .replay import Replayed, replay, replay_prompt
from .sglang import NgramSglang, SglangSettings
from .suffix import Suffix, SuffixSettings

METHODS: dict[str, tuple[type[Proposer], type]] = {
    "ngram": (NgramVllm, NgramSettings),
    "sglang-ngram": (NgramSglang, SglangSettings),
    "suffix": (Suffix, SuffixSettings),
}


def make(method: str, settings: str | dict | None = None) -> Proposer:
    """The proposer `method` (a METHODS key) with `settings` ("key=value,..." or a dict; None: the engine's
    defaults); a fresh one per replayed set (its caches start empty)."""
    if method not in METHODS:
        raise SettingsError(f"method {method!r}: expected one of {', '.join(METHODS)}")
    cls, settings_cls = METHODS[method]
    return cls(settings_of(settings_cls, settings))


def settings_dict(prop: Proposer) -> dict:
    """The proposer's settings as plain JSON (what a run records)."""
    return asdict(prop.settings)


__all__ = [
    "METHODS",
    "Proposal",
    "Proposer",
    "Replayed",
    "SettingsError",
    "make",
    "replay",
    "replay_prompt",
    "settings_dict",
    "settings_of",
]
