"""One-position draft lag: how often the draft at slot k is the target's token one position behind its own.

Contract: plain per-prompt data in, rates out. A lagging draft is the signature of a drafter trained with the
anchor's own hidden state in view (at inference the context stops before the anchor, so its drafts come out
shifted by one). In: the flat drafts [A*(B-1)] of a run_prompts row (-1 where a chain-only replay did not draft),
the prompt + completion token ids and P. Not in the registry (it needs the tokens, which run rows do not hold).
"""

from __future__ import annotations

LAG_FORMULA = (
    "lag rate at slot k = #(d_k = t[p+k-1]) / #anchors, over every anchor p with drafts and slot k "
    "inside the completion where t[p+k] != t[p+k-1] (else a lag cannot be told from a hit); "
    "on-target rate = #(d_k = t[p+k]) / the same anchors"
)


def lag_counts(
    drafts: list[int], tokens: list[int], prompt_len: int, block_size: int
) -> tuple[list[int], list[int], list[int]]:
    """Per slot k = 1..B-1 of one prompt: (anchors counted, drafts lagging one position, drafts on target).
    Anchors counted: p = P..T-1 with drafts, p+k <= T-1 and t[p+k] != t[p+k-1]."""
    import numpy as np

    D, P, T = block_size - 1, prompt_len, len(tokens)
    n, lag, hit = [0] * D, [0] * D, [0] * D
    A = T - P
    if D < 1 or A < 1 or len(drafts) != A * D:
        return n, lag, hit
    d, t = np.asarray(drafts, dtype=np.int64).reshape(A, D), np.asarray(tokens, dtype=np.int64)
    for k in range(1, min(D, A - 1) + 1):  # anchor p = P + a drafts d_k for t[p+k]: anchors a = 0..A-1-k
        col, want, prev = d[: A - k, k - 1], t[P + k :], t[P + k - 1 : T - 1]
        ok = (col >= 0) & (want != prev)  # -1: not drafted (chain-only replay, off the walks)
        n[k - 1] = int(ok.sum())
        lag[k - 1], hit[k - 1] = int((ok & (col == prev)).sum()), int((ok & (col == want)).sum())
    return n, lag, hit


def lag_rate(prompts: list[tuple[list[int], list[int], int]], block_size: int) -> dict:
    """Pooled over prompts given as (drafts, tokens, prompt_len): {"anchors", "lag", "on_target"} per slot
    k = 1..B-1 (rates None where no anchor counts)."""
    return lag_pool(
        [lag_counts(list(drafts), list(tokens), int(P), block_size) for drafts, tokens, P in prompts], block_size
    )


def lag_pool(counts: list, block_size: int) -> dict:
    """`lag_rate` from per-prompt `lag_counts` triples (as kept by pipeline.analysis "lag")."""
    D = block_size - 1
    n, lag, hit = [0] * D, [0] * D, [0] * D
    for triple in counts:
        for acc, part in zip((n, lag, hit), triple):
            for k, v in enumerate(part[:D]):
                acc[k] += v
    return {
        "anchors": n,
        "lag": [l / c if c else None for l, c in zip(lag, n)],
        "on_target": [h / c if c else None for h, c in zip(hit, n)],
    }
