"""One sequence's drafts scored: acceptance, chain and DDTree walks, the rounds' candidates; run summaries.

Contract: `score` turns one sequence's `Drafts` into its `metrics.Prompt` (the walks of `walks`, numpy only;
arrays as numpy, never Python lists); `summarize` applies the metric registry to a run's prompts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import metrics
from ..metrics import Prompt
from ..metrics.headroom import MISSED
from ..sampling import expected
from ..walks import accepted, chain_walk, round_top, tree_accepted

if TYPE_CHECKING:
    from .head import Drafts


def score(pid: str, d: Drafts, tokens: np.ndarray, prompt_len: int, budget: int) -> Prompt:
    """Acceptance, chain walk and DDTree walk of one sequence from its drafts."""
    T = len(tokens)
    acc = accepted(d.tokens.numpy(), tokens, prompt_len)
    rounds = chain_walk(acc, prompt_len, T)
    r = Prompt(pid, prompt_len, acc, [c for _, _, c in rounds], drafts=d.tokens.numpy())
    if d.top_logp.shape[-1]:  # the log-probability of each argmax draft (calibration)
        r.draft_logp = d.top_logp[:, :, 0].numpy()
        at = np.asarray([p for p, _, _ in rounds], dtype=np.int64) - prompt_len  # [R] rows of the rounds' anchors
        r.round_top_ids, r.round_top_p = round_top(d.top_ids.numpy()[at], d.top_logp.numpy()[at])
        r.target_rank = target_rank(d.top_ids.numpy(), tokens, prompt_len)
    if d.confidence is not None:
        r.confidence = d.confidence.numpy()
    if budget:
        tacc = tree_accepted(d.top_ids.numpy(), d.top_logp.numpy(), tokens, prompt_len, budget)
        r.tree_at, r.tree_rounds = tacc, [c for _, _, c in chain_walk(tacc, prompt_len, T)]
    if d.alpha is not None:  # the expected-acceptance pass: bounds of the expected committed tokens per anchor
        a = d.alpha.double().numpy()
        r.expected_at = expected(a[..., 0], a[..., 1], prompt_len + np.arange(len(a)), T).astype(np.float32)
    return r


def target_rank(top_ids: np.ndarray, tokens: np.ndarray, prompt_len: int) -> np.ndarray:
    """[A, D] rank of the target's token x_{p+1+j} among the top-K candidates of draft j at anchor p (MISSED when it
    is not among them, -1 past the sequence's end or where the slot was not drafted)."""
    A, D, _ = top_ids.shape
    T = len(tokens)
    pos = prompt_len + np.arange(A)[:, None] + 1 + np.arange(D)[None, :]  # [A, D] the drafted positions
    inside = pos < T
    want = np.asarray(tokens)[np.minimum(pos, T - 1)]
    hit = top_ids == want[..., None]  # [A, D, K]
    rank = np.where(hit.any(-1), hit.argmax(-1), MISSED)
    return np.where(inside & (top_ids[..., 0] >= 0), rank, -1).astype(np.int64)


def summarize(results: list[Prompt], B: int, budget: int) -> dict:
    """Run-level metrics: every entry of the metric registry (`metrics.REGISTRY`)."""
    return metrics.summarize(results, B, budget)
