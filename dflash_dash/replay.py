"""Every-anchor replay, chain walk, metrics and DDTree (SPEC 2 and 3).

Contract: tensors in, numbers out. No files, no HTTP, no store. The metrics themselves are defined once in
`metrics` (the registry); `summarize` applies it. A sequence is prompt + completion token
ids [T] with its cached features [T, K*H]; the completion starts at position P (the prompt length).
For every completion anchor p in P..T-1 the drafter drafts d_1..d_{B-1} for positions p+1..p+B-1;
`accepted(p)` counts leading drafts equal to the tokens, inside the completion only. The chain walk then
reproduces a greedy speculative decoder: anchor P first, then anchor += accepted + 1 (capped).
"""
from __future__ import annotations

import heapq
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from . import metrics
from .drafter import Drafter
from .target import Head


@dataclass
class Drafts:
    tokens: torch.Tensor    # [A, B-1] argmax drafts at anchors P..T-1 (A = T-P)
    top_ids: torch.Tensor   # [A, B-1, k] top-k tokens per slot (k = max(tree budget, 1): slot 0 is the draft)
    top_logp: torch.Tensor  # [A, B-1, k] their log-probabilities


# ---------------------------------------------------------------------------
# drafting


def _embed_blocks(drafter: Drafter, head: Head, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """[anchor token, MASK x (B-1)] embedded with the target embedding -> [N, B, H]."""
    B = drafter.c.block_size
    ids = torch.full((len(anchors), B), drafter.c.mask_token_id, dtype=torch.long, device=head.embed.device)
    ids[:, 0] = tokens.to(ids.device)[anchors.to(ids.device)]
    return head.embed[ids].to(drafter.device, drafter.dtype)


HEAD_ROWS = 2048  # rows of the LM head computed at once: bounds the [rows, V] logits buffer


def _top_triton():
    """A Triton kernel reading each row of logits [R, V] once: top-k (descending; among equal values the
    lower id first, so slot 0 is torch.argmax) and log-sum-exp in fp32. Built on first use."""
    import triton
    import triton.language as tl

    @triton.jit
    def top_rows(x_ptr, stride, val_ptr, idx_ptr, lse_ptr, V: tl.constexpr, K: tl.constexpr,
                 KP: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        lanes = tl.arange(0, BLOCK)
        slots = tl.arange(0, KP)
        m = tl.full([BLOCK], -1e30, tl.float32)                  # running max per lane (finite: no inf - inf)
        s = tl.zeros([BLOCK], tl.float32)                        # running sum of exp(x - m) per lane
        bv = tl.where(slots < K, float("-inf"), float("inf"))    # best K values so far (pad slots: never out)
        bi = tl.zeros([KP], tl.int32)                            # their ids
        for off in range(0, V, BLOCK):
            x = tl.load(x_ptr + row * stride + off + lanes, mask=off + lanes < V, other=float("-inf"))
            x = x.to(tl.float32)
            m2 = tl.maximum(m, x)
            s = s * tl.exp(m - m2) + tl.exp(x - m2)
            m = m2
            while tl.max(x, 0) > tl.min(bv, 0):                  # the tile's best beats the K-th best
                i = tl.argmax(x, 0, tie_break_left=True)
                out = tl.argmax(tl.where(bv == tl.min(bv, 0), bi, -1), 0)  # K-th best (of equals, last id)
                bv = tl.where(slots == out, tl.max(x, 0), bv)
                bi = tl.where(slots == out, off + i, bi)
                x = tl.where(lanes == i, float("-inf"), x)
        mx = tl.max(m, 0)
        tl.store(lse_ptr + row, mx + tl.log(tl.sum(s * tl.exp(m - mx), 0)))
        live = slots < K
        for j in tl.static_range(K):                             # sorted: value down, then id up
            v = tl.max(tl.where(live, bv, float("-inf")), 0)
            i = tl.min(tl.where(live & (bv == v), bi, 2147483647), 0)
            tl.store(val_ptr + row * K + j, v)
            tl.store(idx_ptr + row * K + j, i.to(tl.int64))
            live = live & ((bv != v) | (bi != i))

    def top(x: torch.Tensor, k: int):
        R, V = x.shape
        vals = torch.empty(R, k, dtype=torch.float32, device=x.device)
        ids = torch.empty(R, k, dtype=torch.long, device=x.device)
        lse = torch.empty(R, dtype=torch.float32, device=x.device)
        top_rows[(R,)](x, x.stride(0), vals, ids, lse, V=V, K=k, KP=max(2, triton.next_power_of_2(k)),
                       BLOCK=4096, num_warps=8)
        return vals, ids, lse
    return top


_TOP: list = []  # [the built Triton kernel, or None where Triton cannot run]


def top_logp(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits [R, V] -> argmax [R], top-k ids [R, k] and their log-probabilities [R, k] (fp32).

    On CUDA one Triton pass over the logits; elsewhere torch (argmax, topk, logsumexp of an fp32 copy).
    Same values either way; only the order of exactly equal logits inside the top-k may differ.
    """
    if logits.is_cuda and logits.stride(1) == 1:
        if not _TOP:
            try:
                _TOP.append(_top_triton())
            except Exception:  # noqa: BLE001  (no Triton here: the torch path below is exact too)
                _TOP.append(None)
        if _TOP[0] is not None:
            try:
                vals, ids, lse = _TOP[0](logits, max(k, 1))
                return ids[:, 0], ids[:, :k], vals[:, :k] - lse[:, None]
            except Exception as e:  # noqa: BLE001  (a Triton that cannot compile it: torch below is exact)
                warnings.warn(f"Triton top-k kernel unavailable ({type(e).__name__}: {e}); using torch.topk")
                _TOP[0] = None
    top = logits.topk(k, dim=-1)
    return logits.argmax(-1), top.indices, top.values.float() - torch.logsumexp(logits.float(), -1)[:, None]


def _head(drafter: Drafter, head: Head, h: torch.Tensor, topk: int):
    """Normed block states [N, B, H] -> argmax [N, B-1], top-k ids and log-probs [N, B-1, k] (on h's device).

    Rows go through the LM head HEAD_ROWS at a time and the logits stay in the model dtype (no fp32
    copy of [rows, V]); `top_logp` reads them: log p = logit - logsumexp(logits), in fp32.
    """
    N, B1 = h.shape[0], h.shape[1] - 1
    x = h[:, 1:].reshape(N * B1, -1)
    w = head.lm_head.to(h.device, h.dtype)
    parts = [top_logp(x[r:r + HEAD_ROWS] @ w.T, topk) for r in range(0, x.shape[0], HEAD_ROWS)]
    drafts, ids, logp = (torch.cat([p[i] for p in parts]) for i in range(3))
    return drafts.view(N, B1), ids.view(N, B1, topk), logp.view(N, B1, topk)


def _stack(parts) -> Drafts:
    """Concatenate per-chunk (drafts, ids, logp) and copy them to the CPU once."""
    return Drafts(*(torch.cat([p[i] for p in parts]).cpu() for i in range(3)))


def _draft(drafter: Drafter, head: Head, features: torch.Tensor, tokens: torch.Tensor, prompt_len: int,
           topk: int, chunk: int) -> list:
    """Queue the every-anchor drafts of one sequence on the device; per-chunk results stay there."""
    T, dev = len(tokens), drafter.device
    kv = drafter.context_kv(features.to(dev))
    tokens = tokens.to(head.embed.device)
    parts = []
    for s in range(prompt_len, T, chunk):
        e = min(s + chunk, T)
        anchors = torch.arange(s, e, device=dev)
        emb = _embed_blocks(drafter, head, tokens, anchors)
        parts.append(_head(drafter, head, drafter.blocks(kv, anchors, emb, max_anchor=e - 1), topk))
    return parts


def _upload(drafter: Drafter, features: torch.Tensor) -> torch.Tensor:
    """Features to the drafter's device without waiting (pinned, asynchronous) on CUDA."""
    if drafter.device.type != "cuda" or features.is_cuda:
        return features
    return features.pin_memory().to(drafter.device, non_blocking=True)


@torch.inference_mode()
def draft_all(drafter: Drafter, head: Head, features: torch.Tensor, tokens: torch.Tensor, prompt_len: int,
              topk: int = 0, chunk: int = 64) -> Drafts:
    """Every-anchor drafts of one sequence: context K/V once, then `chunk` blocks per batched call."""
    return _stack(_draft(drafter, head, features, tokens, prompt_len, topk, chunk))


@torch.inference_mode()
def draft_loop(drafter: Drafter, head: Head, features: torch.Tensor, tokens: torch.Tensor, prompt_len: int,
               topk: int = 0) -> Drafts:
    """Reference: one block per forward call, context recomputed each time. Same output as draft_all."""
    parts = []
    for p in range(prompt_len, len(tokens)):
        emb = _embed_blocks(drafter, head, tokens, torch.tensor([p]))[0]
        h = drafter.block(features.to(drafter.device), p, emb)
        parts.append(_head(drafter, head, h[None], topk))
    return _stack(parts)


@torch.inference_mode()
def draft_one(drafter: Drafter, head: Head, features: torch.Tensor, anchor: int, anchor_token: int) -> list[int]:
    """The argmax drafts d_1..d_{B-1} of ONE block at `anchor`, through the every-anchor path (`context_kv`,
    `blocks`, `_head`): what `draft_all` drafts there. features [>= anchor, K*H]: rows from `anchor` on are never
    seen (the block's queries see context keys < anchor only). The speculative stand-in (specdec) drafts with it."""
    dev = drafter.device
    kv = drafter.context_kv(features.to(dev))
    ids = torch.full((1, drafter.c.block_size), drafter.c.mask_token_id, dtype=torch.long, device=head.embed.device)
    ids[0, 0] = int(anchor_token)
    emb = head.embed[ids].to(dev, drafter.dtype)                                   # [1, B, H]
    h = drafter.blocks(kv, torch.tensor([anchor], device=dev), emb, max_anchor=anchor)
    return _head(drafter, head, h, 1)[0][0].tolist()


# ---------------------------------------------------------------------------
# acceptance


def accepted(drafts: np.ndarray, tokens: np.ndarray, prompt_len: int) -> np.ndarray:
    """accepted(p) for p = P..T-1: leading drafts equal to tokens[p+1..], inside the completion only."""
    T = len(tokens)
    A, D = drafts.shape
    out = np.zeros(A, dtype=np.int64)
    for a in range(A):
        p = prompt_len + a
        n = min(D, T - 1 - p)
        ok = drafts[a, :n] == tokens[p + 1 : p + 1 + n]
        out[a] = n if ok.all() else int(np.argmin(ok))
    return out


def walk(acc: np.ndarray, prompt_len: int, T: int) -> list[tuple[int, int, int]]:
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
    D, k = top_ids.shape
    if budget <= 0 or D == 0 or k == 0:
        return 0
    paths: set[tuple[int, ...]] = set()      # token paths in the tree
    heap = [(-float(top_logp[0, 0]), (0,))]   # (-score, ranks)
    while heap and len(paths) < budget:
        neg, ranks = heapq.heappop(heap)
        d, r = len(ranks), ranks[-1]
        paths.add(tuple(int(top_ids[i, ranks[i]]) for i in range(d)))
        base = -neg - float(top_logp[d - 1, r])
        if r + 1 < k:
            heapq.heappush(heap, (-(base + float(top_logp[d - 1, r + 1])), ranks[:-1] + (r + 1,)))
        if d < D:
            heapq.heappush(heap, (neg - float(top_logp[d, 0]), ranks + (0,)))
    n = 0
    while n < len(target) and tuple(int(t) for t in target[: n + 1]) in paths:
        n += 1
    return n


def tree_accepted(d: Drafts, tokens: np.ndarray, prompt_len: int, budget: int) -> np.ndarray:
    """DDTree acceptance at every completion anchor."""
    T = len(tokens)
    ids, logp = d.top_ids.numpy(), d.top_logp.numpy()
    out = np.zeros(len(ids), dtype=np.int64)
    for a in range(len(ids)):
        p = prompt_len + a
        out[a] = tree_accept(ids[a], logp[a], tokens[p + 1 : min(T, p + ids.shape[1] + 1)], budget)
    return out


# ---------------------------------------------------------------------------
# metrics


@dataclass
class PromptResult:
    id: str
    prompt_len: int                 # P
    accepted_at: list[int]          # accepted(p), p = P..T-1
    drafts: list[list[int]]         # argmax drafts at each anchor [A][B-1]
    rounds: list[int]               # committed per round of the chain walk
    round_anchors: list[int]        # anchor of each round
    tree_at: list[int] = field(default_factory=list)      # DDTree accepted(p)
    tree_rounds: list[int] = field(default_factory=list)  # committed per round of the DDTree walk
    draft_logp: list[list[float]] = field(default_factory=list)  # [A][B-1] log-prob of each argmax draft


def score(pid: str, d: Drafts, tokens: np.ndarray, prompt_len: int, budget: int) -> PromptResult:
    """Acceptance, chain walk and DDTree walk of one sequence from its drafts."""
    T = len(tokens)
    acc = accepted(d.tokens.numpy(), tokens, prompt_len)
    rounds = walk(acc, prompt_len, T)
    r = PromptResult(pid, prompt_len, acc.tolist(), d.tokens.tolist(), [c for _, _, c in rounds],
                     [p for p, _, _ in rounds])
    if d.top_logp.shape[-1]:  # the log-probability of each argmax draft (calibration)
        r.draft_logp = d.top_logp[:, :, 0].tolist()
    if budget:
        tacc = tree_accepted(d, tokens, prompt_len, budget)
        r.tree_at, r.tree_rounds = tacc.tolist(), [c for _, _, c in walk(tacc, prompt_len, T)]
    return r


def summarize(results: list[PromptResult], B: int, budget: int) -> dict:
    """Run-level metrics of SPEC 3: every entry of the metric registry (`metrics.REGISTRY`)."""
    return metrics.summarize(results, B, budget)


# ---------------------------------------------------------------------------
# whole run


@dataclass
class Sequence:
    id: str
    tokens: torch.Tensor    # [T] prompt + completion ids
    prompt_len: int         # P
    features: torch.Tensor  # [T, K*H]


def run(drafter: Drafter, head: Head, seqs: list[Sequence], budget: int = 8, chunk: int = 64,
        progress: Callable[[int, int], None] | None = None) -> tuple[list[PromptResult], dict]:
    """Replay every sequence (every-anchor, batched) and summarise.

    Scoring (CPU: acceptance, chain and DDTree walks) of sequence i runs on a worker thread once the
    device's queue holds sequence i+1's work, and the next features are uploaded meanwhile; results come
    back in input order.
    """
    with ThreadPoolExecutor(1) as pool, torch.inference_mode():
        futures, done = [], None
        nxt = _upload(drafter, seqs[0].features) if seqs else None
        for i, s in enumerate(seqs):
            parts = _draft(drafter, head, nxt, s.tokens, s.prompt_len, max(budget, 1), chunk)  # queued, not waited
            if done is not None:  # started only now: its thread would slow the launches above (the GIL)
                futures.append(pool.submit(score, *done))
            if i + 1 < len(seqs):
                nxt = _upload(drafter, seqs[i + 1].features)
            done = (s.id, _stack(parts), s.tokens.numpy(), s.prompt_len, budget)
            if len(futures) > 1:
                futures[-2].result()  # at most one sequence scoring behind; its errors surface here
            if progress:
                progress(i + 1, len(seqs))
        if done is not None:
            futures.append(pool.submit(score, *done))
        results = [f.result() for f in futures]
    return results, summarize(results, drafter.c.block_size, budget)


# ---------------------------------------------------------------------------
# chain-only replay: only the anchors the walks visit, many sequences in lockstep


CHAIN_BATCH = 64  # sequences advancing in lockstep: every drafter call carries ~CHAIN_BATCH*2 blocks


@torch.inference_mode()
def run_chain(drafter: Drafter, head: Head, seqs: list[Sequence], budget: int = 8, batch: int = CHAIN_BATCH,
              progress: Callable[[int, int], None] | None = None) -> tuple[list[PromptResult], dict]:
    """Replay computing only the anchors the chain walk (and the DDTree walk, with `budget`) visits.

    The sequences of a batch advance in lockstep: each step drafts, for every unfinished sequence, the block
    at its chain anchor and at its tree anchor in ONE batched call over their stacked context K/V (finished
    sequences are dropped from the stack as they end). Rounds, drafts, acceptance and tree acceptance at the
    visited anchors equal the every-anchor mode's; the other anchors hold -1 (drafts, accepted) and NaN
    (log-probabilities), so metrics that need every anchor are not computed (`metrics`)."""
    results: list[PromptResult] = []
    for b0 in range(0, len(seqs), batch):
        results += _chain_batch(drafter, head, seqs[b0:b0 + batch], budget)
        if progress:
            progress(min(b0 + batch, len(seqs)), len(seqs))
    return results, summarize(results, drafter.c.block_size, budget)


def _stack_features(drafter: Drafter, seqs: list[Sequence]) -> torch.Tensor:
    """Features of `seqs` padded with zeros to one length and stacked on the drafter's device: [S, T, K*H]."""
    T = max(len(s.tokens) for s in seqs)
    out = torch.zeros(len(seqs), T, seqs[0].features.shape[1], dtype=seqs[0].features.dtype,
                      device=seqs[0].features.device)
    for j, s in enumerate(seqs):
        out[j, :len(s.tokens)] = s.features
    return _upload(drafter, out)


def _chain_batch(drafter: Drafter, head: Head, seqs: list[Sequence], budget: int) -> list[PromptResult]:
    B, k, dev = drafter.c.block_size, max(budget, 1), drafter.device
    D = B - 1
    kv = drafter.context_kv(_stack_features(drafter, seqs))             # per layer k, v [S, nkv, T, hd]
    toks = [s.tokens.numpy() for s in seqs]
    T_pad = max(len(t) for t in toks)
    tok_pad = torch.zeros(len(seqs), T_pad, dtype=torch.long)
    for j, t in enumerate(toks):
        tok_pad[j, :len(t)] = torch.from_numpy(t)
    tok_pad = tok_pad.to(head.embed.device)
    A = [len(t) - s.prompt_len for t, s in zip(toks, seqs)]
    acc = [np.full(a, -1, dtype=np.int64) for a in A]                  # accepted(p), -1: not computed
    tacc = [np.full(a, -1, dtype=np.int64) for a in A]
    drafts = [np.full((a, D), -1, dtype=np.int64) for a in A]
    logp = [np.full((a, D), np.nan, dtype=np.float32) for a in A]
    chain = [s.prompt_len for s in seqs]                               # next chain anchor per sequence
    tree = [s.prompt_len if budget else len(t) for s, t in zip(seqs, toks)]  # next tree anchor (none: done)
    rounds: list[list[int]] = [[] for _ in seqs]
    anchors_of: list[list[int]] = [[] for _ in seqs]
    tree_rounds: list[list[int]] = [[] for _ in seqs]
    G = 2 if budget else 1                                             # blocks per sequence per step
    rows = list(range(len(seqs)))                                      # sequences in the stack, in kv order
    while True:
        live = [j for j in rows if chain[j] < len(toks[j]) - 1 or tree[j] < len(toks[j]) - 1]
        if not live:
            break
        if len(live) <= 0.75 * len(rows):                              # drop finished sequences from the stack
            keep = torch.tensor([rows.index(j) for j in live], device=dev)
            kv = [(kk.index_select(0, keep), vv.index_select(0, keep)) for kk, vv in kv]
            rows = live
        want = []                                                      # G anchors per stacked sequence
        for j in rows:
            last = len(toks[j]) - 1
            a = [p for p in (chain[j], tree[j]) if p < last] or [seqs[j].prompt_len - 1]  # done: a spare block
            want += (a + a[:1] * G)[:G] if G == 2 else [a[0]]
        anchors = torch.tensor(want, device=dev)
        seq_rows = torch.tensor([j for j in rows for _ in range(G)], device=tok_pad.device)
        ids = torch.full((len(want), B), drafter.c.mask_token_id, dtype=torch.long, device=tok_pad.device)
        ids[:, 0] = tok_pad[seq_rows, anchors.to(tok_pad.device)]
        emb = head.embed[ids].to(dev, drafter.dtype)                   # [N, B, H]
        h = drafter.blocks(kv, anchors, emb, max_anchor=max(want))
        d_tok, top_ids, top_lp = (t.cpu().numpy() for t in _head(drafter, head, h, k))
        for n, p in enumerate(want):
            j = rows[n // G]
            T, P, a = len(toks[j]), seqs[j].prompt_len, p - seqs[j].prompt_len
            if chain[j] >= T - 1 and tree[j] >= T - 1:                 # finished, still stacked: nothing to keep
                continue
            if drafts[j][a, 0] == -1:
                drafts[j][a], logp[j][a] = d_tok[n], top_lp[n, :, 0]
                m = min(D, T - 1 - p)
                ok = d_tok[n, :m] == toks[j][p + 1:p + 1 + m]
                acc[j][a] = m if ok.all() else int(np.argmin(ok))
            if budget and p == tree[j] and tacc[j][a] == -1:
                tacc[j][a] = tree_accept(top_ids[n], top_lp[n], toks[j][p + 1:min(T, p + D + 1)], budget)
        for j in rows:
            T, P = len(toks[j]), seqs[j].prompt_len
            if chain[j] < T - 1:
                c = min(int(acc[j][chain[j] - P]) + 1, T - 1 - chain[j])
                rounds[j].append(c)
                anchors_of[j].append(chain[j])
                chain[j] += c
            if budget and tree[j] < T - 1:
                c = min(int(tacc[j][tree[j] - P]) + 1, T - 1 - tree[j])
                tree_rounds[j].append(c)
                tree[j] += c
    out = []
    for j, s in enumerate(seqs):
        r = PromptResult(s.id, s.prompt_len, acc[j].tolist(), drafts[j].tolist(), rounds[j], anchors_of[j],
                         draft_logp=logp[j].tolist())
        if budget:
            r.tree_at, r.tree_rounds = tacc[j].tolist(), tree_rounds[j]
        out.append(r)
    return out
