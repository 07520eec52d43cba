"""Chain-only replay: only the anchors the chain and DDTree walks visit, many sequences in lockstep;
its rounds, drafts and acceptance equal the every-anchor mode's on the same inputs."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from synthetic import planted

from dflash_dash import drafters as dr, metrics, ops, replay as rp, target as tg
from dflash_dash.drafters import kernels
from tools import tiny


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    base = tmp_path_factory.mktemp("chain")
    g = torch.Generator().manual_seed(1)
    head = tg.Head(torch.randn(512, 64, generator=g), torch.randn(512, 64, generator=g))
    out = {}
    for name, types, win in [
        ("full", ["full_attention"] * 2, None),
        ("sliding", ["sliding_attention", "full_attention"], 6),
    ]:
        m = dr.load(
            tiny.write_drafter(
                base / name, tiny.TinyDrafter(seed=3, layer_types=types, sliding_window=win, block_size=5)
            )
        )
        seqs = []
        for i, (T, P) in enumerate([(60, 5), (31, 9), (47, 3), (13, 11), (2, 1), (40, 20)]):
            feats = torch.randn(T, 128, generator=g)
            seqs.append(rp.Sequence(f"s{i}", planted(m, head, feats, P, T, seed=i), P, feats))
        out[name] = (m, seqs)
    return head, out


@pytest.mark.parametrize("name", ["full", "sliding"])
@pytest.mark.parametrize("budget,batch", [(0, 4), (3, 2), (6, 64)])
def test_chain_rounds_equal_every_anchor(case, name, budget, batch, monkeypatch):
    head, models = case
    monkeypatch.setattr(rp.lockstep, "HEAD_STAGES", (1, 3))  # DDTree off: LM-head stages of slots 1 | 2..3 | 4 (B = 5)
    monkeypatch.setattr(
        kernels, "KEY_ALIGN", 8
    )  # short key spans: the lockstep attention reads only keys below a bound
    m, seqs = models[name]
    every, s_every = rp.every_anchor(m, head, seqs, budget=budget, chunk=7)
    kept, keep = [], rp.lockstep.Lockstep.keep
    monkeypatch.setattr(rp.lockstep.Lockstep, "keep", lambda st, idx: (kept.append(len(idx)), keep(st, idx))[1])
    chain, s_chain = rp.chain_only(m, head, seqs, budget=budget, batch=batch)
    # the stacks shrink as walks end, never to one row (a shape compiled kernels specialise on): a spare row stays
    assert all(k >= 2 for k in kept) and (batch < 4 or 2 in kept), kept
    assert s_every["tau_pooled"] > 1.5  # planted acceptance: the walks skip anchors
    visited = 0
    for a, b in zip(every, chain):
        assert (a.id, a.rounds, a.round_anchors, a.tree_rounds) == (b.id, b.rounds, b.round_anchors, b.tree_rounds)
        T, D = b.prompt_len + len(b.accepted_at), m.c.block_size - 1
        computed = [x for x, v in enumerate(b.accepted_at) if v >= 0]
        for x in computed:
            assert b.accepted_at[x] == a.accepted_at[x]
            got = [i for i, t in enumerate(b.drafts[x]) if t >= 0]  # the slots computed there
            # DDTree on: every slot; off: at least every slot the walk reads (up to the first rejected draft)
            reads = D if budget else min(b.accepted_at[x] + 1, D, T - 1 - (b.prompt_len + x))
            assert got == list(range(len(got))) and len(got) >= reads
            assert [b.drafts[x][i] for i in got] == [a.drafts[x][i] for i in got]
            assert [b.draft_logp[x][i] for i in got] == pytest.approx([a.draft_logp[x][i] for i in got], abs=1e-4)
        skipped = [x for x in range(len(b.accepted_at)) if x not in computed]  # -1 drafts, NaN log-probabilities
        assert all(t == -1 for x in skipped for t in b.drafts[x]) and np.isnan([b.draft_logp[x] for x in skipped]).all()
        ids, top_p = np.array(b.round_top_ids), np.array(b.round_top_p, dtype=float)
        done = ids >= 0  # the rounds' top-K blocks
        assert (ids[done] == np.array(a.round_top_ids)[done]).all() and (budget == 0 or done.all())
        assert np.allclose(top_p[done], np.array(a.round_top_p, dtype=float)[done], atol=1e-5)
        assert np.isnan(top_p[~done]).all()
        if budget:  # DDTree acceptance wherever the chain mode computed it (tree and chain anchors)
            assert all(t == a.tree_at[x] for x, t in enumerate(b.tree_at) if t >= 0)
            assert all(b.tree_at[p - b.prompt_len] >= 0 for p in b.round_anchors)
        visited += len(computed)
    assert visited < sum(len(a.accepted_at) for a in every)  # really fewer anchors than every-anchor
    for key in (
        "tau_macro",
        "tau_pooled",
        "ddtree_tau",
        "ddtree_tau_pooled",
        "accept_hist",
        "depth_conditional",
        "depth_marginal",
        "rounds",
        "committed",
    ):
        assert s_chain[key] == s_every[key], key
    assert s_chain["every_anchor_tau"] is None and s_every["every_anchor_tau"] is not None  # not computed
    for key in ("calibration_ece", "confidence_depth"):  # their samples stop at the first rejected draft
        assert s_chain[key] == pytest.approx(s_every[key], abs=1e-6), key
    # the expected tau needs every slot: not computed where the LM head ran only for the slots the walk reads
    assert (s_chain["expected_tau"] is None) == (budget == 0) and s_every["expected_tau"] is not None


@pytest.mark.parametrize("name", ["full", "sliding"])
@pytest.mark.parametrize("align", [256, 8])
def test_blocks_in_place_equals_concatenated_keys(case, name, align, monkeypatch):
    """`blocks_in_place` (block keys written into spare slots before the stacked context, attention over
    every context key, or only over those below `max_anchor`) gives the per-call concatenation's states."""
    monkeypatch.setattr(kernels, "KEY_ALIGN", align)
    head, models = case
    m, seqs = models[name]
    seqs = [s for s in seqs if len(s.tokens) > 20][:3]
    T = max(len(s.tokens) for s in seqs)
    feats = torch.stack(
        [torch.cat([s.features, s.features.new_zeros(T - len(s.tokens), s.features.shape[1])]) for s in seqs]
    )
    kv = m.context_kv(feats)
    B = m.c.block_size
    kv_tail = [tuple(torch.cat([t.new_full((*t.shape[:2], B, t.shape[3]), float("nan")), t], 2) for t in p) for p in kv]
    anchors = torch.tensor([len(s.tokens) - 18 for s in seqs])
    emb = torch.randn(len(seqs), B, m.c.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = m.blocks(kv, anchors, emb)
        for top in (None, int(anchors.max())):
            got = m.blocks_in_place(kv_tail, anchors, emb, max_anchor=top)
            assert torch.allclose(got, ref, atol=1e-5), top
        if align < T:  # a bound below an anchor hides keys that the block sees: the bound is really used
            assert not torch.allclose(
                m.blocks_in_place(kv_tail, anchors, emb, max_anchor=int(anchors.min()) - 9), ref, atol=1e-5
            )


def test_long_sequences_advance_in_smaller_batches(case, monkeypatch):
    """Lockstep batches are bounded by their stacked K/V bytes (CHAIN_BYTES, the batch's longest sequence
    counted for each) and context K/V by their features' bytes (CTX_BYTES): tight bounds cut the batches and
    the context steps, and the results are those of one batch."""
    head, models = case
    m, seqs = models["sliding"]
    want, s_want = rp.chain_only(m, head, seqs, budget=3, batch=64)
    per_token = 2 * m.c.num_hidden_layers * m.c.num_key_value_heads * m.c.head_dim * 4  # fp32
    monkeypatch.setattr(rp.lockstep, "CHAIN_BYTES", 2 * 47 * per_token)  # two sequences of <= 47 tokens
    monkeypatch.setattr(rp.lockstep, "CTX_BYTES", 1)  # context K/V one sequence at a time
    parts = rp.lockstep.batches(m, seqs, 64)
    assert [[s.id for s in p] for p in parts] == [["s0"], ["s1", "s2"], ["s3", "s4"], ["s5"]]
    assert [len(p) for p in rp.lockstep.batches(m, seqs, 1)] == [1] * 6
    got, s_got = rp.chain_only(m, head, seqs, budget=3, batch=64)
    assert [a.id for a in got] == [s.id for s in seqs]
    for a, b in zip(got, want):  # another padding: the same drafts, log-probabilities within rounding
        assert (a.rounds, a.tree_rounds, a.round_anchors) == (b.rounds, b.tree_rounds, b.round_anchors)
        assert np.array_equal(a.accepted_at, b.accepted_at) and np.array_equal(a.drafts, b.drafts)
        np.testing.assert_allclose(a.draft_logp, b.draft_logp, rtol=0, atol=1e-5)
    for key in ("tau_macro", "tau_pooled", "ddtree_tau", "rounds", "committed", "accept_hist", "depth_conditional"):
        assert s_got[key] == s_want[key], key


def test_every_anchor_metrics_absent_on_chain_rows():
    p = metrics.Prompt("x", 2, [3, -1, -1, -1, 0, 1], [4, 1, 2])
    assert metrics.every_anchor(p, metrics.Ctx(4, 0)) is None
    assert metrics.tau(p, metrics.Ctx(4, 0)) == pytest.approx(7 / 3)


@pytest.mark.parametrize("passes", ["one", "several"])
def test_sweep_one_pass_equals_separate_replays_and_reads_features_once(prepared, workspace_copy, monkeypatch, passes):
    from dflash_dash import cache, pipeline
    from dflash_dash.store import Store

    if passes == "several":  # a pass of one prompt each: every checkpoint replays pass after pass
        monkeypatch.setattr("dflash_dash.pipeline.device_io.PASS_GIB", 1e-9)
    st = Store(workspace_copy)
    seen = []
    reads = []
    real = cache.read
    monkeypatch.setattr(cache, "read", lambda root, ex, pid, *a, **k: reads.append(pid) or real(root, ex, pid, *a, **k))
    before = {r["checkpoint"]: r["id"] for r in st.runs()}
    st.run("DELETE FROM runs")  # the sweep must replay both checkpoints (the old runs stay as the reference)
    ids = pipeline.sweep(
        st,
        ops.Sweep(checkpoints=str(prepared.train), extraction=prepared.extraction),
        progress=lambda d, t, m: seen.append(m),
    )
    assert sorted(reads) == sorted({r["prompt_id"] for r in st.items(prepared.extraction)})  # once each
    n = len(reads)
    assert sum(f"(pass {k}/{n if passes == 'several' else 1})" in m for m in seen for k in range(1, n + 1)) == (
        n if passes == "several" else 1
    )
    timed = [
        m
        for m in seen
        if re.fullmatch(
            r"checkpoint \d/\d: loaded in [\d.]+ s \(read beside in [\d.]+ s\), "
            r"\d+ prompts replayed in [\d.]+ s",
            m,
        )
    ]
    assert len(timed) == len(ids) * (n if passes == "several" else 1)  # the job log times each checkpoint's pass
    ref = Store(prepared.workspace)
    for rid in ids:
        run = st.run_row(rid)
        assert run["summary"]["anchors"] == "chain"
        want = {p["prompt_id"]: p for p in ref.run_prompts(before[run["checkpoint"]])}
        for p in st.run_prompts(rid):
            w = want[p["prompt_id"]]
            assert (p["rounds"], p["tree_rounds"]) == (w["rounds"], w["tree_rounds"])
            assert p["tau"] == pytest.approx(w["tau"])


def test_worker_results_travel_packed_and_equal():
    """A worker's `metrics.Prompt` crosses the pipe packed and comes back an equal `metrics.Prompt`: its arrays
    numpy (integers and NaN kept), its per-round counts lists; ragged and empty values as they are."""
    import json

    from dflash_dash.jobs import wire

    r = metrics.Prompt(
        "p",
        3,
        np.array([2, -1, 0]),
        [3],
        draft_logp=np.array([[-0.5, np.nan], [np.nan, np.nan], [-1e-8, -3.0]], dtype=np.float32),
        drafts=np.array([[5, 6], [-1, -1], [7, 2**40]]),
        round_top_ids=[[[5, 1], [6, 2]]],
        round_top_p=[[[0.5, 0.25], [0.125, 1 / 3]]],
    )
    back = wire.unpacked(json.loads(json.dumps({"result": r}, default=wire.plain)))["result"]
    assert isinstance(back, metrics.Prompt) and (back.id, back.prompt_len, back.rounds, back.tree_rounds) == (
        "p",
        3,
        [3],
        [],
    )
    assert back.accepted_at.tolist() == [2, -1, 0] and back.drafts.tolist() == r.drafts.tolist()  # int64 kept
    assert np.array_equal(back.draft_logp, r.draft_logp, equal_nan=True)
    assert back.round_top_p.tolist() == r.round_top_p.tolist() and back.round_top_ids.tolist() == [[[5, 1], [6, 2]]]
    assert back.tree_at.size == 0 and back.tau is None and wire.pack([[1], [2, 3]]) == [[1], [2, 3]]
    # chain-only shape: most anchors' rows empty (-1 / NaN); only the others travel, and come back in place
    drafts = np.full((50, 4), -1, dtype=np.int64)
    logp = np.full((50, 4), np.nan, dtype=np.float32)
    drafts[[0, 7, 30]] = [[3, -1, -1, -1], [0, 9, 8, 1], [-1, 4, -1, -1]]  # a row with one value is not empty
    logp[[0, 7, 30]] = [[-0.5, np.nan, np.nan, np.nan], [-1, -2, -3, 0], [np.nan, -0.25, np.nan, np.nan]]
    for a in (drafts, logp, drafts[:, :, None].repeat(2, 2)):
        packed = wire.pack(a)
        assert len(packed["packed"]) == 4 and len(json.dumps(packed)) < len(json.dumps(wire.pack(a[[0, 7, 30]]))) * 2
        got = wire.unpack(json.loads(json.dumps(packed)))
        assert got.shape == a.shape and np.array_equal(got, a, equal_nan=True)
    dense = drafts.copy()
    dense[:30] = 1  # most rows filled: sent whole
    assert len(wire.pack(dense)["packed"]) == 3 and np.array_equal(wire.unpack(wire.pack(dense)), dense)


def test_worker_writer_keeps_order_and_raises_its_failure():
    """The worker's writer thread writes every line in the order emitted; a value it cannot send fails the worker
    (at the next emit or at close), and nothing after it is written."""
    import io
    import json

    from dflash_dash.jobs import wire

    out = io.StringIO()
    w = wire.Writer(out)
    for i in range(200):
        w.emit(
            {"progress": [i, 200, "x"]}
            if i % 2
            else {"event": {"result": metrics.Prompt(str(i), 1, [i], [1], drafts=[[i]])}}
        )
    w.close()
    lines = [json.loads(ln) for ln in out.getvalue().splitlines()]
    assert [ln["progress"][0] if "progress" in ln else int(ln["event"]["result"]["id"]) for ln in lines] == list(
        range(200)
    )
    out = io.StringIO()
    w = wire.Writer(out)
    w.emit({"event": 1})
    w.emit({"event": object()})  # not JSON data
    w.emit({"event": 3})
    with pytest.raises(TypeError):
        w.close()
    assert out.getvalue() == '{"event": 1}\n'


def test_check_validates_like_load_without_reading(tmp_path, monkeypatch):
    """`drafters.check` refuses what `load` refuses (here a tensor of the wrong shape) and reads no tensor."""
    from safetensors.torch import load_file, save_file

    ok = tiny.write_drafter(tmp_path / "ok", tiny.TinyDrafter(seed=1))
    bad = tiny.write_drafter(tmp_path / "bad", tiny.TinyDrafter(seed=1))
    f = next(bad.glob("*.safetensors"))
    w = load_file(str(f))
    name = next(k for k in w if k.endswith("fc.weight"))
    w[name] = w[name][:, :-1].contiguous()
    save_file(w, str(f))
    with pytest.raises(dr.CheckpointError, match="fc.weight' has shape") as e_load:
        dr.load(bad)
    want = dr.load(ok).c
    monkeypatch.setattr(
        "safetensors.safe_open.get_tensor", lambda *a: pytest.fail("check read a tensor"), raising=False
    )
    with pytest.raises(dr.CheckpointError) as e_check:
        dr.check(bad)
    assert str(e_check.value) == str(e_load.value)
    assert dr.check(ok) == want


def test_fused_ops_fall_back_to_eager(monkeypatch):
    """A torch.compile that fails makes the fused element-wise ops warn once and run eager, same values."""

    def broken(fn, **kw):
        def call(*a):
            raise RuntimeError("no inductor here")

        return call

    monkeypatch.setattr(torch, "compile", broken)
    fused = kernels.Kernels(True)
    x, w = torch.randn(3, 8), torch.randn(8)
    with pytest.warns(UserWarning, match="fused rmsnorm unavailable"):
        got = fused.rmsnorm(x, w, 1e-6)
    assert torch.equal(got, kernels.rmsnorm(x, w, 1e-6)) and torch.equal(fused.rmsnorm(x, w, 1e-6), got)
    assert kernels.kernels_for(torch.device("cpu")) is kernels.EAGER
