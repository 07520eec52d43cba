"""The walks over a sequence's drafts: acceptance, the chain walk, the DDTree walk, the rounds' candidates.

Contract: numpy in, numbers out; numpy (and heapq) is the only dependency, so analysis, pages and metrics walk
drafts without torch. A sequence is prompt + completion token ids [T], the completion starting at P (the prompt
length). `accepted` counts, at every completion anchor p = P..T-1, the leading drafts equal to the tokens inside
the completion; `chain_walk` reproduces a greedy speculative decoder over those counts (anchor P first, then
anchor += accepted + 1, capped); `tree_accept` is DDTree's acceptance at one anchor from per-slot candidates,
`tree_accepted` at every anchor; `round_top` keeps the top-K candidates of each chain round's block.
"""

from __future__ import annotations

import heapq

import numpy as np

ROUND_TOPK = 4  # K: candidates kept per slot of each chain round's block (the drafts carry at least this many)


def accepted(drafts: np.ndarray, tokens: np.ndarray, prompt_len: int) -> np.ndarray:
    """accepted(p) for p = P..T-1: leading drafts equal to tokens[p+1..], inside the completion only."""
    T = len(tokens)
    A, D = drafts.shape
    at = prompt_len + 1 + np.arange(A)[:, None] + np.arange(D)  # [A, D] position each draft guesses
    ok = (at < T) & (drafts == np.asarray(tokens)[np.minimum(at, T - 1)])
    leading: np.ndarray = np.cumprod(ok, axis=1).sum(axis=1).astype(np.int64)  # leading matches
    return leading


def chain_walk(acc: np.ndarray, prompt_len: int, T: int) -> list[tuple[int, int, int]]:
    """Chain walk: rounds (anchor, accepted, committed) from anchor P while anchor < T-1."""
    rounds, p = [], prompt_len
    while p < T - 1:
        a = int(acc[p - prompt_len])
        c = min(a + 1, T - 1 - p)
        rounds.append((p, a, c))
        p += c
    return rounds


def tree_accept(top_ids: np.ndarray, top_logp: np.ndarray, target: np.ndarray, budget: int) -> int:
    """DDTree-b acceptance at one anchor.

    top_ids/top_logp [B-1, k]: per-slot candidates sorted by log-probability. The tree grows best-first
    by summed path log-probability; popping a node pushes its next sibling (same depth, next rank) and its
    first child (next depth, rank 0), until `budget` non-root nodes exist. Returns the length of the
    longest root path whose tokens equal `target` (the next tokens, already cut to the completion).
    """
    D, k = min(top_ids.shape[0], budget), min(top_ids.shape[1], budget)  # deeper or lower ranks never pop
    if budget <= 0 or D == 0 or k == 0:
        return 0
    ids, lp = top_ids[:D, :k].tolist(), top_logp[:D, :k].tolist()  # Python lists: no numpy scalar per read
    paths: set[tuple[int, ...]] = set()  # token paths in the tree
    heap: list[tuple[float, tuple[int, ...]]] = [(-lp[0][0], (0,))]  # (-score, ranks)
    while heap and len(paths) < budget:
        neg, ranks = heapq.heappop(heap)
        d, r = len(ranks), ranks[-1]
        paths.add(tuple(ids[i][ranks[i]] for i in range(d)))
        base = -neg - lp[d - 1][r]
        if r + 1 < k:
            heapq.heappush(heap, (-(base + lp[d - 1][r + 1]), ranks[:-1] + (r + 1,)))
        if d < D:
            heapq.heappush(heap, (neg - lp[d][0], ranks + (0,)))
    want = [int(t) for t in target]
    n = 0
    while n < len(want) and tuple(want[: n + 1]) in paths:
        n += 1
    return n


def tree_accepted(ids: np.ndarray, logp: np.ndarray, tokens: np.ndarray, prompt_len: int, budget: int) -> np.ndarray:
    """DDTree acceptance at every completion anchor from the drafts' top-k ids and log-probabilities [A, B-1, k]
    (0 without a tree walk where the next token is none of the first slot's candidates that a tree of `budget`
    nodes can hold)."""
    T = len(tokens)
    out = np.zeros(len(ids), dtype=np.int64)
    if not len(ids) or budget <= 0 or 0 in ids.shape[1:]:
        return out
    nxt = np.asarray(tokens)[np.minimum(prompt_len + 1 + np.arange(len(ids)), T - 1)]
    live = np.flatnonzero((ids[:, 0, :budget] == nxt[:, None]).any(axis=1))  # anchors whose slot 1 can match
    for a in live.tolist():
        p = prompt_len + a
        out[a] = tree_accept(ids[a], logp[a], tokens[p + 1 : min(T, p + ids.shape[1] + 1)], budget)
    return out


def round_top(ids: np.ndarray, logp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The top-K candidates of the blocks at the chain rounds' anchors: ids and log-probs [R, B-1, k] ->
    (ids [R, B-1, K], probabilities [R, B-1, K] in float64), K = min(ROUND_TOPK, k), sorted by probability
    (slot's draft first)."""
    K = min(ROUND_TOPK, ids.shape[-1])
    return ids[..., :K], np.exp(logp[..., :K].astype(np.float64))
