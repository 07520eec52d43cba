"""Model-free baselines: each proposer's drafts on hand-made sequences whose drafts are worked out by hand from the
engine's rule (the engine's source file named at each), a plain reference of vLLM's rule on random sequences, a
baseline run stored and read back, and the CLI.

Engines' sources: vLLM `vllm/v1/spec_decode/ngram_proposer.py` (016e8ede); SGLang
`python/sglang/srt/speculative/cpp_ngram/trie_cache.cpp` (0657507f) and `ngram_worker.py`; vLLM
`vllm/v1/spec_decode/suffix_decoding.py` (044ac3a0) over Arctic Inference `csrc/suffix_decoding/suffix_tree.cc`
(0a11e6ad) and `arctic_inference/suffix_decoding/cache.py` (21fa211b).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from dflash_dash import baselines, cli, ops
from dflash_dash.baselines.sglang import NgramSglang, SglangSettings
from dflash_dash.baselines.suffix import SuffixSettings, SuffixTrie


def ids(*xs) -> np.ndarray:
    return np.asarray(xs, dtype=np.int64)


def ngram(settings: str):
    return baselines.make("ngram", settings)


# -- vLLM ngram ------------------------------------------------------------------------------------------------


def test_vllm_ngram_docstring_example():
    # ngram_proposer.py's own example: [1,2,3,4,2,3], min 2, max 3, k 4: [4,2,3] (only three tokens follow)
    got = ngram("prompt_lookup_min=2,prompt_lookup_max=3,num_speculative_tokens=4").propose(ids(1, 2, 3, 4, 2, 3))
    assert got.ids.tolist() == [4, 2, 3] and got.at == 3 and got.match == 2


def test_vllm_ngram_takes_the_earliest_occurrence():
    # [7,8] occurs at 0 (followed by 1,7) and at 3 (followed by 2,5): vLLM's KMP keeps the first, [1,7]
    prop = ngram("prompt_lookup_min=2,prompt_lookup_max=2,num_speculative_tokens=2")
    got = prop.propose(ids(7, 8, 1, 7, 8, 2, 5, 7, 8))
    assert got.ids.tolist() == [1, 7] and got.at == 2


def test_vllm_ngram_longest_match_wins_over_an_earlier_shorter_one():
    # suffix [5,1,2] (n=3) occurs at 3 -> [3,4]; the 2-gram [1,2] at 0 would give [9,5]
    got = ngram("prompt_lookup_min=2,prompt_lookup_max=3,num_speculative_tokens=2").propose(
        ids(1, 2, 9, 5, 1, 2, 3, 4, 5, 1, 2)
    )
    assert got.ids.tolist() == [3, 4] and got.match == 3


def test_vllm_ngram_without_a_match_drafts_nothing():
    assert ngram("prompt_lookup_min=2,prompt_lookup_max=4").propose(ids(1, 2, 3, 4, 5)).ids.tolist() == []
    assert ngram("prompt_lookup_min=3,prompt_lookup_max=3").propose(ids(1, 1)).ids.tolist() == []


def reference_vllm(ctx: list[int], lo: int, hi: int, k: int) -> list[int]:
    """vLLM's rule written plainly: for n from max down to min, the first s with ctx[s:s+n] == the last n tokens and
    s + n <= len - 1; the k tokens after it."""
    for n in range(hi, lo - 1, -1):
        for s in range(len(ctx) - n):
            if n < len(ctx) and ctx[s : s + n] == ctx[len(ctx) - n :]:
                return ctx[s + n : s + n + k]
    return []


@pytest.mark.parametrize("lo,hi,k", [(1, 1, 3), (2, 5, 4), (3, 3, 1), (1, 4, 8)])
def test_vllm_ngram_matches_a_plain_reference(lo, hi, k):
    rng = np.random.default_rng(lo * 10 + hi)
    prop = ngram(f"prompt_lookup_min={lo},prompt_lookup_max={hi},num_speculative_tokens={k}")
    for _ in range(200):
        ctx = rng.integers(0, 4, int(rng.integers(1, 30))).tolist()
        assert prop.propose(np.asarray(ctx)).ids.tolist() == reference_vllm(ctx, lo, hi, k), ctx


# -- SGLang n-gram -----------------------------------------------------------------------------------------------


def test_sglang_insert_keeps_suffixes_longer_than_the_min_window():
    # TrieCache::insert: windows tokens[i:] with i + min_window < len: [1,2,3,4], [2,3,4], [3,4]; never [4] alone
    p = NgramSglang(SglangSettings())
    p.insert(ids(1, 2, 3, 4))
    assert sorted(p.child[0]) == [1, 2, 3]


def test_sglang_bfs_tree_by_recency_and_greedy_tree_verify():
    p = NgramSglang(SglangSettings())  # min window 1, max 12, breadth 1..10, draft_token_num 16
    p.insert(ids(1, 2, 3, 4))
    p.insert(ids(1, 2, 5, 6))  # [1,2] now has children 5 (most recent) and 3
    tree, w = p.tree(ids(9, 1, 2))
    assert w == 2 and list(tree[0]) == [5, 3]  # recency order under the root
    assert p.propose(ids(9, 1, 2)).ids.tolist() == [5, 6]  # the tree's first branch
    assert p.accept(ids(9, 1, 2), ids(3, 4, 7))[0] == 2  # the other branch verifies: 2 accepted
    assert p.accept(ids(9, 1, 2), ids(5, 6, 7))[0] == 2
    assert p.accept(ids(9, 1, 2), ids(4, 4))[0] == 0
    small = NgramSglang(SglangSettings(draft_token_num=2))  # one draft node: only the most recent child
    small.insert(ids(1, 2, 3, 4))
    small.insert(ids(1, 2, 5, 6))
    assert small.accept(ids(9, 1, 2), ids(3, 4))[0] == 0 and small.accept(ids(9, 1, 2), ids(5, 6))[0] == 1


def test_sglang_prefill_inserts_nothing_and_each_step_inserts_the_tail():
    p = NgramSglang(SglangSettings(draft_token_num=4, max_match_window_size=2, branch_length=3))
    p.start(ids(1, 2, 3, 1, 2), 3)
    assert p.child[0] == {}  # ngram_worker: extend (prefill) is not inserted: the prompt's own repeat is unseen
    assert p.propose(ids(1, 2, 3, 1, 2, 3)).ids.tolist() == []
    p.advance(ids(1, 2, 3, 1, 2, 3, 1), ids(1))  # after a verify: the last branch_length=3 tokens [2,3,1]
    assert sorted(p.child[0]) == [2, 3]  # windows [2,3,1] and [3,1] (i + 1 < 3)
    assert p.propose(ids(5, 2, 3)).ids.tolist() == [1]


# -- suffix decoding -------------------------------------------------------------------------------------------


SEQ = [1, 2, 3, 1, 2, 3, 1, 2]


def spec(seq, **kw):
    s = SuffixSettings(**kw)
    t = SuffixTrie(s.max_tree_depth)
    t.extend(0, seq)
    return t.speculate(seq[-s.max_tree_depth :], s.num_speculative_tokens, s)


def test_suffix_counts_are_occurrences():
    t = SuffixTrie(24)
    t.extend(0, SEQ)
    two = t.find([2])
    assert t.count[two] == 3 and t.count[t.child[two][3]] == 2  # "2" thrice, "2 3" twice (the last 2 ends it)


def test_suffix_best_score_longest_tie():
    # by hand (positions 0..7 = 1 2 3 1 2 3 1 2): match 1 "2" (3 times) -> "2 3" (twice): [3] at 0.667, one token
    # (factor 1); match 2 "1 2" (3) -> "1 2 3" (2) -> "1 2 3 1" (2): [3,1] 0.667 + 0.667; match 3, 4, 5 (twice
    # each) -> continued once: [3,1,2] at 0.5 each = 1.5; match 6 and 7 occur only at the end (no continuation,
    # score 0). Ties go to the longer match: 5.
    drafts, score, n = spec(SEQ)
    assert drafts == [3, 1, 2] and score == pytest.approx(1.5) and n == 5


def test_suffix_min_token_prob_stops_early():
    # min 0.6: match 1 [3] 0.667, match 2 [3,1] 1.333; from match 3 the first token is 0.5 < 0.6: nothing
    drafts, score, n = spec(SEQ, min_token_prob=0.6)
    assert drafts == [3, 1] and n == 2 and score == pytest.approx(4 / 3)


def test_suffix_spec_factor_caps_by_match_length():
    # factor 0.5: match 1 -> int(0.5) = 0 tokens; 2 and 3 -> 1 token; 4 and 5 -> 2 tokens [3,1] (0.5 + 0.5)
    drafts, score, n = spec(SEQ, max_spec_factor=0.5)
    assert drafts == [3, 1] and n == 5 and score == pytest.approx(1.0)


def test_suffix_uses_earlier_outputs_through_the_global_tree():
    p = baselines.make("suffix")
    p.start(ids(4, 4), 7)
    p.advance(ids(4, 4, 7, 8, 9, 7, 8, 9), ids(8, 9, 7, 8, 9))  # request 1's output: 7 8 9 7 8 9
    p.finish(ids(4, 4, 7, 8, 9, 7, 8, 9))
    p.start(ids(1, 2), 7)  # request 2: its prompt never holds 7
    got = p.propose(ids(1, 2, 7))
    # global: "7" 3 times (twice in request 1, once now), "7 8" twice: [8] at 0.667, match 1 (match 1 caps at 1)
    assert got.ids.tolist() == [8] and got.origin == "outputs" and got.match == 1
    alone = baselines.make("suffix", "max_cached_requests=0")
    alone.start(ids(4, 4), 7)
    alone.advance(ids(4, 4, 7, 8, 9, 7, 8, 9), ids(8, 9, 7, 8, 9))
    alone.start(ids(1, 2), 7)
    assert alone.propose(ids(1, 2, 7)).ids.tolist() == []  # no global tree: nothing to copy


def test_suffix_known_suffix_nodes_equal_the_walks(monkeypatch):
    """The proposer hands each tree the context's own suffix nodes instead of walking them from the root: the same
    drafts as the walks (SuffixTree::_match_context) on random requests that repeat themselves."""
    rng = np.random.default_rng(3)
    seqs = [(f"r{i}", rng.integers(0, 5, 80).tolist(), 20) for i in range(4)]
    fast = [r.prompt for r in baselines.replay(baselines.make("suffix", "num_speculative_tokens=6"), seqs)]
    monkeypatch.setattr(SuffixTrie, "suffixes", lambda self, seq: [])
    slow = [r.prompt for r in baselines.replay(baselines.make("suffix", "num_speculative_tokens=6"), seqs)]
    assert fast == slow and sum(sum(p.rounds) for p in fast) > len(fast[0].rounds)


def test_suffix_eviction_forgets_the_oldest_output():
    p = baselines.make("suffix", "max_cached_requests=1")
    p.start(ids(4), 7)
    p.advance(ids(4, 7, 8), ids(8))
    p.start(ids(5), 6)  # evicts request 1's output [7, 8]
    assert p.outputs.find([7]) == -1 and p.outputs.count[0] == 1


# -- the replay as a chain walk ---------------------------------------------------------------------------------


def test_replay_walks_the_chain_with_plain_decode_rounds():
    # prompt [1,2,3], completion [1,2,3,4,1,2,3]; vLLM ngram n=2..2, k=3. Anchor 3 (token 1): suffix [3,1] unseen
    # -> no drafts, commit 1. Anchor 4 (token 2): [1,2] at 0 -> drafts [3,1,2] vs truth [3,4,1]: 1 accepted, commit
    # 2. Anchor 6 (token 4): [3,4] unseen -> 1. Anchor 7 (token 1): [4,1] unseen -> 1. Anchor 8 (token 2): [1,2] at
    # 0 -> [3,1,2] vs truth [3]: 1 accepted, commit min(2, 1) = 1. Anchor 9 = T-1: done.
    prop = ngram("prompt_lookup_min=2,prompt_lookup_max=2,num_speculative_tokens=3")
    r = baselines.replay_prompt(prop, "x", [1, 2, 3, 1, 2, 3, 4, 1, 2, 3], 3)
    assert r.prompt.rounds == [1, 2, 1, 1, 1]
    assert r.sources["anchor"] == [3, 4, 6, 7, 8] and r.sources["at"] == [-1, 2, -1, -1, 2]
    assert r.prompt.accepted_at.tolist() == [0, 1, -1, 0, 0, 1, -1]
    assert r.prompt.drafts[1].tolist() == [3, 1, 2]


def test_methods_are_the_cli_choices():
    (method,) = [f for f in dataclasses.fields(ops.Baseline) if f.name == "method"]
    assert tuple(baselines.METHODS) == ops.METHODS == ops.choices(method)


def test_bad_settings_name_the_setting():
    with pytest.raises(ops.InputError, match="prompt_lookup_min"):
        ops.Baseline(method="ngram", completions="x", settings="prompt_lookup_min=7,prompt_lookup_max=3")
    with pytest.raises(ops.InputError, match="not a setting"):
        ops.Baseline(method="suffix", completions="x", settings="prompt_lookup_min=2")


# -- stored as a run, read back ----------------------------------------------------------------------------------


def plain_tau(seq: list[int], P: int, lo: int, hi: int, k: int) -> tuple[int, int]:
    """(committed, rounds) of a greedy speculative decoder with vLLM's rule over one stored completion, walked by
    hand: anchor P first, accepted = leading drafts equal to the completion, committed = accepted + 1 (capped)."""
    p, committed, rounds = P, 0, 0
    while p < len(seq) - 1:
        drafts = reference_vllm(seq[: p + 1], lo, hi, k)
        a = 0
        while a < len(drafts) and p + 1 + a < len(seq) and drafts[a] == seq[p + 1 + a]:
            a += 1
        c = min(a + 1, len(seq) - 1 - p)
        committed, rounds, p = committed + c, rounds + 1, p + c
    return committed, rounds


def test_baseline_run_is_stored_beside_the_extraction_with_the_right_tau(workspace_copy, prepared):
    from dflash_dash import pipeline
    from dflash_dash.store import Store

    st = Store(workspace_copy)
    op = ops.Baseline(method="ngram", completions=prepared.set_name, settings="prompt_lookup_min=1,prompt_lookup_max=3")
    out = pipeline.perform(st, op)
    run = next(r for r in st.runs() if r["id"] == out["run"])
    assert run["extraction_id"] == prepared.extraction and run["set_name"] == prepared.set_name
    assert run["checkpoint"] == "baseline:ngram" and run["summary"]["family"] == "baseline:ngram-vllm"
    assert run["config"]["settings"]["prompt_lookup_max"] == 3 and "ngram_proposer.py" in run["config"]["source"]
    per = []
    for c in st.completions(prepared.set_name):
        per.append(plain_tau(list(c["prompt_ids"]) + list(c["output_ids"]), len(c["prompt_ids"]), 1, 3, 15))
    assert run["summary"]["tau_macro"] == pytest.approx(np.mean([c / r for c, r in per]))
    assert run["summary"]["tau_pooled"] == pytest.approx(sum(c for c, _ in per) / sum(r for _, r in per))
    rows = {p.id: p for p in st.prompts(out["run"])}
    assert {pid: sum(p.rounds) for pid, p in rows.items()} == {
        c["prompt_id"]: len(c["output_ids"]) - 1 for c in st.completions(prepared.set_name)
    }  # every completion token after the prefill's is committed once
    for pid, p in rows.items():
        assert len(st.analysis(out["run"], f"sources:{pid}")["anchor"]) == len(p.rounds)
    # the newest run is the baseline, yet "latest" (attribute, diagnose, export's default) names a drafter's run
    assert st.run_row("latest")["id"] != out["run"] and not st.run_row("latest")["checkpoint"].startswith("baseline:")


def test_baseline_on_a_set_without_extraction_and_its_readers(workspace_copy, tmp_path):
    from dflash_dash import pipeline
    from dflash_dash.store import Store

    f = tmp_path / "c.jsonl"
    rows = [{"id": "q0", "prompt": "p", "output": "o", "prompt_ids": [1, 2, 3], "output_ids": [4, 1, 2, 3, 4] * 3}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    st = Store(workspace_copy)
    pipeline.import_completions(st, str(f), "bare")
    out = pipeline.baseline(st, ops.Baseline(method="suffix", completions="bare"))
    run = st.run_row(out["id"])
    assert run["extraction_id"] is None and run["summary"]["set_name"] == "bare"
    assert run["summary"]["tau_macro"] > 1.5  # the repeats are drafted from the prompt and the output so far
    assert pipeline.export(st, out["id"])["prompts"][0]["id"] == "q0"  # readers resolve the set without extraction
    assert any(r["id"] == out["id"] and r["completions"] == "bare" for r in pipeline.listing(st, "runs"))


def test_cli_baseline(workspace_copy, prepared, capsys):
    ws = str(workspace_copy)
    rc = cli.main(["--workspace", ws, "baseline", "--completions", prepared.set_name, "--method", "sglang-ngram"])
    assert rc == 0
    got = json.loads(capsys.readouterr().out)
    assert got["summary"]["family"] == "baseline:ngram-sglang" and got["summary"]["block_size"] == 16
    rc = cli.main(["--workspace", ws, "baseline", "--completions", prepared.set_name, "--settings", "k=3"])
    assert rc == 2 and "settings k: not a setting" in capsys.readouterr().err


def test_pages_open_on_baseline_runs(workspace_copy, prepared, monkeypatch, tmp_path):
    """Acceptance (with its token view) on a baseline beside the extraction and on one without extraction, the
    Overview and Compare with baselines in the store: no exception, no error."""
    from apptest import app, clean, htmls

    from dflash_dash import pipeline
    from dflash_dash.store import Store

    st = Store(workspace_copy)
    beside = pipeline.baseline(st, ops.Baseline(method="suffix", completions=prepared.set_name))["id"]
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"id": "q0", "prompt": "p", "output": "o", "prompt_ids": [1, 2], "output_ids": [3] * 9}))
    pipeline.import_completions(st, str(f), "bare")
    one = "prompt_lookup_min=1,prompt_lookup_max=1"
    alone = pipeline.baseline(st, ops.Baseline(method="ngram", completions="bare", settings=one))["id"]
    for run, prompt in ((beside, prepared.script_id), (alone, "q0")):
        at = app(workspace_copy, monkeypatch, "acceptance", run=run, prompt=prompt, round="2")
        clean(at)
        assert any('<div class="dfv">' in h for h in htmls(at)), run
    # prompt [1,2], output 3 x 9: round 2 at anchor 3 copies from position 3, after the [3] at position 2
    assert any("Round 2 (anchor 3)" in h and "occurred first at positions 2–2" in h for h in htmls(at))
    at = app(workspace_copy, monkeypatch, "acceptance", run=prepared.runs[0])  # a drafter beside the suffix run
    clean(at)
    assert any("Against the best model-free baseline on these completions" in h for h in htmls(at))
    at = app(workspace_copy, monkeypatch)
    clean(at)
    assert any("its best drafter" in h for h in htmls(at))
    assert any(e.label.startswith("Set bare · model-free baselines") for e in at.expander)
    clean(app(workspace_copy, monkeypatch, "compare"))
    at = app(workspace_copy, monkeypatch, "compare", section="sweep", sweep=str(prepared.train))
    clean(at)  # the training sweep's chart draws the suffix run as the baseline line
    assert any("(baseline)" in c.proto.spec for c in at.get("plotly_chart"))


def test_source_html_names_the_copied_span_and_escapes_tokens():
    from dflash_dash.render.baseline import source_html

    src = {"anchor": [4, 6], "at": [-1, 2], "match": [0, 2], "origin": ["", "context"]}
    toks = [10, 11, 12, 13, 10, 11, 10]
    names = {10: "<b>", 11: "x", 12: "y", 13: "z"}
    strings = lambda ids: [names[i] for i in ids]  # noqa: E731
    assert "no drafts" in source_html(src, 1, toks, strings)
    got = source_html(src, 2, toks, strings)
    assert "the 2 tokens ending at the anchor <code>x&lt;b&gt;</code>" in got  # positions 5-6, escaped
    assert "occurred first at positions 0–1" in got and "from position 2: <code>yz&lt;b&gt;x&lt;b&gt;</code>" in got


def test_best_baseline_on_the_same_completions_and_by_how_much():
    from dflash_dash.analysis.reference import best_baseline, versus
    from dflash_dash.store import Run

    def run(i, ex, tau, ck="ck", set_name="s"):
        return Run(id=i, extraction_id=ex, set_name=set_name, checkpoint=ck, name=i,
                   summary={"tau_macro": tau, "baseline": ck[9:] or None})  # fmt: skip

    drafter = run("d", "e1", 3.0)
    runs = [
        drafter,
        run("b1", "e1", 1.5, "baseline:ngram"),
        run("b2", "e1", 2.0, "baseline:suffix"),
        run("b3", "e2", 2.9, "baseline:suffix"),  # another extraction: not these completions
        run("d2", "e1", 3.5),  # a drafter is never the reference
    ]
    assert best_baseline(runs, drafter).id == "b2"
    v = versus(drafter, best_baseline(runs, drafter))
    assert v["ratio"] == pytest.approx(1.5) and v["gain"] == pytest.approx(1.0) and v["method"] == "suffix"
    assert best_baseline(runs[:1], drafter) is None


def test_baseline_as_a_job(workspace_copy, prepared):
    from dflash_dash.jobs import dispatch
    from dflash_dash.store import Store

    st = Store(workspace_copy)
    args = {"method": "suffix", "completions": prepared.set_name}
    st.add_job("job-b", "baseline", args, str(workspace_copy / "b.log"))
    assert dispatch.execute(st, "job-b") == 0
    run = st.job("job-b")["result"]["run"]
    assert st.run_row(run)["checkpoint"] == "baseline:suffix"


def test_sweep_fig_draws_the_baseline_as_a_line():
    from dflash_dash.render.figures import sweep_fig

    pts = [{"step": 1, "name": "a", "tau_macro": 1.2, "tau_pooled": 1.1, "ddtree_tau": None}]
    fig = sweep_fig(pts, ("suffix", 1.7))
    assert [sh.y0 for sh in fig.layout.shapes] == [1.7] and "suffix (baseline)" in fig.layout.annotations[0].text
    assert not sweep_fig(pts).layout.shapes
