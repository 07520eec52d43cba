"""Attention with its log-sum-exp, and the merge of two attentions over disjoint keys.

Contract: `attend(q, k, v, ok)` is softmax(q k^T / sqrt(hd) + mask) v over keys [..., Lk, hd] for queries
[..., Lq, hd], with `ok` a boolean visibility mask broadcast to [..., Lq, Lk] (None: every key visible), and
returns the output (q's dtype) and the log-sum-exp of each query's scores (fp32, [..., Lq]). `merge` combines two
such results over disjoint key sets into the attention over their union: exact up to rounding, so a long context
can be attended in parts. Kernels: on CUDA an unmasked bf16/fp16 call is the flash kernel, an unmasked fp32 one
the memory-efficient kernel; a masked one on CUDA (the small parts of `DFlash.blocks_run`) is plain fp32 matmuls;
on the CPU both go through torch's CPU flash kernel. `reference` is the plain fp32 computation they all equal.
"""

from __future__ import annotations

import math

import torch

__all__ = ["attend", "merge", "reference"]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ok: torch.Tensor | None):
    """Plain fp32 attention and log-sum-exp (the one every kernel path equals)."""
    s = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])  # [..., Lq, Lk]
    if ok is not None:
        s = s.masked_fill(~ok, float("-inf"))
    lse = s.logsumexp(-1)  # [..., Lq]
    return ((s - lse[..., None]).exp() @ v.float()).to(q.dtype), lse


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ok: torch.Tensor | None = None):
    """(output [..., Lq, hd] in q's dtype, log-sum-exp [..., Lq] fp32) of q [B, h, Lq, hd] over k, v
    [B, h, Lk, hd]; ok: bool, broadcastable to [B, h, Lq, Lk], or None. Every query must see a key."""
    if q.device.type == "cpu":
        mask = None
        if ok is not None:
            mask = torch.zeros(ok.shape, dtype=q.dtype).masked_fill_(~ok, float("-inf"))
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask)
        return o, lse.float()
    if ok is None and q.dtype in (torch.float16, torch.bfloat16):
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)
        return out[0], out[1]
    if ok is None:
        o, lse, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True)
        return o, lse[..., : q.shape[-2]].float()
    return reference(q, k, v, ok)


def merge(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """The attention over the union of two disjoint key sets from each one's output [..., L, hd] and log-sum-exp
    [..., L] (o1's dtype): each output weighted by its share of the total softmax mass."""
    m = torch.maximum(lse1, lse2)
    w1, w2 = (lse1 - m).exp(), (lse2 - m).exp()  # [..., L]
    o = o1.float() * (w1 / (w1 + w2))[..., None] + o2.float() * (w2 / (w1 + w2))[..., None]
    return o.to(o1.dtype)
