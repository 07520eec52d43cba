"""Cost model, predicted speedup and the "what to serve" advisor: `profile` on the tiny target and drafter
on the CPU (dflash_dash/replay/profile.py: a real incremental forward after a cached context, the hybrid model's
recurrent state included), the run's predicted speedup against a hand computation from its stored rounds, the
advisor's k-capped re-walk against a plain loop, and the CLI's JSON."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from dflash_dash import cli, costs
from dflash_dash.analysis import speedup as sp
from dflash_dash.pipeline import speed as prof
from dflash_dash.store import Store

T0, TQ, TC = 0.010, 0.001, 1e-5  # the planted table: t_target(q, c) = T0 + TQ q + TC c (linear: interpolation exact)
D0, DC = 0.002, 1e-6  # t_draft(c) = D0 + DC c
TREE0 = 0.004  # t_tree(8, c) = TREE0 + DC c


def t_target(q, c):
    return T0 + TQ * q + TC * c


def planted(B: int) -> costs.CostTable:
    cs = (0, 4096)
    return costs.CostTable(
        device="cpu",
        backend="torch",
        target=tuple((c, q, t_target(q, c)) for c in cs for q in range(1, 10)),
        draft=tuple((c, D0 + DC * c) for c in cs),
        tree=tuple((8, c, TREE0 + DC * c) for c in cs),
        meta={"dtype": "float32", "block_size": B},
    )


def walk(p, k):
    """The chain walked by hand with accepted capped at k: [(anchor, committed)]."""
    out, at = [], p.prompt_len
    while at < p.T - 1:
        a = min(int(p.accepted_at[at - p.prompt_len]), k)
        c = min(a + 1, p.T - 1 - at)
        out.append((at, c))
        at += c
    return out


def by_hand(rounds, verify):
    plain = sum(c * t_target(1, a) for a, c in rounds)
    spec = sum(D0 + DC * a + t_target(verify, a) for a, _ in rounds)
    return plain / spec


def test_profile_on_cpu_stores_every_size_and_context(prepared, workspace_copy, capsys):
    args = ["--target", str(prepared.target), "--drafter", str(prepared.drafters[0]), "--contexts", "8,32"]
    rc = cli.main(["--workspace", str(workspace_copy), "profile", *args, "--sizes", "1,2,64", "--repeats", "3",
                   "--tree-budget", "8"])  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    kept = prof.tables(Store(workspace_copy))
    assert [t["id"] for t in kept] == [out["id"]]
    tab = prof.table(Store(workspace_copy))
    B = tab.meta["block_size"]
    assert (tab.device, tab.backend) == ("cpu", "torch")  # the torch path forced on the CPU, recorded
    assert tab.label().startswith("CPU costs")
    want = {(c, q) for c in (8, 32) for q in {1, 2, 64} | set(range(1, B + 1)) | {9}}
    assert {(c, q) for c, q, _ in tab.target} == want  # every size asked, every verify size 1..B, the tree's 9
    assert [c for c, _ in tab.draft] == [8, 32] and [(b, c) for b, c, _ in tab.tree] == [(8, 8), (8, 32)]
    assert all(s > 0 for *_, s in tab.target + tab.draft + tab.tree)
    t = {(c, q): s for c, q, s in tab.target}
    assert sum(t[c, 64] for c in (8, 32)) > sum(t[c, 1] for c in (8, 32)) / 10  # 64 tokens: not far faster than 1


def test_predicted_speedup_is_the_formula_over_the_stored_rounds(prepared, workspace_copy):
    store = Store(workspace_copy)
    run = prepared.runs[0]
    B = store.run_row(run)["summary"]["block_size"]
    prof.keep(store, planted(B))
    got = prof.predicted(store, run, prof.table(store))
    rounds = [(a, c) for p in store.prompts(run) for a, c in zip(p.round_anchors, p.rounds)]
    assert got["speedup"] == pytest.approx(by_hand(rounds, B))
    assert got["tau"] == pytest.approx(store.run_row(run).summary["tau_pooled"])
    assert got["verify"] == B and "CPU costs" in got["costs"]
    assert got["measured"] is None  # imported completions: the engine reported no timings
    assert prof.predicted(store, run, prof.table(store)) == got  # kept once per (run, table)


def test_advisor_caps_the_drafts_like_a_plain_loop(prepared, workspace_copy):
    store = Store(workspace_copy)
    run = store.run_row(prepared.runs[1])
    B = run.block_size
    prompts = store.prompts(run.id)
    got = sp.advise([(run, prompts)], planted(B))
    drafts = [r for r in got["rows"] if r["kind"] == "drafts"]
    assert [r["k"] for r in drafts] == list(range(1, B))
    for r in drafts:
        rounds = [x for p in prompts for x in walk(p, r["k"])]
        assert r["tau"] == pytest.approx(sum(c for _, c in rounds) / len(rounds))
        assert r["speedup"] == pytest.approx(by_hand(rounds, r["k"] + 1))
        assert r["verify"] == r["k"] + 1
    assert drafts[-1]["tau"] == pytest.approx(run.summary["tau_pooled"])  # capping at B-1 changes nothing
    assert [r["tau"] for r in drafts] == sorted(r["tau"] for r in drafts)  # more drafts never accept fewer
    tree = [r for r in got["rows"] if r["kind"] == "tree"]
    assert [r["setting"] for r in tree] == ["DDTree-8"]
    assert got["best"] == max((r for r in got["rows"]), key=lambda r: r["speedup"])["setting"]
    assert sum(r["best"] for r in got["rows"]) == 1
    # a table without the tree's budget: the tree is left out, and said so
    bare = costs.CostTable("cpu", "torch", planted(B).target, planted(B).draft)
    assert "DDTree-8" in sp.advise([(run, prompts)], bare)["skipped"][0]


def test_advisor_prices_a_temperature_run(prepared, workspace_copy):
    store = Store(workspace_copy)
    run = store.run_row(prepared.runs[0])
    B = run.block_size
    prompts = store.prompts(run.id)
    hot = replace(run, id="hot", summary=run.summary | {"temperature": 0.7, "verify": "target-sample",
                                                        "tau_expected": 1.5})  # fmt: skip
    got = sp.advise([(run, prompts), (hot, prompts)], planted(B))
    (row,) = [r for r in got["rows"] if r["kind"] == "temperature"]
    rounds = [x for p in prompts for x in walk(p, B - 1)]
    t1 = np.mean([t_target(1, a) for a, _ in rounds])
    cost = np.mean([D0 + DC * a + t_target(B, a) for a, _ in rounds])
    assert row["speedup"] == pytest.approx(1.5 * t1 / cost) and row["temperature"] == 0.7
    assert not row["best"]  # the temperature is the user's, not a setting to pick


def test_advise_cli_prints_json_and_refuses_in_one_line(prepared, workspace_copy, capsys):
    ws = str(workspace_copy)
    assert cli.main(["--workspace", ws, "advise", "--run", prepared.runs[0]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no cost table" in err[0] and "profile" in err[0]
    store = Store(workspace_copy)
    B = store.run_row(prepared.runs[0])["summary"]["block_size"]
    tid = prof.keep(store, planted(B))
    assert cli.main(["--workspace", ws, "advise", "--run", prepared.runs[0], "--costs", tid]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == json.loads(json.dumps(prof.advise(store, prepared.runs[0], tid), default=str))
    assert out["costs_id"] == tid and out["best"] in [r["setting"] for r in out["rows"]]
    assert cli.main(["--workspace", ws, "advise", "--run", prepared.runs[0], "--costs", "nope"]) == 2
    assert "cost table 'nope'" in capsys.readouterr().err


def test_measured_rate_reads_each_engines_timings():
    assert sp.measured_rate({"completion_tokens": 100, "e2e_latency": 2.0})[0] == 50.0  # SGLang meta_info
    assert sp.measured_rate({"timings": {"predicted_per_second": 31.5}})[0] == 31.5  # llama.cpp timings
    assert sp.measured_rate({"completion_tokens": 100})[0] is None
    got = sp.run_rate([({"completion_tokens": 100, "e2e_latency": 2.0}, 100), ({"completion_tokens": 50,
                       "e2e_latency": 0.5}, 50), (None, 7)])  # fmt: skip
    assert got["tokens_per_s"] == pytest.approx(150 / 2.5) and got["completions"] == 2


def test_pages_show_the_prediction_and_the_advisor(prepared, workspace_copy, monkeypatch):
    from tests.apptest import app, clean

    store = Store(workspace_copy)
    run = prepared.runs[0]
    B = store.run_row(run)["summary"]["block_size"]
    tid = prof.keep(store, planted(B))
    at = app(workspace_copy, monkeypatch, "acceptance", run=run)
    clean(at)
    heads = [h.value for h in at.subheader]
    assert "Predicted speedup" in heads and "What to serve" in heads
    got = prof.predicted(store, run, prof.table(store, tid))
    (m,) = [x for x in at.metric if x.label == "Predicted speedup"]
    assert m.value == f"{got['speedup']:.2f}×"
    assert any("CPU costs" in c.value and tid in c.value for c in at.caption)  # the device named, CPU labelled
    (best,) = [r for r in prof.advise(store, run, tid)["rows"] if r["best"]]
    assert best["speedup"] < 1  # the planted costs: every setting slower than plain decoding, said so, not advised
    assert any("No setting beats plain decoding" in w.value and best["setting"] in w.value for w in at.warning)
    assert not at.success
    at = app(workspace_copy, monkeypatch, "compare", runs=",".join(prepared.runs))
    clean(at)
    table = [d.value for d in at.dataframe if "predicted speedup" in d.value.columns]
    assert table and table[0]["predicted speedup"].notna().all()
    at = app(workspace_copy, monkeypatch, "compare", sweep=str(prepared.train))
    clean(at)
    lines = [m.value for m in at.markdown if "open in Acceptance" in m.value]
    assert len(lines) == 2 and all("predicted speedup" in x and "×" in x for x in lines)
