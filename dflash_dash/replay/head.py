"""The drafted blocks read out: a block's inputs embedded, and each drafted slot's draft, top-k and
log-probabilities, through the drafter family's own read-out.

Contract: tensors in, tensors out. `embed_blocks` builds the blocks at given anchors of a sequence (the family's
`embed_block`: [anchor token, MASK x (B-1)] through the target's embedding); `read_out` gives the D drafted slots'
drafts, top-k ids and log-probabilities (the family's `read_out`: DFlash's LM head, DSpark's Markov head, Domino's
prefix GRU, DFlash2's candidate selector) and, where the family has one, its confidence; `to_host` gathers
per-chunk results into `Drafts` on the CPU. `top_logp` and HEAD_ROWS live in `drafters.readout`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..drafters import Drafter
from ..drafters.readout import HEAD_ROWS, top_logp
from ..target import Head

__all__ = ["HEAD_ROWS", "Drafts", "embed_blocks", "read_out", "to_host", "top_logp"]


@dataclass
class Drafts:
    tokens: torch.Tensor  # [A, D] drafts at anchors P..T-1 (A = T-P, D = the drafter's drafts per block)
    top_ids: torch.Tensor  # [A, D, k] top-k tokens per slot (k: `every.topk_of`): slot 0 is the draft
    top_logp: torch.Tensor  # [A, D, k] their log-probabilities
    confidence: torch.Tensor | None = None  # [A, D] the family's predicted acceptance per slot (DSpark), or None
    alpha: torch.Tensor | None = None  # [A, D, 2] bounds of each slot's acceptance probability at temperature T
    # (`expect.Rows.alpha`), or None: no expected-acceptance pass


# ---------------------------------------------------------------------------
# drafting


def embed_blocks(drafter: Drafter, head: Head, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """The blocks at `anchors` of a sequence `tokens` [T], as the family feeds them -> [N, B, H]."""
    return drafter.embed_block(head, tokens.to(head.embed.device)[anchors.to(head.embed.device)])


def read_out(
    drafter: Drafter,
    head: Head,
    h: torch.Tensor,
    anchor_ids: torch.Tensor,
    topk: int,
    slots: tuple[int, int] | None = None,
    confidence: bool = False,
    tap=None,
) -> tuple:
    """Normed block states [N, B, H] of blocks whose anchor tokens are `anchor_ids` [N] -> drafts [N, S], top-k
    ids and log-probs [N, S, k] of the D drafted slots (S = D), or of drafts slots[0]..slots[1]-1 only (a family
    that is not `sequential`); with `confidence`, a 4th item: the family's confidence [N, D] or None. `tap`: the
    family hands it each drafted row's full scores (`expect.Tap`)."""
    out = (
        drafter.read_out(head, h, anchor_ids, topk, slots)
        if tap is None
        else drafter.read_out(head, h, anchor_ids, topk, slots, tap)
    )
    if not confidence:
        return out
    return (*out, drafter.confidence(head, h, anchor_ids, out[0]))


def to_host(parts) -> Drafts:
    """Concatenate per-chunk (drafts, ids, logp[, confidence[, alpha]]) and copy them to the CPU once."""
    got = [torch.cat([p[i] for p in parts]).cpu() for i in range(3)]

    def whole(i: int, cast):
        x = [p[i] for p in parts if len(p) > i and p[i] is not None]
        return cast(torch.cat(x)).cpu() if x and len(x) == len(parts) else None

    return Drafts(*got, whole(3, lambda t: t.float()), whole(4, lambda t: t))
