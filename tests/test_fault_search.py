"""Fault search that does not depend on which way the bug goes: faulty engines built by transforming a correct
engine's inputs, never by the product's own fault variants (no `--speculative-bug`, no `server.faults`, no
`diagnose` internals), must each be named by `diagnose` with a margin; the correct engine by no fault.

Every engine here is the stand-in's correct speculative decoder (`server.specdec.Speculator`, decoded in-process by
tests/speculative.py `plant`, SGLang's per-step accept_lengths as --speculative-stats detailed answers them):
  - layer offsets: it serves a copy of the checkpoint whose config.json `dflash_config.target_layer_ids` are the
    replayed copy's shifted by the offset (the engine feeds the drafter target layers l + offset; offset -1 from the
    trained layers is the Hugging Face hidden_states[l] vs hidden_states[l + 1] slip), while the replay runs the
    unshifted copy. Both copies hold the same weights, so only the layers read differ.
  - context window: a Speculator subclass that hands the drafter only the last WINDOW context positions' features
    (re-positioned from 0) before drafting.
  - draft tokens: a Speculator subclass whose drafts past the first VERIFIED are replaced by the drafter's mask
    token (which no completion holds), so a verify step can accept VERIFIED drafts at most.

Models: the committed demo target (6 layers, 0..5) and its healthy drafter (trained on layers [1, 3, 5]: tau 13 on
these 40-token completions; on shifted layers 1.3 to 4.9), replayed on an extraction of every target layer.
Replayed bases [1, 2, 3] (offsets +1, +2) and [2, 3, 4] (-1, -2) leave three offsets in the target's range each,
so the planted offset competes with the other offsets as well as with the other faults.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass

import pytest
from speculative import DEMO, IDS, TARGET, one_torch_thread, plant, private_copy, run_cli

from dflash_dash import demo, ops, pipeline, replay
from dflash_dash.analysis import steps
from dflash_dash.pipeline import diagnose
from dflash_dash.server import specdec
from dflash_dash.store import Extraction, Item, Store

HEALTHY = next(c for c in demo.checkpoints(DEMO / demo.CHECKPOINTS) if c.role == "final").path
TRAINED = [1, 3, 5]  # the healthy drafter's target_layer_ids
USED = IDS[:2]  # two prompts keep the in-process decodes short
WINDOW = 8  # context-window: positions the windowed engine's drafter sees
VERIFIED = 3  # draft-tokens: drafts the capped engine can accept a step
CASES = {  # offset -> (the replayed copy's target layers, the engine's)
    -2: ([2, 3, 4], [0, 1, 2]),
    -1: ([2, 3, 4], [1, 2, 3]),
    1: ([1, 2, 3], [2, 3, 4]),
    2: ([1, 2, 3], [3, 4, 5]),
}


@pytest.fixture(scope="module")
def ws(spec_workspace, tmp_path_factory):
    """A private copy of the conformance workspace with an extraction of every target layer (0..5)."""
    base = tmp_path_factory.mktemp("search")
    st = Store(private_copy(spec_workspace["ws"], base / "ws"))
    with one_torch_thread():
        ex = pipeline.extract(st, ops.Extract(target=str(TARGET), completions="c4", layers=list(range(6))))
    runs: dict = {}

    def copy_reading(layers: list[int]):
        """(a copy of the healthy checkpoint whose config reads target `layers`, its replay on the extraction)."""
        key = tuple(layers)
        if key not in runs:
            ck = base / "ck" / "-".join(map(str, layers))
            shutil.copytree(HEALTHY, ck)
            cfg = json.loads((ck / "config.json").read_text())
            cfg["dflash_config"]["target_layer_ids"] = layers
            (ck / "config.json").write_text(json.dumps(cfg))
            with one_torch_thread():
                runs[key] = (ck, pipeline.replay(st, ops.Replay(drafter=str(ck), extraction=ex))["id"])
        return runs[key]

    return {"store": st, "copy": copy_reading, "ws": base / "ws"}


def rank(ws, run: str, engine: str) -> dict:
    with one_torch_thread():
        return diagnose.rank_faults(ws["store"], run, engine)


def named_with_margin(got: dict, fault: str, param) -> None:
    """`fault` at `param` is named, first, with a clear margin over the runner-up and over its other parameters."""
    top = got["faults"][0]
    assert got["mode"] == "steps" and got["gap"] and got["clean_score"] < 1.0, got
    assert (top["fault"], top["param"]) == (fault, param), got["candidates"][:5]
    assert got["explained_by"] == fault and got["explained_param"] == param, (got["margin"], got["candidates"][:5])
    assert top["score"] == 1.0  # the same drafter on the same features: the engine's steps reproduced exactly
    assert got["margin"] >= steps.MARGIN * (1 - got["clean_score"]) and got["margin"] > 0, got["faults"][:3]
    if got["param_margin"] is not None:
        assert got["param_margin"] > 0, got["candidates"]


@pytest.mark.parametrize("offset", sorted(CASES))
def test_a_layer_offset_in_either_direction_is_named(ws, offset):
    base, served = CASES[offset]
    ck, run = ws["copy"](base)
    eng_ck, _ = ws["copy"](served)
    engine = f"layers{offset:+d}"
    plant(ws["store"], None, engine, USED, drafter=eng_ck)  # the correct decoder, fed other layers by its config
    got = rank(ws, run, engine)
    named_with_margin(got, "layer-shift", offset)
    tried = {c["param"] for c in got["candidates"] if c["fault"] == "layer-shift"}
    assert tried == {o for o in (-2, -1, 1, 2) if all(0 <= l + o <= 5 for l in base)}  # every in-range offset
    assert any(k.startswith("layer-shift ") for k in got["skipped"])  # the offsets out of range, with why
    assert diagnose.faults(ws["store"], run, engine)["explained_param"] == offset  # kept


def test_the_hidden_states_slip_from_the_trained_layers_is_named(ws):
    """The reported case: the engine reads hidden_states[l] (layer l-1's output) for each trained layer id l."""
    ck, run = ws["copy"](TRAINED)
    eng_ck, _ = ws["copy"]([l - 1 for l in TRAINED])
    plant(ws["store"], None, "slip", USED, drafter=eng_ck)
    got = rank(ws, run, "slip")
    named_with_margin(got, "layer-shift", -1)
    assert got["runner_up"] != "clean" and got["param_margin"] is None  # only -1 stays inside layers 0..5


def test_the_correct_engine_is_named_by_no_fault(ws):
    ck, run = ws["copy"](TRAINED)
    plant(ws["store"], None, "correct", USED, drafter=ck)
    got = rank(ws, run, "correct")
    assert got["clean_score"] == 1.0 and not got["gap"]
    assert got["explained_by"] is None and got["explained_param"] is None
    assert got["evidence"] == steps.NO_GAP


@dataclass
class Windowed(specdec.Speculator):
    """The stand-in's decoder whose drafter sees only the last WINDOW context positions (re-positioned from 0)."""

    def draft(self, model, head, seq, total):
        p = len(seq) - 1
        feats = self.features(model, seq[:p], total)
        w = min(p, WINDOW)
        return replay.draft_one(self.drafter, head, feats[p - w : p], w, seq[-1])


@dataclass
class Capped(specdec.Speculator):
    """The stand-in's decoder whose drafts past the first VERIFIED are the mask token: at most VERIFIED accepted."""

    def draft(self, model, head, seq, total):
        d = super().draft(model, head, seq, total)
        return d[:VERIFIED] + [self.drafter.c.mask_token_id] * (len(d) - VERIFIED)


@pytest.mark.parametrize(
    "cls,fault,param", [(Windowed, "context-window", WINDOW), (Capped, "draft-tokens", VERIFIED)], ids=["window", "cap"]
)
def test_a_window_or_draft_count_planted_in_the_engine_is_named(ws, cls, fault, param):
    ck, run = ws["copy"](TRAINED)
    mask = json.loads((ck / "config.json").read_text())["dflash_config"]["mask_token_id"]
    assert all(mask not in c["output_ids"] for c in ws["store"].completions("c4"))  # the cap can never be passed
    plant(ws["store"], None, fault, USED, drafter=ck, speculator=cls)
    named_with_margin(rank(ws, run, fault), fault, param)


def test_cli_reads_shifted_layers_from_another_extraction_and_prints_the_margin(ws):
    """A run on an extraction of its own layers only: diagnose reads the shifted layers from another extraction of
    the same completions and target (here the one of layers 0..5), and prints the margin and every candidate."""
    st = ws["store"]
    with one_torch_thread():
        own = pipeline.extract(st, ops.Extract(target=str(TARGET), completions="c4", layers=TRAINED))
        run = pipeline.replay(st, ops.Replay(drafter=str(HEALTHY), extraction=own))["id"]
    if "slip" not in {e for e in st.engines("c4")}:
        plant(st, None, "slip", USED, drafter=ws["copy"]([l - 1 for l in TRAINED])[0])
    rc, out, err = run_cli("--workspace", str(ws["ws"]), "diagnose", "--run", run, "--engine", "slip")
    assert rc == 0, err
    got = json.loads(out)
    assert got["explained_by"] == "layer-shift" and got["explained_param"] == -1, got["candidates"][:4]
    assert f"{steps.EVIDENCE['layer-shift']}: layer-shift (layers [0, 2, 4] instead of [1, 3, 5]" in err
    assert f"{got['margin']:.3f} above {got['runner_up']}" in err  # the margin, in words on stderr
    assert got["margin"] > 0 and got["runner_up"] in steps.FAULTS
    shift = next(c for c in got["candidates"] if c["fault"] == "layer-shift")
    assert "from extraction" in shift["detail"] and "offset -1" in shift["detail"]


class Bare:
    """A store holding one extraction (the run's) and nothing else: what `diagnose.shifted` looks through."""

    workspace = "/ws"

    def __init__(self, ex: Extraction):
        self.ex = ex

    def extractions(self):
        return [self.ex]

    def items(self, _id):
        return [Item(_id, "a", 1, "")]


def test_an_offset_no_extraction_holds_names_the_extract_command():
    ex = Extraction("e1", "c4", str(TARGET), layer_ids=[1, 3, 5], status="done")
    found, why, cmd = diagnose.shifted(Bare(ex), ex, [1, 3, 5], {"a"})
    assert found == {} and set(why) == {-2, -1, 1, 2}
    assert "past the target's last layer (5)" in why[1] and "below layer 0" in why[-2]
    assert "no extraction of 'c4' holds them" in why[-1]
    assert "extract --target" in cmd and cmd.endswith("--completions c4 --layers 0,2,4")  # the one in range
