"""The demo's relations beyond its DFlash runs, on the demo workspace built once per session: one drafter
of each other family with its view, an engine that does not conform (flagged, its evidence kept, its fault named
by the ranking), the n-gram baseline and the HumanEval completions; the sweep's points, the final tau's range and what
each bug costs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from speculative import conformance_json

from dflash_dash import demo, pipeline
from dflash_dash.demo import extras
from dflash_dash.server import faults
from dflash_dash.store import Store

pytestmark = pytest.mark.skipif(
    not (demo.ASSETS / "MANIFEST.json").is_file(), reason="demo assets are not in this checkout"
)

CKS = demo.checkpoints(demo.ASSETS / demo.CHECKPOINTS) if (demo.ASSETS / "MANIFEST.json").is_file() else []


@pytest.fixture(scope="module")
def ws(demo_workspace) -> Path:
    return demo_workspace  # built once per session (tests/conftest.py)


def run_of(store: Store, ck: demo.Checkpoint) -> dict:
    """Checkpoint `ck`'s run on the torch extraction (runs are named as MANIFEST.json names the checkpoints)."""
    exs = {e["id"]: e["backend"] for e in store.extractions()}
    return next(r for r in store.runs() if r["name"] == ck.name and exs[r["extraction_id"]] == "torch")


def test_each_family_is_replayed_with_its_view(ws):
    """DSpark (its confidence head), Domino and DFlash2 each have a run whose summary names the family; every run
    keeps its heads analysis (top-K headroom), and DSpark's holds the confidence head's reliability."""
    store = Store(ws)
    fams = {c.name: c for c in CKS if c.role == "family"}
    got = {}
    for c in fams.values():
        r = run_of(store, c)
        got[r["summary"]["family"]] = r
        heads = pipeline.analysis(store, r["id"], "heads")
        assert heads["headroom"] is not None, c.name
        assert (heads["confidence"] is not None) == (r["summary"]["family"] == "DSpark"), c.name
    assert set(got) == {"DSpark", "Domino", "DFlash2"}
    conf = pipeline.analysis(store, got["DSpark"]["id"], "heads")["confidence"]
    assert conf["ece"] is not None and 0 <= conf["ece"] <= 1, conf


def test_a_non_conforming_engine_is_flagged_with_its_evidence(ws):
    """The final run against the faulty server's counters: a verdict other than "conforms", prompts flagged below,
    the served drafter recorded (the replayed one: the gap is the engine's), and the kept fault ranking names the
    planted fault. Against the conforming server: no prompt flagged."""
    store = Store(ws)
    fin = run_of(store, demo.final(CKS))
    assert set(store.engines(demo.SET_NAME)) == {"sglang", extras.FAULT_ENGINE}
    bad = conformance_json(ws, "--run", fin["id"], "--engine", extras.FAULT_ENGINE)
    assert bad["verdict"] == "engine-below", bad["verdict"]
    served = demo.final(demo.checkpoints(ws / "demo" / demo.CHECKPOINTS)).path
    assert bad["why"] and bad["served"]["draft_model_path"] == str(served), bad["served"]
    assert bad["identity"]["same"] is True, bad["identity"]
    flagged = [p for p in bad["prompts"] if p["flagged"]]
    assert len(flagged) == len(bad["prompts"]) == extras.FAULT_N, bad["prompts"]
    assert bad["explained_by"] == faults.FAULT_OF[extras.FAULT], bad.get("faults")
    good = conformance_json(ws, "--run", fin["id"], "--engine", "sglang")
    assert good["verdict"] == "conforms" and not [p for p in good["prompts"] if p["flagged"]]


def test_a_cpu_cost_table_and_the_advisor_answer(ws):
    """The demo keeps a cost table measured on this CPU, and the advisor prices the final run on it: a best draft
    count among the rows, labelled as CPU costs."""
    from dflash_dash.pipeline import speed

    store = Store(ws)
    (tab,) = speed.tables(store)
    assert tab["device"] == "cpu"
    got = speed.advise(store, run_of(store, demo.final(CKS))["id"])
    best = [r for r in got["rows"] if r["best"]]
    assert got["device"] == "cpu" and len(best) == 1 and best[0]["speedup"] > 0, got["rows"]
    assert {r["k"] for r in got["rows"] if r["kind"] == "drafts"} >= {1, 15}


def test_baseline_and_humaneval_are_in_the_workspace(ws):
    store = Store(ws)
    base = [r for r in store.runs() if r["checkpoint"] == f"baseline:{extras.BASELINE}"]
    assert len(base) == 1 and base[0]["summary"]["tau_macro"] >= 1
    sets = {s["name"]: s["prompts"] for s in store.sets()}
    assert sets[extras.HUMANEVAL_SET] == extras.HUMANEVAL_N
    assert all(c["prompt_id"].startswith("HumanEval/") for c in store.completions(extras.HUMANEVAL_SET))


def distinct(ws: Path, name: str) -> bool:
    outs = [tuple(c.output_ids) for c in Store(ws).completions(name)]
    return len(outs) >= 8 and len(set(outs)) == len(outs)


def test_coding_completions_are_distinct_across_prompts(ws):
    """No two coding-10 prompts share a completion."""
    assert distinct(ws, demo.SET_NAME)


def test_humaneval_completions_are_distinct_across_prompts(ws):
    assert distinct(ws, extras.HUMANEVAL_SET)


def test_the_sweep_has_eight_points(ws):
    from dflash_dash.analysis.compare import sweep_extraction, sweep_points

    store = Store(ws)
    rs, folder = store.runs(), demo.series_folder(ws)
    ex = sweep_extraction(rs, folder, [e["id"] for e in store.extractions()])
    assert len(sweep_points(rs, folder, ex)) >= 8


def test_final_tau_in_range(ws):
    """Final tau (macro and pooled) in [3, 8], as real drafters on code."""
    fin = run_of(Store(ws), demo.final(CKS))["summary"]
    assert 3 <= fin["tau_macro"] <= 8 and 3 <= fin["tau_pooled"] <= 8, fin["tau_macro"]


@pytest.mark.parametrize("bug", ["noisy_labels", "anchor_visible", "soft_kl"])
def test_each_bug_costs(ws, bug):
    """Every bug checkpoint at most 0.6 x the final's tau (macro)."""
    store = Store(ws)
    fin = run_of(store, demo.final(CKS))["summary"]
    (c,) = [c for c in CKS if c.bug == bug]
    assert run_of(store, c)["summary"]["tau_macro"] <= 0.6 * fin["tau_macro"], c.name


def test_a_sampled_set_and_the_final_replay_at_its_temperature(ws):
    """coding-10 sampled from the demo server at extras.SAMPLED_T with a fixed seed: 10 completions, most of them
    unlike the greedy ones, the set saying how it was sampled; the final checkpoint's replay on its extraction
    records that temperature and an expected tau between 1 and the block size."""
    from dflash_dash.pipeline import sampled

    store = Store(ws)
    greedy = {c["prompt_id"]: c["output_ids"] for c in store.completions(demo.SET_NAME)}
    hot = {c["prompt_id"]: c["output_ids"] for c in store.completions(extras.SAMPLED_SET)}
    assert len(hot) == 10 and set(hot) == set(greedy)
    differ = [pid for pid in hot if hot[pid] != greedy[pid]]
    assert len(differ) > len(hot) / 2, differ
    assert (
        sampled.set_sampling(store, extras.SAMPLED_SET)
        == f"sampled at T={extras.SAMPLED_T:g}, seed {extras.SAMPLED_SEED}"
    )
    (run,) = [r for r in store.runs() if r["name"] == demo.final(CKS).name + extras.SAMPLED_SUFFIX]
    assert store.extraction(run["extraction_id"])["set_name"] == extras.SAMPLED_SET
    s = run["summary"]
    assert s["temperature"] == extras.SAMPLED_T and s["block_size"] == 16
    assert 1 <= s["tau_expected"] <= s["block_size"], s["tau_expected"]
    assert extras.done(store, demo.SET_NAME)


def test_chat_template_completions_are_on_task_and_distinct():
    """With the chat template on (the Fetch form's default: the prompt as the user's message, the template's
    generation prompt after it), the demo target answers each coding-10 prompt with its code (the prompt's last line,
    the def or class it asks for, appears in the answer), and no two answers are the same."""
    import torch

    from dflash_dash import prompts, server

    eng = server.Engine(model_dir=(demo.ASSETS / demo.TARGET).resolve(), device="cpu")
    eng.load()
    eng.load_tokenizer()
    tok, outs = eng.tokenizer, {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for p in prompts.load(demo.PROMPT_SET):
            text = tok.apply_chat_template(
                [{"role": "user", "content": p["prompt"]}], add_generation_prompt=True, tokenize=False
            )
            out, _, _ = eng.greedy(tok(text, add_special_tokens=False)["input_ids"], 128, eng.eos_ids, [])
            outs[p["id"]] = tok.decode(out)
            assert p["prompt"].rstrip().splitlines()[-1].strip() in outs[p["id"]], (p["id"], outs[p["id"]])
    finally:
        torch.set_num_threads(threads)
    assert len(set(outs.values())) == len(outs)
