"""DFlash2: DFlash's backbone with block-local convolutions around every sublayer and a candidate selector
(docs/families.md 5).

Contract: `SPEC` declares it: `DFlash2DraftModel`, projector_type `dflash2`, and SGLang's convention that its
fields on a DFlashDraftModel make a DFlash2 (`implied_by`); its fields (`head`: convolution taps and group,
selector rank and candidates, output scaling), the convolution and selector tensors (`extra_shapes`), the
codebooks as an `nn.Embedding` re-save names them, the SpecForge strategy that trains it (DFlash's), and the
replay's candidate count (`selector_top_k`). The model and its kernels are `drafters/dflash2.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError
from ..spec import FamilySpec, Fields

if TYPE_CHECKING:
    from ..config import DrafterConfig

FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")  # configured together
SUBLAYERS = ("attention_conv", "mlp_conv")  # a layer's two convolutions (drafters/dflash.py ATTN, MLP)


def head(f: Fields) -> dict[str, Any]:
    missing = [k for k in FIELDS if not f.present(k)]
    if missing:
        raise CheckpointError(
            f"config.json: a DFlash2 drafter needs dflash_config.{missing[0]} (convolutions and candidate selector "
            f"are configured together: {', '.join(FIELDS)})"
        )
    T = f.integer("conv_kernel_size", 1, f.block_size)
    group = f.integer("conv_group_size", 1)
    if f.hidden_size % group:
        raise CheckpointError(
            f"config.json: dflash_config.conv_group_size = {group} does not divide hidden_size {f.hidden_size}"
        )
    cap = f.get("final_logit_softcapping")
    return {
        "conv_kernel_size": T,  # taps of the block-local causal convolution
        "conv_group_size": group,  # channels sharing one dynamic kernel correction
        "selector_rank": f.integer("selector_rank", 1),  # R of the codebooks
        "selector_top_k": f.integer("selector_top_k", 1, f.vocab_size),  # candidates per slot
        "output_multiplier": f.positive("output_multiplier", 1.0),
        "final_logit_softcapping": None if not cap else f.positive("final_logit_softcapping"),
        "input_embedding_scale": f.positive("input_embedding_scale", 1.0),
    }


def extra_shapes(c: DrafterConfig) -> dict[str, tuple[int, ...]]:
    H, V, f = c.hidden_size, c.vocab_size, c.head
    T, R, groups = f["conv_kernel_size"], f["selector_rank"], H // f["conv_group_size"]
    out: dict[str, tuple[int, ...]] = {}
    for i in range(c.num_hidden_layers):
        for conv in SUBLAYERS:
            p = f"layers.{i}.{conv}."
            out |= {p + "base_kernel": (2, T, H), p + "kernel_projection.weight": (2 * T * groups, H)}
    return out | {
        "candidate_selector.predecessor_codebook": (V, R),
        "candidate_selector.successor_codebook": (V, R),
        "candidate_selector.hidden_projection.weight": (R, H),
    }


def rename(key: str) -> str:
    """The codebooks as an `nn.Embedding` re-save spells them (`...codebook.weight`) -> their current names."""
    if key.startswith("candidate_selector.") and key.endswith("_codebook.weight"):
        return key.removesuffix(".weight")
    return key


SPEC = FamilySpec(
    key="dflash2",
    name="DFlash2",
    architectures=("DFlash2DraftModel",),
    model="dflash_dash.drafters.dflash2:DFlash2",
    flops="dflash_dash.drafters.dflash2:flops_per_block",
    projector="dflash2",
    own_fields=FIELDS,
    implied_by=FIELDS,  # SGLang serves DFlash2 from these fields on a DFlashDraftModel architecture
    head=head,
    extra_shapes=extra_shapes,
    rename=rename,
    strategies=("dflash",),  # SpecForge trains DFlash2 through DFlash's strategy
    candidates=lambda h: h.get("selector_top_k", 0),
)
