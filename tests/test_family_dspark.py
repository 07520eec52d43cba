"""DSpark: drafts, log-probabilities and confidence equal an independent float64 forward at every anchor; the
batched, plain and chain-only replays agree; every form a user holds (SpecForge HF export, SGLang's normalised
export, runtime training_state.pt, legacy `logit_head.*` names) replays identically; bad checkpoints are named;
a sweep over a run folder of DSpark checkpoints works end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from ref_dspark import Spec, drafts_at_every_anchor
from safetensors.torch import load_file, save_file
from synthetic import planted, random_head

from dflash_dash import drafters as dr, ops, pipeline, replay as rp
from dflash_dash.drafters.dflash import DFlash
from dflash_dash.store import Store
from tools import tiny

R = 8  # markov_rank of the test drafters


def tiny_dspark(seed=3, rank=R, kind="vanilla", conf=True, with_markov=True, anchor=None, **kw) -> tiny.TinyDrafter:
    fields = {"markov_rank": rank, "markov_head_type": kind, "enable_confidence_head": conf}
    if conf:
        fields["confidence_head_with_markov"] = with_markov
    if anchor is not None:
        fields["sample_from_anchor"] = anchor
    return tiny.TinyDrafter(architecture="DSparkDraftModel", seed=seed, family_fields=fields, **kw)


def spec(d: tiny.TinyDrafter) -> Spec:
    f = d.family_fields
    return Spec(
        d.block_size,
        d.num_attention_heads,
        d.num_key_value_heads,
        d.head_dim,
        d.num_hidden_layers,
        d.mask_token_id,
        d.rope_theta,
        f["markov_rank"],
        f["markov_head_type"],
        f["enable_confidence_head"],
        f.get("confidence_head_with_markov", False),
        f.get("sample_from_anchor", True),
    )


def inputs(seed=1, T=30, P=6):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (T,), generator=g), torch.randn(T, 128, generator=g), P


CASES = {  # name -> drafter
    "vanilla": tiny_dspark(kind="vanilla"),
    "gated": tiny_dspark(kind="gated", with_markov=False),
    "rnn": tiny_dspark(kind="rnn", block_size=5),
    "rnn-spec-generate": tiny_dspark(kind="rnn", anchor=False, block_size=5),  # slots 1..B-1
    "no-markov": tiny_dspark(rank=0, with_markov=False),
    "no-confidence": tiny_dspark(kind="gated", conf=False),
}


# ---------------------------------------------------------------------------
# the forward against an independent float64 implementation


@pytest.mark.parametrize("name", list(CASES))
def test_drafts_equal_float64_reference_at_every_anchor(tmp_path, name):
    d = CASES[name]
    ck = tiny.write_drafter(tmp_path / name, d)
    m = dr.load(ck)
    head = random_head()
    tokens, feats, P = inputs()
    got = rp.draft_all(m, head, feats, tokens, P, topk=3, chunk=5)
    want, want_lp, want_conf = drafts_at_every_anchor(
        load_file(str(ck / "model.safetensors")), spec(d), feats, tokens, P, head.embed, head.lm_head
    )
    B, anchor = d.block_size, spec(d).from_anchor
    assert type(m).__name__ == "DSpark" and m.drafts == (B if anchor else B - 1) and m.width == m.drafts + 1
    assert got.tokens.shape == want.shape == (len(tokens) - P, m.drafts)
    assert torch.equal(got.tokens, want)
    assert torch.equal(got.top_ids[..., 0], got.tokens)
    assert torch.allclose(got.top_logp[..., 0].double(), want_lp, atol=1e-4)
    assert (got.top_logp[..., :1] >= got.top_logp[..., 1:]).all()  # top-k sorted, the draft first
    if want_conf is None:
        assert got.confidence is None
    else:
        assert torch.allclose(got.confidence.double(), want_conf, atol=1e-5)
    # plain DFlash over the same backbone weights and the same slots (the LM head alone): the Markov head is applied
    plain = rp.draft_all(DFlash(m.c, m.w), head, feats, tokens, P, topk=3, chunk=5)
    if spec(d).rank:
        assert not torch.equal(plain.tokens, got.tokens)
        assert len(set(got.tokens.flatten().tolist())) > 3
    else:
        assert torch.equal(plain.tokens, got.tokens) and torch.allclose(plain.top_logp, got.top_logp, atol=1e-5)


def test_confidence_reads_the_walks_own_drafts(tmp_path):
    """With `confidence_head_with_markov` the confidence of slot j reads the draft of slot j-1, not another
    token: other drafts give other confidences from the slot after the first changed one."""
    m = dr.load(tiny.write_drafter(tmp_path / "c", CASES["vanilla"]))
    head = random_head()
    tokens, feats, P = inputs()
    with torch.inference_mode():
        kv = m.context_kv(feats)
        anchors = torch.arange(P, len(tokens))
        h = m.blocks(kv, anchors, m.embed_block(head, tokens[anchors]))
        drafts = m.read_out(head, h, tokens[anchors], 1)[0]
        c = m.confidence(head, h, tokens[anchors], drafts)
        other = drafts.clone()
        other[:, 1] = (other[:, 1] + 1) % 512
        c2 = m.confidence(head, h, tokens[anchors], other)
    assert torch.equal(c[:, :2], c2[:, :2]) and not torch.allclose(c[:, 2], c2[:, 2])
    assert c.dtype == torch.float32 and ((c > 0) & (c < 1)).all()


def test_bfloat16_runs_and_agrees_with_float32(tmp_path):
    ck = tiny.write_drafter(tmp_path / "rnn", CASES["rnn"])
    head = random_head()
    tokens, feats, P = inputs()
    a = rp.draft_all(dr.load(ck), head, feats, tokens, P, topk=2)
    b = rp.draft_all(dr.load(ck, dtype=torch.bfloat16), head, feats.bfloat16(), tokens, P, topk=2)
    assert b.tokens.shape == a.tokens.shape and b.top_logp.dtype == torch.float32 and b.confidence is not None
    assert (a.tokens[:, 0] == b.tokens[:, 0]).float().mean() > 0.7  # bf16 rounding flips a few near-ties only


# ---------------------------------------------------------------------------
# the replay paths agree


@pytest.mark.parametrize("long", [False, True])  # True: the long-context path (`DFlash.blocks_run`)
@pytest.mark.parametrize("name", ["vanilla", "rnn", "rnn-spec-generate", "no-markov"])
def test_batched_equals_loop_and_chain_equals_every(monkeypatch, tmp_path, name, long):
    monkeypatch.setattr(rp.every, "LONG", 0 if long else rp.every.LONG)
    m = dr.load(tiny.write_drafter(tmp_path / name, CASES[name]))
    head = random_head()
    tokens, feats, P = inputs(T=33, P=9)
    b = rp.draft_loop(m, head, feats, tokens, P, topk=4)
    for chunk in (1, 7, 64):
        a = rp.draft_all(m, head, feats, tokens, P, topk=4, chunk=chunk)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.top_ids, b.top_ids)
        assert torch.allclose(a.top_logp, b.top_logp, atol=1e-4)
        assert (a.confidence is None) == (b.confidence is None)
        assert a.confidence is None or torch.allclose(a.confidence, b.confidence, atol=1e-5)
    for p in (P, P + 3, len(tokens) - 1):  # the speculative stand-in's one block: what the replay drafts there
        assert rp.draft_one(m, head, feats, p, int(tokens[p])) == a.tokens[p - P].tolist()
    g = torch.Generator().manual_seed(5)
    seqs = []
    for i, (T, P) in enumerate([(32, 5), (20, 9), (6, 4)]):
        f = torch.randn(T, 128, generator=g)
        seqs.append(rp.Sequence(f"s{i}", planted(m, head, f, P, T, seed=i), P, f))
    for budget in (0, 3):
        every, s_every = rp.every_anchor(m, head, seqs, budget=budget, chunk=7)
        chain, s_chain = rp.chain_only(m, head, seqs, budget=budget, batch=3)
        assert s_every["tau_pooled"] > 1.5  # planted acceptance: rounds of several tokens
        assert max(max(p.rounds) for p in every) <= m.width
        for a, b in zip(every, chain):
            assert (a.id, a.rounds, a.round_anchors, a.tree_rounds) == (b.id, b.rounds, b.round_anchors, b.tree_rounds)
            done = np.asarray(b.accepted_at) >= 0
            assert (np.asarray(b.accepted_at)[done] == np.asarray(a.accepted_at)[done]).all()
        for key in ("tau_macro", "tau_pooled", "ddtree_tau", "accept_hist", "rounds", "committed"):
            assert s_chain[key] == s_every[key], key


# ---------------------------------------------------------------------------
# the forms users hold


def sglang_config(d: tiny.TinyDrafter) -> dict:
    """SGLang's normalised export (`normalize_dflash_export`): Qwen3DSparkModel, the Markov fields copied to the
    top level (the head type lower-cased), dflash_config kept with projector_type."""
    cfg = tiny.drafter_config(d)
    cfg["architectures"] = ["Qwen3DSparkModel"]
    cfg["dflash_config"]["projector_type"] = "dspark"
    for k in ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov"):
        cfg[k] = cfg["dflash_config"][k]
    return cfg


def legacy(state: dict) -> dict:
    return {
        ("logit_head." + k if k.startswith(("markov_head.", "confidence_head.")) else k): v for k, v in state.items()
    }


def write_hf(folder: Path, cfg: dict, state: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("kind", ["gated", "rnn"])
def test_every_form_replays_identically(tmp_path, kind):
    d = tiny_dspark(kind=kind, seed=4)
    state = tiny.weights(d)
    cfg = tiny.drafter_config(d)
    cfg_file = tmp_path / "draft_config.json"
    cfg_file.write_text(json.dumps(cfg))
    heads = {k for k in state if k.startswith(("markov_head.", "confidence_head."))}
    assert any(k.startswith("markov_head.gate_proj" if kind == "gated" else "markov_head.joint_proj") for k in heads)
    forms = {
        "hf": write_hf(tmp_path / "hf", cfg, state),
        "sglang": write_hf(tmp_path / "sglang", sglang_config(d), state),
        "legacy": write_hf(tmp_path / "legacy", cfg, legacy(state)),
        "both-names": write_hf(tmp_path / "both", cfg, state | legacy({k: state[k].clone() for k in heads})),
        "runtime": tiny.write_runtime(tmp_path / "out", state, 300, "r1", strategy="dspark"),
        "runtime-legacy": tiny.write_runtime(tmp_path / "out", legacy(state), 400, "r1", strategy="dspark"),
    }
    head = random_head()
    tokens, feats, P = inputs()
    got = {}
    for name, path in forms.items():
        m = dr.load(path, draft_config=cfg_file if name.startswith("runtime") else None)
        assert type(m).__name__ == "DSpark" and m.c.head == dr.load(forms["hf"]).c.head
        got[name] = rp.draft_all(m, head, feats, tokens, P, topk=3)
    for name, x in got.items():
        ref = got["hf"]
        assert torch.equal(x.tokens, ref.tokens) and torch.equal(x.top_ids, ref.top_ids), name
        assert torch.equal(x.top_logp, ref.top_logp) and torch.equal(x.confidence, ref.confidence), name


def test_markov_fields_read_from_either_place():
    d = tiny_dspark(kind="rnn")
    a = dr.parse_config(tiny.drafter_config(d))
    top = sglang_config(d)
    top["markov_head_type"] = "RNN"  # case-insensitive
    top["dflash_config"] = {k: v for k, v in top["dflash_config"].items() if k not in d.family_fields}
    b = dr.parse_config(top)
    assert a.family == b.family == "dspark" and a.head == b.head and a.head["markov_head_type"] == "rnn"
    newer = tiny.drafter_config(d)  # SpecForge's newer spelling: the fields in a dspark_config dict
    newer["dspark_config"] = {k: newer["dflash_config"].pop(k) for k in d.family_fields}
    assert dr.parse_config(newer).head == a.head
    assert (a.first_slot, a.drafts) == (0, d.block_size)
    off = dr.parse_config(tiny.drafter_config(tiny_dspark(anchor=False)))
    assert (off.first_slot, off.drafts) == (1, d.block_size - 1)


def test_flops_count_the_heads():
    """DFlash's backbone count, the LM head of all D drafted slots, and more for every head the config adds."""
    plain = tiny.drafter_config(tiny.TinyDrafter())
    n = {
        name: dr.flops_per_block(dr.parse_config(tiny.drafter_config(d)), 100, 512)
        for name, d in [
            ("rank0", tiny_dspark(rank=0, conf=False)),
            *[(k, tiny_dspark(kind=k, conf=False)) for k in ("vanilla", "gated", "rnn")],
            ("conf", tiny_dspark(kind="rnn")),
        ]
    }
    base = dr.flops_per_block(dr.parse_config(plain), 100, 512)
    assert n["rank0"] - base == 2 * 64 * 512  # one more LM-head row: B drafts, not B-1
    assert n["rank0"] < n["vanilla"] < n["gated"] < n["rnn"] < n["conf"]


# ---------------------------------------------------------------------------
# bad checkpoints are named


def _drop(name):
    return lambda s: {k: v for k, v in s.items() if k != name}


@pytest.mark.parametrize(
    "fields,edit,match",
    [
        ({}, _drop("markov_head.markov_w2.weight"), "missing tensor 'markov_head.markov_w2.weight'"),
        ({}, _drop("confidence_head.proj.bias"), "missing tensor 'confidence_head.proj.bias'"),
        ({"kind": "rnn"}, _drop("markov_head.joint_proj.weight"), "missing tensor 'markov_head.joint_proj.weight'"),
        (
            {},
            lambda s: s | {"markov_head.markov_w1.weight": torch.zeros(512, R + 1)},
            r"'markov_head.markov_w1.weight' has shape \(512, 9\), expected \(512, 8\)",
        ),
        (
            {"with_markov": False},
            lambda s: s | {"confidence_head.proj.weight": torch.zeros(1, 64 + R)},
            r"'confidence_head.proj.weight' has shape \(1, 72\), expected \(1, 64\)",
        ),
        (
            {"kind": "vanilla"},
            lambda s: s | {"markov_head.gate_proj.weight": torch.zeros(R, 64 + R)},
            "unknown tensor 'markov_head.gate_proj.weight'",
        ),
        (
            {"kind": "gated"},
            lambda s: s | {"markov_head.gate_proj.bias": torch.zeros(R + 2)},
            r"'markov_head.gate_proj.bias' has shape \(10,\), expected \(8,\)",
        ),
    ],
)
def test_bad_tensor_named(tmp_path, fields, edit, match):
    d = tiny_dspark(**fields)
    ck = write_hf(tmp_path / "bad", tiny.drafter_config(d), edit(tiny.weights(d)))
    with pytest.raises(dr.CheckpointError, match=match):
        dr.load(ck)
    with pytest.raises(dr.CheckpointError, match=match):
        dr.check(ck)


@pytest.mark.parametrize(
    "patch,match",
    [
        ({"markov_head_type": "cond"}, "markov_head_type = 'cond'"),
        ({"markov_rank": -1}, "markov_rank = -1"),
        ({"markov_rank": "8"}, "markov_rank = '8'"),
        ({"sample_from_anchor": "yes"}, "sample_from_anchor = 'yes'"),
        ({"markov_rank": 0, "confidence_head_with_markov": True}, "confidence_head_with_markov"),
        ({"attention_mode": "mha"}, "attention_mode = 'mha'"),
        ({"attention_mode": "mla"}, "attention_mode = 'mla'"),
        ({"projector_type": "domino"}, "projector_type"),
    ],
)
def test_bad_field_named(tmp_path, patch, match):
    cfg = tiny.drafter_config(tiny_dspark())
    cfg["dflash_config"] |= patch
    with pytest.raises(dr.CheckpointError, match=match):
        dr.parse_config(cfg)
    top = sglang_config(tiny_dspark())
    top["markov_rank"] = R * 2  # the two places disagree
    with pytest.raises(dr.CheckpointError, match="markov_rank"):
        dr.parse_config(top)


# ---------------------------------------------------------------------------
# a sweep over a run folder of DSpark checkpoints


def test_sweep_over_a_dspark_run_folder(tmp_path):
    target = tiny.write_target(tmp_path / "target", tiny.TinyTarget(model_type="qwen3", num_hidden_layers=6))
    d = tiny_dspark(kind="rnn", target_layer_ids=[1, 4], num_target_layers=6)
    g = np.random.default_rng(0)
    lines = [
        {"id": f"p{i}", "prompt_ids": g.integers(0, 512, 5).tolist(), "output_ids": g.integers(0, 512, 14).tolist()}
        for i in range(2)
    ]
    f = tmp_path / "c.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    st = Store(tmp_path / "ws")
    pipeline.import_completions(st, f, "s")
    ex = pipeline.extract(st, ops.Extract(target=str(target), completions="s", layers=d.target_layer_ids))
    out = tmp_path / "train"
    for step, seed in ((200, 6), (100, 5)):
        tiny.write_runtime(out, tiny.weights(tiny_dspark(kind="rnn", seed=seed)), step, "r1", strategy="dspark")
    (out / "config.json").write_text(json.dumps(tiny.drafter_config(d)))
    res = pipeline.perform(st, ops.Sweep(checkpoints=str(out), extraction=ex, tree_budget=2))
    by = {r["id"]: r for r in st.runs()}
    ids = [i for i in by if by[i]["checkpoint"].startswith(str(out.resolve()))]
    assert sorted(by[i]["step"] for i in ids) == [100, 200] and json.dumps(res)
    # the sweep's chain-only rounds equal an every-anchor replay of the same weights exported as an HF folder
    hf = write_hf(tmp_path / "hf200", tiny.drafter_config(d), tiny.weights(tiny_dspark(kind="rnn", seed=6)))
    every = pipeline.replay(st, ops.Replay(drafter=str(hf), extraction=ex, tree_budget=2, anchors="every"))
    sweep200 = next(i for i in ids if by[i]["step"] == 200)
    a = {p["prompt_id"]: p for p in st.run_prompts(every["id"])}
    b = {p["prompt_id"]: p for p in st.run_prompts(sweep200)}
    assert a.keys() == b.keys() == {"p0", "p1"}
    for pid in a:
        assert a[pid]["rounds"] == b[pid]["rounds"]
        assert len(a[pid]["drafts"]) == len(a[pid]["accepted_at"]) * d.block_size  # B drafts per anchor (stored flat)
    assert by[sweep200]["summary"]["tau_macro"] == pytest.approx(every["summary"]["tau_macro"])


def test_runtime_strategy_must_train_the_configs_family(tmp_path):
    """A runtime checkpoint trained with strategy 'domino' read with a DSpark config is refused naming both; the
    family's own strategy and DFlash's (which also trains DFlash2) are read."""
    d = tiny_dspark(kind="vanilla")
    out = tmp_path / "out"
    cfg = tmp_path / "draft.json"
    cfg.write_text(json.dumps(tiny.drafter_config(d)))
    bad = tiny.write_runtime(out, tiny.weights(d), 100, "r1", strategy="domino")
    with pytest.raises(dr.CheckpointError, match="strategy 'domino' but its config .* describes a dspark drafter"):
        dr.check(bad, draft_config=cfg)
    good = tiny.write_runtime(out, tiny.weights(d), 200, "r1", strategy="dspark")
    assert dr.check(good, draft_config=cfg).family == "dspark"
