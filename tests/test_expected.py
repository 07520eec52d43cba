"""Expected acceptance at temperature T through the replay (dflash_dash/replay/expect.py, every.py, lockstep.py)
against a plain per-position reference: python loops over anchors and slots using the full target logits of the
tiny target (transformers' own forward, float64 softmax) and each family's independent float64 drafter
(tests/ref_dspark.py for DFlash and DSpark, ref_domino.py, ref_dflash2.py), for both verify rules (SGLang's
DFlash verify `target-sample`; Leviathan et al.'s `rejection`); the T -> 0 limit on a greedy completion equals
the greedy every-anchor tau; chain mode equals every-anchor at the chain's anchors; the torch twins equal the
numpy math of dflash_dash/sampling.py; the extraction's top-K equals the full logits' top-K."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ref_dflash2 import block_states, walk as walk2
from ref_domino import domino_drafts
from ref_dspark import Spec, backbone, walk as walk_dspark
from test_family_dflash2 import FIELDS as D2_FIELDS
from test_family_domino import spec as domino_spec, state_of as domino_state
from test_family_dspark import spec as dspark_spec, tiny_dspark

from dflash_dash import drafters as dr, replay as rp, sampling, target as tg
from dflash_dash.replay import expect
from tools import tiny

P, N_NEW = 6, 18  # prompt tokens, greedy completion tokens


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The tiny target, a greedy completion of it, its full logits (float64) and the extraction's features and
    top-K (every id kept, and 8 kept) through target.extract_top."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("expected")
    target = tiny.write_target(root / "target", tiny.TinyTarget())
    tg.force_torch_kernels()  # on CPU the torch path, as the product's extraction binds it
    lm = AutoModelForCausalLM.from_pretrained(target).eval()
    ids = torch.randint(10, 500, (P,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():  # greedy: each completion token the target's argmax
        ids = lm.generate(ids[None], max_new_tokens=N_NEW, do_sample=False, min_new_tokens=N_NEW)[0]
        logits = lm.double()(input_ids=ids[None]).logits[0]  # [T, V]: row i predicts position i + 1
    dec, _ = tg.load(target, [1, 4], "cpu", torch.float32, whole=True)
    tops = {}
    for k in (512, 8):
        feats, t_ids, t_lp, t_tail = tg.extract_top(dec, ids, [1, 4], tg.top_head(target, k), P)
        tops[k] = sampling.Top(t_ids.numpy(), t_lp.numpy(), t_tail.numpy(), P, 512)
    assert (tops[8].ids[:, 0] == ids[P:].numpy()).all()  # greedy as the extraction's own argmax sees it
    return dict(
        target=target,
        tokens=ids,
        p=torch.softmax(logits, -1).numpy(),
        feats=feats.to(torch.bfloat16),
        tops=tops,
        head=tg.load_head(target),
        root=root,
    )


def _write(root, name, d: tiny.TinyDrafter, state=None):
    from test_family_dflash2 import write

    state = state if state is not None else tiny.weights(d)
    return write(root / name, tiny.drafter_config(d), state), state


FAMILIES = ("dflash", "dspark", "domino", "dflash2")


def family(world, name):
    """(loaded drafter, reference q rows per anchor: fn(p) -> (drafts [D], [(scores, cand ids | None)] per slot))."""
    head, feats, tokens = world["head"], world["feats"].double(), world["tokens"]
    emb, lmh = head.embed, head.lm_head
    if name in ("dflash", "dspark"):
        d = tiny.TinyDrafter(seed=1) if name == "dflash" else tiny_dspark(conf=False)
        path, state = _write(world["root"], name, d)
        s = (
            dspark_spec(d)
            if name == "dspark"
            else Spec(d.block_size, 4, 2, 16, 2, d.mask_token_id, d.rope_theta, 0, "vanilla", False, False, False)
        )
        w = {k: v.double() for k, v in state.items()}

        def ref(p):
            full: list = []
            tok = int(tokens[p])
            drafts = walk_dspark(w, s, backbone(w, s, feats, tok, p, emb), tok, lmh, full)[0]
            return drafts.tolist(), [(x, None) for x in full]

    elif name == "domino":
        d = domino_spec()
        path, state = _write(world["root"], name, d, domino_state(d))
        cfg = tiny.drafter_config(d)

        def ref(p):
            full: list = []
            drafts = domino_drafts(state, cfg, feats, tokens, p, emb, lmh, full)[0]
            return drafts, [(x, None) for x in full]

    else:
        d = tiny.TinyDrafter(seed=7, block_size=5, family_fields=dict(D2_FIELDS), architecture="DFlash2DraftModel")
        cfg = tiny.transformers5_config(d)
        path, state = _write(world["root"], name, d)

        def ref(p):
            full: list = []
            tok = int(tokens[p])
            drafts = walk2(state, cfg, block_states(state, cfg, feats, tok, p, emb, True), tok, lmh, full)[0]
            return drafts, full

    return dr.load(path), ref


def reference(world, ref, t: float, rule: str) -> np.ndarray:
    """Plain per-position expected committed tokens at every anchor P..T-1."""
    p_all, T = world["p"], len(world["tokens"])
    out = []
    for a in range(P, T):
        drafts, qs = ref(a)
        alpha = []
        for j, (d, (scores, cand)) in enumerate(zip(drafts, qs)):
            pos = a + 1 + j
            if pos >= T:
                alpha.append(0.0)
                continue
            pt = p_all[pos - 1] ** (1 / t)
            pt = pt / pt.sum()
            if rule == "target-sample":
                alpha.append(pt[d])
            else:
                qs_ = torch.softmax(scores.double() / t, -1).numpy()
                q = np.zeros_like(pt)
                np.add.at(q, np.arange(len(q)) if cand is None else cand.numpy(), qs_)
                alpha.append(np.minimum(pt, q).sum())
        out.append(1 + np.cumprod(alpha).sum())
    return np.asarray(out)


def replayed(world, m, t: float, rule: str, k: int = 512, chain: bool = False, budget: int = 0):
    seq = rp.Sequence("s", world["tokens"], P, world["feats"], world["tops"][k])
    how = expect.Sampling(t, rule)
    if chain:
        return rp.chain_only_results(m, world["head"], [seq], budget, sampling=how)[0]
    return rp.every_anchor_results(m, world["head"], [seq], budget, chunk=5, sampling=how)[0]


@pytest.mark.parametrize("rule", sampling.RULES)
@pytest.mark.parametrize("name", FAMILIES)
def test_expected_acceptance_equals_plain_reference(world, name, rule):
    m, ref = family(world, name)
    t = 0.2
    want = reference(world, ref, t, rule)
    got = replayed(world, m, t, rule).expected_at.reshape(-1, 2)
    # compared past the bonus token (the tiny target spreads its mass: the drafts' share is small)
    np.testing.assert_allclose(got[:, 0] - 1, want - 1, rtol=3e-3, atol=1e-7)
    np.testing.assert_allclose(got[:, 1] - 1, want - 1, rtol=3e-3, atol=1e-7)  # every id kept: low == high
    assert (want[:-1] > 1 + 1e-4).all() and want.std() > 1e-4  # a signal the comparison can miss
    # with only 8 of 512 ids kept the bound still holds the exact value (wide: the tiny target's mass is spread)
    cut = replayed(world, m, t, rule, k=8).expected_at.reshape(-1, 2)
    assert (cut[:, 0] <= want + 1e-5).all() and (want <= cut[:, 1] + 1e-5).all()
    assert (cut[:, 1] > cut[:, 0]).any()


@pytest.mark.parametrize("rule", sampling.RULES)
@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_limit_is_every_anchor_tau(world, name, rule):
    """At T -> 0 on the target's greedy completion, tau_expected equals the every-anchor tau."""
    from dflash_dash import metrics

    m, _ = family(world, name)
    r = replayed(world, m, 0.0, rule)
    s = metrics.summarize([r], m.width, 0)
    assert s["tau_expected"] == pytest.approx(s["every_anchor_tau"], abs=1e-6)
    assert s["tau_expected_bound"] == pytest.approx([s["every_anchor_tau"]] * 2, abs=1e-6)
    e = r.expected_at.reshape(-1, 2)[:, 0]
    np.testing.assert_allclose(e, r.accepted_at + 1, atol=1e-6)


@pytest.mark.parametrize("budget", [0, 2])
@pytest.mark.parametrize("rule", sampling.RULES)
@pytest.mark.parametrize("name", FAMILIES)
def test_chain_mode_equals_every_anchor_at_its_anchors(world, name, rule, budget):
    m, _ = family(world, name)
    every = replayed(world, m, 0.2, rule, budget=budget).expected_at.reshape(-1, 2)
    chain = replayed(world, m, 0.2, rule, chain=True, budget=budget)
    got = chain.expected_at.reshape(-1, 2)
    at = np.asarray(chain.round_anchors) - P
    assert len(at) and not np.isnan(got[at]).any()
    np.testing.assert_allclose(got[at], every[at], rtol=1e-5)
    assert np.isnan(got[np.flatnonzero(chain.accepted_at < 0)]).all()  # anchors not computed


def test_extracted_top_equals_full_logits(world):
    p, top = world["p"], world["tops"][8]
    rows = p[P - 1 : -1]  # predictions of positions P..T-1
    want = np.argsort(-rows, axis=1, kind="stable")[:, :8]
    np.testing.assert_array_equal(top.ids, want)
    np.testing.assert_allclose(np.exp(top.logp), np.take_along_axis(rows, want, 1), rtol=1e-4)
    np.testing.assert_allclose(top.tail, 1 - np.take_along_axis(rows, want, 1).sum(1), rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("t", [0.0, 0.5, 1.0, 1.7])
def test_torch_twins_equal_numpy(t):
    rng = np.random.default_rng(0)
    A, D, V, K = 5, 3, 50, 7
    logits = rng.normal(size=(A, D, V)) * 2
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    ids = np.argsort(-p, -1, kind="stable")[..., :K]
    kept = np.take_along_axis(p, ids, -1)
    logp, tail = np.log(kept).astype(np.float32), (1 - kept.sum(-1)).astype(np.float32)
    lo, hi = expect.tempered(torch.from_numpy(logp), torch.from_numpy(tail), t, V)
    nlo, nhi = sampling.tempered(logp.reshape(-1, K), tail.reshape(-1), t, V)
    np.testing.assert_allclose(lo.reshape(-1, K).numpy(), nlo, rtol=1e-9)
    np.testing.assert_allclose(hi.reshape(-1, K).numpy(), nhi, rtol=1e-9)
    drafts = rng.integers(0, V, size=(A, D))
    got = expect.draft_alpha(torch.from_numpy(ids), lo, hi, torch.from_numpy(drafts), t)
    want = sampling.draft_alpha(ids, logp, tail, drafts, t, V)
    np.testing.assert_allclose(got[..., 0].numpy(), want[0], rtol=1e-9)
    np.testing.assert_allclose(got[..., 1].numpy(), want[1], rtol=1e-9)
    scores = rng.normal(size=(A, D, V)) * 2
    q = np.exp(scores / max(t, 1e-9) - (scores / max(t, 1e-9)).max(-1, keepdims=True))
    q = q / q.sum(-1, keepdims=True) if t else np.eye(V)[scores.argmax(-1)]
    want = sampling.overlap_alpha(ids, logp, tail, q, t, V)
    got = expect.overlap(
        torch.from_numpy(ids).view(-1, K), lo.view(-1, K), hi.view(-1, K), torch.from_numpy(scores).view(-1, V), t
    ).view(A, D, 2)
    np.testing.assert_allclose(got[..., 0].numpy(), want[0], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(got[..., 1].numpy(), want[1], rtol=1e-6, atol=1e-9)
