"""DFlash2 (docs/families.md section 5): the convolution-wrapped backbone and the selector walk, against an
independent float64 implementation (tests/ref_dflash2.py) in every form a user holds (SpecForge HF export,
SGLang's DFlashDraftModel + fields, ModelOpt's projector_type, the released all-sliding bidirectional config,
runtime training_state.pt, re-saved codebook names); batched == plain reference == chain-only; bad checkpoints
named; a sweep end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from prepared import drafted
from ref_dflash2 import block_states, unary_argmax, walk
from safetensors.torch import load_file, save_file
from synthetic import planted

from dflash_dash import cli, drafters as dr, ops, pipeline, replay as rp, target as tg
from dflash_dash.drafters import dflash2
from dflash_dash.drafters.kernels import rmsnorm
from dflash_dash.store import Store
from tools import tiny

FIELDS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 6}
V, H = 512, 64


def drafter(**kw) -> tiny.TinyDrafter:
    return tiny.TinyDrafter(**({"seed": 7, "block_size": 5, "family_fields": dict(FIELDS)} | kw))


def form(name: str) -> tuple[tiny.TinyDrafter, dict]:
    """(tiny drafter, config.json) of one form users hold."""
    if name == "specforge":  # HF export under transformers 5: block_size only inside dflash_config
        d = drafter(architecture="DFlash2DraftModel")
        cfg = tiny.transformers5_config(d)
        assert "block_size" not in cfg and cfg["dflash_config"]["block_size"] == 5
        return d, cfg
    if name == "sglang":  # DFlash2 fields on a DFlash architecture, with SGLang's unary transform
        d = drafter(seed=8)
        cfg = tiny.drafter_config(d)
        cfg["dflash_config"] |= {"output_multiplier": 0.7, "final_logit_softcapping": 6.0}
        return d, cfg
    if name == "modelopt":  # projector_type dflash2, block_size at both levels, top-level is_causal, sliding layers
        d = drafter(seed=9, layer_types=["sliding_attention", "full_attention"], sliding_window=4)
        cfg = tiny.drafter_config(d) | {"is_causal": True}
        cfg["dflash_config"] |= {"projector_type": "dflash2", "block_size": 5}
        return d, cfg
    if name == "released":  # all sliding layers, is_causal false: bidirectional blocks; vLLM's embedding scale
        d = drafter(seed=10, architecture="DFlash2DraftModel", layer_types=["sliding_attention"] * 2, sliding_window=6)
        cfg = tiny.transformers5_config(d) | {"is_causal": False}
        cfg["dflash_config"] |= {"input_embedding_scale": 1.5}
        return d, cfg
    raise ValueError(name)


def write(folder: Path, cfg: dict, state: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def inputs(seed: int, T: int = 28):
    g = torch.Generator().manual_seed(seed)
    head = tg.Head(torch.randn(V, H, generator=g), torch.randn(V, H, generator=g))
    return head, torch.randint(0, V, (T,), generator=g), torch.randn(T, 128, generator=g)


def backbone_only(state: dict) -> dict:
    return {k: v for k, v in state.items() if "_conv." not in k and not k.startswith("candidate_selector.")}


# ---------------------------------------------------------------------------
# drafts == the float64 reference, every anchor


@pytest.mark.parametrize("name", ["specforge", "sglang", "modelopt", "released"])
def test_drafts_equal_float64_reference_at_every_anchor(tmp_path, name):
    d, cfg = form(name)
    state = tiny.weights(d)
    m = dr.load(write(tmp_path / name, cfg, state))
    assert isinstance(m, dflash2.DFlash2) and m.c.family == "dflash2" and m.sequential
    assert (m.c.first_slot, m.drafts, m.width) == (1, 4, 5)
    assert m.sliding_block == ("bidirectional" if name == "released" else "causal")
    head, tokens, feats = inputs(3)
    P, topk = 7, 8  # topk > selector_top_k: padded
    got = rp.draft_all(m, head, feats, tokens, P, topk=topk, chunk=6)
    raw = load_file(str(tmp_path / name / "model.safetensors"))
    causal = m.sliding_block == "causal"
    unary_differs = False
    for a, p in enumerate(range(P, len(tokens))):
        h = block_states(raw, cfg, feats, int(tokens[p]), p, head.embed, causal)
        drafts, logps, ranked = walk(raw, cfg, h, int(tokens[p]), head.lm_head)
        assert got.tokens[a].tolist() == drafts, (name, p)
        assert got.top_logp[a, :, 0].tolist() == pytest.approx(logps, abs=1e-4)
        assert got.top_ids[a, :, :6].tolist() == ranked
        unary_differs |= unary_argmax(cfg, h, head.lm_head) != drafts
    assert (got.top_ids[:, :, 6:] == -1).all() and torch.isinf(got.top_logp[:, :, 6:]).all()
    assert unary_differs  # the selector's transitions change drafts (not just the unary argmax)
    # plain DFlash with the same backbone weights drafts differently: the convolutions and selector are applied
    plain_cfg = tiny.drafter_config(d) | {"architectures": ["DFlashDraftModel"]}
    plain_cfg["dflash_config"] = {k: v for k, v in plain_cfg["dflash_config"].items() if k not in FIELDS}
    plain = dr.load(write(tmp_path / "plain", plain_cfg, backbone_only(state)))
    assert plain.c.family == "dflash"
    other = rp.draft_all(plain, head, feats, tokens, P, topk=1, chunk=6)
    assert not torch.equal(other.tokens, got.tokens)


def test_convolution_is_block_local(tmp_path):
    """Slot i reads slots i-1..i-T+1 of its own block only: with many blocks batched, each block's states are
    those of the block run alone, and changing one block's input never moves another block."""
    d, cfg = form("specforge")
    m = dr.load(write(tmp_path / "d", cfg, tiny.weights(d)))
    x = torch.randn(3, 5, H)
    delta = torch.randn(3, 5, 2, 4)
    base = m.conv[(0, dflash2.ATTN)][0][0]
    whole = m._convolve(x, delta, base)
    for n in range(3):
        torch.testing.assert_close(m._convolve(x[n], delta[n], base), whole[n])
    x2 = x.clone()
    x2[1] += 1.0
    moved = m._convolve(x2, delta, base)
    assert torch.equal(moved[0], whole[0]) and torch.equal(moved[2], whole[2]) and not torch.equal(moved[1], whole[1])
    x3 = x.clone()
    x3[:, 3] += 1.0  # slot 3 feeds slots 3 and 4 (T = 2), never slots 0..2
    moved = m._convolve(x3, delta, base)
    assert torch.equal(moved[:, :3], whole[:, :3]) and not torch.equal(moved[:, 3:], whole[:, 3:])


# ---------------------------------------------------------------------------
# batched == plain reference; chain-only == every-anchor


@pytest.mark.parametrize("long", [False, True])  # True: the long-context path (`DFlash.blocks_run`)
@pytest.mark.parametrize("name,chunk", [("specforge", 64), ("released", 5), ("modelopt", 1)])
def test_draft_all_equals_draft_loop(monkeypatch, tmp_path, name, chunk, long):
    monkeypatch.setattr(rp.every, "LONG", 0 if long else rp.every.LONG)
    d, cfg = form(name)
    m = dr.load(write(tmp_path / name, cfg, tiny.weights(d)))
    head, tokens, feats = inputs(4, T=33)
    a = rp.draft_all(m, head, feats, tokens, 9, topk=4, chunk=chunk)
    b = rp.draft_loop(m, head, feats, tokens, 9, topk=4)
    assert a.tokens.shape == (24, 4)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.top_ids, b.top_ids)
    assert torch.allclose(a.top_logp, b.top_logp, atol=1e-4)
    assert len(set(a.tokens.flatten().tolist())) > 3
    assert torch.equal(rp.draft_all(m, head, feats, tokens, 9, topk=0).tokens, a.tokens)  # k may be 0


def test_bfloat16_follows_float32(tmp_path):
    d, cfg = form("sglang")
    ck = write(tmp_path / "d", cfg, tiny.weights(d))
    m32, m16 = dr.load(ck), dr.load(ck, dtype=torch.bfloat16)
    head, tokens, feats = inputs(5, T=30)
    a = rp.draft_all(m32, head, feats, tokens, 6, topk=3)
    b = rp.draft_all(m16, tg.Head(head.embed.bfloat16(), head.lm_head.bfloat16()), feats, tokens, 6, topk=3)
    assert b.top_logp.dtype == torch.float32 and b.tokens.shape == a.tokens.shape
    assert (a.tokens == b.tokens).float().mean() > 0.6  # rounding moves a few walks, not most


@pytest.mark.parametrize("name", ["specforge", "released"])
def test_chain_only_rounds_equal_every_anchor(tmp_path, name):
    d, cfg = form(name)
    m = dr.load(write(tmp_path / name, cfg, tiny.weights(d)))
    g = torch.Generator().manual_seed(6)
    head = tg.Head(torch.randn(V, H, generator=g), torch.randn(V, H, generator=g))
    seqs = []
    for i, (T, P) in enumerate([(40, 5), (23, 9), (31, 3), (2, 1)]):
        feats = torch.randn(T, 128, generator=g)
        seqs.append(rp.Sequence(f"s{i}", planted(m, head, feats, P, T, seed=i), P, feats))
    for budget in (0, 8):  # 8 > selector_top_k: the padded ranks reach the DDTree walk
        every, s_every = rp.every_anchor(m, head, seqs, budget=budget, chunk=7)
        chain, s_chain = rp.chain_only(m, head, seqs, budget=budget, batch=3)
        assert s_every["tau_pooled"] > 1.5  # planted acceptance: the walks skip anchors
        for a, b in zip(every, chain):
            assert (a.rounds, a.round_anchors, a.tree_rounds) == (b.rounds, b.round_anchors, b.tree_rounds)
            for x, v in enumerate(b.accepted_at):
                if v >= 0:
                    assert v == a.accepted_at[x] and list(b.drafts[x]) == list(a.drafts[x])
        for key in ("tau_macro", "tau_pooled", "ddtree_tau", "accept_hist", "rounds", "committed"):
            assert s_chain[key] == s_every[key], key


# ---------------------------------------------------------------------------
# layouts and names


@pytest.mark.parametrize("strategy", ["dflash", "dflash2"])
def test_runtime_layout_and_codebook_spelling_replay_like_the_hf_folder(tmp_path, strategy):
    d, cfg = form("specforge")
    state = tiny.weights(d)
    hf = dr.load(write(tmp_path / "hf", cfg, state))
    step = tiny.write_runtime(tmp_path / "out", state, 40, "r1", strategy=strategy)
    cfg_file = tmp_path / "draft.json"
    cfg_file.write_text(json.dumps(cfg))
    rt = dr.load(step, draft_config=cfg_file)
    resaved = {
        (k + ".weight" if k.endswith("_codebook") else k): v for k, v in state.items()
    }  # an nn.Embedding re-save
    assert "candidate_selector.successor_codebook.weight" in resaved
    emb = dr.load(write(tmp_path / "emb", cfg, resaved))
    head, tokens, feats = inputs(7)
    ref = rp.draft_all(hf, head, feats, tokens, 5, topk=3)
    for m in (rt, emb):
        assert isinstance(m, dflash2.DFlash2)
        got = rp.draft_all(m, head, feats, tokens, 5, topk=3)
        assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.top_logp, ref.top_logp)


def test_input_embedding_scale_and_unary_transform_are_read(tmp_path):
    d, cfg = form("released")
    m = dr.load(write(tmp_path / "d", cfg, tiny.weights(d)))
    head = inputs(8)[0]
    ids = torch.tensor([5, 9])
    emb = m.embed_block(head, ids)
    assert torch.equal(emb[:, 0], head.embed[ids] * 1.5) and torch.equal(emb[:, 1], head.embed[[3, 3]] * 1.5)
    s = tiny.drafter_config(drafter())
    s["dflash_config"] |= {"output_multiplier": 0.5, "final_logit_softcapping": 2.0}
    capped = dr.load(write(tmp_path / "c", s, tiny.weights(drafter())))
    h = rmsnorm(torch.randn(3, 5, H), torch.ones(H), 1e-6)
    U, _ = capped._unary_top(head, h[:, 1:])
    u = torch.tanh((h[:, 1:] @ head.lm_head.T) * 0.5 / 2.0) * 2.0
    torch.testing.assert_close(U, u.topk(6, -1).values)
    assert U.abs().max() < 2.0


BAD = [
    ({"conv_kernel_size": 6}, "conv_kernel_size = 6"),  # more taps than the block's 5 slots
    ({"conv_group_size": 7}, "conv_group_size = 7 does not divide hidden_size 64"),
    ({"selector_top_k": 0}, "selector_top_k = 0"),
    ({"selector_rank": None}, "needs dflash_config.selector_rank"),
    ({"output_multiplier": -1.0}, "output_multiplier = -1.0"),
]


@pytest.mark.parametrize("patch,match", BAD)
def test_bad_field_named(tmp_path, patch, match):
    d, cfg = form("sglang")
    cfg["dflash_config"] = {k: v for k, v in (cfg["dflash_config"] | patch).items() if v is not None}
    with pytest.raises(dr.CheckpointError, match=match):
        dr.load(write(tmp_path / "d", cfg, tiny.weights(d)))


def test_bad_tensor_named(tmp_path):
    d, cfg = form("specforge")
    state = tiny.weights(d)
    missing = {k: v for k, v in state.items() if k != "candidate_selector.successor_codebook"}
    with pytest.raises(dr.CheckpointError, match="missing tensor 'candidate_selector.successor_codebook'"):
        dr.load(write(tmp_path / "a", cfg, missing))
    wrong = state | {"layers.1.mlp_conv.kernel_projection.weight": torch.zeros(15, H)}
    with pytest.raises(dr.CheckpointError, match=r"'layers.1.mlp_conv.kernel_projection.weight' has shape \(15, 64\)"):
        dr.load(write(tmp_path / "b", cfg, wrong))
    with pytest.raises(dr.CheckpointError, match="missing tensor 'layers.0.attention_conv.base_kernel'"):
        dr.load(write(tmp_path / "c", cfg, backbone_only(state)))  # a DFlash checkpoint under a DFlash2 config
    with pytest.raises(ValueError, match="whole blocks"):
        dr.load(write(tmp_path / "e", cfg, state)).read_out(
            inputs(1)[0], torch.randn(1, 5, H), torch.tensor([1]), 1, (0, 2)
        )


def test_flops_count_the_family_matmuls():
    d, _ = form("specforge")
    c = dr.parse_config(tiny.drafter_config(d))
    plain = dr.parse_config(tiny.drafter_config(drafter(family_fields={})))
    extra = dr.flops_per_block(c, 100, V) - dr.flops_per_block(plain, 100, V)
    assert extra == 2 * 2 * (2 * 5 * H * 2 * 2 * 4) + 2 * 4 * (H * 8 + 6 * 8)


# ---------------------------------------------------------------------------
# a sweep end to end


def test_sweep_over_a_run_folder(tmp_path, capsys):
    """A SpecForge run folder of DFlash2 runtime checkpoints (config.json above them) sweeps through the CLI; each
    step's per-prompt acceptance equals a replay of the same weights as an HF export. One completion is made of
    step 10's own drafts, so its acceptance is partly high there and the two steps differ."""
    _, cfg = form("released")
    target = tiny.write_target(tmp_path / "target", tiny.TinyTarget(model_type="qwen3"))
    out = tmp_path / "train"
    states = {step: tiny.weights(drafter(seed=seed)) for step, seed in ((20, 11), (10, 12))}
    for step, state in states.items():
        tiny.write_runtime(out, state, step, "r1", strategy="dflash")
    (out / "config.json").write_text(json.dumps(cfg))
    hf = write(tmp_path / "hf", cfg, states[10])
    rng = np.random.default_rng(0)
    recs = [{"id": f"p{i}", "prompt_ids": rng.integers(10, 500, 6).tolist()} for i in range(2)]
    recs[0]["output_ids"] = drafted(target, hf, recs[0]["prompt_ids"], 16, seed=3)
    recs[1]["output_ids"] = rng.integers(10, 500, 14).tolist()
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    ws = tmp_path / "ws"

    def run(*args: str) -> str:
        capsys.readouterr()
        assert cli.main(["--workspace", str(ws), *args]) == 0, args
        return capsys.readouterr().out

    run("import-completions", str(tmp_path / "c.jsonl"), "--name", "s")
    ex = run("extract", "--target", str(target), "--completions", "s", "--drafter", str(hf)).strip()
    ids = run("sweep", "--checkpoints", str(out), "--extraction", ex, "--tree-budget", "2").split()
    st = Store(ws)
    by = {r["id"]: r for r in st.runs()}
    assert [by[i]["step"] for i in ids] == [10, 20]
    pipeline.perform(st, ops.Replay(drafter=str(hf), extraction=ex, tree_budget=2))
    swept = {p["prompt_id"]: p for p in st.run_prompts(ids[0])}
    plain = {p["prompt_id"]: p for p in st.run_prompts(st.runs()[-1]["id"])}
    assert swept.keys() == plain.keys() == {"p0", "p1"}
    for pid in swept:
        assert swept[pid]["rounds"] == plain[pid]["rounds"]
        done = [x for x, v in enumerate(swept[pid]["accepted_at"]) if v >= 0]  # the anchors the chain visited
        assert done and [swept[pid]["accepted_at"][x] for x in done] == [plain[pid]["accepted_at"][x] for x in done]
    assert max(swept["p0"]["accepted_at"]) >= 2  # the drafted completion is accepted in part
    assert by[ids[0]]["summary"]["tau_macro"] > by[ids[1]]["summary"]["tau_macro"]
