"""DFlash2's fast path (the default) against its plain reference (`DFlash2.fast = False`, `stack = 1`), fp32 on the
CPU: the one-expression convolution (`kernels.conv`, fused on CUDA) against the tap-by-tap reference and the
float64 by-hand one (tests/ref_dflash2.py), the one-pass candidates against the fp32 [rows, V] transform, and whole
replays with blocks stacked per forward (`stack`) against the reference replay and the one-block loop: identical
drafts and candidates, log-probabilities within fp32 rounding, at several block sizes, taps, groups, chunks, layer
kinds and both every-anchor paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ref_dflash2 import conv as conv_by_hand
from safetensors.torch import save_file

from dflash_dash import drafters as dr, replay as rp, target as tg
from dflash_dash.drafters import dflash2, kernels
from dflash_dash.drafters.kernels import rmsnorm
from tools import tiny

V, H = 512, 64


def load(tmp: Path, block: int, taps: int, group: int, unary: dict | None = None, **kw) -> dflash2.DFlash2:
    """A tiny seeded DFlash2 (block `block`, `taps` convolution taps over groups of `group` channels)."""
    fields = {"conv_kernel_size": taps, "conv_group_size": group, "selector_rank": 8, "selector_top_k": 6}
    d = tiny.TinyDrafter(
        **({"seed": 5, "block_size": block, "architecture": "DFlash2DraftModel", "family_fields": fields} | kw)
    )
    cfg = tiny.drafter_config(d)
    cfg["dflash_config"] |= unary or {}
    tmp.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tiny.weights(d).items()}, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps(cfg))
    m = dr.load(tmp)
    assert isinstance(m, dflash2.DFlash2) and m.fast  # the fast path is the default
    return m


def reference(m: dflash2.DFlash2) -> dflash2.DFlash2:
    """The same weights on the plain path: tap-by-tap convolution, fp32 transform of every logit, one block of
    the replay's chunk per block."""
    ref = dflash2.DFlash2(m.c, m.w, m.path, m.sliding_block)
    ref.fast, ref.stack = False, 1
    return ref


def inputs(seed: int, T: int):
    g = torch.Generator().manual_seed(seed)
    head = tg.Head(torch.randn(V, H, generator=g), torch.randn(V, H, generator=g))
    return head, torch.randint(0, V, (T,), generator=g), torch.randn(T, 128, generator=g)


@pytest.mark.parametrize("B,T,gs", [(8, 2, 16), (5, 3, 8), (4, 1, 64), (16, 4, 16), (3, 3, 32)])
def test_conv_equals_the_tap_by_tap_reference(tmp_path, B, T, gs):
    """`kernels.conv` (every tap in one expression) equals DFlash2's tap-by-tap reference and the float64 by-hand
    sum on blocks batched [N, B, H], each block alone."""
    m = load(tmp_path, max(B, T), T, gs)
    g = torch.Generator().manual_seed(B * 10 + T)
    x, delta = torch.randn(3, B, H, generator=g), torch.randn(3, B, T, H // gs, generator=g)
    base = torch.randn(T, H, generator=g)
    got = kernels.conv(x, delta, base)
    want = m._convolve_taps(x, delta, base.unflatten(-1, (-1, gs)))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for n in range(3):
        by_hand = conv_by_hand(x[n].double(), delta[n].double(), base.double(), gs)
        torch.testing.assert_close(got[n].double(), by_hand, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, x)  # the taps do something
    m.fast = True
    torch.testing.assert_close(m._convolve(x, delta, base.unflatten(-1, (-1, gs))), got, rtol=0, atol=0)


@pytest.mark.parametrize("unary", [{}, {"output_multiplier": 0.7, "final_logit_softcapping": 6.0}])
def test_one_pass_candidates_equal_the_fp32_transform(tmp_path, unary):
    """The fast read-out's candidates (top-K of the raw logits, K values transformed) are the reference's (top-K
    of every transformed logit): same ids in the same order, same values."""
    m = load(tmp_path, 8, 2, 16, unary)
    head = inputs(1, 4)[0]
    hs = rmsnorm(torch.randn(40, 7, H, generator=torch.Generator().manual_seed(2)), torch.ones(H), 1e-6)
    U, C = m._unary_top(head, hs)
    rU, rC = reference(m)._unary_top(head, hs)
    assert U.shape == C.shape == (40, 7, 6)
    assert torch.equal(C, rC)
    torch.testing.assert_close(U, rU, rtol=1e-6, atol=1e-6)
    if unary:
        assert U.abs().max() < 6.0  # capped
    assert not torch.equal(C[:, 0], C[:, 1])  # varied rows


CONFIGS = [  # block, taps, group, layer kinds, window, is_causal, chunk
    (8, 2, 16, ["sliding_attention"] * 2, 6, False, 5),  # the released shape: block 8, all sliding, bidirectional
    (8, 2, 16, ["sliding_attention"] * 2, 6, False, 64),
    (5, 3, 8, ["full_attention", "sliding_attention"], 4, True, 2),
    (4, 1, 32, None, None, None, 3),
    (16, 2, 16, ["sliding_attention", "full_attention"], 9, False, 7),  # stack 1: the fast kernels alone
]


@pytest.mark.parametrize("long", [False, True])  # True: the long-context path (`DFlash.blocks_run`)
@pytest.mark.parametrize("block,taps,group,types,window,causal,chunk", CONFIGS)
def test_fast_replay_equals_the_reference(
    monkeypatch, tmp_path, block, taps, group, types, window, causal, chunk, long
):
    """Every-anchor drafts of the fast path (fused convolution, one-pass candidates, `stack` blocks per chunk
    block) equal the reference path's and the plain one-block loop's: identical drafts and top-k ids,
    log-probabilities within fp32 rounding."""
    monkeypatch.setattr(rp.every, "LONG", 0 if long else rp.every.LONG)
    kw = {"layer_types": types, "sliding_window": window} if types else {}
    m = load(tmp_path / "d", block, taps, group, **kw)
    if causal is not None:  # sliding layers: causal (SpecForge's default) or bidirectional (the released config)
        m = dflash2.DFlash2(m.c, m.w, m.path, "causal" if causal else "bidirectional")
    assert m.stack == max(1, 16 // block)
    ref = reference(m)
    head, tokens, feats = inputs(block * 7 + chunk, T=33)
    P, topk = 6, 8  # topk > selector_top_k: the padded ranks too
    a = rp.draft_all(m, head, feats, tokens, P, topk=topk, chunk=chunk)
    wants = [rp.draft_all(ref, head, feats, tokens, P, topk=topk, chunk=chunk)]
    if not long:  # the plain one-block loop (the same for both paths)
        wants.append(rp.draft_loop(ref, head, feats, tokens, P, topk=topk))
    assert a.tokens.shape == (33 - P, block - 1)
    for want in wants:
        assert torch.equal(a.tokens, want.tokens) and torch.equal(a.top_ids, want.top_ids)
        torch.testing.assert_close(a.top_logp, want.top_logp, rtol=0, atol=1e-4)
    assert len(set(a.tokens.flatten().tolist())) > 5


def test_stack_fills_each_forward_with_a_block16_drafters_rows(monkeypatch, tmp_path):
    """A block-8 DFlash2 drafts `chunk` x 2 blocks per forward (groups of GROUP x 2): as many block slots per call
    as a block-16 drafter at the same chunk. Its reference (stack 1) drafts `chunk` blocks per call."""
    m = load(tmp_path, 8, 2, 16)
    head, tokens, feats = inputs(3, T=60)
    seen: list[tuple[int, int]] = []
    real = dflash2.DFlash2.blocks_in_place

    def spy(self, kv, anchors, emb, max_anchor=None):
        seen.append((emb.shape[0], emb.shape[0] // kv[0][0].shape[0]))  # (blocks, blocks per group)
        return real(self, kv, anchors, emb, max_anchor)

    monkeypatch.setattr(dflash2.DFlash2, "blocks_in_place", spy)
    monkeypatch.setattr(rp.every, "GROUP", 4)
    rp.draft_all(m, head, feats, tokens, 4, topk=2, chunk=16)  # 56 anchors: 32 + 24 (padded to 3 groups of 8)
    assert seen == [(32, 8), (24, 8)]
    seen.clear()
    rp.draft_all(reference(m), head, feats, tokens, 4, topk=2, chunk=16)
    assert seen == [(16, 4)] * 3 + [(8, 4)]
