"""Statistics that decide: the paired bootstrap of two runs' per-prompt tau on hand-worked numbers (equal differences:
a zero-width interval; two prompts: every resample enumerated by hand; a clear case, a null case, the too-small
warning), checked against a plain numpy loop with the same seed; per-category tau; then N runs side by side, pure,
through the CLI's `compare` and on the Compare page (AppTest; the browser half: tests/browser/test_compare_many.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from apptest import app, clean

from dflash_dash import cli
from dflash_dash.analysis import stats
from dflash_dash.analysis.compare import default_runs, is_baseline, many_rows, many_table, verdict_rows
from dflash_dash.store import Run, Store


def ids(n: int) -> list[str]:
    return [f"p{i:02d}" for i in range(n)]


def pair(diffs: list[float], base=None) -> tuple[dict, dict]:
    """Runs A and B over len(diffs) prompts: A's tau `base` (default 3 everywhere), B's = A's + diff."""
    base = base if base is not None else [3.0] * len(diffs)
    return dict(zip(ids(len(diffs)), base)), {p: a + d for p, a, d in zip(ids(len(diffs)), base, diffs)}


def plain(d: list[float], seed: int = 0, n: int = 1000) -> tuple[float, float]:
    """The paired percentile bootstrap written out: n resamples of the prompts, the mean difference of each."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d), size=(n, len(d)))
    means = np.array([np.mean(np.asarray(d)[row]) for row in idx])
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def test_equal_differences_give_a_zero_width_interval():
    # B = A + 0.4 on each of 30 prompts whose own taus vary widely: every resample's mean difference is 0.4
    a, b = pair([0.4] * 30, base=[1.5 + (i % 7) for i in range(30)])
    got = stats.paired(a, b)
    assert got["prompts"] == 30 and got["diff"] == pytest.approx(0.4)
    assert got["lo"] == pytest.approx(0.4) and got["hi"] == pytest.approx(0.4)
    assert got["verdict"] == "B is better by 0.40 [0.40, 0.40]" and got["warning"] is None
    # unpaired, the two runs' own intervals overlap widely: pairing is what separates them
    ca, cb = stats.by_category(a, {})[0], stats.by_category(b, {})[0]
    assert ca["hi"] > cb["lo"]


def test_two_prompts_every_resample_by_hand():
    # d = [0, 1]: a resample of two prompts draws (0,0), (0,1), (1,0), (1,1) with mean 0, .5, .5, 1 (p = 1/4 each);
    # of 1,000 resamples about 250 have mean 0 and 250 mean 1, so the 2.5 % and 97.5 % quantiles are 0 and 1
    got = stats.paired({"x": 2.0, "y": 2.0}, {"x": 2.0, "y": 3.0})
    assert (got["diff"], got["lo"], got["hi"]) == (0.5, 0.0, 1.0)
    assert got["verdict"] == "no difference the data can show (B − A = +0.50 [+0.00, +1.00])"
    assert got["warning"].startswith("only 2 shared prompts: fewer than 20 cannot separate two checkpoints")


def test_clear_case_and_its_mirror():
    # d alternates 0.3, 0.5 over 40 prompts: mean 0.4, sd 0.1, so the mean's sd is 0.1 / sqrt(40) = 0.016 and the
    # 95 % interval about 0.4 ± 0.031
    d = [0.3, 0.5] * 20
    a, b = pair(d)
    got = stats.paired(a, b, "step_100", "step_200")
    assert got["diff"] == pytest.approx(0.4)
    assert 0.36 < got["lo"] < 0.38 and 0.42 < got["hi"] < 0.44
    assert (got["lo"], got["hi"]) == pytest.approx(plain(d))  # the same numbers as the plain loop, same seed
    assert got["verdict"] == f"step_200 is better by 0.40 [{got['lo']:.2f}, {got['hi']:.2f}]"
    assert got["warning"] is None
    back = stats.paired(b, a, "step_200", "step_100")  # the other direction: the same interval, mirrored
    assert (back["lo"], back["hi"]) == pytest.approx((-got["hi"], -got["lo"]))
    assert back["verdict"] == got["verdict"]


def test_null_case_warns_that_the_set_is_too_small():
    # d alternates +1, -1 over 40 prompts: mean 0, the mean's sd 1 / sqrt(40) = 0.158, interval about ± 0.31; at
    # ±0.1 the set would need about 40 * (0.31 / 0.1)^2 = 384 prompts
    d = [1.0, -1.0] * 20
    got = stats.paired(*pair(d))
    assert got["diff"] == 0.0 and got["lo"] < -0.25 and got["hi"] > 0.25
    assert (got["lo"], got["hi"]) == pytest.approx(plain(d))
    assert got["verdict"].startswith("no difference the data can show (B − A = +0.00 [")
    half = (got["hi"] - got["lo"]) / 2
    need = int(np.ceil(40 * (half / stats.RESOLVE) ** 2))
    assert 300 < need < 480
    assert got["warning"] == (
        f"the set is too small to separate them: the 95% interval is ±{half:.2f} tau, so a difference under about "
        f"{half:.2f} cannot show with 40 prompts; about {need:,} prompts would resolve ±0.1"
    )
    # seeded: the same numbers every time; another seed draws other resamples (the plain loop's with that seed)
    assert stats.paired(*pair(d)) == got
    other = stats.paired(*pair(d), seed=1)
    assert (other["lo"], other["hi"]) == pytest.approx(plain(d, seed=1))


def test_only_shared_prompts_with_a_tau_pair_up():
    a = {"p": 2.0, "q": 3.0, "r": None, "s": 4.0}
    b = {"p": 2.5, "q": 3.5, "r": 9.0}
    got = stats.paired(a, b)
    assert got["prompts"] == 2 and got["diff"] == pytest.approx(0.5)
    assert stats.paired({"p": 1.0}, {"q": 2.0})["verdict"] == "no shared prompt with a tau"


def test_per_category_tau_by_hand():
    taus = {"a1": 2.0, "a2": 4.0, "b1": 5.0, "n1": 3.0, "x": None}
    cats = {"a1": "code", "a2": "code", "b1": "math", "n1": None, "x": "math"}
    rows = {r["category"]: r for r in stats.by_category(taus, cats)}
    assert list(rows) == ["all", "code", "math", "(none)"]
    assert (rows["all"]["prompts"], rows["all"]["tau"]) == (4, 3.5)
    assert (rows["code"]["prompts"], rows["code"]["tau"]) == (2, 3.0)
    assert 2.0 <= rows["code"]["lo"] <= rows["code"]["hi"] <= 4.0
    assert (rows["math"]["tau"], rows["math"]["lo"], rows["math"]["hi"]) == (5.0, None, None)  # one prompt: no interval
    assert [r["category"] for r in stats.by_category(taus, {})] == ["all"]  # a set without categories


# ---------------------------------------------------------------------------
# N runs (pure)


def run(rid: str, name: str, ex: str = "ex1", **summary) -> Run:
    return Run(id=rid, name=name, extraction_id=ex, checkpoint=f"/ck/{name}", summary=summary)


def test_many_runs_table_rows_and_verdicts():
    runs = [run("r1", "step_100"), run("r2", "step_200"), run("r3", "ngram", family="baseline:ngram-vllm")]
    cats = {p: ("code" if i < 20 else "chat") for i, p in enumerate(ids(40))}
    t1 = {p: 3.0 + (i % 5) * 0.1 for i, p in enumerate(ids(40))}
    taus = {"r1": t1, "r2": {p: t + (0.5 if cats[p] == "code" else 0.0) for p, t in t1.items()}, "r3": dict(t1)}
    assert [is_baseline(r) for r in runs] == [False, False, True]
    rows = many_rows(runs, taus, cats)
    assert [(r["run"], r["category"], r["prompts"]) for r in rows[:3]] == [
        ("r1", "all", 40),
        ("r1", "code", 20),
        ("r1", "chat", 20),
    ]
    table = many_table(runs, rows)
    assert [r["kind"] for r in table] == ["DFlash", "DFlash", "baseline"]
    assert table[1]["tau · code"] == pytest.approx(table[0]["tau · code"] + 0.5)
    assert table[1]["tau · chat"] == pytest.approx(table[0]["tau · chat"])
    v = {(r["run"], r["category"]): r for r in verdict_rows(runs[0], runs, taus, cats)}
    assert v[("step_200", "code")]["verdict"] == "step_200 is better by 0.50 [0.50, 0.50]"
    assert v[("step_200", "chat")]["verdict"].startswith("no difference the data can show")
    # d = 0.5 on the 20 code prompts, 0 on the 20 chat ones: mean 0.25, its sd 0.25 / sqrt(40) = 0.04
    assert v[("step_200", "all")]["verdict"].startswith("step_200 is better by 0.25 [0.1")
    assert ("step_100", "all") not in v  # the reference is not judged against itself


def test_default_runs_are_one_extractions_newest_drafters_and_its_baselines():
    runs = [run(f"r{i}", f"s{i}") for i in range(8)] + [run("old", "x", ex="ex0")]
    runs += [run("b", "ngram", family="baseline:suffix"), run("r9", "s9")]
    got = default_runs(runs, most=6)
    # the newest pair on one extraction is (b, r9) on ex1; its newest six drafter runs and its baseline
    assert got == ["r3", "r4", "r5", "r6", "r7", "b", "r9"]


# ---------------------------------------------------------------------------
# a planted workspace of four runs on one extraction, with categories


def build_many(work) -> dict:
    """tools/planted.py: 24 completions of 64 tokens, three planted runs (mean accepted 2.3) and a fourth drafting
    much better (mean accepted 5), the prompts in three categories (code, math, chat by index), then vLLM's n-gram
    baseline replayed on the same completions (pipeline.baseline). {"ws", "runs": ids oldest first}."""
    from dflash_dash import ops, pipeline
    from tools import planted, tiny

    ws = planted.build(work, 24, 64, 3, block_size=8, budget=0)
    st = Store(ws)
    comps = st.completions(planted.SET)
    cats = ("code", "math", "chat")
    st.add_completions(planted.SET, [c | {"id": c["prompt_id"], "category": cats[i % 3]} for i, c in enumerate(comps)])
    ex = st.extractions()[-1]
    ck = tiny.write_drafter(work / "models" / "sweep" / "step_400", tiny.TinyDrafter(seed=9, block_size=8))
    res = planted.planted_results(comps, 9, 8, 0, mean_accepted=5.0)
    how = ops.ReplaySettings(tree_budget=0)
    pipeline.store_run(
        st, extraction=ex, checkpoint=ops.CheckpointSpec(str(ck)), results=res, settings=how, device="cpu"
    )
    for c in comps:  # the planted extraction's prompts (it writes no feature files; a baseline reads none)
        st.add_item(ex["id"], c["prompt_id"], len(c["prompt_ids"]) + len(c["output_ids"]), "")
    pipeline.baseline(st, ops.Baseline(method="ngram", extraction=ex["id"]))
    return {"ws": ws, "runs": [r["id"] for r in st.runs()]}


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> dict:
    """`build_many`. Read-only."""
    return build_many(tmp_path_factory.mktemp("many"))


def test_cli_compare_json(many, capsys):
    r = many["runs"]
    assert cli.main(["--workspace", str(many["ws"]), "compare", "--runs", r[0], r[1], r[3]]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [x["run"] for x in got["runs"]] == ["step_100", "step_200", "step_400"]
    assert {"tau · code", "tau · math", "tau · chat"} <= set(got["runs"][0])
    best = next(p for p in got["paired"] if p["run"] == "step_400" and p["category"] == "all")
    assert best["verdict"].startswith("step_400 is better by") and best["prompts"] == 24
    assert cli.main(["--workspace", str(many["ws"]), "compare", "--runs", r[0]]) == 2
    assert "give at least two run ids" in capsys.readouterr().err


def test_compare_page_many_runs(many, monkeypatch):
    r = many["runs"]
    at = app(many["ws"], monkeypatch, "compare", runs=",".join(r[1:]))
    clean(at)
    tables = {tuple(df.value.columns): df.value for df in at.dataframe}
    wide = next(v for k, v in tables.items() if "tau · code" in k)
    assert list(wide["run"])[:3] == ["step_200", "step_300", "step_400"]
    assert list(wide["kind"]) == ["DFlash", "DFlash", "DFlash", "baseline"]
    verdicts = next(v for k, v in tables.items() if "verdict" in k)
    assert set(verdicts["run"]) == {"step_300", "step_400", wide["run"][3]}  # each against the first chosen run
    row = verdicts[(verdicts["run"] == "step_400") & (verdicts["category"] == "all")].iloc[0]
    assert row["verdict"].startswith("step_400 is better by")
    assert any("only 8 shared prompts" in w for w in verdicts["warning"])  # 8 prompts per category
    assert any("tau per run and category" in c.proto.spec for c in at.get("plotly_chart"))
    assert any("(baseline)" in c.proto.spec for c in at.get("plotly_chart"))  # the baseline's dashed line
    # the pair below is chosen from the runs above
    assert len(next(s for s in at.selectbox if s.label == "A").options) == 4
