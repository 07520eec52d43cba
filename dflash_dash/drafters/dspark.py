"""DSpark: DFlash's backbone with SpecForge's DSpark heads, a Markov logit bias and a confidence head.

Contract: `DSpark(c, w)` is a `DFlash` (same block forwards, same `embed_block`) whose `read_out` adds the
checkpoint's Markov bias to the target LM head's logits, walking each block left to right with its own drafts as
the previous tokens, as SpecForge's `sample_block_tokens` and SGLang's DSpark sampler do (docs/families.md 3.4):
  - alignment: drafts j = 0..D-1 come from block slots first_slot + j (`sample_from_anchor` true, the default:
    slots 0..B-1, D = B; false: slots 1..B-1, D = B-1, SpecForge's `spec_generate`); the walk's first previous
    token is the anchor in both;
  - Markov head of rank r (`markov_head_type`): e = W1[prev] [r]; vanilla bias W2 e; gated W2 (sigmoid(Wg [h ; e]
    + bg) * e); rnn: (a, c, o) = Wj [u ; e ; h] + bj, u <- sigmoid(a) u + (1 - sigmoid(a)) tanh(c) (u = 0 at each
    block start), bias W2 tanh(o); r = 0: no bias (plain LM-head drafts, DSpark's alignment all the same);
  - `confidence(head, h, anchor_ids, drafts)`: sigmoid(wc . f + bc) per drafted slot, f = h or [h ; W1[prev]]
    (`confidence_with_markov`) with the walk's previous tokens [anchor, drafts[:-1]]; None without the head.
Top-k and log-probabilities are those of the corrected logits the walk used at each slot. A DSpark with a Markov
head is `sequential` (a slot's draft depends on the drafts before it): its `read_out` takes whole blocks. Batched
over the N blocks; one step per drafted slot. `load` reads a checkpoint into a DSpark (`dflash.load`), and
`flops_per_block` counts DFlash's matmuls plus the heads'.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import dflash
from .checkpoint import Checkpoint
from .config import DrafterConfig
from .dflash import DFlash
from .readout import lm_top, slot_tap
from .weights import Weights, shapes

__all__ = ["DSpark", "load", "shapes", "flops_per_block"]

MARKOV = "markov_head."
CONFIDENCE = "confidence_head.proj."


class DSpark(DFlash):
    """A DSpark checkpoint: DFlash's backbone, the Markov head (rank r, may be 0) and the optional confidence
    head."""

    sequential = True  # a slot's Markov bias reads the draft before it (an instance without the head: False)

    def __init__(self, c: DrafterConfig, w: Weights, path: str = "", sliding_block: str | None = None):
        super().__init__(c, w, path, sliding_block)
        x, f = w.extra, c.head
        self.rank, self.kind = f["markov_rank"], f["markov_head_type"]
        self.sequential = self.rank > 0  # rank 0: plain LM-head drafts, any slots may be read out alone
        self.w1 = x.get(MARKOV + "markov_w1.weight")  # [V, r] previous-token embedding
        self.w2 = x.get(MARKOV + "markov_w2.weight")  # [V, r] r -> V, no bias
        self.gate = (x.get(MARKOV + "gate_proj.weight"), x.get(MARKOV + "gate_proj.bias"))  # [r, H+r], [r]
        self.joint = (x.get(MARKOV + "joint_proj.weight"), x.get(MARKOV + "joint_proj.bias"))  # [3r, 2r+H], [3r]
        self.conf = (x.get(CONFIDENCE + "weight"), x.get(CONFIDENCE + "bias")) if f["confidence"] else None

    # -- read-out ---------------------------------------------------------------

    def _drafted(self, h: torch.Tensor) -> torch.Tensor:
        """The drafting slots' states [N, D, H] of normed block states [N, B, H]."""
        f = self.c.first_slot
        return h[:, f : f + self.c.drafts]

    def read_out(self, head, h: torch.Tensor, anchor_ids: torch.Tensor, topk: int, slots=None, tap=None):
        """Drafts [N, D], top-k ids [N, D, k] and log-probs [N, D, k] of blocks [N, B, H] with anchor tokens [N]:
        the Markov walk seeded with the anchor (slots: only without a Markov head); `tap` as DFlash's."""
        if not self.rank:
            return super().read_out(head, h, anchor_ids, topk, slots, tap)
        D = self.c.drafts
        if slots not in (None, (0, D)):
            raise ValueError(f"DSpark with a Markov head drafts whole blocks (slots {slots} of {D} asked)")
        x = self._drafted(h)  # [N, D, H]
        prev = anchor_ids.to(x.device, torch.long)  # [N]
        state = x.new_zeros(x.shape[0], self.rank)  # [N, r] the rnn head's state, zero at the block start
        out = []
        for j in range(D):
            z, state = self._latent(x[:, j], prev, state)  # [N, r]
            drafts, ids, logp = lm_top(head, x[:, j], topk, self._bias(z), slot_tap(tap, j))
            out.append((drafts, ids, logp))
            prev = drafts
        return tuple(torch.stack([o[i] for o in out], 1) for i in range(3))

    def _latent(self, hs: torch.Tensor, prev: torch.Tensor, state: torch.Tensor):
        """One walk step: the Markov latent z [N, r] whose W2 projection is the slot's bias, and the next rnn
        state, from the slot's states hs [N, H], the previous tokens [N] and the state [N, r]."""
        e = self.w1[prev]  # [N, r]
        if self.kind == "gated":
            return torch.sigmoid(F.linear(torch.cat([hs, e], -1), *self.gate)) * e, state
        if self.kind == "rnn":
            a, c, o = F.linear(torch.cat([state, e, hs], -1), *self.joint).chunk(3, -1)  # [N, r] each
            g = torch.sigmoid(a)
            return torch.tanh(o), g * state + (1 - g) * torch.tanh(c)
        return e, state

    def _bias(self, z: torch.Tensor) -> Callable[[int, int], torch.Tensor]:
        """`lm_top`'s logit correction: rows r0..r1 of W2 z -> [r1-r0, V] (computed a chunk at a time)."""
        return lambda r0, r1: z[r0:r1] @ self.w2.T

    def confidence(self, head, h: torch.Tensor, anchor_ids: torch.Tensor, drafts: torch.Tensor):
        """Predicted acceptance [N, D] (fp32) of each draft from the confidence head, reading the previous tokens
        the walk used ([anchor, drafts[:, :-1]]) when the head takes the Markov embedding; None without a head."""
        if self.conf is None:
            return None
        x = self._drafted(h)  # [N, D, H]
        if self.c.head["confidence_with_markov"]:
            prev = torch.cat([anchor_ids.to(x.device, torch.long)[:, None], drafts.to(x.device)[:, :-1]], 1)
            x = torch.cat([x, self.w1[prev.clamp(min=0)]], -1)  # [N, D, H + r]
        return torch.sigmoid(F.linear(x, *self.conf).squeeze(-1).float())


# ---------------------------------------------------------------------------
# loading


def load(
    ck: Checkpoint,
    c: DrafterConfig,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    sliding_block: str | None = None,
    place: Callable[[dict], dict] | None = None,
) -> DSpark:
    """A DSpark from a located checkpoint with validated config `c` (every tensor checked, legacy `logit_head.*`
    names read under their current names: `dflash.load`)."""
    return dflash.load(ck, c, dtype, device, sliding_block, place, cls=DSpark)


def flops_per_block(c: DrafterConfig, ctx_len: int, vocab: int) -> float:
    """Matmul FLOPs of one block: DFlash's backbone, the LM head of the D drafted slots, the Markov bias (W2, and
    the gated/rnn projection) and the confidence head of each drafted slot."""
    H, B, D, f = c.hidden_size, c.block_size, c.drafts, c.head
    r = f["markov_rank"]
    n = dflash.flops_per_block(c, ctx_len, vocab) + 2 * (D - (B - 1)) * H * vocab  # LM head of D slots, not B-1
    per_slot = 0
    if r:
        per_slot += 2 * r * vocab  # W2
        per_slot += {"gated": 2 * (H + r) * r, "rnn": 2 * (2 * r + H) * 3 * r}.get(f["markov_head_type"], 0)
    if f["confidence"]:
        per_slot += 2 * (H + r if f["confidence_with_markov"] else H)
    return n + D * per_slot
