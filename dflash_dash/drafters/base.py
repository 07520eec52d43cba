"""The drafter family interface: what a family module provides, and the forward every drafter offers.

Contract: a family is a module under `drafters/` registered in `drafters.FAMILIES`; it provides
`shapes(c)` (the tensors a checkpoint of config `c` holds), `load(ck, c, dtype, device, sliding_block, place)`
(a `Drafter` from a located, validated checkpoint) and `flops_per_block(c, ctx_len, vocab)`. A `Drafter` takes
target features and block embeddings and returns normed hidden states (no embedding, no LM head: the caller
owns those), through three forwards, one per K/V layout:
  - `blocks`: many blocks over context K/V as `context_kv` returns it, [context ; block] keys per call;
  - `blocks_in_place`: many blocks over stacked context K/V with spare leading key slots the blocks' keys are
    written into (no per-call copy of the context);
  - `block`: one block the plain way (the reference the tests trust).
Torch-free itself: the tensor types appear in annotations only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from .config import DrafterConfig


@dataclass(frozen=True)
class Family:
    name: str  # shown to users, e.g. "DFlash"
    module: str  # the module implementing it (imported on first load: it imports torch)
    architectures: tuple[str, ...]  # config.json `architectures` values of this family


class Drafter(ABC):
    """A loaded drafter: config `c`, its weights on `device` in `dtype`, and the block forwards."""

    c: DrafterConfig
    path: str  # the checkpoint folder it was loaded from
    device: Any  # torch.device
    dtype: Any  # torch.dtype
    sliding_block: str  # causal | bidirectional: block semantics of sliding-window layers

    @abstractmethod
    def context_kv(self, features: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (k, v) of a sequence's context ([nkv, T, hd]; [S, nkv, T, hd] for stacked features)."""

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
    def block(self, features: torch.Tensor, anchor: int, emb: torch.Tensor) -> torch.Tensor:
        """Normed states [B, H] of ONE block at `anchor`, the plain way (the reference)."""
