"""Attention with its log-sum-exp, and the merge of two attentions over disjoint keys.

Contract: `attend(q, k, v, ok)` is softmax(q k^T / sqrt(hd) + mask) v over keys [..., Lk, hd] for queries
[..., Lq, hd], with `ok` a boolean visibility mask broadcast to [..., Lq, Lk] (None: every key visible), and
returns the output (q's dtype) and the log-sum-exp of each query's scores (fp32, [..., Lq]). `merge` combines two
such results over disjoint key sets into the attention over their union: exact up to rounding, so a long context
can be attended in parts. Kernels: on CUDA an unmasked bf16/fp16 call is the flash kernel, any other call the
memory-efficient one (a mask as an aligned additive bias), on the CPU torch's CPU flash kernel; a call whose
kernels failed in this process (each warned once) is `reference` in query chunks that bound its fp32 scores.
`reference` is the plain fp32 computation they all equal. `prefix(q, k, v)` is `attend` without a mask over a long
key range; with `PREFIX = "cudnn"` (CUDA, bf16/fp16) its keys go through cuDNN's attention in `tiled` runs of TILE
keys (one execution plan for every full tile: cuDNN builds a plan per new shape, about 50 ms) and the rest through
`attend`, merged.
"""

from __future__ import annotations

import math
import warnings

import torch

__all__ = ["attend", "merge", "prefix", "reference", "tiled"]

SCORE_BYTES = 1 << 30  # the fp32 scores one chunk of `chunked` holds at most (its queries split to fit)
_FAILED: set[str] = set()  # kernels that raised in this process: not tried again
PREFIX = "cudnn"  # the unmasked long-prefix kernel on CUDA: "cudnn" (tiles) or "flash" (torch's flash kernel). cuDNN
# measured 1.50x flash at one chunk's shape of a 32K replay on an H100 (547 against 365 TFLOP/s; outputs within 4.9e-4,
# log-sum-exp within 2.9e-6: bf16's size); benchmarks/RESULTS.md
TILE = 8192  # keys per cuDNN call of `prefix`


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ok: torch.Tensor | None):
    """Plain fp32 attention and log-sum-exp (the one every kernel path equals)."""
    s = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])  # [..., Lq, Lk]
    if ok is not None:
        s = s.masked_fill(~ok, float("-inf"))
    lse = s.logsumexp(-1)  # [..., Lq]
    return ((s - lse[..., None]).exp() @ v.float()).to(q.dtype), lse


def chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ok: torch.Tensor | None):
    """`reference` over chunks of the queries, each holding at most SCORE_BYTES of fp32 scores."""
    per_row = 4 * k.shape[-2] * max(q[..., 0, 0].numel(), 1)  # bytes of one query row's scores, all batch dims
    rows = max(1, SCORE_BYTES // per_row)
    Lq = q.shape[-2]
    if rows >= Lq:
        return reference(q, k, v, ok)
    outs, lses = [], []
    for a in range(0, Lq, rows):
        m = ok if ok is None or ok.shape[-2] == 1 else ok[..., a : a + rows, :]
        o, lse = reference(q[..., a : a + rows, :], k, v, m)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, -2), torch.cat(lses, -1)


def _cpu(q, k, v, ok):
    mask = None if ok is None else torch.zeros(ok.shape, dtype=q.dtype).masked_fill_(~ok, float("-inf"))
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask)
    return o, lse.float()


def _flash(q, k, v, ok):
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)
    return out[0], out[1].float()


def _efficient(q, k, v, ok):
    bias = None
    if ok is not None:  # additive, in q's dtype, rows padded to a multiple of 16 keys (the kernel's alignment)
        Lk = k.shape[-2]
        rows = torch.zeros((*ok.shape[:-1], -(-Lk // 16) * 16), dtype=q.dtype, device=q.device)
        bias = rows[..., :Lk].masked_fill_(~ok, float("-inf")).expand(*q.shape[:-1], Lk)
    o, lse, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True)
    return o, lse[..., : q.shape[-2]].float()


def _cudnn(q, k, v, ok):
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False, False)
    return out[0], out[1].reshape(q.shape[:-1]).float()


KERNELS = {"cpu": _cpu, "flash": _flash, "efficient": _efficient, "efficient_masked": _efficient, "cudnn": _cudnn}


def _kernels(q: torch.Tensor, ok) -> list[str]:
    """The kernels to try for this call, best first (`chunked` after them all)."""
    if q.device.type == "cpu":
        return ["cpu"]
    if ok is not None:
        return ["efficient_masked"]  # its failure (the bias's alignment) leaves the unmasked calls theirs
    return ["flash", "efficient"] if q.dtype in (torch.float16, torch.bfloat16) else ["efficient"]


def _try(name: str, q, k, v, ok):
    """KERNELS[name]'s result, or None where it raised (then warned once and not tried again) or had raised."""
    if name in _FAILED:
        return None
    try:
        return KERNELS[name](q, k, v, ok)
    except (RuntimeError, TypeError, NotImplementedError) as e:
        _FAILED.add(name)
        warnings.warn(
            f"attention kernel {name} unavailable ({type(e).__name__}: {str(e)[:200]}); "
            "the long-context replay falls back to another kernel, or to plain fp32 attention in query chunks "
            "(same result, slower)",
            stacklevel=3,
        )
        return None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ok: torch.Tensor | None = None):
    """(output [..., Lq, hd] in q's dtype, log-sum-exp [..., Lq] fp32) of q [B, h, Lq, hd] over k, v
    [B, h, Lk, hd]; ok: bool, broadcastable to [B, h, Lq, Lk], or None. Every query must see a key."""
    for name in _kernels(q, ok):
        if (got := _try(name, q, k, v, ok)) is not None:
            return got
    return chunked(q, k, v, ok)


def tiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: int, kernel) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked `attend` of q over k, v with the keys in runs of `tile`: each full run through `kernel(q, k, v)`
    (-> (output, log-sum-exp) as `attend`), the rest through `attend`, merged in fp32 (output in q's dtype)."""
    Lk, full = k.shape[-2], k.shape[-2] - k.shape[-2] % tile
    o = lse = None
    for a in range(0, Lk, tile):
        part = (kernel if a < full else attend)(q, k[..., a : a + tile, :], v[..., a : a + tile, :])
        if o is None:
            o, lse = part[0].float(), part[1]
        else:
            o, lse = merge(o, lse, part[0], part[1]), torch.logaddexp(lse, part[1])
    return o.to(q.dtype), lse


def prefix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`attend(q, k, v)` over a long unmasked key range, through the kernel PREFIX names (see the module)."""
    cudnn = PREFIX == "cudnn" and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and "cudnn" not in _FAILED
    if not cudnn or k.shape[-2] < TILE:
        return attend(q, k, v)

    def run(q, k, v):  # a tile through cuDNN, through `attend` once cuDNN has failed (warned once)
        got = _try("cudnn", q, k, v, None)
        return got if got is not None else attend(q, k, v)

    return tiled(q, k, v, TILE, run)


def merge(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """The attention over the union of two disjoint key sets from each one's output [..., L, hd] and log-sum-exp
    [..., L] (o1's dtype): each output weighted by its share of the total softmax mass."""
    m = torch.maximum(lse1, lse2)
    w1, w2 = (lse1 - m).exp(), (lse2 - m).exp()  # [..., L]
    o = o1.float() * (w1 / (w1 + w2))[..., None] + o2.float() * (w2 / (w1 + w2))[..., None]
    return o.to(o1.dtype)
