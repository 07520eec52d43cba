"""The drafter family interface: what a family module provides, and the forward every drafter offers.

Contract: a family is a `spec.FamilySpec` in the registry (`drafters/families/` for the built-ins); its model
class, a `Drafter` (every built-in extends `dflash.DFlash`), is built from a located, validated checkpoint by
`drafters.load`, and its module gives `flops_per_block(c, ctx_len, vocab)`. A `Drafter` takes
target features and block embeddings and returns normed hidden states through four forwards, one per K/V
layout:
  - `blocks`: many blocks over context K/V as `context_kv` returns it, [context ; block] keys per call;
  - `blocks_in_place`: many blocks over stacked context K/V with spare leading key slots the blocks' keys are
    written into (no per-call copy of the context);
  - `blocks_run`: blocks at consecutive anchors over one sequence's context K/V, attended in parts (the keys
    every block of the run sees, unmasked, and the rest) whose work grows only with the keys each block sees;
  - `block`: one block the plain way (the reference the tests trust);
and owns both ends of them: `embed_block` (the block's inputs from the target's embedding) and `read_out` (the D
drafts of each block, with top-k and log-probabilities, from the normed states through the target's LM head and
the family's heads), plus `confidence` for a family that predicts its own acceptance. A `sequential` family's
draft for a slot depends on the drafts before it (DSpark's Markov head, Domino's GRU, DFlash2's selector walk):
its `read_out` walks each block left to right with its own drafts, as inference does, so every drafted slot is
what the drafter really proposes (up to the first rejection they equal a walk fed the target's tokens).
Torch-free itself: the tensor types appear in annotations only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from .config import DrafterConfig


class Drafter(ABC):
    """A loaded drafter: config `c`, its weights on `device` in `dtype`, and the block forwards."""

    c: DrafterConfig
    path: str  # the checkpoint folder it was loaded from
    device: Any  # torch.device
    dtype: Any  # torch.dtype
    sliding_block: str  # causal | bidirectional: block semantics of sliding-window layers
    sequential: bool = False  # read_out needs whole blocks: a draft depends on the drafts before it
    stack: int = 1  # blocks a replay stacks per forward for each block of its `chunk` (a small-block family's
    # forwards then hold as many rows as a block-16 drafter's: DFlash2)

    @property
    def drafts(self) -> int:  # D: tokens drafted per block (config `drafts`)
        return self.c.drafts

    @property
    def width(self) -> int:  # D + 1: the most tokens a verify step commits; the metrics' block size
        return self.c.width

    @abstractmethod
    def embed_block(self, head: Any, anchor_ids: torch.Tensor) -> torch.Tensor:
        """Block inputs [N, B, H] for anchor tokens [N]: [anchor, MASK x (B-1)] through the target's embedding."""

    @abstractmethod
    def read_out(
        self,
        head: Any,
        h: torch.Tensor,
        anchor_ids: torch.Tensor,
        topk: int,
        slots: tuple[int, int] | None = None,
        tap: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normed states [N, B, H] of blocks with anchor tokens [N] -> drafts [N, S], top-k ids [N, S, k] and
        their log-probabilities [N, S, k] (fp32) of drafts 0..D-1 (S = D), or of drafts slots[0]..slots[1]-1
        (not for a `sequential` family). Draft j is the token proposed for position anchor + 1 + j; ids[..., 0]
        is the draft. `tap(n [R], j [R], scores [R, V], cand=None)`, when given, hears the full scores each drafted
        row samples from (logits; a selector's scores over candidate ids `cand` [R, C]), blocks n, drafts j."""

    def confidence(self, head: Any, h: torch.Tensor, anchor_ids: torch.Tensor, drafts: torch.Tensor):
        """The family's predicted acceptance [N, D] of each draft (DSpark's confidence head), or None."""
        return None

    @abstractmethod
    def context_kv(self, features: torch.Tensor, start: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (k, v) of a sequence's context ([nkv, T, hd]; [S, nkv, T, hd] for stacked features); `start`:
        the position of row 0 (RoPE), so a decoder extends its context K/V by new rows alone."""

    @abstractmethod
    def blocks(
        self,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        anchors: torch.Tensor,
        emb: torch.Tensor,
        group: int = 16,
        max_anchor: int | None = None,
    ) -> torch.Tensor:
        """Normed states [N, B, H] of N blocks at `anchors` over context K/V as `context_kv` returns it."""

    @abstractmethod
    def blocks_in_place(
        self,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        anchors: torch.Tensor,
        emb: torch.Tensor,
        max_anchor: int | None = None,
    ) -> torch.Tensor:
        """Normed states [N, B, H] over stacked K/V [S, nkv, G*B + T, hd] whose first G*B key slots take the
        blocks' keys, written in place."""

    @abstractmethod
    def blocks_run(
        self, kv: list[tuple[torch.Tensor, torch.Tensor]], start: int, emb: torch.Tensor, group: int = 16
    ) -> torch.Tensor:
        """Normed states [N, B, H] of the N blocks at anchors start..start+N-1 over context K/V as `context_kv`
        returns it, equal to `blocks` at those anchors."""

    @abstractmethod
    def block(self, features: torch.Tensor, anchor: int, emb: torch.Tensor) -> torch.Tensor:
        """Normed states [B, H] of ONE block at `anchor`, the plain way (the reference)."""
