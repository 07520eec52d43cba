"""Scale in the browser: Acceptance and Compare on a workspace of 1,000 completions (planted runs,
`tools/planted.py`: completions imported by the product, each run stored by the replay's own store step).

The completions are 128 tokens (not the benchmark's 2,560) so the workspace builds in about half a minute on a 2-core
machine; the page figures at 2,560 tokens are `benchmarks/bench_pages.py`'s. What is checked here is what
breaks at 1,000 prompts: the per-prompt table and the prompt select hold every prompt, the last prompt's token
view opens from the select, a deep link opens any prompt, and Compare lines up two 1,000-prompt runs."""

from __future__ import annotations

import pytest
from serving import until
from web import CHROMIUM, NO_CHROMIUM, choose, dashboard, drawn, open_page, section, settle, shot

from dflash_dash import pipeline
from dflash_dash.analysis.compare import delta_rows
from dflash_dash.render.tables import prompt_table
from dflash_dash.store import Store
from tools import planted

PROMPTS, TOKENS = 1000, 128
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)


@pytest.fixture(scope="module")
def scale(tmp_path_factory):
    base = tmp_path_factory.mktemp("scale")
    ws = planted.build(base, PROMPTS, TOKENS, runs=2)
    st = Store(ws)
    runs = [r["id"] for r in st.runs()]
    with dashboard(ws, base) as url:
        yield {"ws": ws, "url": url, "runs": runs, "store": st}


def test_acceptance_at_1000_prompts(scale, page):
    st, rid = scale["store"], scale["runs"][0]
    comps = {c["prompt_id"]: c for c in st.completions(planted.SET)}
    order = [r["prompt"] for r in prompt_table(pipeline.analysis(st, rid, "prompts"), comps)]
    assert len(order) == PROMPTS
    open_page(page, scale, f"acceptance?run={rid}", "Acceptance")
    page.get_by_text(f"Token view · {order[0]}").wait_for()  # the lowest tau opens by default
    drawn(page)
    assert page.locator("[data-testid=stException]").count() == 0
    # the prompt select holds all 1,000: the last one (highest tau) is found by typing and opens its token view
    box = page.locator("[data-testid=stSelectbox]").filter(has_text="prompt").last
    choose(page, box, order[-1], exact=True, typed=order[-1])
    page.get_by_text(f"Token view · {order[-1]}").wait_for()
    until(lambda: f"prompt={order[-1]}" in page.url, timeout=10, what="the URL to follow the select")
    settle(page)
    assert page.locator('.dfv span[title^="pos "]').count() == TOKENS  # every completion token of the prompt drawn
    shot(page, "acceptance-1000")
    # a deep link to a prompt in the middle of the set
    pid = sorted(comps)[PROMPTS // 2]
    open_page(page, scale, f"acceptance?run={rid}&prompt={pid}", "Acceptance")
    page.get_by_text(f"Token view · {pid}").wait_for()


def test_compare_at_1000_prompts(scale, page):
    st = scale["store"]
    a, b = scale["runs"]
    rows = delta_rows({r["prompt_id"]: r for r in st.run_prompts(a)}, {r["prompt_id"]: r for r in st.run_prompts(b)})
    assert len(rows) == PROMPTS
    open_page(page, scale, f"compare?a={a}&b={b}", "Compare")
    page.locator(".dfv").nth(1).wait_for()  # the two aligned token views
    until(lambda: f"prompt={rows[0]['prompt']}" in page.url, timeout=10, what="the largest |delta| to open first")
    drawn(page)
    assert page.locator("[data-testid=stException]").count() == 0
    section(page, "One-position draft lag", "lag")  # drawn when chosen
    page.get_by_role("heading", name="One-position draft lag, per slot").wait_for()
    drawn(page)
    assert page.locator("[data-testid=stException]").count() == 0
    shot(page, "compare-1000")
    last = rows[-1]["prompt"]  # the smallest |delta|: the end of the 1,000-row order
    open_page(page, scale, f"compare?a={a}&b={b}&prompt={last}", "Compare")
    page.locator(".dfv").nth(1).wait_for()
    assert f"prompt={last}" in page.url
