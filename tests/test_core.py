"""Core: drafter, target extraction, feature cache, every-anchor replay, metrics, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from synthetic import random_head

from dflash_dash import cache, drafters as dr, ops, replay as rp, target as tg, walks
from dflash_dash.store import Store
from tools import tiny

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("core")
    t = tiny.write_target(base / "target", tiny.TinyTarget())
    d = tiny.write_drafter(base / "drafter", tiny.TinyDrafter(seed=1))
    return t, d


# ---------------------------------------------------------------------------
# replay: batched == loop


@pytest.mark.parametrize(
    "types,window,chunk",
    [
        (["full_attention", "full_attention"], None, 64),
        (["full_attention", "sliding_attention"], 5, 7),
        (["sliding_attention", "sliding_attention"], 3, 1),
    ],
)
def test_batched_equals_loop(tmp_path, types, window, chunk):
    ck = tiny.write_drafter(tmp_path / "d", tiny.TinyDrafter(layer_types=types, sliding_window=window, seed=3))
    m = dr.load(ck)
    head = random_head()
    g = torch.Generator().manual_seed(1)
    T, P = 33, 9
    tokens = torch.randint(0, 512, (T,), generator=g)
    feats = torch.randn(T, 128, generator=g)
    a = rp.draft_all(m, head, feats, tokens, P, topk=4, chunk=chunk)
    b = rp.draft_loop(m, head, feats, tokens, P, topk=4)
    assert a.tokens.shape == (T - P, 3)
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(a.top_ids, b.top_ids)
    assert torch.allclose(a.top_logp, b.top_logp, atol=1e-4)
    # the drafts are not degenerate: several distinct tokens are proposed
    assert len(set(a.tokens.flatten().tolist())) > 3


def test_sliding_window_changes_drafts(tmp_path):
    """A sliding layer must actually limit what it sees: a window of 2 gives other drafts than full."""
    full = dr.load(tiny.write_drafter(tmp_path / "f", tiny.TinyDrafter(seed=3)))
    slide = dr.load(
        tiny.write_drafter(
            tmp_path / "s", tiny.TinyDrafter(seed=3, layer_types=["sliding_attention"] * 2, sliding_window=2)
        )
    )
    head = random_head()
    g = torch.Generator().manual_seed(2)
    tokens, feats = torch.randint(0, 512, (40,), generator=g), torch.randn(40, 128, generator=g)
    a = rp.draft_all(full, head, feats, tokens, 10, topk=2)
    b = rp.draft_all(slide, head, feats, tokens, 10, topk=2)
    assert not torch.allclose(a.top_logp, b.top_logp)


def test_anchor_hidden_state_not_visible(models):
    """Context is positions 0..p-1: changing the feature AT the anchor must not change its drafts."""
    m = dr.load(models[1])
    head = random_head()
    g = torch.Generator().manual_seed(4)
    tokens, feats = torch.randint(0, 512, (20,), generator=g), torch.randn(20, 128, generator=g)
    a = rp.draft_all(m, head, feats, tokens, 10, topk=3)
    feats2 = feats.clone()
    feats2[12] += 5.0
    b = rp.draft_all(m, head, feats2, tokens, 10, topk=3)
    assert torch.allclose(a.top_logp[:3], b.top_logp[:3])  # anchors 10..12 do not see position 12
    assert not torch.allclose(a.top_logp[3:], b.top_logp[3:])  # anchors >= 13 do


# ---------------------------------------------------------------------------
# target extraction


@pytest.mark.parametrize("kind,ids", [("qwen3_5_text", [0, 1, 4, 6]), ("qwen3", [1, 3]), ("llama", [2, 0])])
def test_extract_equals_output_hidden_states(tmp_path, kind, ids):
    from transformers import AutoModelForCausalLM

    path = tiny.write_target(tmp_path / kind, tiny.TinyTarget(model_type=kind, num_hidden_layers=8, seed=5))
    dec, backend = tg.load(path, ids, "cpu")
    assert backend == ("torch" if kind == "qwen3_5_text" else tg.NO_LINEAR)  # no linear attention: no backend
    assert len(tg._layers(dec)) == max(ids) + 1  # cut after the last needed layer
    tok = torch.randint(0, 512, (37,), generator=torch.Generator().manual_seed(0))
    feats = tg.extract(dec, tok, ids)
    full = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        hs = full(tok[None], output_hidden_states=True).hidden_states
    ref = torch.cat([hs[l + 1][0] for l in ids], -1)
    assert feats.shape == (37, len(ids) * 64)
    torch.testing.assert_close(feats, ref, rtol=1e-5, atol=1e-5)


def test_hybrid_target_has_both_layer_kinds(models):
    info = tg.describe(models[0])
    assert {"linear_attention", "full_attention"} <= set(info.layer_types)


def test_torch_path_forced_on_cpu_with_fla_installed(models):
    """transformers binds fla whenever it imports (it does here: fla + triton are installed);
    on CPU the extraction must force and record the torch path."""
    assert tg.fla_version() is not None, "fla must be importable for this test to mean anything"
    import transformers.models.qwen3_5.modeling_qwen3_5 as q

    tg.use_backend("torch")
    key = f"{q.__name__}.torch_chunk_gated_delta_rule"
    assert tg.bindings(at_import=True)[key] == "fla"  # what transformers picked at import
    dec, backend = tg.load(models[0], [1, 4], "cpu")
    assert backend == "torch"
    assert tg.bindings()[key] == "torch" == tg.kernel_of(q.torch_chunk_gated_delta_rule)
    assert tg.pick_backend("cpu") == "torch"
    with pytest.raises(tg.TargetError, match="out of range"):
        tg.load(models[0], [1, 8], "cpu")


def test_load_head_reads_only_embedding_and_lm_head(models):
    from transformers import AutoModelForCausalLM

    h = tg.load_head(models[0])
    full = AutoModelForCausalLM.from_pretrained(models[0])
    assert torch.equal(h.embed, full.get_input_embeddings().weight)
    assert torch.equal(h.lm_head, full.lm_head.weight)


# ---------------------------------------------------------------------------
# drafter validation


def test_wrong_shape_named(tmp_path, models):
    ck = tiny.write_drafter(tmp_path / "bad", tiny.TinyDrafter())
    w = load_file(str(ck / "model.safetensors"))
    w["layers.1.self_attn.k_proj.weight"] = torch.zeros(31, 64)
    save_file(w, str(ck / "model.safetensors"))
    with pytest.raises(dr.CheckpointError, match=r"layers\.1\.self_attn\.k_proj\.weight.*\(31, 64\).*\(32, 64\)"):
        dr.load(ck)


def test_missing_field_and_tensor_named(tmp_path):
    ck = tiny.write_drafter(tmp_path / "d", tiny.TinyDrafter())
    cfg = json.loads((ck / "config.json").read_text())
    del cfg["block_size"]
    (ck / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(dr.CheckpointError, match="block_size"):
        dr.load(ck)
    ck2 = tiny.write_drafter(tmp_path / "d2", tiny.TinyDrafter())
    w = load_file(str(ck2 / "model.safetensors"))
    del w["norm.weight"]
    save_file(w, str(ck2 / "model.safetensors"))
    with pytest.raises(dr.CheckpointError, match="missing tensor 'norm.weight'"):
        dr.load(ck2)


def test_target_mismatch_named():
    c = dr.parse_config(tiny.drafter_config(tiny.TinyDrafter()))
    with pytest.raises(dr.CheckpointError, match="hidden_size=64.*expected 96"):
        dr.check_target(c, 96, 512, 8)
    with pytest.raises(dr.CheckpointError, match="vocab_size=512.*expected 1000"):
        dr.check_target(c, 64, 1000, 8)
    with pytest.raises(dr.CheckpointError, match="contains 4.*< 3"):
        dr.check_target(c, 64, 512, 3)


def test_default_layer_ids():
    assert dr.default_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    assert dr.default_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert dr.default_layer_ids(40, 1) == [20]


# ---------------------------------------------------------------------------
# acceptance, chain walk, metrics, DDTree


def test_accepted_and_walk_by_hand():
    # P=2, T=10 -> anchors 2..9; drafts of 3 slots
    tokens = np.array([9, 9, 1, 2, 3, 4, 5, 6, 7, 8])
    drafts = np.array(
        [
            [2, 3, 0],  # anchor 2: tokens 3.. = 2,3,4 -> accepted 2
            [0, 0, 0],
            [0, 0, 0],
            [0, 0, 0],  # anchor 5
            [0, 0, 0],
            [7, 8, 9],  # anchor 7: only positions 8, 9 are inside (tokens 7, 8) -> accepted 2
            [8, 0, 0],  # anchor 8: only position 9 inside -> accepted 1
            [8, 0, 0],  # anchor 9: nothing left -> 0
        ]
    )
    acc = walks.accepted(drafts, tokens, 2)
    assert acc.tolist() == [2, 0, 0, 0, 0, 2, 1, 0]
    rounds = walks.chain_walk(acc, 2, 10)
    # anchor 2 commits 3 -> 5; anchor 5 commits 1 -> 6; anchor 6 commits 1 -> 7; anchor 7: min(3, 2) = 2 -> 9
    assert rounds == [(2, 2, 3), (5, 0, 1), (6, 0, 1), (7, 2, 2)]
    assert sum(c for *_, c in rounds) == 10 - 1 - 2


def test_depth_curves_and_summary_by_hand():
    from dflash_dash import metrics

    r = metrics.Prompt("x", 2, [2, 0, 0, 0, 0, 2, 1, 0], [3, 1, 1, 2], drafts=[[0] * 3] * 8)
    ps, ctx = [r], metrics.Ctx(4, 0)
    assert r.round_anchors == [2, 5, 6, 7]
    cond, marg = metrics.depth_conditional(ps, ctx), metrics.depth_marginal(ps, ctx)
    assert metrics.depth_samples(ps, ctx) == [4, 2, 1]
    # rounds at anchors 2,5,6,7 with accepted 2,0,0,2; anchor 7 has 2 tokens left -> depths 1,2 only
    # depth1: 4 rounds, hits 2 (anchors 2,7); depth2: 4 inside, reach 2, hits 2;
    # depth3: 3 inside (anchors 2,5,6), reach 1 (anchor 2), hit 0
    assert cond == [0.5, 1.0, 0.0]
    assert marg == [0.5, 0.5, 0.0]
    s = rp.summarize([r], 4, 0)
    assert s["tau_pooled"] == pytest.approx(7 / 4)
    assert s["accept_hist"] == [2, 0, 2, 0]
    assert s["every_anchor_tau"] == pytest.approx(np.mean([3, 1, 1, 1, 1, 3, 2]))


def test_ddtree_by_hand():
    ids = np.array([[10, 11], [20, 21], [30, 31]])  # slot candidates A/B, C/D, E/F
    logp = np.array([[-0.1, -2.5], [-0.2, -1.0], [-0.3, -0.4]])
    # budget 4 pops A(-0.1), AC(-0.3), ACE(-0.6), ACF(-0.7)
    assert walks.tree_accept(ids, logp, np.array([10, 20, 31]), 4) == 3
    assert walks.tree_accept(ids, logp, np.array([10, 21, 30]), 4) == 1
    assert walks.tree_accept(ids, logp, np.array([11, 20, 30]), 4) == 0
    # budget 3 stops before ACF; budget 5 adds AD(-1.1) but not ADE
    assert walks.tree_accept(ids, logp, np.array([10, 20, 31]), 3) == 2
    assert walks.tree_accept(ids, logp, np.array([10, 21, 30]), 5) == 2
    # a target cut by the completion's end
    assert walks.tree_accept(ids, logp, np.array([10]), 4) == 1
    # budget 1 tree == greedy chain of length 1
    assert walks.tree_accept(ids, logp, np.array([10, 20, 30]), 1) == 1


def _plain_tree(ids, logp, target, budget):
    """DDTree-b by its definition, no shortcuts: the `budget` best prefix-closed paths, grown best-first."""
    import heapq

    D, k = ids.shape
    paths, heap = set(), [(-float(logp[0, 0]), (0,))] if budget > 0 and D and k else []
    while heap and len(paths) < budget:
        neg, ranks = heapq.heappop(heap)
        d, r = len(ranks), ranks[-1]
        paths.add(tuple(int(ids[i, ranks[i]]) for i in range(d)))
        if r + 1 < k:
            heapq.heappush(heap, (neg + float(logp[d - 1, r]) - float(logp[d - 1, r + 1]), ranks[:-1] + (r + 1,)))
        if d < D:
            heapq.heappush(heap, (neg - float(logp[d, 0]), ranks + (0,)))
    n = 0
    while n < len(target) and tuple(int(t) for t in target[: n + 1]) in paths:
        n += 1
    return n


def test_scoring_shortcuts_equal_plain_definitions():
    """`accepted` (vectorised), `tree_accept` (candidates cut to the budget's depth and rank) and `tree_accepted`
    (no tree where the next token is none of slot 1's candidates) equal the plain per-anchor definitions, with
    tied log-probabilities, tiny vocabularies (many matches) and budgets beyond the candidates."""
    rng = np.random.default_rng(3)
    for trial in range(40):
        T, D, k, V = (
            int(rng.integers(3, 120)),
            int(rng.integers(1, 8)),
            int(rng.integers(1, 6)),
            int(rng.integers(2, 9)),
        )
        P = int(rng.integers(1, T))
        tokens, A = rng.integers(0, V, T), T - P
        ids = np.array([[rng.permutation(max(V, k))[:k] for _ in range(D)] for _ in range(A)]).reshape(A, D, k)
        logp = np.sort(np.round(-rng.exponential(1.0, (A, D, k)), 1), -1)[..., ::-1].astype(np.float32)
        drafts = ids[:, :, 0]
        plain = [
            next((j for j in range(min(D, T - 1 - p)) if drafts[p - P, j] != tokens[p + 1 + j]), min(D, T - 1 - p))
            for p in range(P, T)
        ]
        assert walks.accepted(drafts, tokens, P).tolist() == plain
        d = rp.Drafts(torch.from_numpy(drafts.copy()), torch.from_numpy(ids), torch.from_numpy(logp.copy()))
        for budget in (0, 1, 2, 5, 30):
            want = [_plain_tree(ids[a], logp[a], tokens[P + a + 1 : min(T, P + a + D + 1)], budget) for a in range(A)]
            assert walks.tree_accepted(d.top_ids.numpy(), d.top_logp.numpy(), tokens, P, budget).tolist() == want, (
                trial,
                budget,
            )


def test_full_tree_never_below_chain(models):
    """A budget that covers every path of the top-2 candidates contains the greedy chain: tree >= chain;
    budget 1 is the first greedy draft alone."""
    m = dr.load(models[1])
    head = random_head()
    g = torch.Generator().manual_seed(7)
    tokens, feats = torch.randint(0, 512, (30,), generator=g), torch.randn(30, 128, generator=g)
    d = rp.draft_all(m, head, feats, tokens, 5, topk=2)
    tk = tokens.numpy().copy()
    tk[11:14] = d.tokens[10 - 5].numpy()  # the target agrees with the drafts at anchor 10
    acc = walks.accepted(d.tokens.numpy(), tk, 5)
    assert acc[10 - 5] == 3
    for a in range(len(acc)):
        p = 5 + a
        ids, lp, target = d.top_ids[a].numpy(), d.top_logp[a].numpy(), tk[p + 1 : p + 4]
        assert walks.tree_accept(ids, lp, target, 2 + 4 + 8) >= acc[a]
        assert walks.tree_accept(ids, lp, target, 1) == min(acc[a], 1)


# ---------------------------------------------------------------------------
# self-drafted completion replays to tau = B


def self_drafted(target_dir, drafter_dir, prompt, rounds):
    """Grow a completion from the drafter's own drafts: each round appends B-1 drafts and a bonus token."""
    m = dr.load(drafter_dir)
    head = tg.load_head(target_dir)
    ids = m.c.target_layer_ids
    dec, _ = tg.load(target_dir, ids, "cpu")
    seq = list(prompt) + [7]  # first completion token: from the target's prefill (any token works here)
    for r in range(rounds):
        feats = tg.extract(dec, torch.tensor(seq), ids)  # re-extracted as the sequence grows
        feats = feats.to(torch.bfloat16)  # as the cache stores them
        p = len(seq) - 1
        d = rp.draft_all(m, head, feats, torch.tensor(seq), p, topk=0)
        seq += d.tokens[0].tolist() + [(11 * r + 5) % 512]  # drafts + bonus
    return seq


def test_self_drafted_completion_reaches_block_size(tmp_path, models):
    t, d = models
    prompt = [5, 17, 200, 33, 90, 4]
    seq = self_drafted(t, d, prompt, rounds=4)
    B = dr.read_config(d).block_size
    line = {"id": "self", "prompt_ids": prompt, "output_ids": seq[len(prompt) :]}
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps(line) + "\n")
    from dflash_dash import pipeline

    st = Store(tmp_path / "ws")
    pipeline.import_completions(st, f, "self")
    ex = pipeline.extract(st, ops.Extract(target=str(t), completions="self", layers=dr.read_config(d).target_layer_ids))
    out = pipeline.replay(st, ops.Replay(drafter=str(d), extraction=ex, tree_budget=4))
    assert out["summary"]["tau_macro"] == B
    assert 1 <= out["summary"]["ddtree_tau"] <= B  # best-first may spend the budget on siblings
    exp = pipeline.export(st, out["id"])
    assert exp["prompts"][0]["rounds"] == [B] * 4


# ---------------------------------------------------------------------------
# feature cache


def test_cache_roundtrip_and_damage(tmp_path):
    f = torch.randn(10, 6)
    p = cache.write(tmp_path, "ex1", "a/b <x>", f, {"backend": "torch"})
    assert p.parent == tmp_path / "ex1" and "<" not in p.name
    assert p.stat().st_size - 10 * 6 * 2 < 1024  # header + exactly K*H*2 bytes per token
    got = cache.read(tmp_path, "ex1", "a/b <x>", 10, 6)
    assert got.dtype == torch.bfloat16 and torch.equal(got, f.to(torch.bfloat16))
    assert cache.meta(tmp_path, "ex1", "a/b <x>")["backend"] == "torch"
    assert not list(tmp_path.glob("ex1/.*tmp"))  # no temp file left behind
    with pytest.raises(cache.CacheError, match="expected bfloat16 \\(11, 6\\).*re-extract"):
        cache.read(tmp_path, "ex1", "a/b <x>", 11, 6)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - 7])
    with pytest.raises(cache.CacheError, match="truncated.*re-extract"):
        cache.read(tmp_path, "ex1", "a/b <x>", 10, 6)
    p.write_bytes(b"\x00" * len(data))
    with pytest.raises(cache.CacheError, match="damaged.*re-extract"):
        cache.read(tmp_path, "ex1", "a/b <x>", 10, 6)
    with pytest.raises(cache.CacheError, match="missing"):
        cache.read(tmp_path, "ex1", "nope", 10, 6)
    for bad in (float("nan"), float("inf"), float("-inf")):  # anywhere in the file
        for at in ((0, 0), (9, 5), (4, 2)):
            g = f.clone()
            g[at] = bad
            cache.write(tmp_path, "ex1", "a/b <x>", g, {})
            with pytest.raises(cache.CacheError, match="NaN or inf.*re-extract"):
                cache.read(tmp_path, "ex1", "a/b <x>", 10, 6)
    assert cache.finite(torch.zeros(0, 6, dtype=torch.bfloat16))


def test_cache_files_are_safetensors_and_a_failed_write_leaves_none(tmp_path, monkeypatch):
    """`cache.write` writes the safetensors layout itself (straight from the tensor's memory): the library reads
    it back (tensor, metadata, 8-byte aligned payload), an empty sequence included; a write that fails halfway
    leaves neither the file nor its temp file."""
    from safetensors import safe_open

    for T in (7, 0):
        f = torch.randn(T, 12)
        p = cache.write(tmp_path, "ex", f"p{T}", f, {"layer_ids": [1, 2]})
        with safe_open(str(p), framework="pt") as sf:
            assert list(sf.keys()) == [cache.KEY] and torch.equal(sf.get_tensor(cache.KEY), f.to(torch.bfloat16))
            assert sf.metadata() == {"meta": '{"layer_ids": [1, 2]}', "prompt_id": f"p{T}", "tokens": str(T)}
        assert (8 + int.from_bytes(p.read_bytes()[:8], "little")) % 8 == 0
        assert p.stat().st_size == 8 + int.from_bytes(p.read_bytes()[:8], "little") + T * 12 * 2
    calls = []

    def fail(f, data):
        calls.append(len(data))
        if len(calls) == 2:  # the payload, after the header was written
            raise OSError(28, "No space left on device")
        f.write(data)

    monkeypatch.setattr(cache, "_write_all", fail)
    with pytest.raises(OSError, match="No space"):
        cache.write(tmp_path, "ex", "gone", torch.randn(5, 12), {})
    assert not cache.path(tmp_path, "ex", "gone").exists() and not list((tmp_path / "ex").glob(".*tmp"))


def test_cache_reads_into_staging_and_many_in_order(tmp_path):
    """`read(out=...)` fills the caller's buffer (pinned staging on CUDA); `read_many` yields in the asked order
    with its threads reading ahead, and a bad file fails it with the file's own message."""
    fs = {f"p{i}": torch.randn(5 + i, 6) for i in range(11)}
    for pid, f in fs.items():
        cache.write(tmp_path, "ex", pid, f, {})
    buf = torch.full((100,), 7.0, dtype=torch.bfloat16)
    got = cache.read(tmp_path, "ex", "p3", 8, 6, out=buf)
    assert got.data_ptr() == buf.data_ptr() and torch.equal(got, fs["p3"].to(torch.bfloat16))
    assert torch.equal(buf[48:], torch.full((52,), 7.0, dtype=torch.bfloat16))  # nothing written past the payload
    order = [f"p{i}" for i in (10, 0, 7, 3, 9, 1, 2, 8, 4, 6, 5)]
    many = list(cache.read_many(tmp_path, "ex", [(p, 5 + int(p[1:])) for p in order], 6))
    assert all(torch.equal(t, fs[p].to(torch.bfloat16)) for p, t in zip(order, many))
    with pytest.raises(cache.CacheError, match="nope.*missing"):
        list(cache.read_many(tmp_path, "ex", [("p0", 5), ("nope", 9)], 6))
    with pytest.raises(cache.CacheError, match="expected bfloat16 \\(9, 6\\)"):
        list(cache.read_many(tmp_path, "ex", [("p0", 5), ("p3", 9)], 6))


# ---------------------------------------------------------------------------
# CLI end to end


def cli(ws, *args, check=True):
    r = subprocess.run(
        [sys.executable, "-m", "dflash_dash", "--workspace", str(ws), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    if check and r.returncode != 0:
        raise AssertionError(f"{args} failed: {r.stderr[-2000:]}")
    return r


def test_cli_end_to_end(tmp_path, models):
    t, d = models
    g = np.random.default_rng(0)
    lines = [
        {
            "id": f"p{i}",
            "prompt_ids": g.integers(0, 512, 6).tolist(),
            "output_ids": g.integers(0, 512, 15).tolist(),
            "output": "<b>x</b>",
        }
        for i in range(3)
    ]
    f = tmp_path / "c.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    ws = tmp_path / "ws"
    assert "imported 3" in cli(ws, "import-completions", str(f), "--name", "s").stdout
    ex = cli(ws, "extract", "--target", str(t), "--completions", "s", "--drafter", str(d)).stdout.strip()
    assert ex.startswith("ex-")
    out = cli(ws, "replay", "--drafter", str(d), "--extraction", ex, "--tree-budget", "4").stdout
    run_id, summary = json.loads(out)["id"], json.loads(out)["summary"]
    exp = json.loads(cli(ws, "export", "--run", "latest").stdout)
    assert exp["run"]["id"] == run_id and exp["summary"]["tau_macro"] == summary["tau_macro"]
    assert [p["id"] for p in exp["prompts"]] == ["p0", "p1", "p2"]
    for p in exp["prompts"]:
        assert len(p["accepted_at"]) == 15 and sum(p["rounds"]) == 14
        assert p["tau"] == pytest.approx(14 / len(p["rounds"]))
        assert len(p["ddtree_rounds"]) <= len(p["rounds"])
    assert exp["summary"]["backend"] == "torch"
    # the features on disk are exactly K*H*2 bytes per token, bf16, with provenance
    files = sorted(f for f in (ws / "features" / ex).glob("*.safetensors") if not f.name.endswith(".top.safetensors"))
    assert len(files) == 3  # one feature file per prompt, beside it the target's top-K (extract --target-topk)
    assert len(list((ws / "features" / ex).glob("*.top.safetensors"))) == 3
    assert cache.meta(ws / "features", ex, "p0")["backend"] == "torch"
    listed = json.loads(cli(ws, "extractions").stdout)
    assert listed[0]["id"] == ex and listed[0]["backend"] == "torch"
    # a drafter whose layers differ from the extraction is refused with a named error
    other = tiny.write_drafter(tmp_path / "other", tiny.TinyDrafter(target_layer_ids=[2, 5]))
    r = cli(ws, "replay", "--drafter", str(other), "--extraction", ex, check=False)
    assert r.returncode == 2 and "layers [2, 5]" in r.stderr and "Traceback" not in r.stderr
    r = cli(ws, "import-completions", str(tmp_path / "missing.jsonl"), "--name", "x", check=False)
    assert r.returncode == 2 and "no such file" in r.stderr
