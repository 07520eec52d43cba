"""Every-anchor replay, chain walk, metrics and DDTree (SPEC 2 and 3).

Contract: tensors in, numbers out. No files, no HTTP, no store. The metrics themselves are defined once in
`metrics` (the registry); `summarize` applies it. A sequence is prompt + completion token
ids [T] with its cached features [T, K*H]; the completion starts at position P (the prompt length).
For every completion anchor p in P..T-1 the drafter drafts d_1..d_{B-1} for positions p+1..p+B-1;
`accepted(p)` counts leading drafts equal to the tokens, inside the completion only. The chain walk then
reproduces a greedy speculative decoder: anchor P first, then anchor += accepted + 1 (capped). Each chain round
also keeps its whole block: the top-K candidates of every slot with their probabilities (`round_top`, K =
ROUND_TOPK), in both anchor modes, and with a tree budget DDTree's acceptance at its anchor (`tree_at`).
"""

from __future__ import annotations

import heapq
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace

import numpy as np
import torch

from . import drafter as drafter_mod
from . import metrics
from .drafter import Drafter
from .target import Head
from .walk import walk


@dataclass
class Drafts:
    tokens: torch.Tensor  # [A, B-1] argmax drafts at anchors P..T-1 (A = T-P)
    top_ids: torch.Tensor  # [A, B-1, k] top-k tokens per slot (k = max(tree budget, ROUND_TOPK): slot 0 is the draft)
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


TOP_BLOCK, TOP_WARPS = 4096, 8  # logits per tile of the CUDA top-k kernel, and its warps per row


def _top_triton():
    """A Triton kernel reading each row of logits [R, V] once: top-k (descending; among equal values the
    lower id first, so slot 0 is torch.argmax) and log-sum-exp in fp32. Built on first use."""
    import triton
    import triton.language as tl

    @triton.jit
    def top_rows(
        x_ptr,
        stride,
        val_ptr,
        idx_ptr,
        lse_ptr,
        V: tl.constexpr,
        K: tl.constexpr,
        KP: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        lanes = tl.arange(0, BLOCK)
        slots = tl.arange(0, KP)
        m = tl.full([BLOCK], -1e30, tl.float32)  # running max per lane (finite: no inf - inf)
        s = tl.zeros([BLOCK], tl.float32)  # running sum of exp(x - m) per lane
        bv = tl.where(slots < K, float("-inf"), float("inf"))  # best K values so far (pad slots: never out)
        bi = tl.zeros([KP], tl.int32)  # their ids
        for off in range(0, V, BLOCK):
            x = tl.load(x_ptr + row * stride + off + lanes, mask=off + lanes < V, other=float("-inf"))
            x = x.to(tl.float32)
            e = tl.exp(-tl.abs(x - m))  # one exp per element (x = -inf: 0)
            s = tl.where(x > m, s * e + 1.0, s + e)  # the lane's sum, rescaled to its new max
            m = tl.maximum(m, x)
            while tl.max(x, 0) > tl.min(bv, 0):  # the tile's best beats the K-th best
                i = tl.argmax(x, 0, tie_break_left=True)
                out = tl.argmax(tl.where(bv == tl.min(bv, 0), bi, -1), 0)  # K-th best (of equals, last id)
                bv = tl.where(slots == out, tl.max(x, 0), bv)
                bi = tl.where(slots == out, off + i, bi)
                x = tl.where(lanes == i, float("-inf"), x)
        mx = tl.max(m, 0)
        tl.store(lse_ptr + row, mx + tl.log(tl.sum(s * tl.exp(m - mx), 0)))
        live = slots < K
        for j in tl.static_range(K):  # sorted: value down, then id up
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
        top_rows[(R,)](
            x,
            x.stride(0),
            vals,
            ids,
            lse,
            V=V,
            K=k,
            KP=max(2, triton.next_power_of_2(k)),
            BLOCK=TOP_BLOCK,
            num_warps=TOP_WARPS,
        )
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


def _head(drafter: Drafter, head: Head, h: torch.Tensor, topk: int, slots: tuple[int, int] | None = None):
    """Normed block states [N, B, H] -> argmax [N, S], top-k ids and log-probs [N, S, k] (on h's device) of the
    drafted slots 1..B-1 (S = B-1), or of block positions slots[0]..slots[1]-1 only.

    Rows go through the LM head HEAD_ROWS at a time and the logits stay in the model dtype (no fp32
    copy of [rows, V]); `top_logp` reads them: log p = logit - logsumexp(logits), in fp32.
    """
    lo, hi = slots or (1, h.shape[1])
    N, B1 = h.shape[0], hi - lo
    x = h[:, lo:hi].reshape(N * B1, -1)
    w = head.lm_head.to(h.device, h.dtype)
    parts = [top_logp(x[r : r + HEAD_ROWS] @ w.T, topk) for r in range(0, x.shape[0], HEAD_ROWS)]
    drafts, ids, logp = (torch.cat([p[i] for p in parts]) for i in range(3))
    return drafts.view(N, B1), ids.view(N, B1, topk), logp.view(N, B1, topk)


def _stack(parts) -> Drafts:
    """Concatenate per-chunk (drafts, ids, logp) and copy them to the CPU once."""
    return Drafts(*(torch.cat([p[i] for p in parts]).cpu() for i in range(3)))


GROUP = 16  # every-anchor: consecutive blocks whose queries share one attention call's keys (`Drafter.blocks`)
REPLICA_BYTES = 4 << 30  # every-anchor: bound on the context K/V copies of one sequence (`_replicas`); a long
# sequence gets fewer groups per call (2,560 tokens at 27B shapes: 16 groups, 0.9 GiB)


def _tail_keys(spare: int, T: int) -> int:
    """Key slots of a `Drafter.blocks(tail=True)` stack: `spare` block slots, then >= T context slots, a multiple of
    KEY_ALIGN in all (the extra slots stay zero and are never visible)."""
    return -(-(spare + T) // drafter_mod.KEY_ALIGN) * drafter_mod.KEY_ALIGN


def _tail_kv(drafter: Drafter, S: int, spare: int, T: int) -> list:
    """Per layer zeroed (k, v) [S, nkv, _tail_keys(spare, T), hd]: the stacked context K/V that
    `Drafter.blocks(tail=True)` takes, the context to be written from slot `spare` on."""
    c = drafter.c
    shape = (S, c.num_key_value_heads, _tail_keys(spare, T), c.head_dim)
    return [
        tuple(torch.zeros(shape, dtype=drafter.dtype, device=drafter.device) for _ in range(2))
        for _ in range(c.num_hidden_layers)
    ]


def _replicas(drafter: Drafter, kv: list, S: int, spare: int) -> list:
    """One sequence's context K/V (per layer [nkv, T, hd]) copied into the S rows of a `_tail_kv` stack. The
    blocks' keys are then written in place at each call instead of each call concatenating [context ; blocks]
    per group."""
    T = kv[0][0].shape[1]
    out = _tail_kv(drafter, S, spare, T)
    for (K, V), (k, v) in zip(out, kv):
        K[:, :, spare : spare + T] = k
        V[:, :, spare : spare + T] = v
    return out


def _draft(
    drafter: Drafter, head: Head, features: torch.Tensor, tokens: torch.Tensor, prompt_len: int, topk: int, chunk: int
) -> list:
    """Queue the every-anchor drafts of one sequence on the device; per-chunk results stay there.

    Each call drafts `chunk` blocks as S groups of G consecutive anchors over the context replicated S times
    (`_replicas`, S bounded by REPLICA_BYTES); a shorter last chunk uses the first groups it needs, its last block
    repeated to fill them."""
    T, dev, c = len(tokens), drafter.device, drafter.c
    B, G = c.block_size, max(1, min(GROUP, chunk))
    per = 2 * c.num_hidden_layers * c.num_key_value_heads * _tail_keys(G * B, T) * c.head_dim  # values a replica
    S = max(1, min(-(-chunk // G), REPLICA_BYTES // (per * drafter.dtype.itemsize)))
    chunk = min(chunk, S * G)
    kv = _replicas(drafter, drafter.context_kv(features.to(dev)), S, G * B)
    tokens = tokens.to(head.embed.device)
    parts = []
    for s in range(prompt_len, T, chunk):
        e = min(s + chunk, T)
        n, s_ = e - s, -(-(e - s) // G)  # blocks, groups used
        anchors = torch.arange(s, s + s_ * G, device=dev).clamp(max=e - 1)  # [s_*G], the last one repeated
        emb = _embed_blocks(drafter, head, tokens, anchors)
        part = kv if s_ == S else [(k[:s_], v[:s_]) for k, v in kv]
        h = drafter.blocks(part, anchors, emb, max_anchor=e - 1, tail=True)
        parts.append(_head(drafter, head, h[:n], topk))
    return parts


def _upload(drafter: Drafter, features: torch.Tensor) -> torch.Tensor:
    """Features to the drafter's device without waiting (pinned, asynchronous) on CUDA."""
    if drafter.device.type != "cuda" or features.is_cuda:
        return features
    return features.pin_memory().to(drafter.device, non_blocking=True)


@torch.inference_mode()
def draft_all(
    drafter: Drafter,
    head: Head,
    features: torch.Tensor,
    tokens: torch.Tensor,
    prompt_len: int,
    topk: int = 0,
    chunk: int = 64,
) -> Drafts:
    """Every-anchor drafts of one sequence: context K/V once, then `chunk` blocks per batched call."""
    return _stack(_draft(drafter, head, features, tokens, prompt_len, topk, chunk))


@torch.inference_mode()
def draft_loop(
    drafter: Drafter, head: Head, features: torch.Tensor, tokens: torch.Tensor, prompt_len: int, topk: int = 0
) -> Drafts:
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
    emb = head.embed[ids].to(dev, drafter.dtype)  # [1, B, H]
    h = drafter.blocks(kv, torch.tensor([anchor], device=dev), emb, max_anchor=anchor)
    return _head(drafter, head, h, 1)[0][0].tolist()


# ---------------------------------------------------------------------------
# acceptance


def accepted(drafts: np.ndarray, tokens: np.ndarray, prompt_len: int) -> np.ndarray:
    """accepted(p) for p = P..T-1: leading drafts equal to tokens[p+1..], inside the completion only."""
    T = len(tokens)
    A, D = drafts.shape
    at = prompt_len + 1 + np.arange(A)[:, None] + np.arange(D)  # [A, D] position each draft guesses
    ok = (at < T) & (drafts == np.asarray(tokens)[np.minimum(at, T - 1)])
    return np.cumprod(ok, axis=1).sum(axis=1).astype(np.int64)  # leading matches


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
    heap = [(-lp[0][0], (0,))]  # (-score, ranks)
    while heap and len(paths) < budget:
        neg, ranks = heapq.heappop(heap)
        d, r = len(ranks), ranks[-1]
        paths.add(tuple(ids[i][ranks[i]] for i in range(d)))
        base = -neg - lp[d - 1][r]
        if r + 1 < k:
            heapq.heappush(heap, (-(base + lp[d - 1][r + 1]), ranks[:-1] + (r + 1,)))
        if d < D:
            heapq.heappush(heap, (neg - lp[d][0], ranks + (0,)))
    target = [int(t) for t in target]
    n = 0
    while n < len(target) and tuple(target[: n + 1]) in paths:
        n += 1
    return n


def tree_accepted(d: Drafts, tokens: np.ndarray, prompt_len: int, budget: int) -> np.ndarray:
    """DDTree acceptance at every completion anchor (0 without a tree walk where the next token is none of the
    first slot's candidates that a tree of `budget` nodes can hold)."""
    T = len(tokens)
    ids, logp = d.top_ids.numpy(), d.top_logp.numpy()
    out = np.zeros(len(ids), dtype=np.int64)
    if not len(ids) or budget <= 0 or 0 in ids.shape[1:]:
        return out
    nxt = np.asarray(tokens)[np.minimum(prompt_len + 1 + np.arange(len(ids)), T - 1)]
    live = np.flatnonzero((ids[:, 0, :budget] == nxt[:, None]).any(axis=1))  # anchors whose slot 1 can match
    for a in live.tolist():
        p = prompt_len + a
        out[a] = tree_accept(ids[a], logp[a], tokens[p + 1 : min(T, p + ids.shape[1] + 1)], budget)
    return out


# ---------------------------------------------------------------------------
# metrics


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


ROUND_TOPK = 4  # K: candidates kept per slot of each chain round's block (the drafts carry at least this many)


def round_top(ids: np.ndarray, logp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The top-K candidates of the blocks at the chain rounds' anchors: ids and log-probs [R, B-1, k] ->
    (ids [R, B-1, K], probabilities [R, B-1, K] in float64), K = min(ROUND_TOPK, k), sorted by probability
    (slot's draft first)."""
    K = min(ROUND_TOPK, ids.shape[-1])
    return ids[..., :K], np.exp(logp[..., :K].astype(np.float64))


def score(pid: str, d: Drafts, tokens: np.ndarray, prompt_len: int, budget: int, arrays: bool = False) -> PromptResult:
    """Acceptance, chain walk and DDTree walk of one sequence from its drafts (`arrays`: the list fields as numpy
    arrays, see `chain`)."""
    T = len(tokens)
    acc = accepted(d.tokens.numpy(), tokens, prompt_len)
    rounds = walk(acc, prompt_len, T)
    r = PromptResult(pid, prompt_len, acc, d.tokens.numpy(), [c for _, _, c in rounds], [p for p, _, _ in rounds])
    if d.top_logp.shape[-1]:  # the log-probability of each argmax draft (calibration)
        r.draft_logp = d.top_logp[:, :, 0].numpy()
        at = np.asarray(r.round_anchors, dtype=np.int64) - prompt_len  # [R] rows of the rounds' anchors
        r.round_top_ids, r.round_top_p = round_top(d.top_ids.numpy()[at], d.top_logp.numpy()[at])
    if budget:
        tacc = tree_accepted(d, tokens, prompt_len, budget)
        r.tree_at, r.tree_rounds = tacc, [c for _, _, c in walk(tacc, prompt_len, T)]
    return r if arrays else listed(r)


def summarize(results: list[PromptResult], B: int, budget: int) -> dict:
    """Run-level metrics of SPEC 3: every entry of the metric registry (`metrics.REGISTRY`)."""
    return metrics.summarize(results, B, budget)


# ---------------------------------------------------------------------------
# whole run


@dataclass
class Sequence:
    id: str
    tokens: torch.Tensor  # [T] prompt + completion ids
    prompt_len: int  # P
    features: torch.Tensor  # [T, K*H]


def run(
    drafter: Drafter,
    head: Head,
    seqs: list[Sequence],
    budget: int = 8,
    chunk: int = 64,
    progress: Callable[[int, int], None] | None = None,
    arrays: bool = False,
) -> tuple[list[PromptResult], dict]:
    """Replay every sequence (every-anchor, batched) and summarise (`arrays`: results as `score(arrays=True)` and
    no summary, None: a worker's share, summarised by the parent).

    Scoring (CPU: acceptance, chain and DDTree walks) of sequence i runs on a worker thread once the
    device's queue holds sequence i+1's work, and the next features are uploaded meanwhile; results come
    back in input order.
    """
    with ThreadPoolExecutor(1) as pool, torch.inference_mode():
        futures, done = [], None
        nxt = _upload(drafter, seqs[0].features) if seqs else None
        for i, s in enumerate(seqs):
            parts = _draft(drafter, head, nxt, s.tokens, s.prompt_len, max(budget, ROUND_TOPK), chunk)  # queued
            if done is not None:  # started only now: its thread would slow the launches above (the GIL)
                futures.append(pool.submit(score, *done))
            if i + 1 < len(seqs):
                nxt = _upload(drafter, seqs[i + 1].features)
            done = (s.id, _stack(parts), s.tokens.numpy(), s.prompt_len, budget, arrays)
            if len(futures) > 1:
                futures[-2].result()  # at most one sequence scoring behind; its errors surface here
            if progress:
                progress(i + 1, len(seqs))
        if done is not None:
            futures.append(pool.submit(score, *done))
        results = [f.result() for f in futures]
    return results, summarize(results, drafter.c.block_size, budget) if not arrays else None


# ---------------------------------------------------------------------------
# chain-only replay: only the anchors the walks visit, many sequences in lockstep


CHAIN_BATCH = 256  # sequences advancing in lockstep: one block each per step (~4,000 query rows per matmul)
CTX_SEQS = 16  # sequences whose context K/V are computed at once (bounds the fp32 temporaries)
CHAIN_HALVES = 2  # with a tree budget: stacks whose steps alternate (host scoring overlaps the device)
DROP_AT = 0.875  # drop finished sequences from the stack once the live ones are this share or fewer
HEAD_STAGES = (4, 8)  # DDTree off: drafted slots split here; a later stage's LM head only for the rows whose
# drafts were all accepted so far (the walk reads no slot after the first rejected one)


def run_chain(
    drafter: Drafter,
    head: Head,
    seqs: list[Sequence],
    budget: int = 8,
    batch: int = CHAIN_BATCH,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[PromptResult], dict]:
    """`chain` and the run's metrics (`summarize`)."""
    results = chain(drafter, head, seqs, budget, batch, progress)
    return results, summarize(results, drafter.c.block_size, budget)


@torch.inference_mode()
def chain(
    drafter: Drafter,
    head: Head,
    seqs: list[Sequence],
    budget: int = 8,
    batch: int = CHAIN_BATCH,
    progress: Callable[[int, int], None] | None = None,
    arrays: bool = False,
) -> list[PromptResult]:
    """Replay computing only the anchors the chain walk (and the DDTree walk, with `budget`) visits.

    The sequences of a batch advance in lockstep over their stacked context K/V: each step drafts ONE block per
    sequence, at the smaller of its two walks' next anchors that is not computed yet (an anchor both walks
    visit is computed once; finished sequences are dropped from the stack as they end). Without a tree budget
    the chain walk runs on the device (the host reads only row counts) and the LM head computes only the slots
    the walk reads (`HEAD_STAGES`): at a visited anchor the slots after the first rejected draft hold -1 and
    NaN. With a tree budget each step's top-k comes back to the host for the DDTree acceptance. Rounds,
    acceptance, tree acceptance, and the drafts and rounds' top-K of every computed slot equal the every-anchor
    mode's; the other anchors hold -1 (drafts, accepted) and NaN (log-probabilities), so metrics that need
    every anchor (or every slot: the expected tau) are not computed (`metrics`). `arrays`: the results' list
    fields are numpy arrays (no Python lists built: a worker packs them as they are; `listed` converts)."""
    results: list[PromptResult] = []
    for b0 in range(0, len(seqs), batch):
        results += _chain_batch(drafter, head, seqs[b0 : b0 + batch], budget, arrays)
        if progress:
            progress(min(b0 + batch, len(seqs)), len(seqs))
    return results


def listed(r: PromptResult, keep_2d: bool = False) -> PromptResult:
    """`r` with its numpy fields (`chain(arrays=True)`) as lists; `keep_2d`: only the 1-D ones (the store step
    reads the drafts, log-probabilities and round blocks as arrays too, and their lists are its largest cost)."""
    return replace(
        r,
        **{
            f.name: v.tolist()
            for f in fields(r)
            if isinstance(v := getattr(r, f.name), np.ndarray) and (v.ndim == 1 or not keep_2d)
        },
    )


def _stack_features(drafter: Drafter, seqs: list[Sequence]) -> torch.Tensor:
    """Features of `seqs` padded with zeros to one length and stacked on the drafter's device: [S, T, K*H]."""
    T = max(len(s.tokens) for s in seqs)
    out = torch.zeros(
        len(seqs), T, seqs[0].features.shape[1], dtype=seqs[0].features.dtype, device=seqs[0].features.device
    )
    for j, s in enumerate(seqs):
        out[j, : len(s.tokens)] = s.features
    return _upload(drafter, out)


class _Lockstep:
    """Device state of one chain-only batch: the stacked context K/V (after spare key slots for one block per
    sequence, `Drafter.blocks(tail=True)`), the tokens, and per-anchor result buffers [S, A+1, ...] (A = the
    longest completion; column A takes the blocks of finished sequences, which are never read)."""

    def __init__(self, drafter: Drafter, head: Head, seqs: list[Sequence], k: int, staged: bool = False):
        c, dev = drafter.c, drafter.device
        self.d, self.head, self.k, self.D, self.staged = drafter, head, k, c.block_size - 1, staged
        S, self.T_pad = len(seqs), max(len(s.tokens) for s in seqs)
        self.P = torch.tensor([s.prompt_len for s in seqs], device=dev)
        self.T = torch.tensor([len(s.tokens) for s in seqs], device=dev)
        tok = torch.zeros(S, self.T_pad, dtype=torch.long)
        for j, s in enumerate(seqs):
            tok[j, : len(s.tokens)] = s.tokens
        self.tok = tok.to(dev)
        self.A = A = max([len(s.tokens) - s.prompt_len for s in seqs] + [1])
        B = c.block_size
        self.kv = _tail_kv(drafter, S, B, self.T_pad)  # a block's slots, then context slots >= T_pad
        for s0 in range(0, S, CTX_SEQS):  # context K/V a few sequences at a time, into the stack
            for (K, V), (k_, v_) in zip(
                self.kv, drafter.context_kv(_stack_features(drafter, seqs[s0 : s0 + CTX_SEQS]))
            ):
                K[s0 : s0 + len(k_), :, B : B + k_.shape[-2]] = k_
                V[s0 : s0 + len(v_), :, B : B + v_.shape[-2]] = v_
        kk = min(ROUND_TOPK, k)
        self.acc = torch.full((S, A + 1), -1, dtype=torch.long, device=dev)
        self.drafts = torch.full((S, A + 1, self.D), -1, dtype=torch.long, device=dev)
        self.top_ids = torch.full((S, A + 1, self.D, kk), -1, dtype=torch.long, device=dev)
        self.top_lp = torch.full((S, A + 1, self.D, kk), float("nan"), dtype=torch.float32, device=dev)
        self.rows = torch.arange(S, device=dev)  # the sequence of each stacked row
        self.slot = torch.arange(self.D, device=dev)

    def keep(self, idx: torch.Tensor) -> None:
        """Keep only the stacked rows `idx` (the others' sequences are finished)."""
        self.kv = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in self.kv]
        self.rows = self.rows[idx]

    def shrink(self, live: torch.Tensor) -> torch.Tensor | None:
        """Drop finished rows, keeping `live` (stacked row indices), and a finished row beside a lone live one: it
        drafts a spare block. One row is a shape the compiled kernels specialise on (dynamic shapes except 0 and
        1), and its recompile cost about 0.9 s on the H200 in a process's first walk (`bench_walk_cold.py`).
        Returns the rows kept, or None when nothing was dropped."""
        n = len(self.rows)
        idx = torch.stack([live[0], (live[0] + 1) % n]) if len(live) == 1 and n > 1 else live
        if len(idx) == n:
            return None
        self.keep(idx.to(self.rows.device))
        return idx

    def step(self, anchors: torch.Tensor, record: torch.Tensor, top: int):
        """One block per stacked row at `anchors` [R] (device, each <= `top`: the attention reads context keys
        below it only); rows with `record` store their drafts, acceptance and top-K at their anchor's column.
        Returns (accepted [R], top ids, top log-probs [R, D, k])."""
        d, c, seq = self.d, self.d.c, self.rows
        ids = torch.full((len(seq), c.block_size), c.mask_token_id, dtype=torch.long, device=seq.device)
        ids[:, 0] = self.tok[seq, anchors]
        emb = self.head.embed[ids.to(self.head.embed.device)].to(d.device, d.dtype)
        h = d.blocks(self.kv, anchors, emb, max_anchor=top, tail=True)  # [R, B, H]
        nxt = self.tok[seq[:, None], (anchors[:, None] + 1 + self.slot).clamp(max=self.T_pad - 1)]
        inside = (self.slot < (self.T[seq] - 1 - anchors)[:, None]) & record[:, None]  # in the completion (and
        # recorded: a spare block accepts none)
        if self.staged:
            d_tok, t_ids, t_lp, acc = self._staged(h, nxt, inside)
        else:
            d_tok, t_ids, t_lp = _head(d, self.head, h, self.k)
            nxt = self.follow(nxt, d_tok, inside, self.D)
            acc = ((d_tok == nxt) & inside).long().cumprod(1).sum(1)  # accepted(p), as `accepted`
        col = torch.where(record, anchors - self.P[seq], self.A)
        kk = self.top_ids.shape[-1]
        self.acc[seq, col] = acc
        self.drafts[seq, col] = d_tok
        self.top_ids[seq, col] = t_ids[..., :kk]
        self.top_lp[seq, col] = t_lp[..., :kk]
        return acc, t_ids, t_lp

    def follow(self, nxt: torch.Tensor, d_tok: torch.Tensor, inside: torch.Tensor, upto: int) -> torch.Tensor:
        """The tokens after each row's anchor [R, D] that the acceptance compares with the drafts, once the drafts of
        slots < `upto` are known: `nxt` itself. (A benchmark's subclass writes planted completions here, drafts the
        replay will reproduce exactly: `benchmarks/bench_sweep.py`.)"""
        return nxt

    def _staged(self, h: torch.Tensor, nxt: torch.Tensor, inside: torch.Tensor):
        """The LM head of `step` in HEAD_STAGES: slots 1..4 of every row, then 5..8 of the rows that accepted all
        four (and reach slot 5), and so on. Each later stage reads its row count (a host sync; the device is
        busy with the block's layers meanwhile). Slots not computed hold -1 (drafts, ids) and NaN
        (log-probabilities). Returns (drafts [R, D], top ids, top log-probs [R, D, k], accepted [R])."""
        R, D, k, dev = h.shape[0], self.D, self.k, h.device
        d_tok = torch.full((R, D), -1, dtype=torch.long, device=dev)
        t_ids = torch.full((R, D, k), -1, dtype=torch.long, device=dev)
        t_lp = torch.full((R, D, k), float("nan"), dtype=torch.float32, device=dev)
        acc, rows = torch.zeros(R, dtype=torch.long, device=dev), None
        cuts = [0] + [c for c in HEAD_STAGES if 0 < c < D] + [D]
        for s0, s1 in zip(cuts, cuts[1:]):
            if s0:
                rows = ((acc == s0) & inside[:, s0]).nonzero().squeeze(1)  # all accepted so far, slot s0 inside
                if not len(rows):
                    break
            at = slice(None) if rows is None else rows
            dt, ti, tl = _head(self.d, self.head, h[at], k, (1 + s0, 1 + s1))
            d_tok[at, s0:s1], t_ids[at, s0:s1], t_lp[at, s0:s1] = dt, ti, tl
            nxt = self.follow(nxt, d_tok, inside, s1)
            acc = ((d_tok == nxt) & inside).long().cumprod(1).sum(1)
        return d_tok, t_ids, t_lp, acc


class _Count:
    """Device counts read back without stalling the queue: copied to pinned memory behind an event."""

    def __init__(self, t: torch.Tensor):
        self.ev = None
        if t.is_cuda:
            self.host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self.host.copy_(t, non_blocking=True)
            self.ev = torch.cuda.Event()
            self.ev.record()
        else:
            self.host = t

    def get(self) -> list[int]:
        if self.ev is not None:
            self.ev.synchronize()
        return self.host.tolist()


def _walk_device(st: _Lockstep) -> None:
    """The chain walk on the device (no tree budget): per step one block per sequence at its chain anchor, the
    acceptance and the next anchor computed there. The host reads, a step behind, the count of walks still
    going (to stop and to drop finished sequences) and their furthest anchor (a step advances an anchor by at
    most B, so the host bounds the next step's anchors and the attention reads no key past them); the staged LM
    head (`_Lockstep._staged`) reads its row counts mid-step."""
    pos, last = st.P.clone(), st.T - 1  # chain anchor and last position, per stacked row
    if not bool((pos < last).any()):
        return
    B, p_max = st.d.c.block_size, int(st.P.max())
    pending, hi = None, p_max  # hi: furthest live anchor known (a step behind)
    while True:
        live = pos < last
        # finished rows draft a spare block at their prompt's end (never recorded, never past `top`)
        acc = st.step(torch.where(live, pos, st.P[st.rows]), live, max(hi + B, p_max))[0]
        pos = torch.where(live, pos + torch.minimum(acc + 1, last - pos), pos)
        going = pos < last
        count = _Count(torch.stack([going.sum(), torch.where(going, pos, 0).max()]))
        if pending is not None:
            n, hi = pending.get()  # the step before this one: this one stays queued
            if n == 0:
                return
            if n <= DROP_AT * len(pos):
                idx = (pos < last).nonzero().squeeze(1)
                if not len(idx):  # every walk ended in the step just queued
                    return
                if (idx := st.shrink(idx)) is not None:
                    pos, last = pos[idx], last[idx]
        pending = count


class _HostWalk:
    """Chain and DDTree walks on the host (tree budget > 0) over one `_Lockstep`: per step one block per
    sequence, at the smaller of the two walks' next anchors not computed yet; its acceptance and top-k (slots
    1..min(budget, B-1): the deepest a tree of `budget` nodes reaches) come back once per step, copied behind
    an event so that another walk's step can be queued meanwhile (`launch`, then `collect`)."""

    def __init__(self, st: _Lockstep, seqs: list[Sequence], budget: int):
        self.st, self.seqs, self.budget, self.Dt = st, seqs, budget, min(budget, st.D)
        self.toks = [s.tokens.numpy() for s in seqs]
        self.acc = [np.full(len(t) - s.prompt_len, -1, dtype=np.int64) for t, s in zip(self.toks, seqs)]
        self.tacc = [np.full(len(t) - s.prompt_len, -1, dtype=np.int64) for t, s in zip(self.toks, seqs)]
        self.tops: list[dict] = [{} for _ in seqs]  # computed anchor -> top ids, log-probs [Dt, k]
        self.chain = [s.prompt_len for s in seqs]
        self.tree = [s.prompt_len for s in seqs]
        self.tree_rounds: list[list[int]] = [[] for _ in seqs]
        self.rows = list(range(len(seqs)))  # sequences in the stack, in kv order
        self.pending = None

    def _tree_at(self, j: int, a: int) -> int:
        if self.tacc[j][a] < 0:
            p, T = a + self.seqs[j].prompt_len, len(self.toks[j])
            self.tacc[j][a] = tree_accept(
                *self.tops[j][a], self.toks[j][p + 1 : min(T, p + self.st.D + 1)], self.budget
            )
        return int(self.tacc[j][a])

    def _next(self, j: int) -> int | None:
        """Advance both walks over computed anchors; the next anchor to compute (None: both done)."""
        T, P, acc = len(self.toks[j]), self.seqs[j].prompt_len, self.acc[j]
        while True:
            c, t = self.chain[j], self.tree[j]
            if c < T - 1 and acc[c - P] >= 0:
                self._tree_at(j, c - P)  # DDTree acceptance at every chain round too
                self.chain[j] += min(int(acc[c - P]) + 1, T - 1 - c)
            elif t < T - 1 and t - P in self.tops[j]:
                n = min(self._tree_at(j, t - P) + 1, T - 1 - t)
                self.tree_rounds[j].append(n)
                self.tree[j] += n
            else:
                break
        todo = [p for p in (self.chain[j], self.tree[j]) if p < T - 1]
        return min(todo) if todo else None

    def launch(self) -> bool:
        """Queue the next step on the device; False when every walk of this stack is done."""
        st, dev = self.st, self.st.d.device
        want = {j: self._next(j) for j in self.rows}
        live = [j for j in self.rows if want[j] is not None]
        if not live:
            return False
        if len(live) <= DROP_AT * len(self.rows):  # drop finished sequences from the stack
            if (idx := st.shrink(torch.tensor([self.rows.index(j) for j in live]))) is not None:
                self.rows = [self.rows[i] for i in idx.tolist()]
        at = [self.seqs[j].prompt_len if want[j] is None else want[j] for j in self.rows]  # finished: a spare block
        record = torch.tensor([want[j] is not None for j in self.rows], device=dev)
        acc, ids, lp = st.step(torch.tensor(at, device=dev), record, max(at))
        out = [acc, ids[:, : self.Dt], lp[:, : self.Dt]]
        ev = None
        if dev.type == "cuda":  # to pinned memory without waiting
            out = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True) for t in out]
            ev = torch.cuda.Event()
            ev.record()
        self.pending = (ev, [(j, want[j]) for j in self.rows], out)
        return True

    def collect(self) -> None:
        """Wait for the last queued step and store its acceptance and top-k."""
        ev, want, out = self.pending
        if ev is not None:
            ev.synchronize()
        acc, ids, lp = (t.numpy() for t in out)
        for n, (j, p) in enumerate(want):
            if p is not None:
                a = p - self.seqs[j].prompt_len
                self.acc[j][a], self.tops[j][a] = acc[n], (ids[n], lp[n])


def _walk_host(sts: list[_Lockstep], parts: list[list[Sequence]], budget: int) -> list[_HostWalk]:
    """Run the host walks of several stacks interleaved: while one stack's step runs on the device, the host
    scores the other's and queues its next step (ping-pong), so the device does not wait on the host."""
    walks = [_HostWalk(st, p, budget) for st, p in zip(sts, parts)]
    active = [w for w in walks if w.launch()]
    while active:
        for w in list(active):
            w.collect()
            if not w.launch():
                active.remove(w)
    return walks


def _computed(st: _Lockstep):
    """A lockstep's results on the host, the computed anchors only (acceptance >= 0: about one anchor in tau,
    gathered on the device so that the copy is that much smaller): (acceptance [S, A], start [S+1] (sequence j's
    computed anchors are rows start[j]:start[j+1], in anchor order), their columns [N], drafts [N, D], top ids
    and top log-probs [N, D, k])."""
    acc = st.acc[:, : st.A]
    at = (acc >= 0).nonzero()  # [N, 2] (sequence, column), row-major
    seq, col = at[:, 0], at[:, 1]
    drafts, ids, lp = (t[seq, col].cpu().numpy() for t in (st.drafts, st.top_ids, st.top_lp))
    start = np.zeros(len(acc) + 1, dtype=np.int64)
    np.cumsum(np.bincount(seq.cpu().numpy(), minlength=len(acc)), out=start[1:])
    return acc.cpu().numpy(), start, col.cpu().numpy(), drafts, ids, lp


def _spread(x: np.ndarray, cols: np.ndarray, n: int, fill) -> np.ndarray:
    """Rows `x` [N, ...] at columns `cols` of a new [n, ...] array, `fill` elsewhere."""
    out = np.full((n,) + x.shape[1:], fill, dtype=x.dtype)
    out[cols] = x
    return out


def _chain_batch(drafter: Drafter, head: Head, seqs: list[Sequence], budget: int, arrays: bool) -> list[PromptResult]:
    k = max(budget, ROUND_TOPK)
    # with a tree budget, CHAIN_HALVES stacks alternate (host scoring of one overlaps the other's step)
    n = max(1, min(CHAIN_HALVES if budget else 1, len(seqs)))
    parts = [seqs[i * len(seqs) // n : (i + 1) * len(seqs) // n] for i in range(n)]
    sts = [_Lockstep(drafter, head, p, k, staged=not budget) for p in parts]
    walks = _walk_host(sts, parts, budget) if budget else None
    if not budget:
        _walk_device(sts[0])
    out = []
    for h, (st, part) in enumerate(zip(sts, parts)):
        acc, start, cols, drafts, ids, lp = _computed(st)
        for j, s in enumerate(part):
            T, P = len(s.tokens), s.prompt_len
            rows = slice(start[j], start[j + 1])  # this sequence's computed anchors, in order
            rounds = walk(acc[j, : T - P], P, T)
            r = PromptResult(
                s.id,
                P,
                acc[j, : T - P],
                _spread(drafts[rows], cols[rows], T - P, -1),
                [c for _, _, c in rounds],
                [p for p, _, _ in rounds],
                draft_logp=_spread(lp[rows, :, 0], cols[rows], T - P, np.nan),
            )
            if rounds:
                at = start[j] + np.searchsorted(cols[rows], np.asarray(r.round_anchors, dtype=np.int64) - P)
                r.round_top_ids, r.round_top_p = round_top(ids[at], lp[at])
            if budget:
                r.tree_at, r.tree_rounds = walks[h].tacc[j], walks[h].tree_rounds[j]
            out.append(r if arrays else listed(r))
    return out
