"""Typed drafter weights: one dataclass field per tensor instead of a string-keyed dict, and the checked read.

Contract: `shapes(c)` names every tensor a checkpoint with config `c` must hold (state-dict names, no prefix) and
its shape; `checked(ck, c, read)` reads a checkpoint's tensors against it (name, shape, none missing, none
unknown but copies of the target's embedding or LM head) and raises `CheckpointError` naming the first wrong one.
`Weights.from_named` builds the typed weights from such a {name: tensor} dict and `Weights.named()` gives the
dict back (same names, same tensor objects), for uploads, training and saving. Torch is never imported here:
the fields hold whatever tensors the caller read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .checkpoint import COPIES, Checkpoint, tensors
from .config import CheckpointError, DrafterConfig
from .fields import extra_shapes, rename_legacy

if TYPE_CHECKING:
    import torch


def shapes(c: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint with config `c` must hold (state-dict names, no prefix): DFlash's
    backbone, then what `c`'s family adds (`fields.extra_shapes`)."""
    H, I, hd, nh, nkv = c.hidden_size, c.intermediate_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads
    out = {"fc.weight": (H, c.K * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        out |= {
            p + "input_layernorm.weight": (H,),
            p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (nh * hd, H),
            p + "self_attn.k_proj.weight": (nkv * hd, H),
            p + "self_attn.v_proj.weight": (nkv * hd, H),
            p + "self_attn.o_proj.weight": (H, nh * hd),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (I, H),
            p + "mlp.up_proj.weight": (I, H),
            p + "mlp.down_proj.weight": (H, I),
        }
        if c.attention_bias:
            out |= {
                p + "self_attn.q_proj.bias": (nh * hd,),
                p + "self_attn.k_proj.bias": (nkv * hd,),
                p + "self_attn.v_proj.bias": (nkv * hd,),
                p + "self_attn.o_proj.bias": (H,),
            }
    return out | extra_shapes(c)


@dataclass
class Linear:
    weight: Any  # [out, in]
    bias: Any = None  # [out] (attention_bias configs only)


@dataclass
class Layer:
    """One draft layer: attention (q/k/v/o projections, per-head q/k RMSNorms) and the gated MLP."""

    input_layernorm: Any  # [H]
    post_attention_layernorm: Any  # [H]
    q_proj: Linear
    k_proj: Linear
    v_proj: Linear
    o_proj: Linear
    q_norm: Any  # [hd]
    k_norm: Any  # [hd]
    gate_proj: Linear
    up_proj: Linear
    down_proj: Linear


_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass
class Weights:
    """A drafter's tensors: fc + hidden_norm (features -> context), the layers, the final norm (the DFlash
    backbone every family shares), and the family's own tensors by state-dict name (`fields.extra_shapes`)."""

    fc: Linear  # [H, K*H]
    hidden_norm: Any  # [H]
    norm: Any  # [H]
    layers: list[Layer] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # {state-dict name: tensor} of the family's heads and convolutions

    @classmethod
    def from_named(cls, c: DrafterConfig, w: dict) -> Weights:
        """Typed weights from {state-dict name: tensor} (as `checked` returns, or a training's dict)."""

        def lin(name: str) -> Linear:
            return Linear(w[name + ".weight"], w.get(name + ".bias"))

        layers = []
        for i in range(c.num_hidden_layers):
            p = f"layers.{i}."
            layers.append(
                Layer(
                    input_layernorm=w[p + "input_layernorm.weight"],
                    post_attention_layernorm=w[p + "post_attention_layernorm.weight"],
                    **{k: lin(p + "self_attn." + k) for k in _ATTN},
                    q_norm=w[p + "self_attn.q_norm.weight"],
                    k_norm=w[p + "self_attn.k_norm.weight"],
                    **{k: lin(p + "mlp." + k) for k in _MLP},
                )
            )
        extra = {k: w[k] for k in extra_shapes(c)}
        return cls(lin("fc"), w["hidden_norm.weight"], w["norm.weight"], layers, extra)

    def named(self) -> dict[str, torch.Tensor]:
        """{state-dict name: tensor}: the names `shapes` lists, the same tensor objects."""
        out = {"fc.weight": self.fc.weight, "hidden_norm.weight": self.hidden_norm, "norm.weight": self.norm}
        if self.fc.bias is not None:
            out["fc.bias"] = self.fc.bias
        for i, L in enumerate(self.layers):
            p = f"layers.{i}."
            out[p + "input_layernorm.weight"] = L.input_layernorm
            out[p + "post_attention_layernorm.weight"] = L.post_attention_layernorm
            for group, names in (("self_attn.", _ATTN), ("mlp.", _MLP)):
                for k in names:
                    lin = getattr(L, k)
                    out[p + group + k + ".weight"] = lin.weight
                    if lin.bias is not None:
                        out[p + group + k + ".bias"] = lin.bias
            out[p + "self_attn.q_norm.weight"] = L.q_norm
            out[p + "self_attn.k_norm.weight"] = L.k_norm
        return out | self.extra


def checked(ck: Checkpoint, c: DrafterConfig, read: Callable[[torch.Tensor], torch.Tensor] | None) -> dict:
    """Every tensor of `ck` checked against `c` (name, shape, none missing): {name: read(tensor)}, or {name: None}
    without `read` (nothing but the files' headers is read). Legacy names are read under their current name
    (`fields.rename_legacy`); a tensor present under both names is kept once, the current one (SpecForge's
    loader does the same)."""
    want = shapes(c)
    w: dict[str, torch.Tensor | None] = {}
    legacy: dict[str, str] = {}  # current name -> the legacy name it was read from
    for fname, raw_key, shape, get in tensors(ck, c.family):
        key = rename_legacy(raw_key)
        if key not in want:
            if key in COPIES or key.endswith("rotary_emb.inv_freq"):
                continue
            raise CheckpointError(
                f"{ck.path / fname}: unknown tensor '{raw_key}': not part of a {c.family_name} drafter with "
                f"this config (another drafter family, or a config that does not match the weights)"
            )
        if shape != want[key]:
            raise CheckpointError(f"{fname}: tensor '{raw_key}' has shape {shape}, expected {want[key]}")
        if key in w and (key != raw_key or key not in legacy):
            continue  # the legacy copy of a tensor already read under its current name
        if key != raw_key:
            legacy[key] = raw_key
        else:
            legacy.pop(key, None)
        w[key] = read(get()) if read else None
    missing = [k for k in want if k not in w]
    if missing:
        raise CheckpointError(
            f"{ck.path}: missing tensor '{missing[0]}' (expected shape {want[missing[0]]})"
            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
        )
    return w
