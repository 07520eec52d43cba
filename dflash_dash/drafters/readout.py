"""Reading drafted states out through the target's LM head: the top-k of each row's logits in one pass.

Contract: tensors in, tensors out. `top_logp(logits, k)` gives argmax, top-k ids and log-probabilities of each row
(one Triton pass over the logits on CUDA, torch elsewhere: the same values); `lm_top(head, x, k)` runs rows of
normed states through the LM head HEAD_ROWS at a time (the logits stay in the model dtype: no fp32 copy of
[rows, V]), optionally adding a family's logit correction to each chunk. Every family's `read_out` uses these.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

HEAD_ROWS = 2048  # rows of the LM head computed at once: bounds the [rows, V] logits buffer


TOP_BLOCK, TOP_WARPS = 4096, 8  # logits per tile of the CUDA top-k kernel, and its warps per row


def _top_triton():
    """A Triton kernel reading each row of logits [R, V] once: top-k (descending; among equal values the
    lower id first, so slot 0 is torch.argmax) and log-sum-exp in fp32. Built on first use."""
    import triton
    import triton.language as tl

    @triton.jit
    def top_rows(
        x_ptr,
        stride,
        val_ptr,
        idx_ptr,
        lse_ptr,
        V: tl.constexpr,
        K: tl.constexpr,
        KP: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        lanes = tl.arange(0, BLOCK)
        slots = tl.arange(0, KP)
        m = tl.full([BLOCK], -1e30, tl.float32)  # running max per lane (finite: no inf - inf)
        s = tl.zeros([BLOCK], tl.float32)  # running sum of exp(x - m) per lane
        bv = tl.where(slots < K, float("-inf"), float("inf"))  # best K values so far (pad slots: never out)
        bi = tl.zeros([KP], tl.int32)  # their ids
        for off in range(0, V, BLOCK):
            x = tl.load(x_ptr + row * stride + off + lanes, mask=off + lanes < V, other=float("-inf"))
            x = x.to(tl.float32)
            e = tl.exp(-tl.abs(x - m))  # one exp per element (x = -inf: 0)
            s = tl.where(x > m, s * e + 1.0, s + e)  # the lane's sum, rescaled to its new max
            m = tl.maximum(m, x)
            while tl.max(x, 0) > tl.min(bv, 0):  # the tile's best beats the K-th best
                i = tl.argmax(x, 0, tie_break_left=True)
                out = tl.argmax(tl.where(bv == tl.min(bv, 0), bi, -1), 0)  # K-th best (of equals, last id)
                bv = tl.where(slots == out, tl.max(x, 0), bv)
                bi = tl.where(slots == out, off + i, bi)
                x = tl.where(lanes == i, float("-inf"), x)
        mx = tl.max(m, 0)
        tl.store(lse_ptr + row, mx + tl.log(tl.sum(s * tl.exp(m - mx), 0)))
        live = slots < K
        for j in tl.static_range(K):  # sorted: value down, then id up
            v = tl.max(tl.where(live, bv, float("-inf")), 0)
            i = tl.min(tl.where(live & (bv == v), bi, 2147483647), 0)
            tl.store(val_ptr + row * K + j, v)
            tl.store(idx_ptr + row * K + j, i.to(tl.int64))
            live = live & ((bv != v) | (bi != i))

    def top(x: torch.Tensor, k: int):
        R, V = x.shape
        vals = torch.empty(R, k, dtype=torch.float32, device=x.device)
        ids = torch.empty(R, k, dtype=torch.long, device=x.device)
        lse = torch.empty(R, dtype=torch.float32, device=x.device)
        top_rows[(R,)](
            x,
            x.stride(0),
            vals,
            ids,
            lse,
            V=V,
            K=k,
            KP=max(2, triton.next_power_of_2(k)),
            BLOCK=TOP_BLOCK,
            num_warps=TOP_WARPS,
        )
        return vals, ids, lse

    return top


_TOP: list = []  # [the built Triton kernel, or None where Triton cannot run]


def top_logp(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits [R, V] -> argmax [R], top-k ids [R, k] and their log-probabilities [R, k] (fp32).

    On CUDA one Triton pass over the logits; elsewhere torch (argmax, topk, logsumexp of an fp32 copy).
    Same values either way; only the order of exactly equal logits inside the top-k may differ.
    """
    if logits.is_cuda and logits.stride(1) == 1:
        if not _TOP:
            try:
                _TOP.append(_top_triton())
            except Exception:  # noqa: BLE001  (no Triton here: the torch path below is exact too)
                _TOP.append(None)
        if _TOP[0] is not None:
            try:
                vals, ids, lse = _TOP[0](logits, max(k, 1))
                return ids[:, 0], ids[:, :k], vals[:, :k] - lse[:, None]
            except Exception as e:  # noqa: BLE001  (a Triton that cannot compile it: torch below is exact)
                warnings.warn(
                    f"Triton top-k kernel unavailable ({type(e).__name__}: {e}); using torch.topk", stacklevel=2
                )
                _TOP[0] = None
    top = logits.topk(k, dim=-1)
    return logits.argmax(-1), top.indices, top.values.float() - torch.logsumexp(logits.float(), -1)[:, None]


def lm_top(
    head,
    x: torch.Tensor,
    topk: int,
    extra: Callable[[int, int], torch.Tensor] | None = None,
    tap: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows x [R, H] through the LM head (+ `extra(r0, r1)` [r1-r0, V], a family's additive correction of those
    rows) -> argmax [R], top-k ids [R, k] and log-probs [R, k]; HEAD_ROWS rows at a time, log p = logit -
    logsumexp(logits) in fp32. `tap(rows [r], logits [r, V])`: each chunk's full logits, as they are made (a
    replay's expected-acceptance pass reads the drafter's whole distribution there, on the device)."""
    w = head.lm_head.to(x.device, x.dtype)
    parts = []
    for r in range(0, x.shape[0], HEAD_ROWS):
        logits = x[r : r + HEAD_ROWS] @ w.T
        if extra is not None:
            logits = logits + extra(r, min(r + HEAD_ROWS, x.shape[0])).to(logits.dtype)
        if tap is not None:
            tap(torch.arange(r, r + logits.shape[0], device=x.device), logits)
        parts.append(top_logp(logits, topk))
    if not parts:
        e = x.new_zeros(0, dtype=torch.long)
        return e, e.view(0, topk), x.new_zeros(0, topk, dtype=torch.float32)
    return tuple(torch.cat([p[i] for p in parts]) for i in range(3))


def slot_tap(tap, j: int | None = None, per: int = 1, lo: int = 0):
    """`lm_top`'s tap for a family's read-out tap `tap(n, j, scores)` (blocks n, drafts j): rows of one draft j
    (row = block), or with `j` None rows flattened block-major over `per` drafts from draft `lo` on."""
    if tap is None:
        return None
    if j is not None:
        return lambda rows, logits: tap(rows, torch.full_like(rows, j), logits)
    return lambda rows, logits: tap(rows // per, lo + rows % per, logits)
