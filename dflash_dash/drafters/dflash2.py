"""DFlash2: the DFlash backbone with a block-local convolution around every sublayer, and a candidate selector
that walks each block left to right over the LM head's top-K (docs/families.md section 5).

Contract: `DFlash2(c, w)` is a `DFlash` (same weights, forwards and K/V layouts) whose two mixing hooks wrap each
layer's attention and MLP in SpecForge's grouped dynamic causal convolution, and whose two ends differ:
  - `embed_block`: DFlash's block inputs times `input_embedding_scale` (vLLM and z-lab read it; SpecForge does
    not: 1.0 in its configs, so the same numbers there);
  - `read_out` (`sequential`): unary logits u_k = LM(h_k) * output_multiplier (soft-capped when
    `final_logit_softcapping` is set; fp32), candidates C_k = top-`selector_top_k` of u_k, then the greedy walk
    from the anchor token: score_k[j] = U_k[j] + sum_r P[prev, r] sigma_k[r] S[C_k[j], r], sigma_k =
    hidden_projection(h_k), draft d_k = C_k[argmax score_k], prev = d_k. Top-k ids are the candidates by
    score (ids[..., 0] is the draft), log-probabilities the log-softmax over the K scores; a k beyond K is
    padded with id -1 and log-probability -inf.
The convolution runs over the B slots of each block (dim -2 of the hooks' [..., B, H]), so every forward keeps a
block whole and never mixes blocks or the context. Two ways to the same numbers, chosen by `fast` (default on): the
fast path convolves through `kernels.conv` (every tap in one expression: one fused kernel on CUDA) and takes each
slot's K candidates from the model-dtype logits in one top-k pass (`readout.top_logp`: the Triton kernel on CUDA),
transforming only those K (the transform is increasing, so the candidates and their order are the same); with
`fast` off, the plain reference: tap by tap, and the whole fp32 [rows, V] transformed before its top-K. `stack`:
blocks a replay stacks per forward for each block of its `chunk` (16 // B: a block of 8 gives forwards of as many
rows as DFlash's 16). `load(ck, c, ...)` reads a checked checkpoint into a DFlash2;
`flops_per_block` adds the family's matmuls to DFlash's count.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import dflash
from .checkpoint import Checkpoint
from .config import DrafterConfig
from .dflash import ATTN, MLP, DFlash
from .readout import HEAD_ROWS, top_logp
from .weights import shapes

__all__ = ["DFlash2", "load", "shapes", "flops_per_block"]

UNARY_VALUES = 1 << 27  # fp32 unary logits computed at once (rows x V): bounds the reference read-out's buffer
STACK_ROWS = 16  # a replay's forwards hold `chunk` x this many block slots: blocks of B < 16 are stacked 16 // B
# per chunk block (DFlash2's block of 8 alone left a third of an H100 idle, benchmarks/RESULTS.md)


class DFlash2(DFlash):
    """A DFlash2 checkpoint: DFlash's forwards with the convolution hooks, the scaled block inputs and the selector
    walk."""

    sequential = True  # a slot's draft depends on the draft before it (the selector's predecessor)

    def __init__(self, c: DrafterConfig, w, path: str = "", sliding_block: str | None = None):
        super().__init__(c, w, path, sliding_block)
        f = c.head
        self.taps, self.group = f["conv_kernel_size"], f["conv_group_size"]
        self.top_k = f["selector_top_k"]
        self.multiplier, self.softcap = f["output_multiplier"], f["final_logit_softcapping"]
        self.scale = f["input_embedding_scale"]
        self.fast = True  # the fused convolution and one-pass candidates; False: the plain reference (tests)
        self.stack = max(1, STACK_ROWS // c.block_size)  # blocks per forward for each block of a replay's chunk
        x = w.extra
        # per (layer, sublayer): base kernel [2, T, Gn, gs] (side 0 input, 1 output) and the delta projection
        self.conv = {
            (i, part): (
                x[f"layers.{i}.{part}.base_kernel"].unflatten(-1, (-1, self.group)),
                x[f"layers.{i}.{part}.kernel_projection.weight"],
            )
            for i in range(c.num_hidden_layers)
            for part in (ATTN, MLP)
        }
        self.pred = x["candidate_selector.predecessor_codebook"]  # P [V, R]
        self.succ = x["candidate_selector.successor_codebook"]  # S [V, R]
        self.hproj = x["candidate_selector.hidden_projection.weight"]  # [R, H]

    # -- the convolution hooks ------------------------------------------------

    def _mix_in(self, i: int, part: str, x: torch.Tensor):
        """x [..., B, H] (the sublayer's normed input) -> (its convolution with the input-side kernel, the
        output side's per-slot kernel deltas [..., B, T, Gn]); both sides' deltas come from x."""
        base, proj = self.conv[(i, part)]
        delta = F.linear(x, proj).unflatten(-1, (2, self.taps, -1))  # [..., B, 2, T, Gn]
        return self._convolve(x, delta[..., 0, :, :], base[0]), delta[..., 1, :, :]

    def _mix_out(self, i: int, part: str, y: torch.Tensor, mix) -> torch.Tensor:
        """The sublayer output y [..., B, H] convolved with the output-side kernel (deltas `mix` from `_mix_in`)."""
        return self._convolve(y, mix, self.conv[(i, part)][0][1])

    def _convolve(self, x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        """out[i, c] = sum_t (base[t, c] + delta[i, t, c // gs]) * x[i - t, c], x[i - t] = 0 before the block's
        first slot. x [..., B, H], delta [..., B, T, Gn], base [T, Gn, gs] -> [..., B, H]: `kernels.conv` (fused on
        CUDA) when `fast`, else the reference below."""
        if self.fast:
            return self.ops.conv(x, delta, base.flatten(-2))
        return self._convolve_taps(x, delta, base)

    def _convolve_taps(self, x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        """The reference convolution: tap by tap, each shifted copy and coefficient tensor made in full."""
        B = x.shape[-2]
        xg = x.unflatten(-1, (-1, self.group))  # [..., B, Gn, gs]
        out = None
        for t in range(min(self.taps, B)):
            shifted = F.pad(xg[..., : B - t, :, :], (0, 0, 0, 0, t, 0))  # slot i holds x[i - t]
            term = (base[t] + delta[..., t, :, None]) * shifted
            out = term if out is None else out + term
        return out.flatten(-2)

    # -- the block's two ends --------------------------------------------------

    def embed_block(self, head, anchor_ids: torch.Tensor) -> torch.Tensor:
        """DFlash's [anchor, MASK x (B-1)] embeddings times input_embedding_scale -> [N, B, H]."""
        emb = super().embed_block(head, anchor_ids)
        return emb if self.scale == 1.0 else emb * self.scale

    def read_out(self, head, h: torch.Tensor, anchor_ids: torch.Tensor, topk: int, slots=None, tap=None):
        """The selector's walk over every block's drafted slots 1..B-1 (whole blocks only: `sequential`); `tap(n,
        j, scores, cand)` hears each slot's selector scores over its K candidates (what it samples from)."""
        D = self.c.drafts
        if slots is not None and tuple(slots) != (0, D):
            raise ValueError(f"DFlash2 reads whole blocks out (its walk is sequential), not drafts {slots}")
        hs = h[:, self.c.first_slot : self.c.first_slot + D]  # [N, D, H]
        U, C = self._unary_top(head, hs)  # [N, D, K] fp32, [N, D, K]
        # the transitions in fp32 (SpecForge: the model dtype): the lattice score adds no bf16 rounding of its own
        sigma = F.linear(hs.float(), self.hproj.float())  # [N, D, R]
        succ = self.succ[C].float()  # [N, D, K, R]
        prev = anchor_ids.to(h.device)  # [N]
        drafts, scores = [], []
        for k in range(D):  # the walk: slot k's predecessor is slot k-1's draft
            ctx = self.pred[prev].float() * sigma[:, k]  # [N, R]
            s = U[:, k] + (succ[:, k] @ ctx[:, :, None])[..., 0]  # [N, K]
            if tap is not None:
                n = torch.arange(s.shape[0], device=s.device)
                tap(n, torch.full_like(n, k), s, C[:, k])
            prev = C[:, k].gather(1, s.argmax(-1, keepdim=True))[:, 0]
            drafts.append(prev)
            scores.append(s)
        return (torch.stack(drafts, 1), *self._ranked(torch.stack(scores, 1), C, topk))

    def _unary_top(self, head, hs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """States [N, D, H] -> the top-K transformed unary logits [N, D, K] (fp32) and their ids [N, D, K]; rows
        through the LM head a bounded number at a time (`_unary_top_fast` when `fast`)."""
        if self.fast:
            return self._unary_top_fast(head, hs)
        N, D, H = hs.shape
        x = hs.reshape(N * D, H)
        w = head.lm_head.to(x.device, x.dtype)
        rows = max(1, min(HEAD_ROWS, UNARY_VALUES // w.shape[0]))
        vals, ids = [], []
        for r in range(0, x.shape[0], rows):
            u = (x[r : r + rows] @ w.T).float() * self.multiplier
            if self.softcap:
                u = torch.tanh(u / self.softcap) * self.softcap
            top = u.topk(self.top_k, dim=-1)
            vals.append(top.values)
            ids.append(top.indices)
        if not vals:
            return x.new_zeros(N, D, self.top_k, dtype=torch.float32), x.new_zeros(N, D, self.top_k, dtype=torch.long)
        return torch.cat(vals).view(N, D, -1), torch.cat(ids).view(N, D, -1)

    def _unary_top_fast(self, head, hs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`_unary_top` from the model-dtype logits, HEAD_ROWS rows at a time: their top-K ids in one pass (the
        Triton kernel on CUDA: descending, equal logits by lower id), the K raw values gathered and only they
        transformed. The transform (x output_multiplier > 0, then the soft cap's increasing tanh) keeps the
        order, so these are the reference's K candidates and values without its fp32 [rows, V] copies."""
        N, D, H = hs.shape
        x = hs.reshape(N * D, H)
        w = head.lm_head.to(x.device, x.dtype)
        vals, ids = [], []
        for r in range(0, x.shape[0], HEAD_ROWS):
            logits = x[r : r + HEAD_ROWS] @ w.T
            top = top_logp(logits, self.top_k)[1] if logits.is_cuda else logits.topk(self.top_k, dim=-1).indices
            u = logits.gather(-1, top).float() * self.multiplier
            if self.softcap:
                u = torch.tanh(u / self.softcap) * self.softcap
            vals.append(u)
            ids.append(top)
        if not vals:
            return x.new_zeros(N, D, self.top_k, dtype=torch.float32), x.new_zeros(N, D, self.top_k, dtype=torch.long)
        return torch.cat(vals).view(N, D, -1), torch.cat(ids).view(N, D, -1)

    def _ranked(self, scores: torch.Tensor, C: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores [N, D, K] of candidates C -> the `topk` best ids [N, D, topk] (equal scores: the lower
        candidate index first, as argmax picks) and their log-softmax over the K scores, padded past K."""
        order = scores.sort(dim=-1, descending=True, stable=True)
        k = min(topk, self.top_k)
        ids = C.gather(-1, order.indices[..., :k])
        logp = (order.values - torch.logsumexp(scores, -1, keepdim=True))[..., :k]
        if topk > k:
            ids = F.pad(ids, (0, topk - k), value=-1)
            logp = F.pad(logp, (0, topk - k), value=float("-inf"))
        return ids, logp


# ---------------------------------------------------------------------------
# loading


def load(
    ck: Checkpoint,
    c: DrafterConfig,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    sliding_block: str | None = None,
    place: Callable[[dict], dict] | None = None,
) -> DFlash2:
    """A DFlash2 from a located checkpoint with validated config `c` (DFlash's checked read, this class)."""
    return dflash.load(ck, c, dtype, device, sliding_block, place, cls=DFlash2)


def flops_per_block(c: DrafterConfig, ctx_len: int, vocab: int) -> float:
    """DFlash's matmul FLOPs plus the kernel projections of both sublayers of every layer and the selector
    (hidden projection of B-1 slots, K transitions of rank R each)."""
    f, H, B = c.head, c.hidden_size, c.block_size
    T, Gn, R, K = f["conv_kernel_size"], H // f["conv_group_size"], f["selector_rank"], f["selector_top_k"]
    conv = c.num_hidden_layers * 2 * (2 * B * H * 2 * T * Gn)  # 2 sublayers, [B, H] x [H, 2*T*Gn]
    selector = 2 * (B - 1) * (H * R + K * R)
    return dflash.flops_per_block(c, ctx_len, vocab) + conv + selector
