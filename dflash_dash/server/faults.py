"""Planted engine faults of the stand-in's speculative decoder: the kinds of engine bug conformance must flag.

Contract: a test aid, never a default. `--speculative-bug NAME` serves a deliberately broken decoder; each fault is
one small function the decoder (`specdec.Speculator`) applies, the correct decoder applying none. `FAULT_OF` names
the fault of `analysis.steps.FAULTS` each bug plants (the ranking must put it first):
  - "truncate-context" / "context-window": the drafter sees the last `TRUNCATE` context positions only (relative
    positions kept): `visible_context`.
  - "layer-off-by-one": the drafter is fed the output of decoder layer l-1 for each target layer id l (HF
    hidden_states[l], not [l+1]; a known bug of another engine); "layer-shift": layer l+1: `feature_layers`.
  - "draft-tokens": each verify step checks only the first `VERIFIED` drafts of the block: `verified`.
  - "prefill-count": the prefill is counted as a verify step that accepted no draft: `counts_prefill`.
  - "numerics": the drafter runs in bf16 instead of fp32: `drafter_dtype`.
  - "sliding-ignored": the drafter's sliding_attention layers attend over the whole context (a copy of its
    config whose `sliding_window` covers every position); "sliding-bidirectional": its sliding layers are
    bidirectional inside the block (`sliding_block="bidirectional"`, whatever the config says): `drafter_variant`.
    Both change nothing for a drafter without sliding-window layers.
"""

from __future__ import annotations

import dataclasses

FAULT_OF = {
    "truncate-context": "context-window",
    "context-window": "context-window",
    "layer-off-by-one": "layer-shift",
    "layer-shift": "layer-shift",
    "draft-tokens": "draft-tokens",
    "prefill-count": "prefill-count",
    "numerics": "numerics",
    "sliding-ignored": "sliding-ignored",
    "sliding-bidirectional": "sliding-bidirectional",
}
BUGS = tuple(FAULT_OF)  # deliberately broken decoders, for tests of conformance
TRUNCATE = 4  # truncate-context / context-window: context positions the drafter still sees
VERIFIED = 1  # draft-tokens: drafts verified per step
FULL = 1 << 30  # sliding-ignored: a key window wider than any context


def feature_layers(bug: str | None, layers: list[int]) -> list[int]:
    """The target layer ids the drafter's features are read from under `bug`."""
    if bug == "layer-off-by-one":  # hidden_states[l] instead of [l+1] (layer 0 stays: nothing below it)
        layers = [max(0, l - 1) for l in layers]
    elif bug == "layer-shift":  # the next layer's output
        layers = [l + 1 for l in layers]
    return layers


def visible_context(bug: str | None, feats, p: int):
    """(features, anchor position) the drafter sees of the context's `feats` [p, ...] at anchor `p` under `bug`."""
    if FAULT_OF.get(bug or "") == "context-window":  # keep only the last TRUNCATE positions (re-positioned from 0)
        w = min(p, TRUNCATE)
        feats, p = feats[p - w : p], w
    return feats, p


def verified(bug: str | None, drafts: int) -> int:
    """Drafts a verify step checks of the block's `drafts`."""
    return min(drafts, VERIFIED) if bug == "draft-tokens" else drafts


def counts_prefill(bug: str | None) -> bool:
    """Whether the prefill is counted as a verify step."""
    return bug == "prefill-count"


def drafter_dtype(bug: str | None, dtype):
    """The drafter's dtype under `bug` (`dtype`: the correct decoder's)."""
    import torch

    return torch.bfloat16 if bug == "numerics" else dtype


def drafter_variant(bug: str | None, d):
    """The loaded drafter `d` as the decoder runs it under `bug` (`d` itself, changed in place)."""
    if bug == "sliding-ignored":  # the window read by every sliding layer's mask (`DFlash._kind`)
        d.c = dataclasses.replace(d.c, sliding_window=FULL)
    elif bug == "sliding-bidirectional":
        d.sliding_block = "bidirectional"
    return d
