"""Expected acceptance at temperature T (dflash_dash/sampling.py) against a plain per-position reference written
from the rules' definitions (SPEC section 3), and the cost table's speedup formula on hand-worked numbers
(dflash_dash/costs.py)."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_dash import costs, sampling, walks


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _topk(logits, K):
    """Temperature-1 top-K log-probs and tail mass, as an extraction keeps them."""
    p = _softmax(logits)
    ids = np.argsort(-p, axis=-1, kind="stable")[..., :K]
    kept = np.take_along_axis(p, ids, axis=-1)
    return ids, np.log(kept), 1.0 - kept.sum(axis=-1)


def _ref_alpha_sample(p_row, d, T):
    """Plain reference: p_T(d) = p(d)^(1/T) / sum_x p(x)^(1/T)."""
    w = p_row ** (1.0 / T)
    return w[d] / w.sum()


def _ref_alpha_reject(p_row, q_row, T):
    pt = p_row ** (1.0 / T) / (p_row ** (1.0 / T)).sum()
    return np.minimum(pt, q_row).sum()


@pytest.mark.parametrize("T", [0.3, 0.7, 1.0, 1.5])
def test_target_sample_equals_reference_with_full_topk(T):
    rng = np.random.default_rng(1)
    A, D, V = 5, 3, 40
    logits = rng.normal(size=(A, D, V)) * 3
    ids, logp, tail = _topk(logits, V)  # every id kept: no truncation, lo == hi == the exact value
    drafts = rng.integers(0, V, size=(A, D))
    lo, hi = sampling.draft_alpha(ids, logp, tail, drafts, T, V)
    p = _softmax(logits)
    ref = np.array([[_ref_alpha_sample(p[a, j], drafts[a, j], T) for j in range(D)] for a in range(A)])
    np.testing.assert_allclose(lo, ref, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(hi, ref, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("T", [0.5, 1.0, 2.0])
def test_truncated_topk_bounds_hold_the_exact_value(T):
    rng = np.random.default_rng(2)
    A, D, V, K = 6, 4, 64, 8
    logits = rng.normal(size=(A, D, V)) * 2
    ids, logp, tail = _topk(logits, K)
    p = _softmax(logits)
    drafts = np.where(rng.random((A, D)) < 0.7, ids[..., 0], rng.integers(0, V, size=(A, D)))  # some outside top-K
    lo, hi = sampling.draft_alpha(ids, logp, tail, drafts, T, V)
    ref = np.array([[_ref_alpha_sample(p[a, j], drafts[a, j], T) for j in range(D)] for a in range(A)])
    assert np.all(lo <= ref + 1e-12) and np.all(ref <= hi + 1e-12)
    q = _softmax(rng.normal(size=(A, D, V)) * 2)
    lo, hi = sampling.overlap_alpha(ids, logp, tail, q, T, V)
    ref = np.array([[_ref_alpha_reject(p[a, j], q[a, j], T) for j in range(D)] for a in range(A)])
    assert np.all(lo <= ref + 1e-12) and np.all(ref <= hi + 1e-12)
    assert np.all(hi - lo < 1.0)  # a bound that says something


def test_rejection_equals_reference_with_full_topk():
    rng = np.random.default_rng(3)
    A, D, V, T = 4, 3, 30, 0.7
    logits = rng.normal(size=(A, D, V)) * 2
    ids, logp, tail = _topk(logits, V)
    qlog = rng.normal(size=(A, D, V)) * 2
    q = _softmax(qlog / T)
    lo, hi = sampling.overlap_alpha(ids, logp, tail, q, T, V)
    p = _softmax(logits)
    ref = np.array([[_ref_alpha_reject(p[a, j], q[a, j], T) for j in range(D)] for a in range(A)])
    np.testing.assert_allclose(lo, ref, rtol=1e-6)
    np.testing.assert_allclose(hi, ref, rtol=1e-6)
    same = sampling.overlap_alpha(ids, logp, tail, _softmax(logits / T), T, V)[0]  # q == p_T accepts always
    np.testing.assert_allclose(same, 1.0, rtol=1e-9)


def test_committed_on_hand_worked_numbers():
    alpha = np.array([[0.5, 0.5, 0.5], [1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    np.testing.assert_allclose(sampling.committed(alpha), [1 + 0.5 + 0.25 + 0.125, 3.0, 1.0])


def test_greedy_limit_equals_every_anchor_tau():
    """At T -> 0 on a greedy completion (each token the target's argmax) the expected committed tokens per anchor
    equal accepted(p) + 1, the every-anchor figure."""
    rng = np.random.default_rng(4)
    V, P, T_len, D = 20, 5, 30, 4
    logits = rng.normal(size=(T_len, V)) * 3  # row i predicts position i
    tokens = rng.integers(0, V, size=T_len)
    tokens[P:] = logits[P:].argmax(axis=1)  # greedy completion
    A = T_len - P
    drafts = np.where(rng.random((A, D)) < 0.6, walks_targets(tokens, P, A, D), rng.integers(0, V, size=(A, D)))
    ids, logp, tail = _topk(logits, 6)
    g = lambda x: sampling.gather(x, P, A, D)  # noqa: E731
    for t in (0.0, 1e-5):
        alpha = sampling.draft_alpha(g(ids), g(logp), g(tail), drafts, t, V)[0] * sampling.inside(P, T_len, A, D)
        exp = sampling.committed(alpha)
        acc = walks.accepted(drafts, tokens, P)
        np.testing.assert_array_equal(exp, acc + 1)


def walks_targets(tokens, P, A, D):
    at = np.minimum(P + 1 + np.arange(A)[:, None] + np.arange(D), len(tokens) - 1)
    return tokens[at]


def _table():
    # target: 10 ms per single-token forward at c=0, 14 ms at c=1000; 16-token verify 12 / 18 ms; draft 3 / 5 ms
    return costs.CostTable(
        device="cpu",
        backend="torch",
        target=((0, 1, 0.010), (1000, 1, 0.014), (0, 16, 0.012), (1000, 16, 0.018)),
        draft=((0, 0.003), (1000, 0.005)),
    )


def test_speedup_formula_on_hand_worked_numbers():
    t = _table()
    # one context length: tau 4 x 10 ms / (3 ms + 12 ms) = 40 / 15
    assert costs.speedup_at(t, 4.0, 0, 16) == pytest.approx(40 / 15)
    # interpolated at c=500: t1 = 12 ms, verify 15 ms, draft 4 ms -> 2 x 12 / 19
    assert costs.speedup_at(t, 2.0, 500, 16) == pytest.approx(24 / 19)
    # two rounds: (c=0, 4 tokens), (c=1000, 2 tokens): plain 4x10 + 2x14 = 68 ms; spec (3+12) + (5+18) = 38 ms
    assert costs.speedup(t, [(0, 4), (1000, 2)], 16) == pytest.approx(68 / 38)
    assert costs.speedup(t, [], 16) == 1.0
    with pytest.raises(costs.CostError, match="no target forward of 8 tokens"):
        costs.speedup_at(t, 2.0, 0, 8)
    assert costs.from_dict(costs.to_dict(t)) == t
