"""Real checkpoints: SpecForge's HF exports (transformers-5 `rope_parameters`, sliding layers,
`dflash_config` fields), SpecForge runtime checkpoints (`{run_id}-step{N}/training_state.pt`), sweep order,
unsafe pickles, other drafter families and RoPE conflicts. Checkpoints are written with the project's own
`tiny` helpers the way SpecForge writes them; the sliding semantics is checked against an independent dense
implementation of SpecForge's training mask."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from serving import stop_jobs, until

from dflash_dash import cli, drafters as dr, ops, pipeline, replay as rp, target as tg
from dflash_dash.drafters import kernels
from dflash_dash.jobs import lifecycle
from dflash_dash.store import Store
from tools import tiny

SLIDING = tiny.TinyDrafter(
    seed=5, layer_types=["sliding_attention", "full_attention"], sliding_window=5, block_size=4, rope_theta=1e7
)


def export_hf(folder: Path, d: tiny.TinyDrafter, cfg: dict | None = None, extra: dict | None = None) -> Path:
    """An HF folder as `specforge export --to hf` writes it (transformers-5 config, model.safetensors)."""
    folder.mkdir(parents=True, exist_ok=True)
    state = tiny.weights(d) | (extra or {})
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg or tiny.transformers5_config(d)))
    return folder


# ---------------------------------------------------------------------------
# an independent dense implementation of SpecForge's training forward (one sequence, all blocks at once)


def dense_specforge(w: dict, d: tiny.TinyDrafter, feats, tokens, anchors, embed, lm_head, causal: bool):
    """Float64 re-implementation: context = hidden_norm(fc(features)) of all T positions, the blocks of every
    anchor appended after it, ONE attention per layer over [context; all blocks] with the dense mask of
    SpecForge's `create_dflash_sdpa_mask`: a block query at position q = anchor + i sees context keys
    k < anchor (and, in sliding layers, q - k <= window - 1) and the keys of its own block (in sliding layers
    only slots j <= i when `causal`). Returns the argmax drafts [n, B-1] and log-probs [n, B-1, V]."""
    f64 = {k: v.double() for k, v in w.items()}
    B, H, hd, nh, nkv, W = (
        d.block_size,
        d.hidden_size,
        d.head_dim,
        d.num_attention_heads,
        d.num_key_value_heads,
        d.sliding_window,
    )

    def norm(x, g):
        return g * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)

    def rope(x, pos):  # x [n, heads, hd], pos [n]
        inv = 1.0 / (d.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = pos.double()[:, None] * inv[None]
        cos, sin = torch.cos(ang)[:, None], torch.sin(ang)[:, None]
        a, b = x[..., : hd // 2], x[..., hd // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    T, n = feats.shape[0], len(anchors)
    ctx = norm(feats.double() @ f64["fc.weight"].T, f64["hidden_norm.weight"])  # [T, H]
    ids = torch.full((n, B), d.mask_token_id)
    ids[:, 0] = tokens[anchors]
    h = embed.double()[ids].reshape(n * B, H)  # [n*B, H]
    qpos = (anchors[:, None] + torch.arange(B)).reshape(-1)  # [n*B]
    kpos = torch.cat([torch.arange(T), qpos])
    qblk = torch.arange(n).repeat_interleave(B)
    qslot = torch.arange(B).repeat(n)
    kblk = torch.cat([torch.full((T,), -1), qblk])
    kslot = torch.cat([torch.full((T,), -1), qslot])
    is_ctx = (kblk == -1)[None, :]
    anchor_q = anchors.repeat_interleave(B)[:, None]
    for i, kind in enumerate(d.layer_types):
        vis_ctx = is_ctx & (kpos[None, :] < anchor_q)
        vis_blk = kblk[None, :] == qblk[:, None]
        if kind == "sliding_attention":
            vis_ctx = vis_ctx & (kpos[None, :] >= qpos[:, None] - (W - 1))
            if causal:
                vis_blk = vis_blk & (kslot[None, :] <= qslot[:, None])
        mask = vis_ctx | vis_blk  # [n*B, T+n*B]
        p = f"layers.{i}."
        x = norm(h, f64[p + "input_layernorm.weight"])
        q = (x @ f64[p + "self_attn.q_proj.weight"].T).view(-1, nh, hd)
        kv_in = torch.cat([ctx, x])
        k = (kv_in @ f64[p + "self_attn.k_proj.weight"].T).view(-1, nkv, hd)
        v = (kv_in @ f64[p + "self_attn.v_proj.weight"].T).view(-1, nkv, hd)
        q = rope(norm(q, f64[p + "self_attn.q_norm.weight"]), qpos)
        k = rope(norm(k, f64[p + "self_attn.k_norm.weight"]), kpos)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        s = s.masked_fill(~mask[None], float("-inf"))
        o = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v).reshape(-1, nh * hd)
        h = h + o @ f64[p + "self_attn.o_proj.weight"].T
        y = norm(h, f64[p + "post_attention_layernorm.weight"])
        h = (
            h
            + (torch.nn.functional.silu(y @ f64[p + "mlp.gate_proj.weight"].T) * (y @ f64[p + "mlp.up_proj.weight"].T))
            @ f64[p + "mlp.down_proj.weight"].T
        )
    out = norm(h, f64["norm.weight"]).view(n, B, H)[:, 1:]
    logp = torch.log_softmax(out @ lm_head.double().T, -1)  # [n, B-1, V]
    return logp.argmax(-1), logp


@pytest.mark.parametrize("semantics", ["causal", "bidirectional"])
def test_sliding_drafts_equal_dense_specforge_mask(tmp_path, semantics):
    """Per anchor, the replay's sliding-layer drafts (batched and one-block paths) equal the dense training-mask
    implementation with the same semantics, and differ from the other semantics somewhere."""
    ck = export_hf(tmp_path / "export", SLIDING)
    m = dr.load(ck, sliding_block=semantics)
    assert m.sliding_block == semantics and m.c.rope_theta == 1e7 and m.c.block_size == 4
    g = torch.Generator().manual_seed(11)
    head = tg.Head(torch.randn(512, 64, generator=g), torch.randn(512, 64, generator=g))
    T, P = 30, 6
    tokens = torch.randint(0, 512, (T,), generator=g)
    feats = torch.randn(T, 128, generator=g)
    got = rp.draft_all(m, head, feats, tokens, P, topk=3, chunk=5)
    loop = rp.draft_loop(m, head, feats, tokens, P, topk=3)
    ref, logp = dense_specforge(
        tiny.weights(SLIDING),
        SLIDING,
        feats,
        tokens,
        torch.arange(P, T),
        head.embed,
        head.lm_head,
        causal=semantics == "causal",
    )
    assert torch.equal(got.tokens, ref) and torch.equal(loop.tokens, ref)
    top = logp.topk(3, -1)
    assert torch.allclose(got.top_logp.double(), top.values, atol=2e-4)
    other, _ = dense_specforge(
        tiny.weights(SLIDING),
        SLIDING,
        feats,
        tokens,
        torch.arange(P, T),
        head.embed,
        head.lm_head,
        causal=semantics != "causal",
    )
    assert not torch.equal(ref, other)  # the semantics matters on this drafter


def test_sliding_default_and_is_causal(tmp_path):
    cfg = tiny.transformers5_config(SLIDING)
    assert dr.load(export_hf(tmp_path / "a", SLIDING, cfg)).sliding_block == "causal"  # trained/served default
    cfg["is_causal"] = False
    m = dr.load(export_hf(tmp_path / "b", SLIDING, cfg))
    assert m.sliding_block == "bidirectional"
    assert dr.load(tmp_path / "b", sliding_block="causal").sliding_block == "causal"  # the run's choice wins
    with pytest.raises(dr.CheckpointError, match="--sliding-block 'both'"):
        dr.load(tmp_path / "b", sliding_block="both")


# ---------------------------------------------------------------------------
# config as transformers 5 / SGLang write it


def test_rope_parameters_and_dflash_config_fields():
    d = tiny.TinyDrafter(rope_theta=1e7)
    c = dr.parse_config(tiny.transformers5_config(d))
    legacy = dr.parse_config(tiny.drafter_config(d))
    assert (c.rope_theta, c.rope_scaling, c.block_size, c.num_target_layers) == (1e7, None, 4, 8)
    assert (legacy.rope_theta, legacy.block_size) == (c.rope_theta, c.block_size)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
    new = tiny.transformers5_config(d)
    new["rope_parameters"] |= yarn
    old = tiny.drafter_config(d) | {"rope_scaling": yarn}
    assert dr.parse_config(new).rope_scaling == dr.parse_config(old).rope_scaling == yarn
    # both forms present and agreeing is fine (SpecForge's export mirrors rope_theta to the top level)
    both = tiny.transformers5_config(d) | {"rope_theta": 1e7}
    assert dr.parse_config(both).rope_theta == 1e7


def test_context_limits_name_where_the_drafter_sees_its_context_differently():
    """Long traces: the sliding window, the end of the positions scaled RoPE was trained on, and the declared
    maximum, in order (the dashed lines of Acceptance's context-position chart)."""
    plain = tiny.drafter_config(tiny.TinyDrafter())
    assert dr.context_limits(plain | {"max_position_embeddings": 40960}) == [(40960, "max_position_embeddings 40,960")]
    assert dr.context_limits({k: v for k, v in plain.items() if k != "max_position_embeddings"}) == []  # undeclared
    d = tiny.TinyDrafter(layer_types=["sliding_attention", "full_attention"], sliding_window=2048)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    c = tiny.drafter_config(d) | {"rope_scaling": yarn, "max_position_embeddings": 131072}
    assert dr.context_limits(c) == [
        (2048, "sliding window 2,048 (1 of 2 layers)"),
        (32768, "RoPE yarn x4 past 32,768"),
        (131072, "max_position_embeddings 131,072"),
    ]


def test_yarn_rope_from_either_form_gives_the_same_drafts(tmp_path):
    d = tiny.TinyDrafter(seed=2)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
    new = tiny.transformers5_config(d)
    new["rope_parameters"] |= yarn
    a = dr.load(export_hf(tmp_path / "new", d, new))
    b = dr.load(export_hf(tmp_path / "old", d, tiny.drafter_config(d) | {"rope_scaling": yarn}))
    plain = dr.load(export_hf(tmp_path / "plain", d))
    pos = torch.arange(3000)
    assert torch.equal(a.rope(pos)[0], b.rope(pos)[0])
    assert not torch.allclose(a.rope(pos)[0], plain.rope(pos)[0])  # yarn really applied


@pytest.mark.parametrize(
    "theta,hd,dtype", [(1e7, 128, torch.bfloat16), (1e4, 64, torch.float32), (5e5, 96, torch.bfloat16)]
)
def test_plain_rope_equals_transformers_bit_for_bit(theta, hd, dtype):
    """Plain RoPE is computed without importing transformers' modeling (seconds in a fresh worker): it must give
    transformers' Qwen3 rotary embedding's cos/sin exactly, at any position."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    c = dr.parse_config(tiny.drafter_config(tiny.TinyDrafter(seed=1)) | {"rope_theta": theta, "head_dim": hd})
    assert c.rope_scaling is None
    ref = Qwen3RotaryEmbedding(
        Qwen3Config(
            hidden_size=c.hidden_size,
            num_attention_heads=c.num_attention_heads,
            head_dim=hd,
            rope_parameters={"rope_type": "default", "rope_theta": theta},
        )
    )
    pos = torch.tensor([[0, 1, 7, 511, 2559], [4095, 20000, 32767, 3, 100]])
    cos, sin = kernels.Rope(c, "cpu", dtype)(pos)
    rc, rs = ref(torch.empty(0, dtype=dtype), pos.reshape(1, -1))
    assert cos.dtype == dtype and cos.shape == (2, 5, hd)
    assert torch.equal(cos, rc.reshape(2, 5, hd)) and torch.equal(sin, rs.reshape(2, 5, hd))


@pytest.mark.parametrize(
    "patch,match",
    [
        ({"rope_theta": 1e6}, "rope_theta = 1000000.0 but rope_parameters.rope_theta = 10000000.0"),
        (
            {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
            "rope_scaling.rope_type = 'linear' but rope_parameters.rope_type = 'default'",
        ),
        ({"rope_parameters": {"rope_type": "mrope", "rope_theta": 1e7}}, "rope_type 'mrope' is not supported"),
        ({"rope_parameters": None}, "no RoPE base"),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}},
            "partial_rotary_factor",
        ),
        ({"block_size": 8}, "block_size = 8 but dflash_config.block_size = 4"),
    ],
)
def test_config_conflicts_are_refused_by_name(patch, match):
    cfg = tiny.transformers5_config(tiny.TinyDrafter(rope_theta=1e7)) | patch
    with pytest.raises(dr.CheckpointError, match=match.replace("(", r"\(").replace(")", r"\)")):
        dr.parse_config(cfg)


# ---------------------------------------------------------------------------
# other drafter families, unknown tensors


FAMILIES = [  # a DFlash checkpoint's weights under another family's config: the missing field or head is named
    (
        {
            "architectures": ["DominoDraftModel"],
            "dflash_config": {"projector_type": "domino", "target_layer_ids": [1, 4], "mask_token_id": 3},
        },
        "missing field 'dflash_config.emb_dim'",
    ),
    ({"architectures": ["DSparkDraftModel"], "markov_rank": 8}, "missing tensor 'markov_head.markov_w1.weight'"),
    (
        {
            "architectures": ["DFlashDraftModel"],
            "dflash_config": {
                "projector_type": "dspark",
                "markov_rank": 8,
                "target_layer_ids": [1, 4],
                "mask_token_id": 3,
            },
        },
        "missing tensor 'markov_head.markov_w1.weight'",
    ),
    ({"markov_head_type": "gated"}, "belongs to a DSpark drafter"),
    ({"enable_confidence_head": True}, "belongs to a DSpark drafter"),
    ({"architectures": ["DFlash2DraftModel"]}, "DFlash2 drafter needs dflash_config.conv_kernel_size"),
    ({"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32000}, "EAGLE-3"),
    ({"architectures": ["Qwen3ForCausalLM"]}, "target model folder"),
]


@pytest.mark.parametrize("patch,name", FAMILIES)
def test_other_families_refused_by_name_and_leave_no_run(prepared, workspace_copy, tmp_path, patch, name):
    d = tiny.TinyDrafter(seed=1)
    ck = export_hf(tmp_path / "other", d, tiny.drafter_config(d) | patch)
    st = Store(workspace_copy)
    before = len(st.runs())
    with pytest.raises(dr.CheckpointError, match=name):
        pipeline.replay(st, ops.Replay(drafter=str(ck), extraction=prepared.extraction, tree_budget=0))
    assert len(st.runs()) == before


def test_unknown_tensors_refused_but_target_copies_ignored(tmp_path):
    d = tiny.TinyDrafter(seed=1)
    ok = export_hf(
        tmp_path / "ok", d, extra={"embed_tokens.weight": torch.zeros(512, 64), "lm_head.weight": torch.zeros(512, 64)}
    )
    assert dr.load(ok).c.hidden_size == 64
    bad = export_hf(
        tmp_path / "bad", d, extra={"markov_head.weight": torch.zeros(4, 4), "prefix_gru.weight_ih": torch.zeros(4, 4)}
    )
    with pytest.raises(dr.CheckpointError, match="unknown tensor 'markov_head.weight'"):
        dr.load(bad)


# ---------------------------------------------------------------------------
# SpecForge runtime checkpoints


def test_runtime_checkpoint_replays_like_the_hf_folder(prepared, workspace_copy, tmp_path, capsys):
    """The same weights as `{run_id}-step{N}/training_state.pt` give the very same per-prompt acceptance as the HF
    folder; the config comes from --draft-config, or from a config.json above the step folder."""
    st = Store(workspace_copy)
    hf = {p["prompt_id"]: p for p in st.run_prompts(prepared.runs[0])}
    state = {k: v for k, v in tiny.weights(tiny.TinyDrafter(seed=1)).items()}
    out = tmp_path / "out"
    step = tiny.write_runtime(out, state, 300, "r1")
    with pytest.raises(dr.CheckpointError, match="pass --draft-config FILE"):
        pipeline.replay(st, ops.Replay(drafter=str(step), extraction=prepared.extraction))
    cfg_file = tmp_path / "draft_config.json"
    cfg_file.write_text((prepared.drafters[0] / "config.json").read_text())
    rc = cli.main(
        [
            "replay",
            "--drafter",
            str(step),
            "--draft-config",
            str(cfg_file),
            "--workspace",
            str(workspace_copy),
            "--extraction",
            prepared.extraction,
        ]
    )
    assert rc == 0
    run = st.runs()[-1]
    assert run["checkpoint"] == str(step.resolve()) and run["config_file"] == str(cfg_file.resolve())
    assert run["step"] == 300 and run["sliding_block"] is None
    got = {p["prompt_id"]: p for p in st.run_prompts(run["id"])}
    assert got.keys() == hf.keys()
    for pid in hf:
        assert got[pid]["accepted_at"] == hf[pid]["accepted_at"] and got[pid]["drafts"] == hf[pid]["drafts"]
    # a config.json above the step folder (the training's output folder) is found without --draft-config
    shutil.copy(cfg_file, out / "config.json")
    assert pipeline.replay(
        st, ops.Replay(drafter=str(step / "training_state.pt"), extraction=prepared.extraction, tree_budget=0)
    )["summary"]["tau_macro"] == pytest.approx(run["summary"]["tau_macro"])


class Payload:
    """An object whose unpickling would create a file (a stand-in for arbitrary code)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_unsafe_pickle_refused_and_its_payload_never_runs(prepared, workspace_copy, tmp_path):
    marker = tmp_path / "PWNED"
    step = tmp_path / "out" / "r1-step5"
    step.mkdir(parents=True)
    torch.save(
        {"draft_state_dict": tiny.weights(tiny.TinyDrafter(seed=1)), "args": Payload(marker)},
        step / "training_state.pt",
    )
    (tmp_path / "out" / "config.json").write_text((prepared.drafters[0] / "config.json").read_text())
    with pytest.raises(dr.CheckpointError, match="specforge export --to hf"):
        dr.load(step)
    assert not marker.exists()
    # the same through a job process, as the browser starts it: failed, named, payload not run, no run stored
    st = Store(workspace_copy)
    before = len(st.runs())
    try:
        job = lifecycle.start(st, "replay", {"drafter": str(step), "extraction": prepared.extraction})
        until(lambda: st.job(job)["status"] not in lifecycle.ACTIVE, 120, what="the replay job to end")
        row = st.job(job)
        assert row["status"] == "failed" and "specforge export --to hf" in row["error"]
    finally:
        stop_jobs(st)
    assert not marker.exists() and len(st.runs()) == before


def test_sweep_orders_steps_counts_links_once_and_skips_non_drafters(prepared, workspace_copy, tmp_path, capsys):
    out = tmp_path / "train"
    for step, seed in ((1000, 3), (50, 1), (200, 2)):
        tiny.write_runtime(out, tiny.weights(tiny.TinyDrafter(seed=seed)), step, "r1")
    os.symlink("r1-step1000", out / "r1-latest")
    os.symlink("r1-step200", out / "r1-best")
    shutil.copy(prepared.drafters[0] / "config.json", out / "config.json")
    tiny.write_target(out / "target", tiny.TinyTarget())  # not a drafter: skipped with a note
    cks, notes = pipeline.checkpoints_in(out)
    assert [p.name for p in cks] == ["r1-step50", "r1-step200", "r1-step1000"]
    assert len(notes) == 1 and notes[0].startswith("target: skipped") and "not a drafter checkpoint" in notes[0]
    assert (
        cli.main(
            [
                "sweep",
                "--checkpoints",
                str(out),
                "--workspace",
                str(workspace_copy),
                "--extraction",
                prepared.extraction,
            ]
        )
        == 0
    )
    ids = capsys.readouterr().out.split()
    st = Store(workspace_copy)
    by = {r["id"]: r for r in st.runs()}
    assert [by[i]["step"] for i in ids] == [50, 200, 1000]
    from dflash_dash.analysis.compare import sweep_points

    assert [p["step"] for p in sweep_points(st.runs(), str(out), prepared.extraction)] == [50, 200, 1000]


@pytest.mark.parametrize(
    "name,step",
    [
        ("epoch_2_step_300", 300),
        ("r1-step40", 40),
        ("checkpoint-7", 7),
        ("step_12", 12),
        ("step9", 9),
        ("r1-latest", None),
        ("final", None),
    ],
)
def test_step_of_every_layout(name, step):
    assert dr.step_of(name) == step


def test_global_options_after_the_command(tmp_path):
    a = cli.parser().parse_args(["runs", "--workspace", str(tmp_path / "w")])
    assert a.workspace == str(tmp_path / "w")
    b = cli.parser().parse_args(["--workspace", str(tmp_path / "v"), "runs"])
    assert b.workspace == str(tmp_path / "v")


# ---------------------------------------------------------------------------
# the train/serve sliding check, and no false alarms for targets without linear attention


def test_sliding_check_replays_both_ways_and_diagnostics_shows_the_gap(prepared, workspace_copy, tmp_path, monkeypatch):
    d = tiny.TinyDrafter(seed=1, layer_types=["sliding_attention", "full_attention"], sliding_window=3)
    ck = export_hf(tmp_path / "slide", d, tiny.drafter_config(d))
    st = Store(workspace_copy)
    out = pipeline.sliding_check(st, ops.SlidingCheck(drafter=str(ck), extraction=prepared.extraction, tree_budget=0))
    runs = {r["id"]: r for r in st.runs()}
    assert runs[out["causal"]]["sliding_block"] == "causal"
    assert runs[out["bidirectional"]]["sliding_block"] == "bidirectional"
    a, b = (st.run_prompts(out[k]) for k in ("causal", "bidirectional"))
    assert [p["drafts"] for p in a] != [p["drafts"] for p in b]  # the two semantics really differ here
    assert out["delta"] == pytest.approx(out["tau_macro"]["causal"] - out["tau_macro"]["bidirectional"])
    again = pipeline.sliding_check(
        st, ops.SlidingCheck(drafter=str(ck), extraction=prepared.extraction, tree_budget=0)
    )  # reuses both runs
    assert again["causal"] == out["causal"] and len(st.runs()) == len(runs)
    with pytest.raises(pipeline.InputError, match="no sliding_attention layers"):
        pipeline.sliding_check(st, ops.SlidingCheck(drafter=str(prepared.drafters[0]), extraction=prepared.extraction))
    # the Diagnostics page shows both runs and the difference, with the formula
    from apptest import app, clean

    at = app(workspace_copy, monkeypatch, "diagnostics", section="sliding")
    clean(at)
    assert at.text_input(key="slide_ck").value == str(ck.resolve())
    table = next(df.value for df in at.dataframe if "sliding layers" in df.value.columns)
    assert list(table["sliding layers"]) == ["causal inside the block", "bidirectional inside the block"]
    msg = [m.value for m in (*at.warning, *at.success) if "causal − bidirectional" in m.value]
    assert msg and f"{out['delta']:+.2f}" in msg[0] and "committed / rounds" in msg[0]


def test_target_without_linear_attention_records_no_backend(tmp_path):
    t = tiny.write_target(tmp_path / "qwen3", tiny.TinyTarget(model_type="qwen3"))
    st = Store(tmp_path / "ws")
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text(json.dumps({"id": "a", "prompt_ids": [5, 6, 7], "output_ids": [8, 9, 10, 11]}) + "\n")
    pipeline.import_completions(st, jsonl, "s")
    ex = pipeline.extract(st, ops.Extract(target=str(t), completions="s", layers=[1, 4]))
    assert st.extraction(ex)["backend"] == tg.NO_LINEAR
    from dflash_dash.analysis.checks import backend_matters, consistency

    info = tg.describe(t)
    rows = {
        r["check"]: r
        for r in consistency(dr.parse_config(tiny.drafter_config(tiny.TinyDrafter())), st.extraction(ex), info)
    }
    assert rows["extraction backend"]["ok"] == "✓" and not backend_matters(str(t))
