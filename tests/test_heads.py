"""Top-K headroom and the confidence head's metrics, on hand-worked prompt rows (B = 4: three drafts per block)."""

from __future__ import annotations

import numpy as np

from dflash_dash import metrics
from dflash_dash.analysis.heads import heads
from dflash_dash.metrics import confidence as conf_mod, headroom

M = metrics.MISSED
CTX = metrics.Ctx(4, 0)


def row(accepted: list[int], rank: list[list[int]], confidence: list[list[float]] | None = None) -> metrics.Prompt:
    """A prompt of P = 2 with accepted(p) and target ranks at every completion anchor; its chain walk computed."""
    from dflash_dash.walks import chain_walk

    acc = np.asarray(accepted)
    T = 2 + len(acc)
    rounds = [c for _, _, c in chain_walk(acc, 2, T)]
    p = metrics.Prompt("p", 2, acc, rounds, target_rank=np.asarray(rank))
    if confidence is not None:
        p.confidence = np.asarray(confidence, dtype=np.float32)
    return p


def test_recall_and_oracle_tau_by_hand():
    # T = 8, anchors 2..7. Chain walk: p=2 accepts 1 (commit 2), p=4 accepts 0 (commit 1), p=5 accepts 2 (commit
    # 2: capped to the tokens left, T-1-5 = 2), end.
    acc = [1, 0, 0, 2, 0, 0]
    rank = [
        [0, 3, M],  # p=2: d1 is the target's token, d2's target is 4th, d3 missed
        [M, M, M],
        [2, 0, 1],  # p=4: d1 second-best ... the oracle takes 3 here
        [0, 0, -1],  # p=5: slot 3 is past the end
        [1, -1, -1],
        [-1, -1, -1],
    ]
    p = row(acc, rank)
    assert p.rounds == [2, 1, 2]
    # recall samples: round p=2 depths 1, 2 (d1 accepted); p=4 depth 1; p=5 depths 1, 2 (slots inside: 2)
    assert headroom.recall_depth([p], CTX, top1=True) == [2 / 3, 1 / 2, None]
    assert headroom.recall_depth([p], CTX) == [1.0, 1.0, None]
    assert headroom.recall_pooled([p], CTX, top1=True) == 3 / 5 and headroom.recall_pooled([p], CTX) == 1.0
    # oracle: p=2 holds 2 leading (d3 missed) -> commit 3 to p=5; p=5 holds 2 -> commit 2 (tokens left) to 7: end
    assert headroom.oracle_rounds(p, CTX) == [3, 2]
    assert headroom.oracle_tau(p, CTX) == 2.5 > metrics.tau(p, CTX)
    s = metrics.summarize([p], 4, 0)
    assert s["oracle_tau"] == 2.5 and s["recall_topk"] == 1.0


def test_chain_only_rows_have_no_headroom():
    p = row([1, 0, 0], [[0, 1, 2]] * 3)
    p.target_rank = np.zeros(0, dtype=np.int64)  # chain-only replays store no ranks
    assert headroom.oracle_tau(p, CTX) is None and metrics.summarize([p], 4, 0)["recall_topk"] is None
    assert heads([p], 4)["headroom"] is None


def test_confidence_stop_walk_by_hand():
    acc = [2, 0, 0, 1, 0, 0]  # T = 8
    conf = [[0.92, 0.75, 0.25], [0.9, 0.1, 0.1], [0.5, 0.5, 0.5], [0.95, 0.45, 0.9], [0.9, 0.9, 0.9], [0.9] * 3]
    p = row(acc, [[0, 0, 0]] * 6, conf)
    assert p.rounds == [3, 2]  # p=2 commits 3 -> p=5 commits 2 (the tokens left) -> p=7 = T-1: the end
    committed, verified = conf_mod.stop_walk(p, CTX, 0.0)
    assert committed == p.rounds and verified == [3, 2]  # t = 0 verifies every draft inside the completion
    # t = 0.85: p=2 verifies 1 (0.92, then 0.75 < t) -> commits min(2, 1) + 1 = 2 -> p=4: verifies 0 (0.5) ->
    # commits 1 -> p=5: verifies 1 (0.95, then 0.45) -> commits 2 -> p=7 ends
    assert conf_mod.stop_walk(p, CTX, 0.85) == ([2, 1, 2], [1, 0, 1])
    curve = conf_mod.stop_curve([p], CTX, [0.0, 0.85])
    assert curve[0]["tau"] == metrics.tau(p, CTX) and curve[1]["tau"] == 5 / 3
    assert curve[1]["verified_per_round"] == 2 / 3
    # reliability samples: p=2 depths 1..3 (accepted 2: all reached, d3 rejected), p=5 depths 1, 2 -> ECE by hand
    k, c, ok = conf_mod._samples([p], CTX)
    assert k.tolist() == [1, 2, 3, 1, 2] and ok.tolist() == [True, True, False, True, False]
    assert np.allclose(c, [0.92, 0.75, 0.25, 0.95, 0.45])
    # bins of width 0.1: [0.2, 0.3) holds 0.25 (rejected), [0.4, 0.5) 0.45 (rejected), [0.7, 0.8) 0.75 (accepted),
    # [0.9, 1] 0.92 and 0.95 (both accepted)
    want = (0.25 + 0.45 + (1 - 0.75) + 2 * (1 - 0.935)) / 5
    assert abs(metrics.summarize([p], 4, 0)["confidence_head_ece"] - want) < 1e-6
    view = heads([p], 4)["confidence"]
    assert view is not None and [r["threshold"] for r in view["stop"]] == metrics.THRESHOLDS


def test_runs_without_confidence_have_no_confidence_view():
    p = row([0, 0, 0], [[0, 0, 0]] * 3)
    assert metrics.summarize([p], 4, 0)["confidence_head_ece"] is None and heads([p], 4)["confidence"] is None


def test_a_selector_keeps_its_candidates_for_headroom(tmp_path):
    """DFlash2's replay keeps selector_top_k candidates per slot (more than the tree budget and ROUND_TOPK), so its
    headroom is recall@1 against recall@selector_top_k."""
    import torch
    from synthetic import random_head

    from dflash_dash import drafters as dr, replay as rp
    from tools import tiny

    d = tiny.TinyDrafter(
        architecture="DFlash2DraftModel",
        seed=2,
        family_fields=dict(conv_kernel_size=2, conv_group_size=16, selector_rank=4, selector_top_k=8),
    )
    m = dr.load(tiny.write_drafter(tmp_path / "d2", d))
    assert rp.every.topk_of(m, 0) == 8 and rp.every.topk_of(m, 12) == 12
    g = torch.Generator().manual_seed(0)
    seq = rp.Sequence("s", torch.randint(0, 512, (24,), generator=g), 6, torch.randn(24, 128, generator=g))
    (p,), s = rp.every_anchor(m, random_head(V=512, H=64), [seq], budget=0)
    assert p.target_rank.shape == (18, 3) and int(p.target_rank.max()) < 8 and s["recall_topk"] is not None
