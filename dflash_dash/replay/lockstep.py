"""Chain-only replay: only the anchors the walks visit, many sequences advancing in lockstep.

Contract: tensors in, numbers out. `chain_only(drafter, head, seqs, budget)` computes, per sequence, the blocks
at the anchors its chain walk (and its DDTree walk, with a tree budget) visits, over the sequences' stacked
context K/V (`DFlash.blocks_in_place`, one block per sequence per step), and returns the per-prompt results
and the run's summary; `chain_only_results` the results alone. Rounds, acceptance, tree acceptance and the
rounds' candidates equal the every-anchor replay's; anchors not computed hold -1 and NaN.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..drafters import Drafter
from ..metrics import Prompt
from ..sampling import expected
from ..target import Head
from ..walks import ROUND_TOPK, chain_walk, round_top, tree_accept
from .every import Sequence, features_to_device, kv_bytes, tail_kv
from .expect import Rows, Sampling
from .head import read_out
from .score import summarize

CHAIN_BATCH = 256  # sequences advancing in lockstep: one block each per step (~4,000 query rows per matmul)
CHAIN_BYTES = 24 << 30  # bound on a lockstep batch's stacked context K/V: long sequences advance in smaller batches
# (the 27B shapes hold 20 KiB a token: 256 x 2,560 tokens fit, 36 x 32,768, 9 x 131,072)
CTX_SEQS = 16  # sequences whose context K/V are computed at once (bounds the fp32 temporaries)
CTX_BYTES = 4 << 30  # ... and at most this many bytes of their stacked features (one sequence at least)
CHAIN_HALVES = 2  # with a tree budget: stacks whose steps alternate (host scoring overlaps the device)
DROP_AT = 0.875  # drop finished sequences from the stack once the live ones are this share or fewer
HEAD_STAGES = (4, 8)  # DDTree off: drafted slots split here; a later stage's LM head only for the rows whose
# drafts were all accepted so far (the walk reads no slot after the first rejected one)


def chain_only(
    drafter: Drafter,
    head: Head,
    seqs: list[Sequence],
    budget: int = 8,
    batch: int = CHAIN_BATCH,
    progress: Callable[[int, int], None] | None = None,
    sampling: Sampling | None = None,
) -> tuple[list[Prompt], dict]:
    """`chain_only_results` and the run's metrics (`summarize`)."""
    results = chain_only_results(drafter, head, seqs, budget, batch, progress, sampling)
    return results, summarize(results, drafter.width, budget)


@torch.inference_mode()
def chain_only_results(
    drafter: Drafter,
    head: Head,
    seqs: list[Sequence],
    budget: int = 8,
    batch: int = CHAIN_BATCH,
    progress: Callable[[int, int], None] | None = None,
    sampling: Sampling | None = None,
) -> list[Prompt]:
    """Replay computing only the anchors the chain walk (and the DDTree walk, with `budget`) visits.

    The sequences of a batch advance in lockstep over their stacked context K/V: each step drafts ONE block per
    sequence, at the smaller of its two walks' next anchors that is not computed yet (an anchor both walks
    visit is computed once; finished sequences are dropped from the stack as they end). Without a tree budget
    the chain walk runs on the device (the host reads only row counts) and the LM head computes only the slots
    the walk reads (`HEAD_STAGES`): at a visited anchor the slots after the first rejected draft hold -1 and
    NaN. With a tree budget each step's top-k comes back to the host for the DDTree acceptance. Rounds,
    acceptance, tree acceptance, and the drafts and rounds' top-K of every computed slot equal the every-anchor
    mode's; the other anchors hold -1 (drafts, accepted) and NaN (log-probabilities), so metrics that need
    every anchor (or every slot: the expected tau) are not computed (`metrics`). The results hold numpy arrays
    (no Python lists built: a worker packs them as they are). `sampling`: the expected-acceptance pass at the
    computed anchors (every slot's LM head then runs: no staging), equal to the every-anchor pass's there."""
    results: list[Prompt] = []
    for part in batches(drafter, seqs, batch):
        results += _chain_batch(drafter, head, part, budget, sampling)
        if progress:
            progress(len(results), len(seqs))
    return results


def batches(drafter: Drafter, seqs: list[Sequence], batch: int = CHAIN_BATCH) -> list[list[Sequence]]:
    """`seqs` in order cut into lockstep batches: at most `batch` sequences, and stacked context K/V (every
    sequence padded to the batch's longest) within CHAIN_BYTES, one sequence at least."""
    per_token = kv_bytes(drafter)
    out: list[list[Sequence]] = []
    longest = 0
    for s in seqs:
        t = max(longest, len(s.tokens))
        if out and len(out[-1]) < batch and (len(out[-1]) + 1) * t * per_token <= CHAIN_BYTES:
            out[-1].append(s)
            longest = t
        else:
            out.append([s])
            longest = len(s.tokens)
    return out


def _stack_features(drafter: Drafter, seqs: list[Sequence]) -> torch.Tensor:
    """Features of `seqs` padded with zeros to one length and stacked on the drafter's device: [S, T, K*H]."""
    T = max(len(s.tokens) for s in seqs)
    out = torch.zeros(
        len(seqs), T, seqs[0].features.shape[1], dtype=seqs[0].features.dtype, device=seqs[0].features.device
    )
    for j, s in enumerate(seqs):
        out[j, : len(s.tokens)] = s.features
    return features_to_device(drafter, out)


class Lockstep:
    """Device state of one chain-only batch: the stacked context K/V (after spare key slots for one block per
    sequence, `DFlash.blocks_in_place`), the tokens, and per-anchor result buffers [S, A+1, ...] (A = the
    longest completion; column A takes the blocks of finished sequences, which are never read)."""

    def __init__(self, drafter: Drafter, head: Head, seqs: list[Sequence], k: int, staged: bool = False, how=None):
        c, dev = drafter.c, drafter.device
        self.d, self.head, self.k, self.D = drafter, head, k, drafter.drafts
        self.expect = None if how is None else Rows([s.top for s in seqs], how, dev)  # `sampling`: target rows
        self.staged = staged and not drafter.sequential  # a sequential family reads whole blocks out
        S, self.T_pad = len(seqs), max(len(s.tokens) for s in seqs)
        self.P = torch.tensor([s.prompt_len for s in seqs], device=dev)
        self.T = torch.tensor([len(s.tokens) for s in seqs], device=dev)
        tok = torch.zeros(S, self.T_pad, dtype=torch.long)
        for j, s in enumerate(seqs):
            tok[j, : len(s.tokens)] = s.tokens
        self.tok = tok.to(dev)
        self.A = A = max([len(s.tokens) - s.prompt_len for s in seqs] + [1])
        B = c.block_size
        self.kv = tail_kv(drafter, S, B, self.T_pad)  # a block's slots, then context slots >= T_pad
        row = seqs[0].features.shape[1] * seqs[0].features.element_size()  # feature bytes a token
        n = max(1, min(CTX_SEQS, CTX_BYTES // (self.T_pad * row)))
        for s0 in range(0, S, n):  # context K/V a few sequences at a time, into the stack
            for (K, V), (k_, v_) in zip(self.kv, drafter.context_kv(_stack_features(drafter, seqs[s0 : s0 + n]))):
                K[s0 : s0 + len(k_), :, B : B + k_.shape[-2]] = k_
                V[s0 : s0 + len(v_), :, B : B + v_.shape[-2]] = v_
        kk = min(ROUND_TOPK, k)
        self.acc = torch.full((S, A + 1), -1, dtype=torch.long, device=dev)
        self.drafts = torch.full((S, A + 1, self.D), -1, dtype=torch.long, device=dev)
        self.top_ids = torch.full((S, A + 1, self.D, kk), -1, dtype=torch.long, device=dev)
        self.top_lp = torch.full((S, A + 1, self.D, kk), float("nan"), dtype=torch.float32, device=dev)
        self.alpha = None if how is None else torch.full((S, A + 1, self.D, 2), float("nan"), device=dev)
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
        d, seq = self.d, self.rows
        first = self.tok[seq, anchors]  # [R] anchor tokens
        h = d.blocks_in_place(self.kv, anchors, d.embed_block(self.head, first), max_anchor=top)  # [R, B, H]
        nxt = self.tok[seq[:, None], (anchors[:, None] + 1 + self.slot).clamp(max=self.T_pad - 1)]
        inside = (self.slot < (self.T[seq] - 1 - anchors)[:, None]) & record[:, None]  # in the completion (and
        # recorded: a spare block accepts none)
        if self.staged:
            d_tok, t_ids, t_lp, acc = self._staged(h, first, nxt, inside)
        else:
            tap = None if self.expect is None else self.expect.tap(seq, anchors, self.D)
            d_tok, t_ids, t_lp = read_out(d, self.head, h, first, self.k, tap=tap)
            if self.expect is not None:
                self.alpha[seq, torch.where(record, anchors - self.P[seq], self.A)] = self.expect.alpha(
                    seq, anchors, d_tok, tap
                )
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

    def _staged(self, h: torch.Tensor, first: torch.Tensor, nxt: torch.Tensor, inside: torch.Tensor):
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
            dt, ti, tl = read_out(self.d, self.head, h[at], first[at], k, (s0, s1))
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


def walk_device(st: Lockstep) -> None:
    """The chain walk on the device (no tree budget): per step one block per sequence at its chain anchor, the
    acceptance and the next anchor computed there. The host reads, a step behind, the count of walks still
    going (to stop and to drop finished sequences) and their furthest anchor (a step advances an anchor by at
    most B, so the host bounds the next step's anchors and the attention reads no key past them); the staged LM
    head (`Lockstep._staged`) reads its row counts mid-step."""
    pos, last = st.P.clone(), st.T - 1  # chain anchor and last position, per stacked row
    if not bool((pos < last).any()):
        return
    B, p_max = st.d.width, int(st.P.max())  # a step commits at most B tokens
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


class HostWalk:
    """Chain and DDTree walks on the host (tree budget > 0) over one `Lockstep`: per step one block per
    sequence, at the smaller of the two walks' next anchors not computed yet; its acceptance and top-k (slots
    1..min(budget, B-1): the deepest a tree of `budget` nodes reaches) come back once per step, copied behind
    an event so that another walk's step can be queued meanwhile (`launch`, then `collect`)."""

    def __init__(self, st: Lockstep, seqs: list[Sequence], budget: int):
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


def walk_host(sts: list[Lockstep], parts: list[list[Sequence]], budget: int) -> list[HostWalk]:
    """Run the host walks of several stacks interleaved: while one stack's step runs on the device, the host
    scores the other's and queues its next step (ping-pong), so the device does not wait on the host."""
    walks = [HostWalk(st, p, budget) for st, p in zip(sts, parts)]
    active = [w for w in walks if w.launch()]
    while active:
        for w in list(active):
            w.collect()
            if not w.launch():
                active.remove(w)
    return walks


def _computed(st: Lockstep):
    """A lockstep's results on the host, the computed anchors only (acceptance >= 0: about one anchor in tau,
    gathered on the device so that the copy is that much smaller): (acceptance [S, A], start [S+1] (sequence j's
    computed anchors are rows start[j]:start[j+1], in anchor order), their columns [N], drafts [N, D], top ids
    and top log-probs [N, D, k])."""
    acc = st.acc[:, : st.A]
    at = (acc >= 0).nonzero()  # [N, 2] (sequence, column), row-major
    seq, col = at[:, 0], at[:, 1]
    drafts, ids, lp = (t[seq, col].cpu().numpy() for t in (st.drafts, st.top_ids, st.top_lp))
    alpha = None if st.alpha is None else st.alpha[seq, col].double().cpu().numpy()
    start = np.zeros(len(acc) + 1, dtype=np.int64)
    np.cumsum(np.bincount(seq.cpu().numpy(), minlength=len(acc)), out=start[1:])
    return acc.cpu().numpy(), start, col.cpu().numpy(), drafts, ids, lp, alpha


def _spread(x: np.ndarray, cols: np.ndarray, n: int, fill) -> np.ndarray:
    """Rows `x` [N, ...] at columns `cols` of a new [n, ...] array, `fill` elsewhere."""
    out = np.full((n,) + x.shape[1:], fill, dtype=x.dtype)
    out[cols] = x
    return out


def _chain_batch(drafter: Drafter, head: Head, seqs: list[Sequence], budget: int, how=None) -> list[Prompt]:
    k = max(budget, ROUND_TOPK)
    # with a tree budget, CHAIN_HALVES stacks alternate (host scoring of one overlaps the other's step)
    n = max(1, min(CHAIN_HALVES if budget else 1, len(seqs)))
    parts = [seqs[i * len(seqs) // n : (i + 1) * len(seqs) // n] for i in range(n)]
    sts = [Lockstep(drafter, head, p, k, staged=not budget and how is None, how=how) for p in parts]
    walks = walk_host(sts, parts, budget) if budget else None
    if not budget:
        walk_device(sts[0])
    out = []
    for h, (st, part) in enumerate(zip(sts, parts)):
        acc, start, cols, drafts, ids, lp, alpha = _computed(st)
        for j, s in enumerate(part):
            T, P = len(s.tokens), s.prompt_len
            rows = slice(start[j], start[j + 1])  # this sequence's computed anchors, in order
            rounds = chain_walk(acc[j, : T - P], P, T)
            r = Prompt(
                s.id,
                P,
                acc[j, : T - P],
                [c for _, _, c in rounds],
                draft_logp=_spread(lp[rows, :, 0], cols[rows], T - P, np.nan),
                drafts=_spread(drafts[rows], cols[rows], T - P, -1),
            )
            at = start[j] + np.searchsorted(cols[rows], np.asarray([p for p, _, _ in rounds], dtype=np.int64) - P)
            r.round_top_ids, r.round_top_p = round_top(ids[at], lp[at])  # [R, D, K] (R = 0: no round)
            if budget:
                r.tree_at, r.tree_rounds = walks[h].tacc[j], walks[h].tree_rounds[j]
            if alpha is not None:  # the computed anchors' expected committed tokens, NaN elsewhere
                a = alpha[rows]
                e = expected(a[..., 0], a[..., 1], P + cols[rows], T).astype(np.float32)
                r.expected_at = _spread(e, cols[rows], T - P, np.nan)
            out.append(r)
    return out
