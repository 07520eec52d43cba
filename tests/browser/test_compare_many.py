"""Compare in the browser with many runs: three checkpoints and vLLM's n-gram baseline on one extraction of a set
with categories (tests/test_decide.py `build_many`): the chart draws a bar per checkpoint in every category and the
baseline as a dashed reference line, the verdicts and the too-small warning show, and the token views of a pair
chosen from the runs still draw."""

from __future__ import annotations

import pytest
from test_decide import build_many
from web import CHROMIUM, NO_CHROMIUM, dashboard, drawn, open_page, shot

from dflash_dash import pipeline
from dflash_dash.store import Store

TEXTS = "els => els.map(e => e.textContent)"  # SVG text has no innerText


@pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)
def test_compare_three_checkpoints_and_the_ngram_baseline_by_category(tmp_path, page):
    got = build_many(tmp_path / "many")
    runs = {r["id"]: r for r in Store(got["ws"]).runs()}
    three = got["runs"][1:4]  # step_200, step_300, step_400
    base = next(i for i, r in runs.items() if r["checkpoint"] == "baseline:ngram")
    want = [p for p in pipeline.compare(Store(got["ws"]), [*three, base])["paired"] if p["category"] == "all"]
    assert len(want) == 3
    with dashboard(got["ws"], tmp_path) as url:
        open_page(page, {"url": url}, f"compare?runs={','.join([*three, base])}", "Compare")
        chart = page.locator(".js-plotly-plot").filter(has_text="tau per run and category").first
        chart.wait_for()
        drawn(page)
        # categories on the x axis, "all" first; a legend entry per checkpoint and the baseline's
        ticks = chart.locator(".xtick text").evaluate_all(TEXTS)
        assert ticks == ["all", "code", "math", "chat"], ticks
        legend = chart.locator(".legendtext").evaluate_all(TEXTS)
        names = [runs[i]["name"] for i in three]
        assert legend[:3] == names and legend[3] == f"{runs[base]['name']} (baseline)", legend
        # three bar traces of four bars each, and the baseline a dashed line over the four categories
        assert chart.locator(".barlayer .trace").count() == 3
        assert chart.locator(".barlayer .trace").nth(0).locator(".point").count() == 4
        line = chart.locator(".scatterlayer .trace .js-line").first
        assert "dasharray" in (line.get_attribute("style") or "")
        # the verdicts in words, and the warning that the categories are too small to separate the runs
        main = page.locator("[data-testid=stMain]")
        assert main.get_by_text("tau per run and category").count() >= 1
        for v in want:  # each run's overall warning against the reference (the first chosen), as the CLI computes it
            alert = page.locator("[data-testid=stAlert]").filter(has_text=f"{v['run']} against {names[0]}")
            assert alert.count() == (1 if v["warning"] else 0), v
            if v["warning"]:
                assert v["warning"][:60] in alert.inner_text()
        # the pair's token views, chosen from the runs above, still draw
        page.locator(".dfcmp").wait_for()
        assert page.locator(".dfcmp .dfv").count() == 2
        shot(page, "compare-many")
