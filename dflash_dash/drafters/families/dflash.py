"""DFlash, the base family: the block drafter every other family extends (its backbone, forwards and loading).

Contract: `SPEC` declares it: `DFlashDraftModel`, projector_type `dflash`, no fields of its own, slot 1 drafts
anchor + 1 (D = B-1); a config of it drafting from the anchor's slot (DeepSpec's `sample_from_anchor`) is refused.
"""

from __future__ import annotations

from ..errors import CheckpointError
from ..spec import FamilySpec, Fields


def refuse(f: Fields) -> None:
    """DeepSpec's convention (slot k drafts anchor + k) on a DFlash config: refused, not replayed shifted."""
    if f.get("sample_from_anchor"):
        raise CheckpointError(
            "config.json: sample_from_anchor = true on a DFlash drafter (DeepSpec's convention: drafts from the "
            "anchor's slot); dflash-dash replays DFlash with slot k drafting anchor + k only"
        )


SPEC = FamilySpec(
    key="dflash",
    name="DFlash",
    architectures=("DFlashDraftModel",),
    model="dflash_dash.drafters.dflash:DFlash",
    flops="dflash_dash.drafters.dflash:flops_per_block",
    projector="dflash",
    refuse=refuse,
    strategies=("dflash",),
)
