"""Performance paths compute the same function as the plain ones.

Each optimisation of the core keeps a test here: grouped SDPA attention of `DFlash.blocks` against the
one-block reference `Drafter.block`; the chunked LM head with the one-pass log-sum-exp against a plain
log_softmax + top-k (the Triton kernel itself runs in Triton's interpreter on the CPU); scoring on a
worker thread against scoring in line; and the overlapped extraction stream against `extract` per item.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from synthetic import random_head

from dflash_dash import drafters as dr, replay as rp, target as tg
from dflash_dash.drafters import readout
from tools import tiny

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return tiny.write_target(tmp_path_factory.mktemp("perf") / "target", tiny.TinyTarget(seed=7))


# ---------------------------------------------------------------------------
# DFlash.blocks: grouped SDPA == one block at a time


@pytest.mark.parametrize(
    "types,window",
    [
        (["full_attention", "full_attention"], None),
        (["sliding_attention", "full_attention"], 4),
    ],
)
@pytest.mark.parametrize("group", [1, 2, 3, 16])
def test_blocks_grouped_equals_one_block(tmp_path, types, window, group):
    m = dr.load(tiny.write_drafter(tmp_path / "d", tiny.TinyDrafter(layer_types=types, sliding_window=window, seed=5)))
    g = torch.Generator().manual_seed(group)
    T = 41
    feats = torch.randn(T, 128, generator=g)
    anchors = torch.tensor([30, 9, 12, 1, 37, 20, 21])  # unsorted, gaps, 7 blocks (not a multiple of 2, 3)
    emb = torch.randn(len(anchors), 4, 64, generator=g)
    with torch.no_grad():
        got = m.blocks(m.context_kv(feats), anchors, emb, group=group)
        want = torch.stack([m.block(feats, int(p), e) for p, e in zip(anchors, emb)])
    assert got.shape == want.shape == (7, 4, 64)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "group,chunk,replica_bytes", [(3, 10, 4 << 30), (16, 40, 4 << 30), (4, 4, 4 << 30), (16, 7, 4 << 30), (3, 10, 1)]
)
def test_every_anchor_groups_over_replicated_context(monkeypatch, tmp_path, group, chunk, replica_bytes):
    """draft_all drafts each call's blocks as groups of consecutive anchors over the context copied once per
    group (`replay.every._replicas`; the blocks' keys written in place): equal to the one-block loop, with several
    groups per call, a short last call (fewer groups, the last block repeated), a sliding layer, and a copy
    budget (`REPLICA_BYTES`) that leaves one group per call."""
    m = dr.load(
        tiny.write_drafter(
            tmp_path / "d",
            tiny.TinyDrafter(layer_types=["sliding_attention", "full_attention"], sliding_window=5, seed=6),
        ),
        sliding_block="causal",
    )
    monkeypatch.setattr(rp.every, "GROUP", group)
    monkeypatch.setattr(rp.every, "REPLICA_BYTES", replica_bytes)
    g = torch.Generator().manual_seed(chunk)
    head = random_head(seed=chunk)
    T, P = 57, 6  # 51 anchors: no chunk size above divides them
    tokens, feats = torch.randint(0, 512, (T,), generator=g), torch.randn(T, 128, generator=g)
    a = rp.draft_all(m, head, feats, tokens, P, topk=4, chunk=chunk)
    b = rp.draft_loop(m, head, feats, tokens, P, topk=4)
    assert a.tokens.shape == (T - P, 3)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.top_ids, b.top_ids)
    torch.testing.assert_close(a.top_logp, b.top_logp, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "types,window,causal",
    [
        (["full_attention", "full_attention"], None, False),
        (["sliding_attention", "full_attention"], 5, True),
        (["sliding_attention", "sliding_attention"], 40, False),
    ],
)
@pytest.mark.parametrize("start,n,group", [(1, 7, 3), (9, 16, 16), (30, 11, 4), (44, 1, 16)])
def test_blocks_run_equals_blocks(tmp_path, types, window, causal, start, n, group):
    """`blocks_run` (the keys every block sees in one unmasked call, the rest masked, merged by log-sum-exp)
    equals the grouped forward at the same anchors: full attention, a narrow causal window and a window wider
    than the context, a run from the first position, one block, groups that do not divide the run."""
    m = dr.load(
        tiny.write_drafter(tmp_path / "d", tiny.TinyDrafter(layer_types=types, sliding_window=window, seed=8)),
        sliding_block="causal" if causal else "bidirectional",
    )
    g = torch.Generator().manual_seed(start * 100 + n)
    feats = torch.randn(45, 128, generator=g)
    emb = torch.randn(n, 4, 64, generator=g)
    with torch.no_grad():
        kv = m.context_kv(feats)
        got = m.blocks_run(kv, start, emb, group=group)
        want = m.blocks(kv, torch.arange(start, start + n), emb, group=group)
    assert got.shape == want.shape == (n, 4, 64)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_blocks_run_follows_blocks_in_bfloat16(tmp_path):
    """In bf16 (the GPU's dtype) `blocks_run` rounds in another order than the grouped forward: its states stay
    within bf16 noise of them, and the drafts (argmax through a random LM head) agree where they are decisive."""
    types = ["sliding_attention", "full_attention"]
    ck = tiny.write_drafter(tmp_path / "d", tiny.TinyDrafter(layer_types=types, sliding_window=9, seed=4))
    m = dr.load(ck, torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(300, 128, generator=g).bfloat16()
    emb = torch.randn(64, 4, 64, generator=g).bfloat16()
    with torch.no_grad():
        kv = m.context_kv(feats)
        got = m.blocks_run(kv, 200, emb).float()
        want = m.blocks(kv, torch.arange(200, 264), emb).float()
    assert (got - want).abs().max() < 0.1 and (got - want).norm() / want.norm() < 0.01
    lm = torch.randn(512, 64, generator=g)
    a, b = got @ lm.T, want @ lm.T
    top2 = b.topk(2, -1).values
    decisive = (top2[..., 0] - top2[..., 1]) > 0.5
    assert decisive.float().mean() > 0.5 and torch.equal(a.argmax(-1)[decisive], b.argmax(-1)[decisive])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_parts_merge_to_the_whole(dtype):
    """`attention.attend` on two disjoint key sets, merged, equals one attention over their union (and each
    part equals the plain fp32 reference), masked or not."""
    from dflash_dash.drafters import attention

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, n, 16, generator=g).to(dtype) for n in (10, 23, 23))
    ok = torch.rand(2, 1, 10, 23, generator=g) > 0.4
    ok[..., 0] = True  # every query sees a key of each part
    ok[..., 12] = True
    whole, _ = attention.reference(q, k, v, ok)
    a, b = (
        attention.attend(q, k[:, :, :12], v[:, :, :12], ok[..., :12]),
        attention.attend(q, k[:, :, 12:], v[:, :, 12:], ok[..., 12:]),
    )
    tol = dict(rtol=0, atol=1e-5) if dtype == torch.float32 else dict(rtol=0, atol=2e-2)
    for part, (o, lse) in zip((slice(0, 12), slice(12, 23)), (a, b)):
        ro, rl = attention.reference(q, k[:, :, part], v[:, :, part], ok[..., part])
        torch.testing.assert_close(o.float(), ro.float(), **tol)
        torch.testing.assert_close(lse, rl, rtol=0, atol=1e-4 if dtype == torch.float32 else 2e-2)
    torch.testing.assert_close(attention.merge(*a, *b).float(), whole.float(), **tol)
    o, _ = attention.attend(q, k, v)  # unmasked
    torch.testing.assert_close(o.float(), attention.reference(q, k, v, None)[0].float(), **tol)


@pytest.mark.parametrize("Lk", [23, 16, 5])
def test_attention_in_tiles_equals_the_whole(Lk):
    """`attention.tiled` (runs of `tile` keys through a kernel, the rest through `attend`, merged in fp32) equals
    the plain attention and its log-sum-exp: tiles and a rest, tiles only, a rest only; `prefix` (flash, the
    default kernel choice) equals it too."""
    from dflash_dash.drafters import attention

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, n, 16, generator=g) for n in (10, Lk, Lk))
    used = []

    def kernel(q, k, v):
        used.append(k.shape[-2])
        return attention.reference(q, k, v, None)

    got = attention.tiled(q, k, v, 8, kernel)
    assert used == [8] * (Lk // 8)  # only full tiles go through the kernel
    for a, b in zip(got, attention.reference(q, k, v, None)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    torch.testing.assert_close(attention.prefix(q, k, v)[0], got[0], rtol=0, atol=1e-5)


def test_attention_falls_back_to_chunked_plain_attention(monkeypatch):
    """A kernel that raises is warned about once and not tried again; the fallback (`chunked`: the plain fp32
    attention over query chunks bounded by SCORE_BYTES) gives the same output and log-sum-exp."""
    from dflash_dash.drafters import attention

    monkeypatch.setattr(attention, "_FAILED", set())
    monkeypatch.setattr(attention, "SCORE_BYTES", 4 * 23 * 6 * 3)  # 3 query rows a chunk
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, n, 16, generator=g) for n in (10, 23, 23))
    ok = torch.rand(2, 1, 10, 23, generator=g) > 0.3
    ok[..., 0] = True
    want = attention.reference(q, k, v, ok)
    calls = []

    def broken(*a):
        calls.append(1)
        raise RuntimeError("no kernel image is available")

    monkeypatch.setitem(attention.KERNELS, "cpu", broken)
    with pytest.warns(UserWarning, match="cpu unavailable.*no kernel image"):
        got = attention.attend(q, k, v, ok)
    again = attention.attend(q, k, v, None)  # not tried again, no second warning
    assert calls == [1]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    torch.testing.assert_close(again[0], attention.reference(q, k, v, None)[0], rtol=0, atol=1e-6)


def test_long_sequences_report_their_anchors(monkeypatch, tmp_path):
    """A sequence past LONG tells `anchors(i, done, total)` as its runs are queued (rising to its total); a short
    one is one step and tells nothing. The results do not depend on the callback."""
    m = dr.load(tiny.write_drafter(tmp_path / "d", tiny.TinyDrafter(seed=3)))
    monkeypatch.setattr(rp.every, "LONG", 30)
    g = torch.Generator().manual_seed(0)
    head = random_head(seed=1)
    seqs = [
        rp.Sequence(f"s{i}", torch.randint(0, 512, (T,), generator=g), P, torch.randn(T, 128, generator=g))
        for i, (T, P) in enumerate([(64, 4), (20, 3), (41, 10)])
    ]
    heard = []
    got, _ = rp.every_anchor(m, head, seqs, budget=2, chunk=8, anchors=lambda i, a, n: heard.append((i, a, n)))
    want, _ = rp.every_anchor(m, head, seqs, budget=2, chunk=8)
    assert got == want
    assert {i for i, _, _ in heard} == {0, 2}  # the two sequences past 30 tokens
    for i, total in ((0, 60), (2, 31)):
        seen = [a for j, a, n in heard if j == i and n == total]
        assert seen == sorted(seen) and seen[-1] == total and len(seen) == -(-total // 8)


@pytest.mark.parametrize("chunk", [5, 64])
def test_every_anchor_long_path_equals_the_loop(monkeypatch, tmp_path, chunk):
    """Past LONG tokens draft_all drafts through `blocks_run` (one context K/V, runs of `chunk` anchors): equal
    to the one-block loop, a sliding layer included."""
    m = dr.load(
        tiny.write_drafter(
            tmp_path / "d",
            tiny.TinyDrafter(layer_types=["sliding_attention", "full_attention"], sliding_window=5, seed=6),
        ),
        sliding_block="causal",
    )
    monkeypatch.setattr(rp.every, "LONG", 16)
    called = []
    real = type(m).blocks_run
    monkeypatch.setattr(type(m), "blocks_run", lambda self, *a, **k: called.append(1) or real(self, *a, **k))
    g = torch.Generator().manual_seed(chunk)
    head = random_head(seed=chunk)
    T, P = 57, 6
    tokens, feats = torch.randint(0, 512, (T,), generator=g), torch.randn(T, 128, generator=g)
    a = rp.draft_all(m, head, feats, tokens, P, topk=4, chunk=chunk)
    b = rp.draft_loop(m, head, feats, tokens, P, topk=4)
    assert called and a.tokens.shape == (T - P, 3)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.top_ids, b.top_ids)
    torch.testing.assert_close(a.top_logp, b.top_logp, rtol=0, atol=1e-4)


def test_blocks_gradients_do_not_depend_on_grouping(tmp_path):
    """The demo trains through `blocks`: grouping and its padding must not change the gradients."""
    ck = tiny.write_drafter(tmp_path / "d", tiny.TinyDrafter(seed=2))
    g = torch.Generator().manual_seed(0)
    feats, emb = torch.randn(30, 128, generator=g), torch.randn(5, 4, 64, generator=g)
    anchors = torch.tensor([4, 17, 9, 25, 11])
    grads = []
    for group in (1, 3):
        m = dr.load(ck)
        for t in m.w.named().values():
            t.requires_grad_(True)
        loss = m.blocks(m.context_kv(feats), anchors, emb, group=group).square().mean()
        loss.backward()
        grads.append(torch.cat([t.grad.flatten() for t in m.w.named().values()]))
    assert grads[0].abs().sum() > 0 and torch.isfinite(grads[0]).all()
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------
# LM head: row chunks, no fp32 logits copy, log p = logit - logsumexp


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_chunks_equal_plain_log_softmax(monkeypatch, dtype):
    head = random_head(V=700, H=32, dtype=dtype)
    h = torch.randn(6, 5, 32, generator=torch.Generator().manual_seed(3)).to(dtype)
    monkeypatch.setattr(readout, "HEAD_ROWS", 7)  # 24 rows in 4 uneven chunks
    drafts, ids, logp = (t.view(6, 4, -1).squeeze(-1) for t in readout.lm_top(head, h[:, 1:].reshape(24, 32), 5))
    logits = (h[:, 1:] @ head.lm_head.T).float()  # the plain formulation
    lp = torch.log_softmax(logits, -1)
    assert torch.equal(drafts, logits.argmax(-1))
    top = lp.topk(5, dim=-1)
    assert torch.equal(ids, top.indices)
    torch.testing.assert_close(logp, top.values, rtol=0, atol=1e-5)
    d0, i0, l0 = readout.lm_top(head, h[:, 1:].reshape(24, 32), 0)
    assert torch.equal(d0.view(6, 4), drafts) and i0.shape == l0.shape == (24, 0)


def test_triton_top_logp_matches_torch_in_interpreter():
    """The CUDA kernel's code, run by Triton's CPU interpreter: top-k values and ids equal a stable
    descending sort's first k (so slot 0 is torch.argmax, first of equal maxima), lse equals torch's; with
    tiles of the product's size and small ones (`TOP_BLOCK`: many tiles per row, equal values in different ones)."""
    code = (
        "import torch\n"
        "from dflash_dash.drafters import readout as ro\n"
        "top = ro._top_triton()\n"
        "g = torch.Generator().manual_seed(0)\n"
        "cases = [(5000, torch.bfloat16, 8, 4.0), (4096, torch.float32, 3, 4.0), (37, torch.float32, 1, 4.0),\n"
        "         (9000, torch.bfloat16, 8, 0.0)]\n"
        "for (V, dt, k, scale), blk in [(c, b) for c in cases for b in (ro.TOP_BLOCK, 512)]:\n"
        "    ro.TOP_BLOCK = blk\n"
        "    x = (torch.randn(3, V, generator=g) * scale).to(dt) if scale else \\\n"
        "        (torch.randint(-40, 40, (3, V), generator=g) / 8).to(dt)\n"  # many exact ties
        "    x[1, min(V - 1, 4100)] = 60.0; x[2, V - 1] = 61.0; x[2, 7] = 61.0\n"  # dominant logits, tied max
        "    vals, ids, lse = top(x, k)\n"
        "    ref = torch.sort(x.float(), dim=-1, descending=True, stable=True)\n"
        "    assert torch.equal(ids, ref.indices[:, :k]), (ids, ref.indices[:, :k])\n"
        "    assert torch.equal(vals, ref.values[:, :k])\n"
        "    assert torch.equal(ids[:, 0], x.float().argmax(-1))\n"
        "    torch.testing.assert_close(lse, torch.logsumexp(x.float(), -1), rtol=1e-5, atol=1e-5)\n"
        "print('ok')\n"
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


# ---------------------------------------------------------------------------
# replay.every_anchor: scoring on a worker thread == scoring in line


def test_run_scores_in_order_like_a_plain_loop(tmp_path):
    m = dr.load(tiny.write_drafter(tmp_path / "d", tiny.TinyDrafter(seed=4)))
    head = random_head()
    g = torch.Generator().manual_seed(9)
    seqs = [
        rp.Sequence(f"s{i}", torch.randint(0, 512, (T,), generator=g), P, torch.randn(T, 128, generator=g))
        for i, (T, P) in enumerate([(30, 5), (18, 9), (25, 3), (12, 11)])
    ]
    seen = []
    results, summary = rp.every_anchor(m, head, seqs, budget=3, chunk=4, progress=lambda i, n: seen.append((i, n)))
    k = max(3, rp.ROUND_TOPK)  # run drafts the DDTree budget's candidates, and ROUND_TOPK for the round detail
    want = [
        rp.score(
            s.id,
            rp.draft_all(m, head, s.features, s.tokens, s.prompt_len, topk=k, chunk=4),
            s.tokens.numpy(),
            s.prompt_len,
            3,
        )
        for s in seqs
    ]
    assert [r.id for r in results] == ["s0", "s1", "s2", "s3"]
    assert results == want
    assert summary == rp.summarize(want, m.c.block_size, 3)
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]


# ---------------------------------------------------------------------------
# target.extract_stream == extract + write per item


def test_extract_stream_equals_extract(target_dir):
    ids_list = [torch.randint(0, 512, (T,), generator=torch.Generator().manual_seed(T)) for T in (23, 7, 40, 16)]
    dec, _ = tg.load(target_dir, [1, 4], "cpu")
    written = {}

    def write(key, feats):
        written[key] = feats.clone()
        return f"file-{key}"

    got = list(tg.extract_stream(dec, enumerate(ids_list), [1, 4], write, depth=2))
    assert got == [(i, f"file-{i}") for i in range(4)]
    for i, ids in enumerate(ids_list):
        torch.testing.assert_close(written[i], tg.extract(dec, ids, [1, 4]), rtol=0, atol=0)


def test_first_long_forward_is_preceded_by_a_short_warm_up(monkeypatch, target_dir):
    """A CUDA decoder's first forward longer than 2 x WARM_TOKENS runs one of WARM_TOKENS tokens first (kernels
    tuned on the short input), once per decoder; the features are unchanged. The device test is patched (no CUDA
    here): `_warm` is given a CUDA device while the decoder runs on the CPU."""
    monkeypatch.setattr(tg, "WARM_TOKENS", 8)
    dec, _ = tg.load(target_dir, [1, 4], "cpu")
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(2))
    want = tg.extract(dec, ids, [1, 4])  # a CPU decoder: never warmed
    lengths = []
    dec.register_forward_pre_hook(lambda m, a, kw: lengths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    tg._warm(dec, ids[:16], [1, 4], torch.device("cuda"))  # not longer than 2 x 8: no warm-up, but seen
    tg._warm(dec, ids, [1, 4], torch.device("cuda"))
    assert lengths == []
    other, _ = tg.load(target_dir, [1, 4], "cpu")
    other.register_forward_pre_hook(lambda m, a, kw: lengths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    tg._warm(other, ids, [1, 4], torch.device("cuda"))
    tg._warm(other, ids, [1, 4], torch.device("cuda"))
    assert lengths == [8]  # one warm-up of WARM_TOKENS tokens, once
    torch.testing.assert_close(tg.extract(other, ids, [1, 4]), want, rtol=0, atol=0)


def test_fla_length_bucketed_autotuners_are_pinned_to_their_one_choice(monkeypatch):
    """fla's row-wise norms tune per bucket of their row count (`NB`): once a tuner has chosen for one setting of
    its other key fields, `pin_buckets` leaves it that one config (later buckets compile it and time none); a
    tuner that chose for two settings (two head sizes), or none yet, keeps every config. fla's real tuners, with
    their choices planted (Triton cannot tune on this CPU); `_warm` pins on every CUDA call."""
    pytest.importorskip("fla.modules")
    monkeypatch.setattr(tg, "_TUNERS", [])
    monkeypatch.setattr(tg, "_PINNED", set())
    tuners = {t.base_fn.__name__: t for t in tg._bucketed()}
    l2, gate = tuners["l2norm_fwd_kernel"], tuners["layer_norm_gated_fwd_kernel"]
    for t in tuners.values():
        monkeypatch.setattr(t, "cache", {})
        monkeypatch.setattr(t, "configs", list(t.configs))
    assert tg.pin_buckets() == 0  # nothing tuned yet
    small, big = l2.configs[1], l2.configs[6]
    l2.cache.update({(128, 1, "torch.bfloat16"): small, (128, 2, "torch.bfloat16"): big})
    rms = (True, False, False, True, "torch.bfloat16")
    gate.cache.update({(128, 1, *rms): gate.configs[0], (256, 1, *rms): gate.configs[1]})
    n_gate = len(gate.configs)
    assert tg.pin_buckets() == 1
    assert l2.configs == [big]  # the largest bucket's choice
    assert len(gate.configs) == n_gate  # two head sizes: left to tune
    assert tg.pin_buckets() == 0  # pinned once
    calls = []
    monkeypatch.setattr(tg, "pin_buckets", lambda: calls.append(1))
    tg._warm(object(), torch.arange(4), [1], torch.device("cpu"))
    assert calls == []  # the CPU runs the torch path: no Triton tuner to pin
    tg._warm(torch.nn.Linear(1, 1), torch.arange(4), [1], torch.device("cuda"))  # short: no warm-up forward
    assert calls == [1]


def test_extract_stream_yields_earlier_items_before_an_input_error(target_dir):
    dec, _ = tg.load(target_dir, [2], "cpu")

    def items():
        yield "a", torch.arange(10)
        yield "b", torch.arange(5)
        raise ValueError("bad prompt c")

    got = []
    with pytest.raises(ValueError, match="bad prompt c"):
        for key, res in tg.extract_stream(dec, items(), [2], lambda k, f: f.shape, depth=3):
            got.append((key, tuple(res)))
    assert got == [("a", (10, 64)), ("b", (5, 64))]


def test_extract_stream_write_error_surfaces(target_dir):
    dec, _ = tg.load(target_dir, [2], "cpu")

    def write(key, feats):
        if key == 1:
            raise OSError("disk full")
        return key

    with pytest.raises(OSError, match="disk full"):
        list(tg.extract_stream(dec, enumerate([torch.arange(6)] * 3), [2], write))


# ---------------------------------------------------------------------------
# fla's causal conv in place of torch's conv1d


def test_fla_conv1d_adapter_matches_transformers_conv(monkeypatch):
    """The adapter maps transformers' [B, D, T] call onto fla's [B, T, D] API: checked with a torch stand-in
    for fla's kernel (which needs a GPU) against transformers' own torch causal conv."""
    import torch.nn.functional as F
    from fla.modules import causal_conv1d as fla_conv
    from transformers.models.qwen3_5 import modeling_qwen3_5 as q

    def stand_in(x, weight, bias=None, activation=None, backend=None, **_):  # x [B, T, D]
        W = weight.shape[1]
        y = F.conv1d(x.transpose(1, 2), weight[:, None], bias, padding=W - 1, groups=x.shape[2])[..., : x.shape[1]]
        return (F.silu(y) if activation in ("silu", "swish") else y).transpose(1, 2), None

    monkeypatch.setattr(fla_conv, "causal_conv1d", stand_in)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 9, 24, generator=g)  # [B, T, D] as the projection leaves it
    w = torch.randn(24, 4, generator=g)
    got = tg.fla_conv1d(x.transpose(1, 2), w, None, activation="silu")
    tg.use_backend("torch")
    assert q.causal_conv1d_fn is not tg.fla_conv1d  # the torch path keeps torch's conv
    want = q.causal_conv1d_fn(x.transpose(1, 2), w, None, activation="silu")
    assert got.shape == want.shape == (2, 24, 9)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
