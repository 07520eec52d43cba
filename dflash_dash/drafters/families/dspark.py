"""DSpark: DFlash's backbone with SpecForge's Markov logit bias and optional confidence head (docs/families.md 3).

Contract: `SPEC` declares it: `DSparkDraftModel` / SGLang's `Qwen3DSparkModel`, projector_type `dspark`, its
fields (`head`: attention mode, Markov rank and head type, confidence head, `sample_from_anchor`), the Markov and
confidence tensors (`extra_shapes`), SpecForge's legacy `logit_head.*` names, and its alignment: drafting from the
anchor's slot (the default) makes slot 0 draft anchor + 1 and D = B. The model is `drafters/dspark.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError
from ..spec import FamilySpec, Fields, renamer

if TYPE_CHECKING:
    from ..config import DrafterConfig

MARKOV_TYPES = ("vanilla", "gated", "rnn")  # SpecForge's Markov heads (SGLang's cond/attn are refused)


def head(f: Fields) -> dict[str, Any]:
    mode = f.get("attention_mode", "gqa")
    if mode not in ("gqa", "mha"):
        raise CheckpointError(
            f"config.json: dflash_config.attention_mode = {mode!r}: only gqa and mha DSpark drafters are replayed "
            "(mla/kda hold other attention tensors)"
        )
    if (mode == "mha") != (f.kv_heads == f.heads):
        raise CheckpointError(
            f"config.json: dflash_config.attention_mode = {mode!r} with {f.heads} query and {f.kv_heads} key/value "
            "heads (gqa needs fewer key/value heads, mha as many)"
        )
    rank = f.integer("markov_rank", 0, default=0)
    kind = str(f.get("markov_head_type", "vanilla")).lower()
    if kind not in MARKOV_TYPES:
        raise CheckpointError(
            f"config.json: dflash_config.markov_head_type = {kind!r}, expected one of {', '.join(MARKOV_TYPES)} "
            "(SGLang's cond/attn heads are not SpecForge's and are not replayed)"
        )
    alpha = f.get("confidence_head_alpha", 0.0)
    conf = f.flag("enable_confidence_head", bool(alpha and alpha > 0))
    with_markov = f.flag("confidence_head_with_markov", False)
    if with_markov and conf and not rank:
        raise CheckpointError(
            "config.json: dflash_config.confidence_head_with_markov = true needs markov_rank > 0 (the head reads "
            "the Markov embedding of the previous token)"
        )
    return {
        "markov_rank": rank,  # r: 0 = no Markov head
        "markov_head_type": kind,  # vanilla | gated | rnn
        "confidence": conf,  # a confidence head is present
        "confidence_with_markov": with_markov and conf,  # its input is [h ; W1[prev]]
        "sample_from_anchor": f.flag("sample_from_anchor", True),  # slot s drafts anchor + s + 1 (B drafts)
        "attention_mode": mode,
    }


def extra_shapes(c: DrafterConfig) -> dict[str, tuple[int, ...]]:
    H, V, f = c.hidden_size, c.vocab_size, c.head
    r = f["markov_rank"]
    out: dict[str, tuple[int, ...]] = {}
    if r:
        out |= {"markov_head.markov_w1.weight": (V, r), "markov_head.markov_w2.weight": (V, r)}
        if f["markov_head_type"] == "gated":
            out |= {"markov_head.gate_proj.weight": (r, H + r), "markov_head.gate_proj.bias": (r,)}
        if f["markov_head_type"] == "rnn":
            out |= {"markov_head.joint_proj.weight": (3 * r, 2 * r + H), "markov_head.joint_proj.bias": (3 * r,)}
    if f["confidence"]:
        width = H + r if f["confidence_with_markov"] else H
        out |= {"confidence_head.proj.weight": (1, width), "confidence_head.proj.bias": (1,)}
    return out


SPEC = FamilySpec(
    key="dspark",
    name="DSpark",
    architectures=("DSparkDraftModel", "Qwen3DSparkModel"),  # Qwen3DSparkModel: SGLang's normalised export
    model="dflash_dash.drafters.dspark:DSpark",
    flops="dflash_dash.drafters.dspark:flops_per_block",
    projector="dspark",
    own_fields=("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov"),
    head=head,
    extra_shapes=extra_shapes,
    # SpecForge `normalize_draft_head_checkpoint_keys`: early DSpark heads under `logit_head`
    rename=renamer({"logit_head.markov_head.": "markov_head.", "logit_head.confidence_head.": "confidence_head."}),
    strategies=("dspark",),
    first_slot=lambda h: 0 if h.get("sample_from_anchor") else 1,
    drafts=lambda h, B: B if h.get("sample_from_anchor") else B - 1,
)
