"""Consistency of a drafter with its target and with an extraction's features: one rule set, many readers.

Contract: `checks(c, hidden, vocab, layers, extraction)` returns one `Check` per rule (hidden size, vocabulary,
layer count, mask token, and given an extraction row: layer ids, feature width, backend), so the replay's
refusal, the serving stand-in's and the Diagnostics table say the same; `check_target` raises
`CheckpointError` for the first fatal one. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .config import CheckpointError, DrafterConfig


class Features(Protocol):
    """What the rules read of an extraction (the store's `Extraction` row; the drafters sit below the store)."""

    @property
    def id(self) -> str: ...  # the extraction's id, named in the problems
    @property
    def layer_ids(self) -> list[int]: ...  # the target layers whose hidden states it holds
    @property
    def hidden_size(self) -> int: ...  # the target's hidden size
    @property
    def backend(self) -> str | None: ...  # the attention kernel backend the target ran


@dataclass(frozen=True)
class Check:
    name: str  # what is compared, e.g. "hidden size"
    drafter: object  # the drafter's value
    other: object  # the target's / extraction's value
    ok: bool  # consistent
    problem: str  # the message when not ok: names the field, what was expected and the fix
    fatal: bool = True  # a replay cannot run (False: a warning, e.g. torch-path features)


def checks(
    c: DrafterConfig, hidden_size: int, vocab_size: int, num_layers: int, extraction: Features | None = None
) -> list[Check]:
    """THE consistency rules of a drafter against its target (hidden size, vocab, layer count) and, given an
    extraction row, against the features it holds (layer ids, hidden size, backend): one Check per rule, so
    the replay's refusal, the serving stand-in's and the Diagnostics table say the same."""
    top = max(c.target_layer_ids)
    out = [
        Check(
            "hidden size",
            c.hidden_size,
            hidden_size,
            c.hidden_size == hidden_size,
            f"hidden_size={c.hidden_size} does not match the target (expected {hidden_size})",
        ),
        Check(
            "vocab size",
            c.vocab_size,
            vocab_size,
            c.vocab_size == vocab_size,
            f"vocab_size={c.vocab_size} does not match the target (expected {vocab_size})",
        ),
        Check(
            "target layers",
            c.num_target_layers,
            num_layers,
            top < num_layers and (c.num_target_layers is None or c.num_target_layers == num_layers),
            f"dflash_config.target_layer_ids contains {top}, expected ids < {num_layers} (the target's layer count)"
            if top >= num_layers
            else f"num_target_layers={c.num_target_layers} but the target has {num_layers}",
        ),
        Check(
            "mask token id < vocab",
            c.mask_token_id,
            vocab_size,
            0 <= c.mask_token_id < vocab_size,
            f"mask_token_id={c.mask_token_id} is outside the target's vocabulary (size {vocab_size})",
        ),
    ]
    if extraction is not None:
        out += [
            Check(
                "target layer ids",
                c.target_layer_ids,
                extraction.layer_ids,
                c.target_layer_ids == extraction.layer_ids,
                f"the drafter reads target layers {c.target_layer_ids} but extraction {extraction.id} "
                f"holds layers {extraction.layer_ids}; extract again with --drafter pointing at this checkpoint",
            ),
            Check(
                "hidden size (extraction)",
                c.hidden_size,
                extraction.hidden_size,
                c.hidden_size == extraction.hidden_size,
                f"hidden_size={c.hidden_size} but extraction {extraction.id} holds features of "
                f"{extraction.hidden_size}; extract with the drafter's target",
            ),
            Check(
                "extraction backend",
                "trained on fla",
                extraction.backend,
                extraction.backend in ("fla", "n/a"),
                f"extraction {extraction.id} ran the torch path: features differ slightly from the fla "
                "kernels the drafter was trained on",
                fatal=False,
            ),
        ]
    return out


def check_target(
    c: DrafterConfig, hidden_size: int, vocab_size: int, num_layers: int, extraction: Features | None = None
) -> None:
    """Raise CheckpointError for the first fatal rule of `checks` the drafter breaks."""
    bad = next((k for k in checks(c, hidden_size, vocab_size, num_layers, extraction) if k.fatal and not k.ok), None)
    if bad:
        raise CheckpointError(bad.problem)
