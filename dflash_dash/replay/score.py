"""One sequence's drafts scored: acceptance, chain and DDTree walks, the rounds' candidates; run summaries.

Contract: `score` turns one sequence's `Drafts` into a `PromptResult` (the walks of `walks`, numpy only);
`summarize` applies the metric registry to a run's results; `listed` converts a result's numpy fields to lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

import numpy as np

from .. import metrics
from ..walks import accepted, chain_walk, round_top, tree_accepted

if TYPE_CHECKING:
    from .head import Drafts


@dataclass
class PromptResult:
    id: str
    prompt_len: int  # P
    accepted_at: list[int]  # accepted(p), p = P..T-1
    drafts: list[list[int]]  # argmax drafts at each anchor [A][B-1]
    rounds: list[int]  # committed per round of the chain walk
    round_anchors: list[int]  # anchor of each round
    tree_at: list[int] = field(default_factory=list)  # DDTree accepted(p)
    tree_rounds: list[int] = field(default_factory=list)  # committed per round of the DDTree walk
    draft_logp: list[list[float]] = field(default_factory=list)  # [A][B-1] log-prob of each argmax draft
    round_top_ids: list[list[list[int]]] = field(
        default_factory=list
    )  # [R][B-1][K] top-K drafts at each round's anchor
    round_top_p: list[list[list[float]]] = field(default_factory=list)  # [R][B-1][K] their probabilities


def score(pid: str, d: Drafts, tokens: np.ndarray, prompt_len: int, budget: int, arrays: bool = False) -> PromptResult:
    """Acceptance, chain walk and DDTree walk of one sequence from its drafts (`arrays`: the list fields as numpy
    arrays, see `chain_only_results`)."""
    T = len(tokens)
    acc = accepted(d.tokens.numpy(), tokens, prompt_len)
    rounds = chain_walk(acc, prompt_len, T)
    r = PromptResult(pid, prompt_len, acc, d.tokens.numpy(), [c for _, _, c in rounds], [p for p, _, _ in rounds])
    if d.top_logp.shape[-1]:  # the log-probability of each argmax draft (calibration)
        r.draft_logp = d.top_logp[:, :, 0].numpy()
        at = np.asarray(r.round_anchors, dtype=np.int64) - prompt_len  # [R] rows of the rounds' anchors
        r.round_top_ids, r.round_top_p = round_top(d.top_ids.numpy()[at], d.top_logp.numpy()[at])
    if budget:
        tacc = tree_accepted(d.top_ids.numpy(), d.top_logp.numpy(), tokens, prompt_len, budget)
        r.tree_at, r.tree_rounds = tacc, [c for _, _, c in chain_walk(tacc, prompt_len, T)]
    return r if arrays else listed(r)


def summarize(results: list[PromptResult], B: int, budget: int) -> dict:
    """Run-level metrics: every entry of the metric registry (`metrics.REGISTRY`)."""
    return metrics.summarize(results, B, budget)


def listed(r: PromptResult, keep_2d: bool = False) -> PromptResult:
    """`r` with its numpy fields (`chain_only_results(arrays=True)`) as lists; `keep_2d`: only the 1-D ones (the
    store step reads the drafts, log-probabilities and round blocks as arrays too, and their lists are its largest
    cost)."""
    return replace(
        r,
        **{
            f.name: v.tolist()
            for f in fields(r)
            if isinstance(v := getattr(r, f.name), np.ndarray) and (v.ndim == 1 or not keep_2d)
        },
    )
