"""The whole proposed block: each chain round keeps its block's top-K candidates (replay, both anchor
modes), the store and the export carry them, analysis and render shape one round slot by slot (escaped,
whitespace visible), and the Acceptance page shows the round a user picks with the target's tokens beside the
drafter's candidates (AppTest; the browser half: tests/browser/test_round_pick.py)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from apptest import app, by_label, clean, htmls
from chainwalk import walk_by_hand
from synthetic import planted

from dflash_dash import drafters as dr, ops, pipeline, replay as rp, target as tg
from dflash_dash.analysis.rounds import round_detail, round_options
from dflash_dash.analysis.trace import trace
from dflash_dash.render.tokens import round_html, token_html, visible
from dflash_dash.store import Store
from dflash_dash.vocab import Vocab
from tools import tiny

K = rp.ROUND_TOPK


# ---------------------------------------------------------------------------
# replay: the block at each round's anchor, both anchor modes


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    base = tmp_path_factory.mktemp("rounds")
    g = torch.Generator().manual_seed(5)
    head = tg.Head(torch.randn(512, 64, generator=g), torch.randn(512, 64, generator=g))
    m = dr.load(tiny.write_drafter(base / "d", tiny.TinyDrafter(seed=3, block_size=5)))
    seqs = []
    for i, (T, P) in enumerate([(44, 5), (13, 11), (2, 1), (30, 7)]):
        feats = torch.randn(T, 128, generator=g)
        seqs.append(rp.Sequence(f"s{i}", planted(m, head, feats, P, T, seed=i), P, feats))
    # the reference: one block per forward call (context recomputed each time), torch top-k
    ref = {s.id: rp.draft_loop(m, head, s.features, s.tokens, s.prompt_len, topk=K) for s in seqs}
    return m, head, seqs, ref


@pytest.mark.parametrize("budget", [0, 3])
def test_round_top_is_the_block_at_each_round_anchor_in_both_modes(case, budget):
    m, head, seqs, ref = case
    every, _ = rp.every_anchor(m, head, seqs, budget=budget, chunk=7)
    chain, _ = rp.chain_only(m, head, seqs, budget=budget, batch=3)
    rounds = 0
    for e, c, s in zip(every, chain, seqs):
        P, d = s.prompt_len, ref[s.id]
        assert len(e.round_top_ids) == len(e.round_anchors) == len(e.round_top_p)
        for i, p in enumerate(e.round_anchors):
            ids, ps = np.asarray(e.round_top_ids[i]), np.asarray(e.round_top_p[i])
            assert ids.shape == ps.shape == (4, K)  # [B-1, K], K = 4 even without a tree budget
            assert ids.tolist() == d.top_ids[p - P].tolist()
            assert ps == pytest.approx(np.exp(d.top_logp[p - P].double().numpy()), abs=1e-4)
            assert ids[:, 0].tolist() == e.drafts[p - P].tolist() == d.tokens[p - P].tolist()
            assert (np.diff(ps, axis=1) <= 0).all()  # best first
            assert ps[:, 0] == pytest.approx(np.exp(np.asarray(e.draft_logp[p - P], dtype=np.float64)), abs=1e-5)
            rounds += 1
        assert np.array_equal(c.round_top_ids, e.round_top_ids)  # chain-only replay: the same candidates
        assert np.asarray(c.round_top_p).ravel() == pytest.approx(np.asarray(e.round_top_p).ravel(), abs=1e-4)
        if budget:  # DDTree's acceptance at each chain round's anchor, also where its own walk went elsewhere
            assert [c.tree_at[p - P] for p in c.round_anchors] == [e.tree_at[p - P] for p in e.round_anchors]
    assert rounds > 10 and any(len(r.round_anchors) < len(r.accepted_at) - 1 for r in every)  # rounds skip anchors


# ---------------------------------------------------------------------------
# store and export


def anchors_of(rounds: list[int], P: int) -> list[int]:
    return [P + sum(rounds[:i]) for i in range(len(rounds))]


def test_store_and_export_carry_the_blocks(prepared, workspace_copy):
    st = Store(prepared.workspace)
    rid = prepared.runs[0]
    run = st.run_row(rid)
    B = run["summary"]["block_size"]
    assert run["summary"]["round_topk"] == K
    rows = {r["prompt_id"]: r for r in st.run_prompts(rid)}
    exp = {p["id"]: p for p in pipeline.export(st, rid)["prompts"]}
    for pid, r in rows.items():
        P, R = r["prompt_len"], len(r["rounds"])
        drafts = np.asarray(r["drafts"]).reshape(-1, B - 1)
        logp = np.asarray(r["draft_logp"], dtype=np.float64).reshape(-1, B - 1)
        ids = np.asarray(r["round_top_ids"]).reshape(R, B - 1, K)
        ps = np.asarray(r["round_top_p"], dtype=np.float64).reshape(R, B - 1, K)
        at = np.asarray(anchors_of(r["rounds"], P)) - P
        assert (ids[:, :, 0] == drafts[at]).all()
        assert ps[:, :, 0] == pytest.approx(np.exp(logp[at]), abs=1e-5)
        e = exp[pid]
        assert e["drafts"] == drafts.tolist() and e["round_anchors"] == (at + P).tolist()
        assert np.asarray(e["draft_p"], dtype=np.float64).ravel() == pytest.approx(np.exp(logp).ravel(), abs=1e-6)
        assert e["round_top_ids"] == ids.tolist()
        assert np.asarray(e["round_top_p"]).ravel() == pytest.approx(ps.ravel(), abs=1e-6)
    # a chain-only replay of the same checkpoint stores the same blocks; its export stays strict JSON (no NaN)
    ws = Store(workspace_copy)
    new = pipeline.replay(
        ws, ops.Replay(drafter=str(prepared.drafters[0]), extraction=prepared.extraction, anchors="chain")
    )["id"]
    for r in ws.run_prompts(new):
        assert r["round_top_ids"] == rows[r["prompt_id"]]["round_top_ids"]
        assert r["round_top_p"] == pytest.approx(rows[r["prompt_id"]]["round_top_p"], abs=1e-4)
    out = pipeline.export(ws, new)
    json.dumps(out, allow_nan=False)
    assert any(None in row for p in out["prompts"] for row in p["draft_p"])  # anchors the walks never visited


# ---------------------------------------------------------------------------
# analysis.rounds and render.tokens: one round slot by slot, on a hand-built row


class Words(Vocab):
    """Token strings chosen by hand: whitespace and markup among them."""

    TEXT = {
        1: "a",
        2: "b",
        10: "<script>x()</script>",
        11: "\t",
        12: " x",
        13: "\n",
        14: "if",
        15: "(",
        16: ")",
        30: "<img src=x onerror=alert(1)>",
        98: "q",
        99: "z",
        7: "m",
        8: "n",
    }

    def _one(self, i):
        return self.TEXT.get(i, f"t{i}")


def hand_row(top: bool = True) -> tuple[dict, dict]:
    """tokens 1 2 | 10 11 12 13 14 15 16 (P = 2, T = 9), B = 5. Round 1 at anchor 2 drafts 11 12 99 98: 2 accepted,
    the chain stops at slot 3 (target 13), committed 3. Round 2 at anchor 5 drafts 14 15 16 0: the 3 slots inside
    the completion accepted, slot 4 past its end, committed 3 -> anchor 8 = T-1: done. DDTree-4 takes 3 at anchor 2
    (the target's 11 12 13) and was not computed at anchor 5."""
    comp = {"prompt_ids": [1, 2], "output_ids": [10, 11, 12, 13, 14, 15, 16]}
    drafts = [[11, 12, 99, 98], [0] * 4, [0] * 4, [14, 15, 16, 0], [0] * 4, [0] * 4, [0] * 4]
    p1 = [[0.6, 0.2], [0.5, 0.3], [0.4, 0.35], [0.3, 0.2]]
    p2 = [[0.9, 0.05], [0.8, 0.1], [0.7, 0.2], [0.6, 0.3]]
    top1 = {0: [x[0] for x in p1], 3: [x[0] for x in p2]}
    row = {
        "prompt_id": "h",
        "prompt_len": 2,
        "accepted_at": [2, 0, 0, 3, 0, 0, 0],
        "rounds": [3, 3],
        "drafts": [t for d in drafts for t in d],
        "tree_at": [3, -1, -1, -1, -1, -1, -1],
        "draft_logp": [math.log(top1[a][s]) if a in top1 else -1.0 for a in range(7) for s in range(4)],
    }
    if top:
        ids = [[[11, 7], [12, 8], [30, 13], [98, 14]], [[14, 1], [15, 1], [16, 1], [0, 1]]]
        row["round_top_ids"] = [t for r in ids for s in r for t in s]
        row["round_top_p"] = [x for r in (p1, p2) for s in r for x in s]
    return row, comp


def test_round_detail_slot_by_slot():
    row, comp = hand_row()
    assert [o["label"] for o in round_options(row, comp, 5)] == [
        "round 1 · anchor 2 · accepted 2/4",
        "round 2 · anchor 5 · accepted 3/3",
    ]
    d = round_detail(row, comp, 5, 1, Words(), k=2, tree_budget=4)
    assert (d["anchor"], d["accepted"], d["inside"], d["committed"], d["stop"], d["tree"], d["topk"]) == (
        2,
        2,
        4,
        3,
        3,
        3,
        2,
    )
    s = d["slots"]
    assert [x["target_id"] for x in s] == [11, 12, 13, 14]
    assert [x["status"] for x in s] == ["acc", "acc", "rej", "after"]
    assert [x["target_rank"] for x in s] == [1, 1, 2, 2]
    assert [x["ddtree"] for x in s] == [True, True, True, False]
    assert [[(c["id"], c["p"]) for c in x["candidates"]] for x in s] == [
        [(11, 0.6), (7, 0.2)],
        [(12, 0.5), (8, 0.3)],
        [(30, 0.4), (13, 0.35)],
        [(98, 0.3), (14, 0.2)],
    ]
    assert s[2]["candidates"][1]["text"] == "\n" and s[2]["target"] == "\n"
    d2 = round_detail(row, comp, 5, 2, Words(), tree_budget=4)  # K read from the row's lengths
    assert (d2["accepted"], d2["inside"], d2["stop"], d2["tree"], d2["topk"]) == (3, 3, None, None, 2)
    assert [x["status"] for x in d2["slots"]] == ["acc", "acc", "acc", "past"] and d2["slots"][3]["target"] is None
    with pytest.raises(ValueError, match="rounds 1..2"):
        round_detail(row, comp, 5, 3, Words())


@pytest.mark.parametrize("top", [True, False])
def test_round_detail_reads_the_round_as_blocks_nests_it(prepared, top):
    """round_detail slices one round out of the flat arrays (a long trace has tens of thousands of rounds, which
    `blocks` would nest for every view): the same candidates as `blocks`, at every round of a stored run, with
    the top-K and with the argmax draft alone (an older run)."""
    from dflash_dash.analysis import rounds

    st = Store(prepared.workspace)
    run = st.run_row(prepared.runs[0])
    B, k = run["summary"]["block_size"], run["summary"].get("round_topk")
    for p in st.run_prompts(run["id"]):
        row = dict(p) | ({} if top else {"round_top_ids": [], "round_top_p": []})
        comp = st.completion(prepared.set_name, p["prompt_id"])
        b = rounds.blocks(row, B, k)
        opts = round_options(row, comp, B)
        assert opts and bool(b["round_topk"]) == top
        for o in opts:
            at = o["anchor"] - row["prompt_len"]
            want = (
                (b["round_top_ids"][o["round"] - 1], b["round_top_p"][o["round"] - 1])
                if b["round_topk"]
                else ([[d] for d in b["drafts"][at]], [[x] for x in b["draft_p"][at]])
            )
            assert rounds._candidates(row, B - 1, k if top else None, o["round"], at) == want


def test_round_html_escapes_and_shows_whitespace():
    row, comp = hand_row()
    out = round_html(round_detail(row, comp, 5, 1, Words(), k=2, tree_budget=4))
    assert "<script" not in out and "<img" not in out and "&lt;img·src=x·onerror=alert(1)&gt;" in out
    assert "the chain stops at slot 3" in out and "DDTree-4 would accept 3 here" in out
    cells = re.findall(r"<tr class=\"dfr-(\w+)\">(.*?)</tr>", out)
    assert [c[0] for c in cells] == ["acc", "acc", "rej", "after"]
    assert "→" in cells[0][1] and "·x" in cells[1][1] and "⏎" in cells[2][1]  # tab, space, newline
    assert '<td class="dfr-hit" title="token 13">⏎<span class="dfr-p">0.350</span></td>' in cells[2][1]
    assert "not recorded" not in out


def test_round_detail_of_a_sweep_run_shows_only_the_slots_it_computed():
    """A chain-only replay without DDTree runs the LM head only for the slots the walk reads: slot 4 of round 1
    (after the stop) holds -1 / NaN and is shown empty, with a note saying why."""
    row, comp = hand_row()
    row["round_top_ids"][6:8] = [-1, -1]
    row["round_top_p"][6:8] = [float("nan")] * 2
    d = round_detail(row, comp, 5, 1, Words(), k=2, tree_budget=0)
    assert [len(x["candidates"]) for x in d["slots"]] == [2, 2, 2, 0] and d["slots"][3]["status"] == "after"
    out = round_html(d)
    assert "Slots after the stop were not computed" in out and "nan" not in out
    assert "not computed" not in round_html(round_detail(*hand_row(), 5, 1, Words(), k=2))


def test_round_detail_of_an_older_run_shows_the_argmax_block():
    row, comp = hand_row(top=False)
    d = round_detail(row, comp, 5, 1, Words(), tree_budget=4)
    assert d["topk"] == 0
    assert [[(c["id"], round(c["p"], 6)) for c in x["candidates"]] for x in d["slots"]] == [
        [(11, 0.6)],
        [(12, 0.5)],
        [(99, 0.4)],
        [(98, 0.3)],
    ]
    assert "Top-k candidates not recorded" in round_html(d) and "replay the checkpoint again" in round_html(d)


def test_token_view_rejected_drafts_readable_with_visible_whitespace():
    row, comp = hand_row()
    tr = trace(row, comp, 5)
    assert tr.rejected[3] == 99  # position 5: the target's 13 (a newline) after the rejected draft 99
    out = token_html(tr, Words(), 5)
    rule = re.search(r"\.dfv \.dfv-rej\{([^}]*)\}", out).group(1)
    assert "font-size" not in rule and "vertical-align" not in rule  # normal size, on the line
    assert '<span class="dfv-rej" title="rejected draft 99">z</span>' in out
    tr.rejected[3] = 13  # a rejected newline: a glyph, not a struck-through blank
    words = Words()
    assert '<span class="dfv-rej" title="rejected draft 13">⏎</span>' in token_html(tr, words, 5)
    assert visible(" \t\n<b>") == "·→⏎&lt;b&gt;"
    assert "round 2 starts: anchor 5, accepted 3/3" in out


# ---------------------------------------------------------------------------
# the page


def test_picking_a_round_shows_its_block(prepared, monkeypatch):
    rid, pid = prepared.runs[0], "drafted"
    st = Store(prepared.workspace)
    row = {r["prompt_id"]: r for r in st.run_prompts(rid)}[pid]
    comp = {c["prompt_id"]: c for c in st.completions(prepared.set_name)}[pid]
    tokens = comp["prompt_ids"] + comp["output_ids"]
    rounds = walk_by_hand(row, comp)
    assert len(rounds) >= 3
    at = app(prepared.workspace, monkeypatch, "acceptance", run=rid, prompt=pid)
    clean(at)
    sb = by_label(at.selectbox, "round of the chain walk")
    assert len(sb.options) == len(rounds)
    sb.set_value("3").run()
    clean(at)
    assert at.query_params["round"] == ["3"] or at.query_params["round"] == "3"
    p, a = rounds[2]
    B = st.run_row(rid)["summary"]["block_size"]
    detail = next(h for h in htmls(at) if 'class="dfr"' in h)
    assert f"round 3 · anchor {p} (" in detail and f"accepted {a} of " in detail
    body = detail[detail.index("<table") :]
    rows = re.findall(r"<tr class=\"dfr-(\w+)\">(.*?)</tr>", body)
    assert len(rows) == B - 1
    n = min(B - 1, len(tokens) - 1 - p)
    drafts = row["drafts"][(p - row["prompt_len"]) * (B - 1) : (p - row["prompt_len"] + 1) * (B - 1)]
    for i, (status, cells) in enumerate(rows, 1):
        if i <= n:  # the target's token id beside the slot, and the slot's argmax draft as candidate 1
            assert f'<span class="dfr-p">{tokens[p + i]}</span>' in cells
        want = "acc" if i <= a else "rej" if i == a + 1 and i <= n else "after" if i <= n else "past"
        assert status == want
        assert re.findall(r'title="token (\d+)"', cells)[0] == str(drafts[i - 1])
        assert len(re.findall(r'title="token \d+"', cells)) == K
    assert "Top-k candidates not recorded" not in detail


def test_an_older_run_shows_the_argmax_block_with_a_note(prepared, workspace_copy, monkeypatch):
    st = Store(workspace_copy)
    for rid in prepared.runs:  # runs replayed before the top-k candidates were kept
        st.put_prompts(rid, [dict(r, round_top_ids=None, round_top_p=None) for r in st.run_prompts(rid)])
    at = app(workspace_copy, monkeypatch, "acceptance", run=prepared.runs[0], prompt="drafted", round="2")
    clean(at)
    detail = next(h for h in htmls(at) if 'class="dfr"' in h)
    assert "Top-k candidates not recorded" in detail and "round 2 · anchor" in detail
    assert all(
        len(re.findall(r'title="token \d+"', c)) == 1 for c in re.findall(r"<tr class=\"dfr-\w+\">(.*?)</tr>", detail)
    )
