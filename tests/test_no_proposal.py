"""A draft of -1 is no proposal, never a rejected draft: the token view, the rejection counts, the most frequent
rejections and the round view.

A model-free baseline that finds no match proposes nothing (`baselines.replay` stores -1 there); the trace once read
that -1 as a drafted token the target rejected, so an n-gram run showed ⟨-1⟩ struck through after almost every token.
Checked on a transformed real run (a replayed drafter's drafts, some rounds' drafts from their stop on set to -1:
the same accepted counts, fewer rejections) and on a real n-gram replay.
"""

from __future__ import annotations

import re

import numpy as np

from dflash_dash import metrics
from dflash_dash.analysis import patterns
from dflash_dash.analysis.rounds import round_detail
from dflash_dash.analysis.trace import trace
from dflash_dash.baselines.ngram import NgramSettings, NgramVllm
from dflash_dash.baselines.replay import replay_prompt
from dflash_dash.render.tokens import round_html, token_html
from dflash_dash.store import Store
from dflash_dash.vocab import Vocab
from dflash_dash.walks import accepted, chain_walk

NO_DRAFT = "⟨-1⟩"  # what Vocab() without a tokenizer would show for the id -1


def strings(ids: list[int]) -> list[str]:
    return Vocab().strings(ids)


def rejected_spans(html: str) -> int:
    return len(re.findall(r'<span class="dfv-rej"', html))


def blanked(row: dict, comp: dict, B: int) -> tuple[dict, set[int]]:
    """`row` with every other rejecting round's drafts from its stop (slot a+1) on set to -1, as a proposer that
    proposed only the a drafts the target took; and the completion offsets of those rounds' bonus tokens."""
    tr, D, P = trace(row, comp, B), B - 1, row["prompt_len"]
    drafts, gone = list(row["drafts"]), set()
    stops = [i for i, x in enumerate(tr.rejected) if x is not None]
    for i in stops[::2]:
        p, a, _ = tr.rounds[tr.round[i]]
        drafts[(p - P) * D + a : (p - P + 1) * D] = [-1] * (D - a)
        gone.add(i)
    return dict(row, drafts=drafts), gone


def test_a_run_with_no_proposals_marks_no_rejection_there(prepared):
    st = Store(prepared.workspace)
    run = st.run_row(prepared.runs[0])
    B = run["summary"]["block_size"]
    comps = {c["prompt_id"]: c for c in st.completions(prepared.set_name)}
    before = after = gone_total = 0
    new_rows = []
    for row in st.run_prompts(run["id"]):
        comp = comps[row["prompt_id"]]
        new, gone = blanked(row, comp, B)
        tokens = np.asarray(list(comp["prompt_ids"]) + list(comp["output_ids"]))
        P = row["prompt_len"]
        # the transformed input is still a consistent run: its drafts give the stored accepted counts
        d = np.asarray(new["drafts"], dtype=np.int64).reshape(len(tokens) - P, B - 1)
        assert accepted(d, tokens, P).tolist() == list(row["accepted_at"])
        old_tr, tr = trace(row, comp, B), trace(new, comp, B)
        assert (tr.role, tr.rounds, tr.start) == (old_tr.role, old_tr.rounds, old_tr.start)
        assert all(tr.rejected[i] is None for i in gone)
        assert [x for i, x in enumerate(tr.rejected) if i not in gone] == [
            x for i, x in enumerate(old_tr.rejected) if i not in gone
        ]
        assert all(x is None or x >= 0 for x in tr.rejected)
        html = token_html(tr, Vocab(), B)
        assert NO_DRAFT not in html and rejected_spans(html) == sum(x is not None for x in tr.rejected)
        before += sum(x is not None for x in old_tr.rejected)
        after += sum(x is not None for x in tr.rejected)
        gone_total += len(gone)
        new_rows.append(metrics.Prompt.from_row(new))
    assert gone_total > 0 and after == before - gone_total > 0  # some blanked, some left: neither count trivial
    # the most frequent rejections count the rounds that rejected a proposed draft, the same as the traces
    out = patterns.analyse(new_rows, comps, B, strings, run["id"], patterns.Config(pairs=10**6))
    assert out["rejections"] == after == sum(r["count"] for r in out["rejection_pairs"])
    assert all(r["draft_id"] >= 0 and r["draft"] != NO_DRAFT for r in out["rejection_pairs"])


def sequence() -> tuple[list[int], int]:
    """A prompt and a completion repeating stretches of it (n-gram matches) between new tokens (no match)."""
    rng = np.random.default_rng(7)
    prompt = rng.integers(10, 60, 40).tolist()
    completion = []
    for k in range(6):
        completion += rng.integers(100, 200, 12).tolist()  # new tokens: no 5-gram matches
        completion += prompt[5 * k : 5 * k + 15]  # a copied stretch: n-gram drafts, partly accepted
        completion += [300 + k]  # a token the copy did not predict: a real rejection
    return prompt + completion, len(prompt)


def test_an_ngram_replay_shows_no_rejection_where_it_found_no_match():
    tokens, P = sequence()
    W = 15
    got = replay_prompt(NgramVllm(NgramSettings(5, 5, W)), "p", tokens, P)
    drafts = np.asarray(got.prompt.drafts)
    B, T = W + 1, len(tokens)
    rounds = chain_walk(np.asarray(got.prompt.accepted_at), P, T)
    row = {
        "prompt_id": "p",
        "prompt_len": P,
        "accepted_at": got.prompt.accepted_at.tolist(),
        "rounds": [c for _, _, c in rounds],
        "drafts": drafts.ravel().tolist(),
    }
    comp = {"prompt_ids": tokens[:P], "output_ids": tokens[P:]}
    # by hand: a round rejected a draft where it proposed one at its stop (inside the completion)
    rejecting = [(p, a) for p, a, _ in rounds if a < min(W, T - 1 - p) and drafts[p - P, a] >= 0]
    empty = [(p, a) for p, a, _ in rounds if a < min(W, T - 1 - p) and drafts[p - P, a] < 0]
    assert rejecting and len(empty) > len(rejecting)  # both kinds, no proposal the more common (as in the demo)
    tr = trace(row, comp, B)
    assert sorted(tr.rejected[p + a + 1 - P] for p, a in rejecting) == sorted(x for x in tr.rejected if x is not None)
    assert all(tr.rejected[p + a + 1 - P] is None for p, a in empty)
    html = token_html(tr, Vocab(), B)
    assert NO_DRAFT not in html and rejected_spans(html) == len(rejecting)
    rs = patterns.rounds([metrics.Prompt.from_row(row)], {"p": comp}, B)
    pairs = patterns.rejection_pairs(rs, strings, top=10**6)
    assert sum(r["count"] for r in pairs) == len(rejecting) and all(r["draft_id"] >= 0 for r in pairs)
    # the round view of a round that proposed nothing: its stop is no rejected draft
    k = next(i for i, (p, a, _) in enumerate(rounds, 1) if (p, a) == empty[0])
    d = round_detail(row, comp, B, k, Vocab())
    stop = d["slots"][d["stop"] - 1]
    assert stop["status"] == "none" and stop["candidates"] == []
    assert "nothing proposed there" in round_html(d) and "first rejected draft" not in round_html(d)
    j = next(i for i, (p, a, _) in enumerate(rounds, 1) if (p, a) == rejecting[0])
    d = round_detail(row, comp, B, j, Vocab())
    assert d["slots"][d["stop"] - 1]["status"] == "rej" and "first rejected draft" in round_html(d)
