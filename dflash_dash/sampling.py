"""Expected acceptance at temperature T, teacher-forced along a stored completion (SPEC section 3).

Contract: numpy in, numbers out (no torch), so metrics, analysis and pages use it as they use `walks`.
A sequence is prompt + completion token ids [T], the completion starting at P; an anchor p = P..T-1 drafts
d_1..d_D for positions p+1..p+D. The target's distribution at a position is kept as its top-K log-probabilities
at temperature 1 (`ids` [N, K], `logp` [N, K], sorted by log-probability, descending) and the probability mass
left outside them (`tail` [N]); row i is the target's prediction OF position i (from the prefix 0..i-1).

Per draft slot j the acceptance probability alpha_j depends on the engine's verify rule (`RULES`):
  - target-sample: drafts are the drafter's greedy tokens; the engine samples the target at each position and
    accepts while the sample equals the draft (SGLang's DFlash verify: accept while
    candidates[1:] == target_sampled[:-1]). alpha_j = p_T(d_j | prefix).
  - rejection: drafts are sampled from the drafter at T and accepted with min(1, p/q) (Leviathan et al. 2023).
    alpha_j = sum_x min(p_T(x), q_T(x)).
Expected committed tokens at an anchor = 1 + sum_k prod_{j<=k} alpha_j (the 1 is the target's bonus token);
slots past the completion's end have alpha 0. "Teacher-forced": every prefix is the stored completion's, so
the estimate is exact when the drafts equal the stored tokens and an approximation elsewhere; pages say so.

Temperature: p_T(x) = p(x)^(1/T) / Z_T. With only the top-K known, Z_T is bounded by the tail: every tail token
has p <= p_K (the smallest kept probability), so for T <= 1 the tail contributes between 0 and
tail * p_K^(1/T - 1); for T > 1 between tail * p_K^(1/T - 1) and (V-K) * (tail/(V-K))^(1/T) (spread evenly).
`bounds` turns those into a low and a high alpha per slot, so every estimate carries its truncation error.
T -> 0 is greedy: p_T is 1 on the argmax (ties: the first kept id), so alpha_j = [d_j == argmax] and on a greedy
completion the expected committed tokens equal accepted(p) + 1, the every-anchor figure.

`Top` is one sequence's stored top-K (an extraction keeps the rows of the completion only: row r predicts position
start + r); `expected` turns per-slot alpha bounds at some anchors into the expected committed tokens' bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RULES = ("target-sample", "rejection")  # verify rules (module docstring)
GREEDY_T = 1e-4  # temperatures at or below this are greedy (argmax), not a power of the probabilities


@dataclass
class Top:
    """The target's top-K at temperature 1 over one sequence: row r is its prediction of position start + r."""

    ids: np.ndarray  # [N, K] token ids, by log-probability descending
    logp: np.ndarray  # [N, K] their log-probabilities (float32)
    tail: np.ndarray  # [N] probability mass outside the K (1 - sum of the kept probabilities)
    start: int  # the position row 0 predicts (the prompt length P: rows cover the completion)
    vocab: int  # V, the target's vocabulary (the tail's spread bound)

    def rows(self, anchors: np.ndarray, D: int) -> np.ndarray:
        """[n, D] row of the target's prediction that draft j at anchor p guesses (position p+1+j), clipped to the
        rows held (slots past the end read the last row: `inside` masks them)."""
        at = np.asarray(anchors)[:, None] + 1 + np.arange(D) - self.start
        return np.clip(at, 0, len(self.tail) - 1)


def tempered(logp: np.ndarray, tail: np.ndarray, temperature: float, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The top-K probabilities at `temperature`, normalised with the tail's least and most mass: (lo [N, K],
    hi [N, K]), lo <= true p_T <= hi for every kept id. logp [N, K] sorted descending, tail [N] (temperature 1)."""
    logp = np.asarray(logp, dtype=np.float64)
    tail = np.clip(np.asarray(tail, dtype=np.float64), 0.0, 1.0)
    if temperature <= GREEDY_T:
        p = np.zeros_like(logp)
        p[:, 0] = 1.0
        return p, p.copy()
    s = 1.0 / temperature
    top = np.exp(s * (logp - logp[:, :1]))  # p^(1/T) / p_1^(1/T): keeps large 1/T in range
    p1 = np.exp(s * logp[:, :1])  # [N, 1] p_1^(1/T), the scale taken out above
    pk = np.exp(logp[:, -1:])  # [N, 1] the smallest kept probability (every tail token is at most this)
    rest = max(vocab - logp.shape[1], 1)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        t = tail[:, None]
        edge = t * pk ** (s - 1.0)  # tail mass if all tail tokens sat at p_K
        even = rest * (t / rest) ** s  # tail mass if it were spread over every other token
        lo_tail, hi_tail = (np.zeros_like(t), edge) if s >= 1.0 else (edge, even)
        lo_tail, hi_tail = lo_tail / p1, hi_tail / p1
    z = top.sum(axis=1, keepdims=True)
    return top / (z + np.nan_to_num(hi_tail, nan=0.0)), top / (z + np.nan_to_num(lo_tail, nan=0.0))


def draft_alpha(
    ids: np.ndarray, logp: np.ndarray, tail: np.ndarray, drafts: np.ndarray, temperature: float, vocab: int
) -> tuple[np.ndarray, np.ndarray]:
    """target-sample: alpha = p_T(draft) per slot, (lo, hi) [A, D]. Row a, slot j reads the target row of the
    position that draft guesses; `ids`/`logp`/`tail` are already gathered per slot: [A, D, K] / [A, D]."""
    A, D, K = ids.shape
    lo, hi = tempered(logp.reshape(A * D, K), tail.reshape(A * D), temperature, vocab)
    hit = ids.reshape(A * D, K) == drafts.reshape(A * D, 1)
    found = hit.any(axis=1)
    got_lo, got_hi = (lo * hit).sum(axis=1), (hi * hit).sum(axis=1)
    if temperature > GREEDY_T:  # a draft outside the top-K has p_T in [0, its most: p_K^(1/T) share of the tail]
        miss_hi = np.minimum(hi[:, -1], 1.0)
        got_hi = np.where(found, got_hi, miss_hi)
    return got_lo.reshape(A, D), got_hi.reshape(A, D)


def overlap_alpha(
    ids: np.ndarray, logp: np.ndarray, tail: np.ndarray, q: np.ndarray, temperature: float, vocab: int
) -> tuple[np.ndarray, np.ndarray]:
    """rejection: alpha = sum_x min(p_T(x), q_T(x)) per slot, (lo, hi) [A, D]. `q` [A, D, V] is the drafter's
    probability over the whole vocabulary at `temperature`; the target's tail adds between 0 and
    min(its tail mass at T, q's mass outside the target's top-K)."""
    A, D, K = ids.shape
    lo, hi = tempered(logp.reshape(A * D, K), tail.reshape(A * D), temperature, vocab)
    qf = q.reshape(A * D, -1)
    qk = np.take_along_axis(qf, ids.reshape(A * D, K), axis=1)  # q at the target's kept ids
    inside_lo = np.minimum(lo, qk).sum(axis=1)
    inside_hi = np.minimum(hi, qk).sum(axis=1)
    q_out = np.clip(1.0 - qk.sum(axis=1), 0.0, 1.0)
    p_out = np.clip(1.0 - lo.sum(axis=1), 0.0, 1.0)  # the most mass the target's tail can hold at T
    return inside_lo.reshape(A, D), (inside_hi + np.minimum(q_out, p_out)).reshape(A, D)


def committed(alpha: np.ndarray) -> np.ndarray:
    """Expected committed tokens per anchor: 1 + sum_k prod_{j<=k} alpha_j. alpha [A, D] -> [A]."""
    return 1.0 + np.cumprod(np.asarray(alpha, dtype=np.float64), axis=1).sum(axis=1)


def inside(prompt_len: int, T: int, A: int, D: int) -> np.ndarray:
    """[A, D] mask of the slots that guess a position inside the completion (anchor p = P + a, slot j -> p+1+j)."""
    at = prompt_len + 1 + np.arange(A)[:, None] + np.arange(D)
    return at < T


def gather(rows: np.ndarray, prompt_len: int, A: int, D: int) -> np.ndarray:
    """Per-slot target rows: rows [T, ...] (row i predicts position i) -> [A, D, ...], row P+1+a+j for anchor
    P+a, slot j; slots past the end read the last row (they are masked by `inside`)."""
    T = rows.shape[0]
    at = np.minimum(prompt_len + 1 + np.arange(A)[:, None] + np.arange(D), T - 1)
    return rows[at]


def expected(alpha_lo: np.ndarray, alpha_hi: np.ndarray, anchors: np.ndarray, T: int) -> np.ndarray:
    """Bounds of the expected committed tokens at `anchors` [n] of a sequence of T tokens from per-slot alpha
    bounds [n, D] (slots guessing a position >= T count 0): [n, 2] (low, high), `committed` of each."""
    D = alpha_lo.shape[1]
    keep = (np.asarray(anchors)[:, None] + 1 + np.arange(D)) < T
    return np.stack([committed(alpha_lo * keep), committed(alpha_hi * keep)], axis=1)
