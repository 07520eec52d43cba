"""Domino: DFlash's backbone with a prefix GRU whose state corrects each draft's logits (docs/families.md 4).

Contract: `SPEC` declares it: `DominoDraftModel`, projector_type `domino` (SpecForge's normaliser keeps it on a
DFlashDraftModel), its fields (`head`: correction width, GRU state, plain drafts before the correction,
`shift_label`), the GRU and correction tensors, SpecForge's legacy `logit_head.*` names, and its alignment:
`shift_label` makes slot 0 draft anchor + 1. The model is `drafters/domino.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError
from ..spec import FamilySpec, Fields, renamer

if TYPE_CHECKING:
    from ..config import DrafterConfig


def head(f: Fields) -> dict[str, Any]:
    for key in ("emb_dim", "gru_hidden_dim"):
        if not f.present(key):
            raise CheckpointError(f"config.json: missing field 'dflash_config.{key}' (a Domino drafter needs it)")
    return {
        "emb_dim": f.integer("emb_dim", 1),  # E: width of the correction's bottleneck
        "gru_hidden_dim": f.integer("gru_hidden_dim", 1),  # G: prefix GRU state
        "pure_draft_prefix_len": f.integer("pure_draft_prefix_len", 0, f.block_size - 1, default=0),
        "shift_label": f.flag("shift_label", False),  # slot k-1 drafts anchor + k
    }


def extra_shapes(c: DrafterConfig) -> dict[str, tuple[int, ...]]:
    H, V, E, G = c.hidden_size, c.vocab_size, c.head["emb_dim"], c.head["gru_hidden_dim"]
    return {
        "prefix_gru.weight_ih_l0": (3 * G, H),
        "prefix_gru.weight_hh_l0": (3 * G, G),
        "embed_proj.0.weight": (E, H + G),
        "embed_proj.2.weight": (V, E),
    }


SPEC = FamilySpec(
    key="domino",
    name="Domino",
    architectures=("DominoDraftModel",),
    model="dflash_dash.drafters.domino:Domino",
    flops="dflash_dash.drafters.domino:flops_per_block",
    projector="domino",
    own_fields=("emb_dim", "gru_hidden_dim", "pure_draft_prefix_len", "shift_label"),
    head=head,
    extra_shapes=extra_shapes,
    # SpecForge `normalize_draft_head_checkpoint_keys`: early Domino heads under `logit_head`
    rename=renamer({"logit_head.prefix_gru.": "prefix_gru.", "logit_head.embed_proj.": "embed_proj."}),
    strategies=("domino",),
    first_slot=lambda h: 0 if h.get("shift_label") else 1,
)
