"""One prompt's proposed blocks and one chain round slot by slot: what the drafter proposed beside what the target
produced, where the chain stopped and what DDTree took at that anchor.

Contract: `blocks` nests a run_prompts row's flat arrays (argmax drafts and their probabilities per anchor, top-K
candidates per round) the way the export and the round view read them; `round_options` lists the rounds of the
chain walk; `round_detail` gives one round's B-1 slots with their candidates (best first), the target's token,
its rank among them and each slot's status (a key of SLOT_STATUS). Texts in the result are raw model output, for
`render.tokens` to escape. A run replayed before the top-K was kept gets the argmax draft alone (K = 0).
"""

from __future__ import annotations

import numpy as np

from ..vocab import Vocab


def _nest(flat: list, *shape: int) -> list:
    """A flat list as nested lists of `shape` (the last axis innermost)."""
    if len(shape) == 1:
        return list(flat)
    n = int(np.prod(shape[1:]))
    return [_nest(flat[i * n : (i + 1) * n], *shape[1:]) for i in range(shape[0])]


def blocks(row: dict, block_size: int, k: int | None = None) -> dict:
    """A run_prompts row's blocks, nested: "drafts" [A][B-1] argmax drafts per anchor (-1: not drafted, a
    chain-only run), "draft_p" [A][B-1] their probabilities exp(draft_logp) (None: not recorded), "round_anchors"
    [R], "round_top_ids"/"round_top_p" [R][B-1][K] top-K candidates at each round's anchor and "round_topk" K
    (0 and empty lists for runs replayed before they were kept). `k` is the run summary's `round_topk` (None: read
    from the row's lengths)."""
    D = block_size - 1
    P, rounds = row["prompt_len"], list(row.get("rounds") or [])
    drafts = list(row.get("drafts") or [])
    A = len(drafts) // D if D else 0
    lp = row.get("draft_logp")
    draft_p = (
        [None if x != x else x for x in np.exp(np.asarray(lp, dtype=np.float64)).tolist()] if lp else [None] * (A * D)
    )  # NaN: not drafted (chain-only run)
    anchors = (P + np.concatenate([[0], np.cumsum(rounds)[:-1]])).tolist() if rounds else []
    K = _topk(row, D, k)
    ids, ps, R = (row["round_top_ids"], row["round_top_p"], len(rounds)) if K else ([], [], 0)
    return {
        "drafts": _nest(drafts, A, D),
        "draft_p": _nest(draft_p, A, D),
        "round_anchors": [int(a) for a in anchors],
        "round_topk": K,
        "round_top_ids": _nest(ids, R, D, K) if K else [],
        "round_top_p": _nest([float(x) for x in ps], R, D, K) if K else [],
    }


def _topk(row: dict, D: int, k: int | None) -> int:
    """K of a row's per-round top-K candidates: `k` (the run summary's round_topk) or read from the lengths; 0 when
    the row holds none, or holds arrays of other lengths (a run replayed before they were kept)."""
    R = len(row.get("rounds") or [])
    ids, ps = row.get("round_top_ids") or [], row.get("round_top_p") or []
    K = k if k else (len(ids) // (R * D) if R and D else 0)
    return K if K and len(ids) == len(ps) == R * D * K else 0


def _candidates(row: dict, D: int, k: int | None, rnd: int, at: int) -> tuple[list, list]:
    """The candidates of round `rnd` (1-based) at completion anchor index `at` (anchor - P): (ids, probabilities),
    each [D][K] best first, or [D][1] (the argmax draft and exp(draft_logp), None where not recorded) without
    top-K. Sliced from the flat arrays: `blocks` nests every anchor, which a long trace cannot afford per view."""
    K = _topk(row, D, k)
    if K:
        lo = (rnd - 1) * D * K
        ids, ps = row["round_top_ids"][lo : lo + D * K], [float(x) for x in row["round_top_p"][lo : lo + D * K]]
        return _nest(list(ids), D, K), _nest(ps, D, K)
    drafts = list((row.get("drafts") or [])[at * D : (at + 1) * D])
    lp = row.get("draft_logp")
    p = (
        [None if x != x else x for x in np.exp(np.asarray(lp[at * D : (at + 1) * D], dtype=np.float64)).tolist()]
        if lp is not None and len(lp)
        else [None] * len(drafts)
    )  # NaN: not drafted (chain-only run)
    return [[d] for d in drafts], [[x] for x in p]


def round_options(row: dict, completion: dict, block_size: int) -> list[dict]:
    """The rounds of the chain walk of one prompt: {"round" (1-based), "anchor", "accepted", "inside" (drafts
    inside the completion, min(B-1, T-1-anchor)), "committed", "label"}."""
    from ..walks import chain_walk as walk

    P = row["prompt_len"]
    T = P + len(completion["output_ids"])
    acc = np.asarray(row["accepted_at"], dtype=np.int64)
    out = []
    for i, (p, a, c) in enumerate(walk(acc, P, T) if len(acc) else []):
        n = min(block_size - 1, T - 1 - p)
        out.append(
            {
                "round": i + 1,
                "anchor": p,
                "accepted": a,
                "inside": n,
                "committed": c,
                "label": f"round {i + 1} · anchor {p} · accepted {a}/{n}",
            }
        )
    return out


SLOT_STATUS = {
    "acc": "accepted",
    "rej": "rejected: the chain stops here",
    "none": "nothing proposed: the chain stops here",
    "after": "not verified (after the stop)",
    "past": "past the end of the completion",
}


def round_detail(
    row: dict, completion: dict, block_size: int, rnd: int, vocab: Vocab, k: int | None = None, tree_budget: int = 0
) -> dict:
    """Round `rnd` (1-based) of a prompt's chain walk, slot by slot: {"round", "anchor", "anchor_token",
    "accepted", "inside", "committed", "stop" (first rejected slot, None: none rejected), "tree" (DDTree's
    accepted tokens at this anchor, None: no tree budget or not computed there), "tree_budget", "topk" (K; 0: only
    the argmax draft recorded), "slots": per slot 1..B-1 {"slot", "position", "target_id", "target" (None past the
    completion), "status" (key of SLOT_STATUS; "none" at the stop when nothing was proposed there: a baseline's
    -1), "candidates" [{"id", "text", "p"}] best first, "target_rank"
    (1-based rank of the target's token among them, None: not among them), "ddtree" (slot inside DDTree's
    accepted path, None: unknown)}}. Texts are raw model output: escape them (`render.tokens.visible`) before HTML."""
    opts = round_options(row, completion, block_size)
    if not 1 <= rnd <= len(opts):
        raise ValueError(f"round {rnd}: the chain walk of prompt {row.get('prompt_id')!r} has rounds 1..{len(opts)}")
    o = opts[rnd - 1]
    P, p, a, n, D = row["prompt_len"], o["anchor"], o["accepted"], o["inside"], block_size - 1
    tokens = list(completion["prompt_ids"]) + list(completion["output_ids"])
    ids, ps = _candidates(row, D, k, rnd, p - P)  # [B-1][K], or [B-1][1]: the argmax draft alone
    tree_at = row.get("tree_at") or []
    tree = int(tree_at[p - P]) if tree_budget and p - P < len(tree_at) and tree_at[p - P] >= 0 else None
    targets = [tokens[p + i] if i <= n else None for i in range(1, D + 1)]
    strs = vocab.strings(
        [tokens[p]] + [t for t in targets if t is not None] + [c for slot in ids for c in slot if c >= 0]
    )
    anchor_str, strs = strs[0], iter(strs[1:])
    target_strs = [next(strs) if t is not None else None for t in targets]
    slots = []
    for i in range(1, D + 1):
        t = targets[i - 1]
        cands = [
            {"id": int(c), "text": next(strs), "p": None if x is None else float(x)}
            for c, x in zip(ids[i - 1], ps[i - 1])
            if c >= 0
        ]  # -1: not computed (chain-only, DDTree off)
        status = "acc" if i <= a else "rej" if i == a + 1 and i <= n else "after" if i <= n else "past"
        if status == "rej" and not cands:  # -1 at the stop: a proposer that found no match drafted nothing
            status = "none"
        rank = next((r for r, c in enumerate(cands, 1) if t is not None and c["id"] == t), None)
        slots.append(
            {
                "slot": i,
                "position": p + i,
                "target_id": t,
                "target": target_strs[i - 1],
                "status": status,
                "candidates": cands,
                "target_rank": rank,
                "ddtree": None if tree is None else i <= tree,
            }
        )
    return {
        "round": rnd,
        "anchor": p,
        "anchor_token": anchor_str,
        "accepted": a,
        "inside": n,
        "committed": o["committed"],
        "stop": a + 1 if a < n else None,
        "tree": tree,
        "tree_budget": tree_budget,
        "topk": _topk(row, D, k),
        "slots": slots,
    }
