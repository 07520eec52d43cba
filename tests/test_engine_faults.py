"""Which fault explains the gap: the stand-in plants each known engine fault (`--speculative-bug`, decoded here
in-process with the server's own Engine and Speculator, SGLang's detailed per-step counters as its answers carry
them); the ranking (`pipeline.diagnose.rank_faults`) replays the checkpoint under every fault and must put the
planted one first, and name none for the correct decoder. Also the per-step alignment and ranking rule on
synthetic numbers.

Models: the committed demo assets (tests/speculative.py): the replay runs on an extraction holding every layer of
the 6-layer target (0..5), so the layers off by one below the drafter's [1, 3, 5] are there (above 5 there is none:
the layer fault planted is `layer-off-by-one`). The sliding-window faults need a drafter with
sliding-window layers: the demo drafter's own weights under a config whose second layer is sliding_attention with
a window of SLIDING_WINDOW keys (the trained pair still agrees often, so the faults move accepted steps). bf16
changes no step of the demo drafter on these prompts (its top drafts win by wide margins), so `numerics` is tested
on the demo drafter's weights plus a little seeded Gaussian noise (NOISE): near-ties, where bf16 flips a draft of
an accepted step of json_parser and no other fault's variant reproduces the flip. Found by a search: of 15 (noise,
seed) pairs tried, most flipped no step at all and two flipped one that context-window also reproduced (a tie, so
no fault named); torch's seeded CPU generator and CPU kernels make the chosen one repeatable on one machine. Its
variant need not reproduce every engine step: bf16 rounds by kernel shape, and the engine drafts one block at a
time where the replay batches them, so another near-tie can part (one step in 58 on this machine's CPU)."""

from __future__ import annotations

import json
import shutil

import pytest
from speculative import DEMO, DRAFT, IDS, TARGET, conformance_json, one_torch_thread, plant, private_copy, run_cli

from dflash_dash import demo, ops, pipeline
from dflash_dash.analysis import steps
from dflash_dash.pipeline import diagnose
from dflash_dash.server import faults
from dflash_dash.store import Store

PLANTED = ["layer-off-by-one", "draft-tokens", "context-window", "prefill-count", "numerics"]
USED = IDS[:2]  # two prompts keep the in-process decodes short
SLIDING = ["sliding-ignored", "sliding-bidirectional"]
SLIDING_WINDOW = 4  # keys a sliding layer sees: far fewer than the context, fewer than the block
NOISE = (0.05, 1)  # numerics: (noise std relative to each weight matrix's std, torch seed)
# faults that take nearly every accepted draft of the weaker drafter: each fault that does so reproduces such an
# engine almost as well (one step boundary in sixty apart), no clear margin, so these rank on the healthy drafter
BLIND = {"layer-off-by-one", "context-window"}
HEALTHY = next(c for c in demo.checkpoints(DEMO / demo.CHECKPOINTS) if c.role == "final").path


@pytest.fixture(scope="module")
def ws(spec_workspace, tmp_path_factory):
    """A private copy of the conformance workspace with an extraction of layers 0..5 and a replay on it."""
    path = private_copy(spec_workspace["ws"], tmp_path_factory.mktemp("faults") / "ws")
    st = Store(path)
    with one_torch_thread():
        ex = pipeline.extract(st, ops.Extract(target=str(TARGET), completions="c4", layers=list(range(6))))
        run = pipeline.replay(st, ops.Replay(drafter=str(DRAFT), extraction=ex))["id"]
    return {"ws": path, "store": st, "run": run}


def variant_of(ws, ck):
    """{"run": a replay of checkpoint `ck` on the module's extraction, "plant": plant(bug) -> engine name}."""
    st = ws["store"]
    ex = st.run_row(ws["run"])["extraction_id"]
    with one_torch_thread():
        run = pipeline.replay(st, ops.Replay(drafter=str(ck), extraction=ex))["id"]
    done: dict = {}

    def get(bug: str | None) -> str:
        if bug not in done:
            done[bug] = f"{ck.name}-{bug or 'none'}"
            plant(st, bug, done[bug], USED, drafter=ck)
        return done[bug]

    return {"run": run, "plant": get}


@pytest.fixture(scope="module")
def sliding(ws, tmp_path_factory):
    """The demo drafter with a sliding-window second layer (causal inside the block, the config's default)."""
    ck = tmp_path_factory.mktemp("sliding") / "sliding"
    shutil.copytree(DRAFT, ck)
    cfg = json.loads((ck / "config.json").read_text())
    cfg |= {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": SLIDING_WINDOW}
    (ck / "config.json").write_text(json.dumps(cfg))
    return variant_of(ws, ck)


def noisy(ck, rel: float, seed: int):
    """Write at `ck` the demo drafter with seeded Gaussian noise (std `rel` x each weight matrix's std) added."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(DRAFT, ck)
    w = load_file(str(ck / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    for k, v in w.items():
        if v.dim() == 2:
            x = v.float()
            w[k] = (x + rel * x.std() * torch.randn(x.shape, generator=g)).to(v.dtype)
    save_file(w, str(ck / "model.safetensors"))
    return ck


@pytest.fixture(scope="module")
def healthy(ws):
    """The demo's healthy final drafter, replayed and planted like the weaker one."""
    return variant_of(ws, HEALTHY)


@pytest.fixture(scope="module")
def near_ties(ws, tmp_path_factory):
    """The demo drafter with seeded noise added to every weight matrix (NOISE): less sure of its drafts."""
    return variant_of(ws, noisy(tmp_path_factory.mktemp("near-ties") / "noisy", *NOISE))


@pytest.fixture(scope="module")
def planted(ws):
    """plant(bug) -> the engine name its counters are stored under, each bug decoded once per module."""
    done: dict = {}

    def get(bug: str | None) -> str:
        if bug not in done:
            done[bug] = f"bug-{bug or 'none'}"
            plant(ws["store"], bug, done[bug], USED)
        return done[bug]

    return get


@pytest.mark.parametrize("bug", [None, *PLANTED])
def test_ranking_names_the_planted_fault(ws, planted, healthy, bug):
    run, engine = (healthy["run"], healthy["plant"](bug)) if bug in BLIND else (ws["run"], planted(bug))
    with one_torch_thread():
        got = diagnose.rank_faults(ws["store"], run, engine)
    assert got["mode"] == "steps"
    names = [f["fault"] for f in got["faults"]]
    assert set(names) <= set(steps.FAULTS) and "sliding-ignored" in got["skipped"]
    if bug is None or (bug == "numerics" and got["clean_score"] == 1.0):
        # the correct decoder; or bf16 drafts that flipped no acceptance on these prompts: nothing to explain
        assert got["clean_score"] == 1.0 and got["explained_by"] is None
        assert got["evidence"] == steps.NO_GAP and not got["gap"]
    else:
        assert names[0] == faults.FAULT_OF[bug], got["faults"]
        assert got["explained_by"] == faults.FAULT_OF[bug], (got["clean_score"], got["faults"])
        # bf16 rounds by kernel shape: the engine's one-block drafts and the replay's batched ones can part on
        # another near-tie (one step in 58 on some CPUs); every other fault is reproduced exactly
        exact = 0.95 if bug == "numerics" else 1.0
        assert got["faults"][0]["score"] >= exact and got["faults"][0]["score"] > got["clean_score"], got["faults"]
    assert diagnose.faults(ws["store"], run, engine)["explained_by"] == got["explained_by"]  # kept


@pytest.mark.parametrize("bug", [None, *SLIDING])
def test_ranking_names_the_planted_sliding_fault(ws, sliding, bug):
    engine = sliding["plant"](bug)
    with one_torch_thread():
        got = diagnose.rank_faults(ws["store"], sliding["run"], engine)
    assert got["mode"] == "steps"
    names = [f["fault"] for f in got["faults"]]
    assert set(SLIDING) <= set(names) and not set(SLIDING) & set(got["skipped"])  # both variants replayed
    for f in SLIDING:  # each variant really changes the drafter's forward: some step differs from the replay's
        assert got["steps"][f] != got["steps"][steps.CLEAN], f
    if bug is None:
        assert got["clean_score"] == 1.0 and got["explained_by"] is None
    else:
        assert names[0] == bug and got["explained_by"] == bug, (got["clean_score"], got["faults"])
        assert got["faults"][0]["score"] == 1.0 > got["clean_score"]
        other = next(f for f in got["faults"] if f["fault"] in SLIDING and f["fault"] != bug)
        assert other["score"] < 1.0  # the other sliding fault does not explain it as well


@pytest.mark.parametrize("bug", [None, "numerics"])
def test_ranking_names_numerics_where_bf16_moves_a_step(ws, near_ties, bug):
    engine = near_ties["plant"](bug)
    with one_torch_thread():
        got = diagnose.rank_faults(ws["store"], near_ties["run"], engine)
    assert got["mode"] == "steps"
    if bug is None:  # the near-ties do not split the replay's fp32 from the decoder's
        assert got["clean_score"] == 1.0 and got["explained_by"] is None
        return
    # bf16 flips a step only at knife-edge near-ties, and how it rounds there depends on the CPU's bf16 kernels:
    # where this machine's bf16 moves no step (or the replay's bf16 path and the decoder's round apart), the
    # phenomenon under test does not occur and there is nothing to rank
    score = {f["fault"]: f["score"] for f in got["faults"]}
    if got["steps"]["numerics"] == got["steps"][steps.CLEAN] or got["clean_score"] == 1.0 or score["numerics"] < 1:
        pytest.skip("bf16 on this CPU does not move the near-tie step in both the replay and the decoder")
    assert got["faults"][0]["fault"] == "numerics" and got["explained_by"] == "numerics", got["faults"]
    assert got["faults"][0]["score"] == 1.0 > got["faults"][1]["score"]


def test_cli_diagnose_then_conformance_reports_the_fault_and_first_divergence(ws, healthy):
    rows = ws["store"].engine_stats("c4", healthy["plant"]("context-window"))  # the same counters, under a new name
    engine = "cli-context-window"  # not yet ranked (the ranking test keeps its own)
    ws["store"].add_engine_stats("c4", engine, [r | {"id": r["prompt_id"]} for r in rows], "copy")
    before = conformance_json(ws["ws"], "--run", healthy["run"], "--engine", engine)
    assert "faults" not in before and "explained_by" not in before  # not ranked yet
    rc, out, err = run_cli("--workspace", str(ws["ws"]), "diagnose", "--run", healthy["run"], "--engine", engine)
    assert rc == 0, err
    assert json.loads(out)["explained_by"] == "context-window"
    got = conformance_json(ws["ws"], "--run", healthy["run"], "--engine", engine)
    assert {"run", "engine", "threshold", "prompts"} <= got.keys()  # the fields scripts rely on, kept
    assert got["explained_by"] == "context-window" and got["faults"][0]["fault"] == "context-window"
    assert [f["score"] for f in got["faults"]] == sorted((f["score"] for f in got["faults"]), reverse=True)
    rounds = {p["prompt_id"]: p["rounds"] for p in ws["store"].run_prompts(healthy["run"])}
    stats = {s["prompt_id"]: s for s in ws["store"].engine_stats("c4", engine)}
    firsts = [p["first_divergence"] for p in got["prompts"]]
    assert any(f is not None for f in firsts)  # the planted fault moved some step
    for p in got["prompts"]:
        lens, r = list(stats[p["id"]]["accept_lengths"]), rounds[p["id"]]
        f = p["first_divergence"]
        if f is None:
            assert steps.cut(lens, sum(r)) == r
        else:  # every step before the token index agrees; the one starting there does not
            i = next(k for k in range(len(r) + 1) if 1 + sum(r[:k]) == f)
            assert lens[:i] == r[:i] and (i >= len(lens) or i >= len(r) or lens[i] != r[i])
    assert got["steps"]["diverging"] == sum(f is not None for f in firsts)


def test_planted_faults_are_named_for_the_ranking():
    assert set(faults.FAULT_OF.values()) <= set(steps.FAULTS)
    assert set(PLANTED + SLIDING) <= set(faults.BUGS)


def test_the_ranking_runs_as_a_job_operation(ws, planted):
    op = ops.of("diagnose", {"run": ws["run"], "engine": planted(None)})
    assert isinstance(op, ops.Diagnose) and op.devices() == ["cpu"]
    with one_torch_thread():
        got = pipeline.perform(ws["store"], op)
    assert got == {"run": ws["run"], "engine": "bug-none", "explained_by": None}
    with pytest.raises(ops.InputError, match="run"):
        ops.Diagnose(run="")
