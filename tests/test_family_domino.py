"""The Domino family: drafts equal an independent float64 walk (tests/ref_domino.py) at every anchor, the
correction really changes them, the replay paths agree, every checkpoint form (SpecForge HF export, SGLang's
normalised export, runtime training_state.pt, legacy `logit_head.*` names) replays the same, bad checkpoints are
refused by name, and a sweep over a run folder of Domino checkpoints works end to end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from ref_domino import domino_drafts
from safetensors.torch import save_file
from synthetic import planted, random_head

from dflash_dash import drafters as dr, ops, pipeline, replay as rp
from dflash_dash.drafters import dflash, domino
from dflash_dash.store import Store
from tools import tiny

HEAD_KEYS = ("prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0", "embed_proj.0.weight", "embed_proj.2.weight")


def spec(shift: bool = True, P: int = 1, seed: int = 3, **kw) -> tiny.TinyDrafter:
    """A tiny SpecForge Domino (its configs: emb_dim and gru_hidden_dim also at the top level are allowed)."""
    fields = {"emb_dim": 16, "gru_hidden_dim": 24, "pure_draft_prefix_len": P, "shift_label": shift}
    return tiny.TinyDrafter(seed=seed, architecture="DominoDraftModel", family_fields=fields, **kw)


def state_of(d: tiny.TinyDrafter) -> dict[str, torch.Tensor]:
    """Seeded weights with a correction strong enough to move drafts (the head is what these tests are about)."""
    w = tiny.weights(d)
    w["embed_proj.2.weight"] = w["embed_proj.2.weight"] * 4
    return w


def write(folder: Path, d: tiny.TinyDrafter, cfg: dict | None = None, state: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in (state or state_of(d)).items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg or tiny.drafter_config(d)))
    return folder


def inputs(T: int = 30, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, 500, (T,), generator=g), torch.randn(T, 128, generator=g)


# ---------------------------------------------------------------------------
# the drafts themselves


@pytest.mark.parametrize("shift", [True, False])
@pytest.mark.parametrize("P", [0, 1])
def test_drafts_equal_float64_walk_at_every_anchor(tmp_path, shift, P):
    d = spec(shift, P)
    state = state_of(d)
    m = dr.load(write(tmp_path / "d", d, state=state))
    assert isinstance(m, domino.Domino) and m.sequential and m.drafts == 3 and m.width == 4
    assert m.c.first_slot == (0 if shift else 1)
    head = random_head()
    tokens, feats = inputs()
    start = 8
    got = rp.draft_all(m, head, feats, tokens, start, topk=3, chunk=5)
    cfg = tiny.drafter_config(d)
    for a, p in enumerate(range(start, len(tokens))):
        want, want_lp = domino_drafts(state, cfg, feats, tokens, p, head.embed, head.lm_head)
        assert got.tokens[a].tolist() == want, p
        assert got.top_logp[a, :, 0].tolist() == pytest.approx(want_lp, abs=1e-4), p
    assert torch.equal(got.top_ids[..., 0], got.tokens)  # ids[..., 0] is the draft
    assert (got.top_logp[..., :-1] >= got.top_logp[..., 1:]).all()  # top-k sorted by the walk's log-probs
    # the same backbone read out as plain DFlash: the first P drafts are the same, the corrected ones are not
    plain = dflash.DFlash(m.c, m.w)
    base = rp.draft_all(plain, head, feats, tokens, start, topk=3, chunk=5)
    assert torch.equal(base.tokens[:, :P], got.tokens[:, :P])
    assert (base.tokens[:, P:] != got.tokens[:, P:]).float().mean() > 0.2
    assert len(set(got.tokens.flatten().tolist())) > 5  # not degenerate


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_bfloat16_walk_close_to_float32(tmp_path, dtype):
    ck = write(tmp_path / "d", spec(True, 1))
    head = random_head()
    tokens, feats = inputs()
    a = rp.draft_all(dr.load(ck), head, feats, tokens, 8, topk=2)
    low = head.__class__(head.embed.to(dtype), head.lm_head.to(dtype))
    b = rp.draft_all(dr.load(ck, dtype=dtype), low, feats, tokens, 8, topk=2)
    assert b.tokens.shape == a.tokens.shape and b.top_logp.dtype == torch.float32
    assert (a.tokens[:, 0] == b.tokens[:, 0]).float().mean() > 0.7


# ---------------------------------------------------------------------------
# replay paths


@pytest.fixture(scope="module")
def planted_case(tmp_path_factory):
    base = tmp_path_factory.mktemp("domino-chain")
    head = random_head()
    g = torch.Generator().manual_seed(2)
    out = {}
    for shift in (True, False):
        m = dr.load(write(base / str(shift), spec(shift, 1, block_size=5)))
        seqs = []
        for i, (T, P) in enumerate([(50, 5), (31, 9), (13, 11), (2, 1)]):
            feats = torch.randn(T, 128, generator=g)
            seqs.append(rp.Sequence(f"s{i}", planted(m, head, feats, P, T, seed=i), P, feats))
        out[shift] = (m, seqs)
    return head, out


@pytest.mark.parametrize("long", [False, True])  # True: the long-context path (`DFlash.blocks_run`)
@pytest.mark.parametrize("shift", [True, False])
def test_batched_equals_loop_and_chain_equals_every(monkeypatch, planted_case, shift, long):
    monkeypatch.setattr(rp.every, "LONG", 0 if long else rp.every.LONG)
    head, cases = planted_case
    m, seqs = cases[shift]
    for s in seqs[:2]:
        a = rp.draft_all(m, head, s.features, s.tokens, s.prompt_len, topk=4, chunk=6)
        b = rp.draft_loop(m, head, s.features, s.tokens, s.prompt_len, topk=4)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.top_ids, b.top_ids)
        assert torch.allclose(a.top_logp, b.top_logp, atol=1e-4)
    every, s_every = rp.every_anchor(m, head, seqs, budget=3, chunk=7)
    chain, s_chain = rp.chain_only(m, head, seqs, budget=3, batch=2)
    assert s_every["tau_pooled"] > 1.5  # planted from the drafter's own walks: long acceptance happens
    for a, b in zip(every, chain):
        assert (a.id, a.rounds, a.round_anchors, a.tree_rounds) == (b.id, b.rounds, b.round_anchors, b.tree_rounds)
        for x, v in enumerate(b.accepted_at):
            if v >= 0:
                assert v == a.accepted_at[x] and list(b.drafts[x]) == list(a.drafts[x])
    for key in ("tau_macro", "tau_pooled", "ddtree_tau", "accept_hist", "rounds", "committed"):
        assert s_chain[key] == s_every[key], key


# ---------------------------------------------------------------------------
# checkpoint forms


def legacy(state: dict) -> dict:
    return {("logit_head." + k if k in HEAD_KEYS else k): v for k, v in state.items()}


def test_every_form_replays_identically(tmp_path):
    d = spec(True, 1)
    state = state_of(d)
    cfg = tiny.drafter_config(d)
    forms = {"hf": write(tmp_path / "hf", d, cfg, state)}
    sglang = json.loads(json.dumps(cfg))  # SpecForge's normaliser: DFlash architecture, projector type kept
    sglang["architectures"] = ["DFlashDraftModel"]
    sglang["dflash_config"]["projector_type"] = "domino"
    sglang["emb_dim"] = sglang["dflash_config"]["emb_dim"]  # SpecForge configs repeat it at the top level
    forms["sglang"] = write(tmp_path / "sglang", d, sglang, state)
    forms["legacy"] = write(tmp_path / "legacy", d, cfg, legacy(state))
    both = legacy(state) | {k: state[k].clone() for k in HEAD_KEYS}  # an export of a legacy run: both spellings
    forms["both"] = write(tmp_path / "both", d, cfg, both)
    cfg_file = tmp_path / "draft_config.json"
    cfg_file.write_text(json.dumps(cfg))
    runtime = tiny.write_runtime(tmp_path / "run", state, 40, "r1", strategy="domino")
    old_runtime = tiny.write_runtime(tmp_path / "old", legacy(state), 20, "r0", strategy="domino")
    head = random_head()
    tokens, feats = inputs()
    ref = rp.draft_all(dr.load(forms["hf"]), head, feats, tokens, 8, topk=3)
    models = {k: dr.load(p) for k, p in forms.items()}
    models["runtime"] = dr.load(runtime, draft_config=cfg_file)
    models["legacy runtime"] = dr.load(old_runtime, draft_config=cfg_file)
    for name, m in models.items():
        assert isinstance(m, domino.Domino), name
        got = rp.draft_all(m, head, feats, tokens, 8, topk=3)
        assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.top_logp, ref.top_logp), name


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda cfg, st: st.pop("prefix_gru.weight_hh_l0"), "missing tensor 'prefix_gru.weight_hh_l0'"),
        (lambda cfg, st: st.pop("logit_head.embed_proj.2.weight"), "missing tensor 'embed_proj.2.weight'"),
        (
            lambda cfg, st: st.update({"embed_proj.0.weight": torch.zeros(16, 64)}),
            r"'embed_proj.0.weight' has shape \(16, 64\), expected \(16, 88\)",
        ),
        (
            lambda cfg, st: st.update({"prefix_gru.bias_ih_l0": torch.zeros(72)}),
            "unknown tensor 'prefix_gru.bias_ih_l0'",
        ),
        (  # a later SpecForge's optional hidden_proj head: not replayed, refused by its tensor
            lambda cfg, st: st.update({"hidden_proj.0.weight": torch.zeros(16, 88)}),
            "unknown tensor 'hidden_proj.0.weight'",
        ),
        (lambda cfg, st: cfg["dflash_config"].pop("gru_hidden_dim"), "dflash_config.gru_hidden_dim"),
        (lambda cfg, st: cfg["dflash_config"].update(pure_draft_prefix_len=4), "pure_draft_prefix_len = 4"),
        (lambda cfg, st: cfg["dflash_config"].update(shift_label="yes"), "shift_label = 'yes'"),
        (lambda cfg, st: cfg["dflash_config"].update(emb_dim=0), "emb_dim = 0"),
        (lambda cfg, st: cfg.update(emb_dim=32), "emb_dim"),
        (lambda cfg, st: cfg["dflash_config"].update(projector_type="dspark"), "projector_type"),
    ],
)
def test_bad_checkpoints_refused_by_name(tmp_path, change, match):
    d = spec(True, 1)
    cfg, st = tiny.drafter_config(d), state_of(d)
    if "logit_head" in match or "embed_proj.2" in match:
        st = legacy(st)
    change(cfg, st)
    ck = write(tmp_path / "bad", d, cfg, st)
    with pytest.raises(dr.CheckpointError, match=match):
        dr.load(ck)
    with pytest.raises(dr.CheckpointError, match=match):
        dr.check(ck)


def test_flops_count_the_head():
    c = dr.parse_config(tiny.drafter_config(spec(True, 1)))
    extra = domino.flops_per_block(c, 100, 512) - dflash.flops_per_block(c, 100, 512)
    assert extra == 3 * 2 * (3 * 24 * 64 + 3 * 24 * 24) + 2 * 2 * (16 * 88 + 512 * 16)
    assert dr.flops_per_block(c, 100, 512) == domino.flops_per_block(c, 100, 512)


# ---------------------------------------------------------------------------
# end to end


def test_sweep_over_a_domino_run_folder(prepared, workspace_copy, tmp_path):
    """Runtime steps of a Domino training (config.json beside them) sweep in step order, chain-only, through
    `pipeline.perform`; a step replayed every-anchor gives the same rounds."""
    out = tmp_path / "train"
    for step, seed in ((200, 2), (100, 1)):
        tiny.write_runtime(out, state_of(spec(True, 1, seed=seed)), step, "r1", strategy="domino")
    (out / "config.json").write_text(json.dumps(tiny.drafter_config(spec(True, 1))))
    st = Store(workspace_copy)
    ids = pipeline.perform(
        st, ops.Sweep(checkpoints=str(out), extraction=prepared.extraction, tree_budget=2, max_prompts=2)
    )["runs"]
    runs = [st.run_row(i) for i in ids]
    assert [r["step"] for r in runs] == [100, 200]
    assert all(r["summary"]["anchors"] == "chain" and r["summary"]["family"] == "Domino" for r in runs)
    assert runs[0]["summary"]["tau_macro"] != runs[1]["summary"]["tau_macro"]  # two different drafters
    shutil.copy(out / "config.json", tmp_path / "cfg.json")
    every = pipeline.replay(
        st,
        ops.Replay(
            drafter=str(out / "r1-step100"),
            extraction=prepared.extraction,
            draft_config=str(tmp_path / "cfg.json"),
            tree_budget=2,
            max_prompts=2,
        ),
    )
    assert every["summary"]["tau_macro"] == pytest.approx(runs[0]["summary"]["tau_macro"])
    chain = {p["prompt_id"]: p for p in st.run_prompts(ids[0])}
    for p in st.run_prompts(every["id"]):
        for key in ("rounds", "tree_rounds"):
            assert list(chain[p["prompt_id"]][key]) == list(p[key]), key
