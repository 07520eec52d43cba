"""Why drafts fail, in the browser: the reliability diagram and the failure patterns on Acceptance (each drawn when
chosen in the page's section picker), a worst-span link that opens the token view with the span outlined, and
target-layer attribution started from Diagnostics with its bar chart (screenshots under out/screenshots/)."""

from __future__ import annotations

import shutil

import pytest
from serving import until
from waiting import JOB_TIMEOUT
from web import CHROMIUM, dashboard, drawn, open_page, section, shot

from dflash_dash import pipeline
from dflash_dash.store import Store

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"Debian chromium is not installed at {CHROMIUM}")


@pytest.fixture(scope="module")
def env(prepared, tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e-analysis")
    ws = base / "ws"
    shutil.copytree(prepared.workspace, ws, ignore=shutil.ignore_patterns("*.lock"))
    with dashboard(ws, base) as url:
        yield {"ws": ws, "url": url, "prepared": prepared}


def chart(page, title: str):
    """The plotly chart whose title is `title`, once drawn."""
    loc = page.locator("[data-testid=stPlotlyChart]").filter(has_text=title).first
    loc.scroll_into_view_if_needed()
    loc.locator(".main-svg").first.wait_for()
    return loc


TRUNCATED = """() => [...document.querySelectorAll('[data-testid=stMetricValue]')]
    .filter(m => [m, ...m.querySelectorAll('*')].some(e => e.scrollWidth > e.clientWidth + 1))
    .map(m => m.innerText)"""


@pytest.mark.parametrize("width", [1280, 1400, 1440])
def test_every_metric_value_fits_its_card(env, page, width):
    """At 1,400-1,440 px the tau interval was cut (`1.28 [1.19, 1.…`). No metric card clips its value."""
    page.set_viewport_size({"width": width, "height": 1000})
    open_page(page, env, f"acceptance?run={env['prepared'].runs[0]}", "Acceptance")
    page.get_by_text("How sure is tau?").wait_for()
    drawn(page)
    values = page.locator("[data-testid=stMetricValue]")
    assert values.count() >= 8 and "[" in values.all_inner_texts()[4]  # the cards, an interval among them
    assert page.evaluate(TRUNCATED) == []


def test_reliability_diagram_and_failure_patterns(env, page):
    rid = env["prepared"].runs[0]
    open_page(page, env, f"acceptance?run={rid}", "Acceptance")
    page.get_by_text("Token view · ").first.wait_for()
    assert page.get_by_role("heading", name="Calibration").count() == 0  # drawn only when chosen
    assert page.locator("[data-testid=stPlotlyChart]").filter(has_text="reliability diagram").count() == 0
    section(page, "Calibration")
    page.get_by_role("heading", name="Calibration").wait_for()
    until(lambda: "section=calibration" in page.url, timeout=10, what="the URL to name the section")
    rel = chart(page, "reliability diagram (pooled over depths)")
    assert "perfectly calibrated" in rel.inner_text()
    page.get_by_text("calibration ECE (pooled over depths)").first.wait_for()
    drawn(page)
    shot(page, "acceptance-calibration", focus='[data-testid=stPlotlyChart]:has-text("reliability diagram")')
    assert page.get_by_role("button", name="reliability bins (CSV)").count() == 1
    section(page, "Failure patterns")
    page.get_by_role("heading", name="Failure patterns").wait_for()
    until(lambda: "section=patterns" in page.url, timeout=10, what="the URL to name the section")
    chart(page, "acceptance by class of the target token at slot 1")
    shot(page, "acceptance-failure-patterns", focus='[data-testid=stPlotlyChart]:has-text("acceptance by class")')
    for label in ("worst spans (CSV)", "by token class (CSV)"):
        assert page.get_by_role("button", name=label).count() == 1
    # a worst span opens its prompt with the span outlined
    span = pipeline.export(Store(env["ws"]), rid)["patterns"]["worst_spans"][0]
    page.get_by_text("open a worst span in the token view").click()
    with page.context.expect_page() as opened:  # Streamlit opens markdown links in a new tab
        page.get_by_role("link", name="open in the token view").first.click()
    tab = opened.value
    tab.set_default_timeout(60_000)
    tab.get_by_text(f"Token view · {span['prompt']}").wait_for()
    assert f"pos={span['start']}-{span['end']}" in tab.url
    tab.get_by_text(f"positions {span['start']}–{span['end']} from the link").wait_for()
    tab.locator(".dfv .dfv-x").first.wait_for()  # the token view is drawn after the caption
    n = tab.evaluate("document.querySelectorAll('.dfv .dfv-x').length")
    assert n == span["end"] - span["start"] + 1
    shot(tab, "acceptance-worst-span", focus=".dfv-x >> nth=0")
    tab.close()


def test_attribution_chart_from_the_button(env, page):
    ws, rid = env["ws"], env["prepared"].runs[0]
    open_page(page, env, f"diagnostics?run={rid}", "Diagnostics")
    page.get_by_role("heading", name="Target-layer attribution").wait_for()
    page.get_by_role("button", name="Attribute", exact=True).click()
    st = Store(ws)
    job = until(
        lambda: next(
            (j for j in st.jobs() if j["kind"] == "attribute" and j["status"] not in ("queued", "running")), None
        ),
        timeout=JOB_TIMEOUT,
        every=0.3,
        what="the attribute job",
    )
    assert job["status"] == "done", job
    bars = chart(page, "tau lost with each target-layer tap replaced by its mean")  # the page reruns when it ends
    assert "tap 0" in bars.inner_text() and "tap 1" in bars.inner_text()
    assert page.get_by_role("button", name="attribution (CSV)").count() == 1
    drawn(page)
    shot(page, "diagnostics-attribution", focus="[data-testid=stPlotlyChart] >> nth=-1")
