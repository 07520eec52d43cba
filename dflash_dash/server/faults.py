"""Planted engine faults of the stand-in's speculative decoder: the kinds of engine bug conformance must flag.

Contract: a test aid, never a default. `--speculative-bug NAME` serves a deliberately broken decoder; each fault is
one small function the decoder (`specdec.Speculator`) applies, the correct decoder applying none:
  - "truncate-context" drafts from the last `TRUNCATE` context positions only (relative positions kept):
    `visible_context`.
  - "layer-off-by-one" feeds the drafter the output of decoder layer l-1 for each target layer id l (HF
    hidden_states[l], not [l+1]; a known bug of another engine): `feature_layers`.
"""

from __future__ import annotations

BUGS = ("truncate-context", "layer-off-by-one")  # deliberately broken decoders, for tests of conformance
TRUNCATE = 4  # truncate-context: context positions the drafter still sees


def feature_layers(bug: str | None, layers: list[int]) -> list[int]:
    """The target layer ids the drafter's features are read from under `bug`."""
    if bug == "layer-off-by-one":  # hidden_states[l] instead of [l+1] (layer 0 stays: nothing below it)
        layers = [max(0, l - 1) for l in layers]
    return layers


def visible_context(bug: str | None, feats, p: int):
    """(features, anchor position) the drafter sees of the context's `feats` [p, ...] at anchor `p` under `bug`."""
    if bug == "truncate-context":  # keep only the last TRUNCATE positions (re-positioned from 0)
        w = min(p, TRUNCATE)
        feats, p = feats[p - w : p], w
    return feats, p
