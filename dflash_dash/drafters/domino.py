"""Domino, a drafter family: DFlash's backbone plus a prefix GRU whose state corrects each draft's logits.

Contract: `Domino(c, w)` is a `DFlash` (same backbone, same forwards, same block inputs) whose `read_out` walks
each block left to right as SpecForge's greedy `spec_generate` does (docs/families.md section 4.4):
  - draft k (k = 1..D, D = B-1, the token for anchor + k) reads block slot k-1 when `shift_label` (slots
    0..B-2: `c.first_slot` 0), else slot k (as DFlash);
  - a one-layer GRU without biases (PyTorch's gate order: reset, update, new) runs over the target's raw input
    embeddings of the block's known tokens [anchor, d_1, .., d_{k-1}], state 0 at the anchor; q_{k-1} is its
    state after d_{k-1};
  - drafts k <= P (`pure_draft_prefix_len`) take the base logits LM(h_s); later drafts add the correction
    embed_proj.2(SiLU(embed_proj.0([h_s ; q_{k-1}]))) [V]; the draft is the full-vocabulary argmax (SGLang's
    2048-id candidate pool is an engine difference the replay does not follow).
The previous tokens are the drafter's own drafts (`sequential`), so every slot is what the drafter proposes; up to
the first rejection this equals a walk fed the target's tokens. Top-k and log-probabilities come from the logits
the walk used at that slot. Batched over N blocks: one Python step per drafted slot, none per anchor.
`load(ck, c, ...)` reads a located Domino checkpoint (`dflash.load` with this class); `flops_per_block` adds the
GRU and correction matmuls to DFlash's count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import dflash
from .checkpoint import Checkpoint
from .config import DrafterConfig
from .readout import lm_top, slot_tap
from .weights import shapes

__all__ = ["Domino", "load", "shapes", "flops_per_block"]

GRU_IH, GRU_HH = "prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0"  # [3G, H], [3G, G]
PROJ_IN, PROJ_OUT = "embed_proj.0.weight", "embed_proj.2.weight"  # [E, H + G], [V, E]


@dataclass(frozen=True)
class _LMHead:
    """The target's LM head cast once per read-out to the drafter's device and dtype (what `lm_top` reads)."""

    lm_head: torch.Tensor  # [V, H]


class Domino(dflash.DFlash):
    """A DFlash backbone with Domino's prefix-GRU logit correction, read out by a sequential walk."""

    sequential = True  # draft k's correction reads the GRU state after the drafts before it

    def gru_step(self, x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """One GRU step without biases: input x [N, H], state q [N, G] -> the next state [N, G]."""
        gi = F.linear(x, self.w.extra[GRU_IH])  # [N, 3G]: reset, update, new
        gh = F.linear(q, self.w.extra[GRU_HH])
        ir, iz, i_n = gi.chunk(3, -1)
        hr, hz, h_n = gh.chunk(3, -1)
        r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
        n = torch.tanh(i_n + r * h_n)
        return (1 - z) * n + z * q

    def _embed(self, head, ids: torch.Tensor) -> torch.Tensor:
        """Raw target input embeddings [N, H] of token ids [N], in the drafter's device and dtype."""
        return head.embed[ids.to(head.embed.device)].to(self.device, self.dtype)

    def read_out(self, head, h: torch.Tensor, anchor_ids: torch.Tensor, topk: int, slots=None, tap=None):
        """Drafts j = 0..D-1 (draft k = j + 1) from block slots first_slot + j, each step's GRU state fed the
        drafts before it; `slots` (lo, hi) slices the whole walk's result (every draft depends on the earlier
        ones, so the walk always runs from the anchor); `tap` as DFlash's."""
        c, N = self.c, h.shape[0]
        D, f, P = c.drafts, c.first_slot, c.head["pure_draft_prefix_len"]
        G = c.head["gru_hidden_dim"]
        lm = _LMHead(head.lm_head.to(h.device, h.dtype))  # cast once, not per slot
        hs = h[:, f : f + D]  # [N, D, H]: the states that draft anchor + 1 .. anchor + D
        W1, W2 = self.w.extra[PROJ_IN], self.w.extra[PROJ_OUT]  # [E, H + G], [V, E]
        q = h.new_zeros(N, G)  # GRU state before the anchor
        prev = anchor_ids
        drafts, ids, logp = [], [], []
        for j in range(D):
            q = self.gru_step(self._embed(head, prev), q)  # q_{k-1}: has read the anchor and d_1..d_{k-1}
            extra = None
            if j + 1 > P:
                a = F.linear(torch.cat([hs[:, j], q], -1), W1)  # [N, E]: one matmul over [h_s ; q], as trained
                extra = _correction(a, W2)
            d, i, lp = lm_top(lm, hs[:, j], topk, extra, slot_tap(tap, j))  # [N], [N, k], [N, k]
            drafts.append(d)
            ids.append(i)
            logp.append(lp)
            prev = d
        lo, hi = slots or (0, D)
        out = torch.stack(drafts, 1), torch.stack(ids, 1), torch.stack(logp, 1)  # [N, D], [N, D, k] x 2
        return tuple(t[:, lo:hi] for t in out)


def _correction(a: torch.Tensor, W2: torch.Tensor) -> Callable[[int, int], torch.Tensor]:
    """The additive logits of rows r0..r1 from embed_proj.0's output a [N, E]: W2 SiLU(a) -> [r1-r0, V], made
    a chunk of rows at a time (as `lm_top` asks) so that no [N, V] buffer beyond the logits' own exists."""
    return lambda r0, r1: F.linear(F.silu(a[r0:r1]), W2)


# ---------------------------------------------------------------------------
# loading


def load(
    ck: Checkpoint,
    c: DrafterConfig,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    sliding_block: str | None = None,
    place: Callable[[dict], dict] | None = None,
) -> Domino:
    """A Domino from a located checkpoint with validated config `c` (every tensor checked, legacy
    `logit_head.*` names read under their current ones: `weights.checked`)."""
    return dflash.load(ck, c, dtype, device, sliding_block, place, cls=Domino)


def flops_per_block(c: DrafterConfig, ctx_len: int, vocab: int) -> float:
    """DFlash's matmul FLOPs of one block plus Domino's: a GRU step per draft, and the correction
    (embed_proj.0 then the [V, E] embed_proj.2) on every draft after the first P."""
    H, D, f = c.hidden_size, c.drafts, c.head
    E, G, P = f["emb_dim"], f["gru_hidden_dim"], f["pure_draft_prefix_len"]
    gru = D * 2 * (3 * G * H + 3 * G * G)
    corr = max(0, D - P) * 2 * (E * (H + G) + vocab * E)
    return dflash.flops_per_block(c, ctx_len, vocab) + gru + corr
