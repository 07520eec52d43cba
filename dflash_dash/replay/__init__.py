"""Replay: a drafter's blocks over a target's cached features, scored against the target's own tokens.

Contract: tensors in, numbers out; no files, no HTTP, no store. A `Sequence` is prompt + completion token ids
[T] with its cached features [T, K*H], the completion starting at position P. Two replays, same numbers:
  - `every_anchor` (module `every`): a block at every completion anchor, so every metric is computed;
  - `chain_only` (module `lockstep`): only the anchors the chain walk (and the DDTree walk) visits, many
    sequences in lockstep; metrics that need every anchor are then not computed.
Each returns (per-prompt `metrics.Prompt`s, the run's summary from the metric registry). The walks themselves
(acceptance, chain walk, DDTree) are numpy code in `walks`; `head` reads drafted states out through the LM head.
"""

from __future__ import annotations

from ..metrics import Prompt
from ..walks import ROUND_TOPK
from .every import Sequence, draft_all, draft_loop, draft_one, every_anchor, every_anchor_results
from .head import Drafts, top_logp
from .lockstep import chain_only, chain_only_results
from .score import score, summarize

__all__ = [
    "ROUND_TOPK",
    "Drafts",
    "Prompt",
    "Sequence",
    "chain_only",
    "chain_only_results",
    "draft_all",
    "draft_loop",
    "draft_one",
    "every_anchor",
    "every_anchor_results",
    "score",
    "summarize",
    "top_logp",
]
