"""Compare that lines up: the default pair, outlines only where the acceptance outcome differs, the
per-prompt delta table and its order, the one-position draft lag rate per slot (hand-made examples worked out
by hand), and the page through AppTest (the browser half: tests/browser/test_compare_panes.py)."""

from __future__ import annotations

import re

import pytest
from apptest import app, clean, htmls
from chainwalk import outcome_walk

from dflash_dash import metrics
from dflash_dash.analysis.compare import default_pair, delta_rows, sweep_extraction
from dflash_dash.analysis.trace import Trace, differing, outcomes, trace
from dflash_dash.render.compare import compare_html
from dflash_dash.render.tokens import token_html
from dflash_dash.store import Extraction, Run, Store
from dflash_dash.vocab import Vocab

# ---------------------------------------------------------------------------
# outcomes: hand-made pair of traces
#
# B = 4 (3 drafts per block), prompt [1, 2] (P = 2), completion of 8 tokens (T = 10): positions 2..9.
# A: round at 2 accepts 3 -> 3,4,5 drafts, 6 target; round at 6 accepts 1 -> 7 draft, 8 target; round at 8 -> 9
#    target (the last token).
# B: round at 2 accepts 0 -> 3 target; round at 3 accepts 2 -> 4,5 drafts, 6 target; round at 6 accepts 2 ->
#    7,8 drafts, 9 target (cut at the end).
# Outcomes (position 2..9):  A  prefill draft  draft draft target draft target target
#                            B  prefill target draft draft target draft draft  target
# They differ at positions 3 and 8 only (offsets 1 and 6), although depth and block starts differ at 4, 5 too.

PROMPT, OUTPUT = [1, 2], [10, 11, 12, 13, 14, 15, 16, 17]


def hand_trace(accepted_at: list[int], drafts: list[int] | None = None) -> Trace:
    row = {"prompt_len": 2, "accepted_at": accepted_at, "drafts": drafts or []}
    return trace(row, {"prompt_ids": PROMPT, "output_ids": OUTPUT}, 4)


def test_outline_only_where_acceptance_outcome_differs():
    a = hand_trace([3, 0, 0, 0, 1, 0, 0, 0])
    b = hand_trace([0, 2, 0, 0, 2, 0, 0, 0], drafts=[99] * 24)  # B's rejected drafts differ from A's: not compared
    assert outcomes(a) == ["prefill", "draft", "draft", "draft", "target", "draft", "target", "target"]
    assert outcomes(b) == ["prefill", "target", "draft", "draft", "target", "draft", "draft", "target"]
    assert differing(a, b) == {1, 6}
    assert differing(a, a) == set() and differing(b, a) == {1, 6}
    # depth and block starts do differ at offsets 2 and 3, and are not outlined
    assert (a.depth[2], a.depth[3]) == (2, 3) and (b.depth[2], b.depth[3]) == (1, 2) and b.start[2] and not a.start[2]
    out = token_html(a, Vocab(), 4, diff=differing(a, b))
    outlined = [int(m) for m in re.findall(r'class="[^"]*dfv-x[^"]*" title="pos (\d+) ', out)]
    assert outlined == [3, 8]


def test_compare_html_escapes_and_carries_one_constant_script():
    a, b = hand_trace([3, 0, 0, 0, 1, 0, 0, 0]), hand_trace([0, 2, 0, 0, 2, 0, 0, 0])

    class Evil(Vocab):
        def _one(self, i):
            return "<script>window.__pwned=1</script>"

    out = compare_html(a, b, Evil(), (4, 4), differing(a, b), ("A <b>x</b>", "B <img src=x>"))
    assert out.count("<script>") == 1 and "__pwned" not in out.split("<script>")[1]
    assert "&lt;script&gt;" in out and "A &lt;b&gt;x&lt;/b&gt;" in out and "<img" not in out
    assert out.count('<div class="dfv">') == 2 and 'data-diffs="2"' in out and "2 differing positions" in out
    same = compare_html(a, a, Vocab(), (4, 4), set(), ("A", "A"))
    assert "dfcmp-next\" disabled" in same


# ---------------------------------------------------------------------------
# the one-position draft lag, by hand
#
# B = 3 (slots 1, 2), prompt [5] (P = 1), completion [6, 7, 7, 8]: tokens t = [5, 6, 7, 7, 8].
# anchor 1 drafts [6, 9]: slot 1 wants t2 = 7, previous t1 = 6 -> lag; slot 2 wants t3 = 7 = t2: not counted.
# anchor 2 drafts [1, 7]: slot 1 wants t3 = 7 = t2: not counted; slot 2 wants t4 = 8, previous t3 = 7 -> lag.
# anchor 3 drafts [8, 3]: slot 1 wants t4 = 8 -> on target; slot 2 would be position 5: outside.
# anchor 4 drafts [-1, -1]: nothing inside anyway.
# Second prompt, chain-only: t = [1, 2, 3], P = 0; anchor 0 not drafted (-1), anchor 1 drafts [2, -1]: slot 1
# wants t2 = 3, previous t1 = 2 -> lag. Pooled: slot 1: 3 anchors, 2 lags, 1 on target; slot 2: 1 anchor, 1 lag.


def test_lag_rate_by_hand():
    first = ([6, 9, 1, 7, 8, 3, -1, -1], [5, 6, 7, 7, 8], 1)
    second = ([-1, -1, 2, -1, -1, -1], [1, 2, 3], 0)
    assert metrics.lag_counts(*first, block_size=3) == ([2, 1], [1, 1], [1, 0])
    assert metrics.lag_counts(*second, block_size=3) == ([1, 0], [1, 0], [0, 0])
    got = metrics.lag_rate([first, second], 3)
    assert got == {"anchors": [3, 1], "lag": [2 / 3, 1.0], "on_target": [1 / 3, 0.0]}
    assert metrics.lag_rate([([1, 2], [5, 6, 7, 7, 8], 1)], 3)["lag"] == [None, None]  # drafts of the wrong size


# ---------------------------------------------------------------------------
# delta table order, default pair


def test_delta_table_sorted_by_absolute_delta():
    ra = {
        "p1": {"tau": 2.0, "tree_tau": 2.5},
        "p2": {"tau": 3.0, "tree_tau": None},
        "p3": {"tau": 1.5},
        "p4": {"tau": None},
        "p5": {"tau": 2.0},
        "only-a": {"tau": 9.0},
    }
    rb = {"p1": {"tau": 2.5}, "p2": {"tau": 1.0}, "p3": {"tau": 2.5}, "p4": {"tau": 2.0}, "p5": {"tau": 1.5}}
    rows = delta_rows(ra, rb)
    # |delta|: p2 2.0, p3 1.0, p1 0.5, p5 0.5 (tie: by id), p4 none (last); only-a is not in B
    assert [r["prompt"] for r in rows] == ["p2", "p3", "p1", "p5", "p4"]
    assert [r["delta (B − A)"] for r in rows] == [-2.0, 1.0, 0.5, -0.5, None]
    assert rows[2] == {
        "prompt": "p1",
        "tau A": 2.0,
        "tau B": 2.5,
        "delta (B − A)": 0.5,
        "DDTree tau A": 2.5,
        "DDTree tau B": None,
    }
    assert "DDTree tau A" not in delta_rows({"p": {"tau": 1.0}}, {"p": {"tau": 2.0}})[0]


def test_default_pair_is_the_newest_pair_on_one_extraction():
    def run(i, ex):
        return Run(id=f"r{i}", extraction_id=ex)

    assert default_pair([run(1, "x"), run(2, "y"), run(3, "x"), run(4, "z")]) == ("r1", "r3")
    assert default_pair([run(1, "x"), run(2, "x"), run(3, "y"), run(4, "y"), run(5, "x")]) == ("r2", "r5")
    assert default_pair([run(1, "x"), run(2, "y")]) == ("r1", "r2")  # no shared extraction: the newest two
    assert default_pair([run(1, "x")]) is None


def test_sweep_and_parity_defaults_skip_newer_extractions_without_runs():
    """Defaults that followed "the newest" opened on a Re-extract's empty extraction."""
    from dflash_dash.analysis.checks import parity_pair

    def ex(i, backend="torch", set_name="s"):
        return Extraction(id=f"e{i}", backend=backend, set_name=set_name, target_path="t")

    def run(ex_id, ck="/train/epoch_0_step_1"):
        return Run(id=f"r-{ex_id}", extraction_id=ex_id, checkpoint=ck, name="n", summary={})

    runs = [run("e1"), run("e2", "/elsewhere/ck")]
    assert sweep_extraction(runs, "/train", ["e1", "e2", "e3"]) == "e1"  # the folder's runs are on e1
    assert sweep_extraction(runs, "", ["e1", "e2", "e3"]) == "e2"  # no folder: the newest with any run
    assert sweep_extraction([], "/train", ["e1", "e2"]) == "e2"  # no run anywhere: the newest
    assert sweep_extraction([], "", []) is None
    # the demo: the healthy series on e1, its final checkpoint also on e2 (newer): the curve's extraction, e1
    series = [run("e1", "/train/step0038"), run("e1", "/train/step1850"), run("e2", "/train/step1850")]
    assert sweep_extraction(series, "/train", ["e1", "e2"]) == "e1"
    assert sweep_extraction(series + [run("e2", "/train/step0038")], "/train", ["e1", "e2"]) == "e2"  # tie: newest
    exs = [ex(1), ex(2, "fla"), ex(3), ex(4, "fla"), ex(5, "torch", "other")]
    assert parity_pair(exs, [run("e1"), run("e2")]) == ("e1", "e2")  # e3, e4 and e5 hold no run
    assert parity_pair(exs, [run("e3")]) == ("e3", "e4")  # B: the newest fla of e3's set (none has runs)
    assert parity_pair(exs, []) == ("e5", "e1")  # no run: the newest torch; no other of its set: the oldest
    assert parity_pair([ex(1)], []) is None


def test_conformance_opens_on_the_newest_run_with_engine_stats():
    from dflash_dash.analysis.conformance import default_run
    from dflash_dash.store import Run

    runs = [Run(id="r1", set_name="served"), Run(id="r2", set_name="served"), Run(id="r3", set_name="plain")]
    assert default_run(runs, {"served"}) == "r2"  # r3 is newer, but no engine reported on its set
    assert default_run(runs, set()) == "r3"
    assert default_run([], {"served"}) is None
    # a model-free baseline stored last (as the demo stores its n-gram run) is not what an engine served
    base = Run(id="r4", set_name="served", checkpoint="baseline:ngram-vllm", summary={"family": "baseline:ngram-vllm"})
    assert default_run([*runs, base], {"served"}) == "r2"
    assert default_run([base], {"served"}) == "r4"  # only a baseline: it, rather than nothing


# ---------------------------------------------------------------------------
# independent references over the store's rows


def lag_by_hand(rows: dict, comps: dict, B: int, shared: list[str]) -> tuple[list[int], list[int]]:
    D = B - 1
    n, lag = [0] * D, [0] * D
    for pid in shared:
        c, r = comps[pid], rows[pid]
        t, P = c["prompt_ids"] + c["output_ids"], r["prompt_len"]
        for a in range(len(t) - P):
            for k in range(1, D + 1):
                p = P + a
                if p + k < len(t) and r["drafts"][a * D] >= 0 and t[p + k] != t[p + k - 1]:
                    n[k - 1] += 1
                    lag[k - 1] += r["drafts"][a * D + k - 1] == t[p + k - 1]
    return n, lag


# ---------------------------------------------------------------------------
# the page (AppTest)


def options(at) -> list[str]:
    """The prompt select's options, in order (AppTest shows their labels: 'id · A tau · B tau · delta')."""
    return [o.split(" · ")[0] for o in at.selectbox(key="cmp_prompt").options]


def test_compare_page_defaults_table_views_and_lag(prepared, monkeypatch):
    st_ = Store(prepared.workspace)
    a_id, b_id = prepared.runs  # both on the one extraction of the prepared workspace
    at = app(prepared.workspace, monkeypatch, "compare")
    clean(at)
    assert (at.query_params["a"], at.query_params["b"]) == (a_id, b_id)
    ra = {r["prompt_id"]: r for r in st_.run_prompts(a_id)}
    rb = {r["prompt_id"]: r for r in st_.run_prompts(b_id)}
    comps = {c["prompt_id"]: c for c in st_.completions(prepared.set_name)}
    want = sorted(ra, key=lambda p: (-abs(rb[p]["tau"] - ra[p]["tau"]), p))
    table = next(d.value for d in at.dataframe if "delta (B − A)" in d.value.columns)
    assert list(table["prompt"]) == want
    # tau and its deltas print as every card does (2 decimals), the formulas as plain text
    config = next(d.proto.columns for d in at.dataframe if "delta (B − A)" in d.value.columns)
    assert all(f'"{c}": {{"type_config": {{"type": "number", "format": "%.2f"}}' in config for c in ("tau A", "tau B"))
    formulas = next(d.value for d in at.dataframe if "formula" in d.value.columns)["formula"]
    assert formulas.str.contains("tree budget").any() and not formulas.str.contains("`").any()
    assert list(table["delta (B − A)"]) == pytest.approx([rb[p]["tau"] - ra[p]["tau"] for p in want], abs=1e-4)
    assert at.selectbox(key="cmp_prompt").value == want[0]
    assert options(at) == want
    # one element holds both views and the script; it outlines exactly the positions whose outcome differs
    (view,) = [h for h in htmls(at) if 'class="dfcmp"' in h]
    assert view.count('<div class="dfv">') == 2 and view.count("<script>") == 1
    c = comps[want[0]]
    P, T = len(c["prompt_ids"]), len(c["prompt_ids"]) + len(c["output_ids"])
    oa, ob = outcome_walk(ra[want[0]]["accepted_at"], P, T), outcome_walk(rb[want[0]]["accepted_at"], P, T)
    diff = [P + i for i in range(T - P) if oa[i] != ob[i]]
    assert diff, "the prepared runs should differ somewhere on their largest-delta prompt"
    assert [int(m) for m in re.findall(r'class="[^"]*dfv-x[^"]*" title="pos (\d+) ', view)] == diff * 2
    assert f'data-diffs="{len(diff)}"' in view
    assert any("accepted draft" in cap.value and "target token" in cap.value for cap in at.caption)
    # the lag table: both runs, every slot, counted here by hand (a section: drawn when chosen)
    at.get("segmented_control")[0].set_value("lag").run()
    clean(at)
    lag = next(d.value for d in at.dataframe if "lag A" in d.value.columns)
    B = st_.run_row(a_id)["summary"]["block_size"]
    for side, rows in (("A", ra), ("B", rb)):
        n, lagged = lag_by_hand(rows, comps, B, sorted(ra))
        assert list(lag[f"anchors {side}"]) == n
        assert list(lag[f"lag {side}"]) == pytest.approx([l / k if k else None for l, k in zip(lagged, n)], abs=1e-4)
    assert "one-position draft lag per slot" in " ".join(c.proto.spec for c in at.get("plotly_chart"))


def test_changing_a_or_b_resorts_and_selects_the_largest_difference(prepared, monkeypatch):
    a_id, b_id = prepared.runs
    at = app(prepared.workspace, monkeypatch, "compare", a=a_id, b=b_id)
    clean(at)
    order = options(at)
    at.selectbox(key="cmp_prompt").set_value(order[-1]).run()
    assert at.query_params["prompt"] == order[-1]
    at.selectbox(key="cmp_a").set_value(b_id).run()  # A = B now: every delta is 0, sorted by id
    clean(at)
    assert options(at) == sorted(order)
    assert at.selectbox(key="cmp_prompt").value == sorted(order)[0] == at.query_params["prompt"]
    at.selectbox(key="cmp_a").set_value(a_id).run()
    assert options(at) == order and at.selectbox(key="cmp_prompt").value == order[0]


def test_acceptance_opens_on_the_healthiest_run_that_matches_serving():
    """The default run on Acceptance is the healthiest checkpoint on the extraction that matches serving
    (fla kernels, or a target without linear attention), not the newest run."""
    from dflash_dash.analysis.compare import healthiest_run

    def run(i, backend, tau):
        return Run(id=f"r{i}", backend=backend, summary={"tau_macro": tau})

    demo_like = [run(1, "torch", 1.04), run(2, "torch", 1.28), run(3, "torch", 1.03), run(4, "fla", 1.27)]
    assert healthiest_run(demo_like) == ("r4", "serving")  # the torch run is higher, but not what serving sees
    assert healthiest_run(demo_like + [run(5, "fla", 1.5), run(6, "n/a", 1.5)]) == ("r6", "serving")  # tie: newest
    assert healthiest_run(demo_like[:3]) == ("r2", "any")  # no serving-matching run: the healthiest of all
    assert healthiest_run([run(1, "fla", None), run(2, "torch", None)]) == ("r2", "newest")
    assert healthiest_run([]) == (None, "")
