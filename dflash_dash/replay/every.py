"""Every-anchor replay: the drafter's block at every completion anchor of every sequence, batched.

Contract: tensors in, numbers out. `every_anchor(drafter, head, seqs)` drafts a block at every completion
anchor of each `Sequence` (context K/V once per sequence, `chunk` blocks per batched call: over replicas of it,
`DFlash.blocks_in_place`, or past LONG tokens over the one copy, `DFlash.blocks_run`), scores each sequence on a
worker thread while the device drafts the next, and returns the per-prompt results and the run's summary.
`draft_all` is one sequence's drafts, `draft_loop` the reference (one plain block forward per anchor), `draft_one`
the drafts of one block (the speculative stand-in).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ..drafters import Drafter, DrafterConfig, kernels
from ..metrics import Prompt
from ..sampling import Top
from ..target import Head
from ..walks import ROUND_TOPK
from .expect import Rows, Sampling
from .head import Drafts, embed_blocks, read_out, to_host
from .score import score, summarize


@dataclass
class Sequence:
    id: str
    tokens: torch.Tensor  # [T] prompt + completion ids
    prompt_len: int  # P
    features: torch.Tensor  # [T, K*H]
    top: Top | None = None  # the target's stored top-K over the completion (an expected-acceptance pass reads it)


GROUP = 16  # every-anchor: consecutive blocks whose queries share one attention call's keys (`DFlash.blocks_in_place`)
LONG = 8192  # every-anchor: sequences longer than this many tokens draft through `DFlash.blocks_run` (context K/V
# once, the keys every block of a call sees attended unmasked); shorter ones through the replicas below
REPLICA_BYTES = 4 << 30  # every-anchor: bound on the context K/V copies of one sequence (`_replicas`); a long
# sequence gets fewer groups per call (2,560 tokens at 27B shapes: 16 groups, 0.9 GiB)


def kv_bytes(drafter: Drafter) -> int:
    """Bytes of context K/V one token takes across the drafter's layers (keys and values, its dtype)."""
    c = drafter.c
    return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * drafter.dtype.itemsize


def tail_keys(spare: int, T: int) -> int:
    """Key slots of a `DFlash.blocks_in_place` stack: `spare` block slots, then >= T context slots, a multiple of
    KEY_ALIGN in all (the extra slots stay zero and are never visible)."""
    return -(-(spare + T) // kernels.KEY_ALIGN) * kernels.KEY_ALIGN


def tail_kv(drafter: Drafter, S: int, spare: int, T: int) -> list:
    """Per layer zeroed (k, v) [S, nkv, tail_keys(spare, T), hd]: the stacked context K/V that
    `DFlash.blocks_in_place` takes, the context to be written from slot `spare` on."""
    c = drafter.c
    shape = (S, c.num_key_value_heads, tail_keys(spare, T), c.head_dim)
    return [
        tuple(torch.zeros(shape, dtype=drafter.dtype, device=drafter.device) for _ in range(2))
        for _ in range(c.num_hidden_layers)
    ]


def _replicas(drafter: Drafter, kv: list, S: int, spare: int) -> list:
    """One sequence's context K/V (per layer [nkv, T, hd]) copied into the S rows of a `tail_kv` stack. The
    blocks' keys are then written in place at each call instead of each call concatenating [context ; blocks]
    per group."""
    T = kv[0][0].shape[1]
    out = tail_kv(drafter, S, spare, T)
    for (K, V), (k, v) in zip(out, kv):
        K[:, :, spare : spare + T] = k
        V[:, :, spare : spare + T] = v
    return out


def _draft(
    drafter: Drafter,
    head: Head,
    features: torch.Tensor,
    tokens: torch.Tensor,
    prompt_len: int,
    topk: int,
    chunk: int,
    anchors: Callable[[int, int], None] | None = None,
    rows: Rows | None = None,
) -> list:
    """Queue the every-anchor drafts of one sequence on the device; per-chunk results stay there. A sequence of
    more than LONG tokens drafts through `_draft_long` (telling `anchors(done, total)` as its runs are queued), a
    shorter one through `_draft_groups`. `rows`: the sequence's target rows, each chunk's alpha bounds added. A
    drafter with `stack` > 1 drafts `chunk` x stack blocks per call, GROUP x stack per attention group: the
    same rows per forward as a block-16 drafter (the drafts do not depend on how blocks are batched)."""
    tokens = tokens.to(head.embed.device)
    chunk *= drafter.stack
    if len(tokens) > LONG:
        return _draft_long(drafter, head, features, tokens, prompt_len, topk, chunk, anchors, rows)
    return _draft_groups(drafter, head, features, tokens, prompt_len, topk, chunk, rows)


def _read(drafter: Drafter, head: Head, h, tokens, at: torch.Tensor, topk: int, rows: Rows | None) -> tuple:
    """`read_out` of blocks at anchors `at` (with confidence), and with `rows` their alpha bounds [n, D, 2]: the
    rejection rule's overlap heard through the read-out's tap, target-sample's from the drafts."""
    first = tokens[at.to(tokens.device)]
    if rows is None:
        return read_out(drafter, head, h, first, topk, confidence=True)
    seq = torch.zeros_like(at)
    tap = rows.tap(seq, at, drafter.drafts)
    out = read_out(drafter, head, h, first, topk, confidence=True, tap=tap)
    return (*out, rows.alpha(seq, at, out[0], tap))


def _draft_groups(
    drafter: Drafter, head: Head, features, tokens, prompt_len: int, topk: int, chunk: int, rows=None
) -> list:
    """Each call drafts `chunk` blocks as S groups of G consecutive anchors over the context replicated S times
    (`_replicas`, S bounded by REPLICA_BYTES); a shorter last chunk uses the first groups it needs, its last block
    repeated to fill them."""
    T, dev, c = len(tokens), drafter.device, drafter.c
    B, G = c.block_size, max(1, min(GROUP * drafter.stack, chunk))
    S = max(1, min(-(-chunk // G), REPLICA_BYTES // (kv_bytes(drafter) * tail_keys(G * B, T))))
    chunk = min(chunk, S * G)
    kv = _replicas(drafter, drafter.context_kv(features.to(dev)), S, G * B)
    parts = []
    for s in range(prompt_len, T, chunk):
        e = min(s + chunk, T)
        n, s_ = e - s, -(-(e - s) // G)  # blocks, groups used
        anchors = torch.arange(s, s + s_ * G, device=dev).clamp(max=e - 1)  # [s_*G], the last one repeated
        emb = embed_blocks(drafter, head, tokens, anchors)
        part = kv if s_ == S else [(k[:s_], v[:s_]) for k, v in kv]
        h = drafter.blocks_in_place(part, anchors, emb, max_anchor=e - 1)
        parts.append(_read(drafter, head, h[:n], tokens, anchors[:n], topk, rows))
    return parts


def _draft_long(
    drafter: Drafter, head: Head, features, tokens, prompt_len: int, topk: int, chunk: int, anchors=None, rows=None
) -> list:
    """Each call drafts the `chunk` consecutive anchors of a run (`DFlash.blocks_run`) over the one context K/V:
    memory for the context once, whatever its length, and no key masked in vain. `anchors(done, total)` hears of
    the runs queued, about a hundred times a sequence (on CUDA the device trails the queue by a few runs)."""
    T, dev = len(tokens), drafter.device
    kv = drafter.context_kv(features.to(dev))
    parts, every = [], max(1, (T - prompt_len) // chunk // 100)
    for n, s in enumerate(range(prompt_len, T, chunk)):
        e = min(s + chunk, T)
        emb = embed_blocks(drafter, head, tokens, torch.arange(s, e, device=dev))
        h = drafter.blocks_run(kv, s, emb, group=GROUP * drafter.stack)
        parts.append(_read(drafter, head, h, tokens, torch.arange(s, e, device=dev), topk, rows))
        if anchors and ((n + 1) % every == 0 or e == T):
            anchors(e - prompt_len, T - prompt_len)
    return parts


def topk_of(drafter: Drafter | DrafterConfig, budget: int) -> int:
    """Candidates a replay keeps per drafted slot of a drafter (or its config): the tree budget, the chain rounds'
    ROUND_TOPK and the drafter's own candidate count (DFlash2's selector), whichever is largest; the run records it
    as its headroom K."""
    c = drafter.c if isinstance(drafter, Drafter) else drafter
    return max(budget, ROUND_TOPK, c.candidates)


def features_to_device(drafter: Drafter, features: torch.Tensor) -> torch.Tensor:
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
    return to_host(_draft(drafter, head, features, tokens, prompt_len, topk, chunk))


@torch.inference_mode()
def draft_loop(
    drafter: Drafter, head: Head, features: torch.Tensor, tokens: torch.Tensor, prompt_len: int, topk: int = 0
) -> Drafts:
    """Reference: one block per forward call, context recomputed each time. Same output as draft_all."""
    parts = []
    for p in range(prompt_len, len(tokens)):
        emb = embed_blocks(drafter, head, tokens, torch.tensor([p]))[0]
        h = drafter.block(features.to(drafter.device), p, emb)
        parts.append(read_out(drafter, head, h[None], tokens[p : p + 1], topk, confidence=True))
    return to_host(parts)


@torch.inference_mode()
def draft_one(drafter: Drafter, head: Head, features: torch.Tensor, anchor: int, anchor_token: int) -> list[int]:
    """The D drafts of ONE block at `anchor`, through the every-anchor path (`context_kv`,
    `blocks`, `read_out`): what `draft_all` drafts there. features [>= anchor, K*H]: rows from `anchor` on are never
    seen (the block's queries see context keys < anchor only). The speculative stand-in (specdec) drafts with it."""
    dev = drafter.device
    kv = drafter.context_kv(features.to(dev))
    first = torch.tensor([int(anchor_token)])
    emb = drafter.embed_block(head, first)  # [1, B, H]
    h = drafter.blocks(kv, torch.tensor([anchor], device=dev), emb, max_anchor=anchor)
    return read_out(drafter, head, h, first, 1)[0][0].tolist()


def every_anchor(
    drafter: Drafter,
    head: Head,
    seqs: list[Sequence],
    budget: int = 8,
    chunk: int = 64,
    progress: Callable[[int, int], None] | None = None,
    anchors: Callable[[int, int, int], None] | None = None,
    sampling: Sampling | None = None,
) -> tuple[list[Prompt], dict]:
    """`every_anchor_results` and the run's metrics (`summarize`)."""
    results = every_anchor_results(drafter, head, seqs, budget, chunk, progress, anchors, sampling)
    return results, summarize(results, drafter.width, budget)


def every_anchor_results(
    drafter: Drafter,
    head: Head,
    seqs: list[Sequence],
    budget: int = 8,
    chunk: int = 64,
    progress: Callable[[int, int], None] | None = None,
    anchors: Callable[[int, int, int], None] | None = None,
    sampling: Sampling | None = None,
) -> list[Prompt]:
    """Replay every sequence (every-anchor, batched): one scored `Prompt` per sequence (a worker's share is
    summarised by the parent). `progress(done, total)` counts sequences; `anchors(i, done, total)` the anchors
    of sequence i as a long one (past LONG tokens) is drafted. `sampling`: the expected-acceptance pass at its
    temperature and verify rule, on each sequence's `top` (its alpha bounds computed in the drafting batches).

    Scoring (CPU: acceptance, chain and DDTree walks) of sequence i runs on a worker thread once the
    device's queue holds sequence i+1's work, and the next features are uploaded meanwhile; results come
    back in input order.
    """
    with ThreadPoolExecutor(1) as pool, torch.inference_mode():
        futures, done = [], None
        nxt = features_to_device(drafter, seqs[0].features) if seqs else None
        for i, s in enumerate(seqs):
            within = (lambda a, n, i=i: anchors(i, a, n)) if anchors else None
            rows = None if sampling is None else Rows([s.top], sampling, drafter.device)
            parts = _draft(drafter, head, nxt, s.tokens, s.prompt_len, topk_of(drafter, budget), chunk, within, rows)
            if done is not None:  # started only now: its thread would slow the launches above (the GIL)
                futures.append(pool.submit(score, *done))
            if i + 1 < len(seqs):
                nxt = features_to_device(drafter, seqs[i + 1].features)
            done = (s.id, to_host(parts), s.tokens.numpy(), s.prompt_len, budget)
            if len(futures) > 1:
                futures[-2].result()  # at most one sequence scoring behind; its errors surface here
            if progress:
                progress(i + 1, len(seqs))
        if done is not None:
            futures.append(pool.submit(score, *done))
        return [f.result() for f in futures]
