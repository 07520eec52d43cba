"""Expected acceptance at temperature T on the device, inside the replay's batches (SPEC section 3).

Contract: tensors in, tensors out; the math is `sampling`'s (numpy), twinned here in torch so that no [A, D, V]
distribution ever leaves the device: `tempered`, `draft_alpha` and `overlap` equal `sampling.tempered`,
`sampling.draft_alpha` and `sampling.overlap_alpha` (tests/test_expected.py). `Rows` holds a batch of sequences'
stored target top-K (`sampling.Top`) on the device, tempered once; per drafted batch it gives the alpha bounds
[R, D, 2] of every slot: `target-sample` from the drafts, `rejection` from the drafter's own scores, which the
family's read-out hands to a `Tap` row chunk by row chunk (`drafters.readout.lm_top`'s tap): q_T = softmax(scores
/ T) over the vocabulary, or over a family's candidates (DFlash2's selector). A sequential family's q_j is the one
its read-out computes, conditioned on its own greedy drafts of the earlier slots (what `replay` drafts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import GREEDY_T, Top

LSE_VALUES = 1 << 25  # logits turned to fp32 at once by a tap (bounds its temporary: 128 MiB)


@dataclass(frozen=True)
class Sampling:
    """What an expected-acceptance pass needs besides the sequences' `top`: the temperature and the verify rule."""

    temperature: float  # T (at or below sampling.GREEDY_T: greedy)
    rule: str  # sampling.RULES: target-sample | rejection


def tempered(logp: torch.Tensor, tail: torch.Tensor, temperature: float, vocab: int):
    """`sampling.tempered` in torch (float64): (lo, hi) [..., K] bounds of p_T at the kept ids."""
    logp, tail = logp.double(), tail.double().clamp(0.0, 1.0)
    if temperature <= GREEDY_T:
        p = torch.zeros_like(logp)
        p[..., 0] = 1.0
        return p, p.clone()
    s = 1.0 / temperature
    top = torch.exp(s * (logp - logp[..., :1]))
    p1, pk, t = torch.exp(s * logp[..., :1]), torch.exp(logp[..., -1:]), tail[..., None]
    rest = max(vocab - logp.shape[-1], 1)
    edge = t * pk ** (s - 1.0)
    even = rest * (t / rest) ** s
    lo_tail, hi_tail = (torch.zeros_like(t), edge) if s >= 1.0 else (edge, even)
    lo_tail, hi_tail = torch.nan_to_num(lo_tail / p1, nan=0.0), torch.nan_to_num(hi_tail / p1, nan=0.0)
    z = top.sum(-1, keepdim=True)
    return top / (z + hi_tail), top / (z + lo_tail)


def draft_alpha(ids: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, drafts: torch.Tensor, temperature: float):
    """`sampling.draft_alpha` on tempered rows: ids, lo, hi [R, D, K] gathered per slot, drafts [R, D] ->
    [R, D, 2] (low, high) of p_T(draft)."""
    hit = ids == drafts[..., None]
    got_lo, got_hi = (lo * hit).sum(-1), (hi * hit).sum(-1)
    if temperature > GREEDY_T:  # a draft outside the top-K: at most the K-th kept id's share
        got_hi = torch.where(hit.any(-1), got_hi, hi[..., -1].clamp(max=1.0))
    return torch.stack([got_lo, got_hi], -1)


def overlap(
    ids: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
    scores: torch.Tensor,
    temperature: float,
    cand: torch.Tensor | None = None,
) -> torch.Tensor:
    """`sampling.overlap_alpha` from the drafter's scores: ids, lo, hi [R, K] (the target's tempered rows),
    scores [R, V] over the vocabulary (cand None) or [R, C] over candidate ids `cand` [R, C] -> [R, 2] bounds of
    sum_x min(p_T(x), q_T(x)), q_T = softmax(scores / T) (T -> 0: one-hot on the argmax, the draft)."""
    R = scores.shape[0]
    if temperature <= GREEDY_T:
        best = scores.argmax(-1, keepdim=True)
        qk = (ids == (best if cand is None else cand.gather(1, best))).double()
    else:
        qk = torch.empty(ids.shape, dtype=torch.float64, device=scores.device)
        step = max(1, LSE_VALUES // max(scores.shape[1], 1))
        for r in range(0, R, step):  # fp32 log-softmax a bounded number of rows at a time
            z = scores[r : r + step].float() / temperature
            z = z - torch.logsumexp(z, -1, keepdim=True)
            if cand is None:
                qk[r : r + step] = z.gather(1, ids[r : r + step]).exp().double()
            else:
                same = ids[r : r + step, :, None] == cand[r : r + step, None, :]  # [r, K, C]
                qk[r : r + step] = (same * z.exp()[:, None, :]).sum(-1).double()
    inside_lo = torch.minimum(lo, qk).sum(-1)
    inside_hi = torch.minimum(hi, qk).sum(-1)
    q_out = (1.0 - qk.sum(-1)).clamp(0.0, 1.0)
    p_out = (1.0 - lo.sum(-1)).clamp(0.0, 1.0)
    return torch.stack([inside_lo, inside_hi + torch.minimum(q_out, p_out)], -1)


class Tap:
    """Collects `overlap` of drafted rows as a family's read-out computes their scores: `tap(n, j, scores, cand)`
    for blocks n [R] and drafts j [R] of the batch; `out` [N, D, 2] (float64) once every slot was read out."""

    def __init__(self, ids: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, temperature: float):
        self.ids, self.lo, self.hi, self.t = ids, lo, hi, temperature  # [N, D, K] per block and draft
        self.out = torch.zeros(ids.shape[:2] + (2,), dtype=torch.float64, device=ids.device)

    def __call__(self, n: torch.Tensor, j: torch.Tensor, scores: torch.Tensor, cand: torch.Tensor | None = None):
        n, j = n.to(self.ids.device), j.to(self.ids.device)
        self.out[n, j] = overlap(self.ids[n, j], self.lo[n, j], self.hi[n, j], scores, self.t, cand)


class Rows:
    """Sequences' target rows on `device`, tempered at T once: ids, lo, hi [S, N, K] (padded), start and count of
    rows [S]; `tap` and `alpha` read the rows each drafted slot guesses."""

    def __init__(self, tops: list[Top], how: Sampling, device):
        S, N, K = len(tops), max(len(t.tail) for t in tops), tops[0].ids.shape[1]
        ids = torch.zeros(S, N, K, dtype=torch.long)
        logp = torch.zeros(S, N, K, dtype=torch.float32)
        tail = torch.zeros(S, N, dtype=torch.float32)
        for i, t in enumerate(tops):
            ids[i, : len(t.tail)] = torch.from_numpy(t.ids.astype("int64"))
            logp[i, : len(t.tail)] = torch.from_numpy(t.logp)
            tail[i, : len(t.tail)] = torch.from_numpy(t.tail)
        self.how = how
        self.ids = ids.to(device)
        self.lo, self.hi = tempered(logp.to(device), tail.to(device), how.temperature, tops[0].vocab)
        self.start = torch.tensor([t.start for t in tops], device=device)
        self.count = torch.tensor([len(t.tail) for t in tops], device=device)

    def at(self, seq: torch.Tensor, anchors: torch.Tensor, D: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(sequence [R, D], row [R, D]) of each slot's guessed position anchor + 1 + j, clipped to the rows held."""
        seq, anchors = seq.to(self.ids.device), anchors.to(self.ids.device)
        r = anchors[:, None] + 1 + torch.arange(D, device=self.ids.device) - self.start[seq][:, None]
        r = torch.minimum(r.clamp(min=0), (self.count[seq] - 1)[:, None])
        return seq[:, None].expand_as(r), r

    def tap(self, seq: torch.Tensor, anchors: torch.Tensor, D: int) -> Tap | None:
        """The read-out tap of a batch of blocks (rule rejection), else None."""
        if self.how.rule != "rejection":
            return None
        s, r = self.at(seq, anchors, D)
        return Tap(self.ids[s, r], self.lo[s, r], self.hi[s, r], self.how.temperature)

    def alpha(self, seq, anchors, drafts: torch.Tensor, tap: Tap | None) -> torch.Tensor:
        """[R, D, 2] float32 alpha bounds of a batch of blocks: the tap's overlap (rejection), or p_T(draft)."""
        if tap is not None:
            return tap.out.float()
        s, r = self.at(seq, anchors, drafts.shape[1])
        return draft_alpha(self.ids[s, r], self.lo[s, r], self.hi[s, r], drafts, self.how.temperature).float()
