"""End to end in a real browser: headless Debian Chromium (Playwright) against `streamlit run app.py`.

A copy of the prepared workspace, a local SGLang stand-in server (subprocess) and the dashboard
(subprocess). Opens every page (screenshots under out/screenshots/), fetches from the server with the
Fetch button, replays from the Replay button, re-extracts from the Re-extract button, opens Compare by URL,
and checks that a completion holding <script> and HTML renders as text and runs nothing.
"""

from __future__ import annotations

import shutil

import pytest
from serving import Served, until
from waiting import job_ids, wait_job
from web import CHROMIUM, NO_CHROMIUM, SCREENSHOTS, dashboard, done_in_panel, drawn, open_page, section, settle, shot

from dflash_dash import pipeline
from dflash_dash.analysis.compare import config_diff
from dflash_dash.render.tables import prompt_table
from dflash_dash.store import Store

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)


# ---------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def env(prepared, tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e")
    ws = base / "ws"
    shutil.copytree(prepared.workspace, ws, ignore=shutil.ignore_patterns("*.lock"))
    server = Served(prepared.target, base / "server.log").wait()
    (ws / "config.toml").write_text(f'[server]\nurl = "{server.url}"\nreadiness_timeout = 60\n')
    try:
        with dashboard(ws, base) as url:
            yield {"ws": ws, "url": url, "server": server, "prepared": prepared, "base": base}
    finally:
        server.stop()


# ---------------------------------------------------------------------------
# tests


def test_no_request_leaves_this_machine(env, page):
    """The favicon came from a font server (console errors offline). Every request a page makes, the
    favicon included, goes to the dashboard itself (or is an inline data: URL)."""
    from urllib.parse import urlsplit

    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    open_page(page, env, "", "dflash-dash")
    drawn(page)
    page.wait_for_function(  # the page's own icon replaced Streamlit's default favicon.png
        "[...document.querySelectorAll('link[rel~=icon]')].some(l => !l.href.endsWith('/favicon.png'))",
        timeout=20_000,
    )
    icons = page.eval_on_selector_all("link[rel~=icon]", "ls => ls.map(l => l.href)")
    assert all(urlsplit(u).scheme == "data" or urlsplit(u).hostname == "127.0.0.1" for u in icons), icons
    away = [u for u in urls if urlsplit(u).scheme != "data" and urlsplit(u).hostname != "127.0.0.1"]
    assert away == [], away


def test_deep_link_opened_first_after_start(env, page):
    """The first view after the server starts is a deep link: it must run under app.py's routing (sidebar,
    navigation) and honour the selection in the URL."""
    p = env["prepared"]
    open_page(page, env, f"acceptance?run={p.runs[1]}&prompt=code-add", "Acceptance")
    assert page.get_by_text("Page not found").count() == 0
    side = page.locator("[data-testid=stSidebar]").inner_text()
    assert "Workspace" in side and "Overview" in side and "common" not in side
    page.get_by_text("Token view · code-add").wait_for()
    assert f"checkpoint {p.drafters[1]}" in page.locator("[data-testid=stMain]").inner_text()
    assert f"run={p.runs[1]}" in page.url and "prompt=code-add" in page.url


def test_every_page_opens(env, page):
    for path, title in (
        ("", "dflash-dash"),
        ("acceptance", "Acceptance"),
        ("compare", "Compare"),
        ("completions", "Completions"),
        ("extraction", "Extraction"),
        ("diagnostics", "Diagnostics"),
    ):
        open_page(page, env, path, title)
        shot(page, path or "overview")  # waits until charts and tables are drawn
        assert page.locator("[data-testid=stException]").count() == 0, path
        assert page.locator("text=Traceback").count() == 0, path
        assert page.get_by_text("Page not found").count() == 0, path
    # the sidebar shows the workspace and a ready server
    side = page.locator("[data-testid=stSidebar]").inner_text()
    assert str(env["ws"].resolve()) in side and "ready" in side
    print(f"\nscreenshots in {SCREENSHOTS}")


def test_selecting_a_table_row_opens_its_token_view(env, page):
    p = env["prepared"]
    st = Store(env["ws"])
    comps = {c["prompt_id"]: c for c in st.completions(p.set_name)}
    order = [r["prompt"] for r in prompt_table(pipeline.analysis(st, p.runs[0], "prompts"), comps)]
    want = order[-1]  # the highest tau: not the prompt opened by default
    open_page(page, env, f"acceptance?run={p.runs[0]}", "Acceptance")
    page.get_by_text(f"Token view · {order[0]}").wait_for()
    table = page.locator("[data-testid=stDataFrame]").first  # the per-prompt table: the one table of the first paint
    table.scroll_into_view_if_needed()
    drawn(page)
    box = table.bounding_box()
    row_h = 35  # glide-data-grid default row height; the header row is as tall
    table.click(position={"x": 14, "y": row_h * (1 + order.index(want)) + row_h / 2})
    page.get_by_text(f"Token view · {want}").wait_for()
    until(lambda: f"prompt={want}" in page.url, timeout=10, what="the URL to follow the selection")
    assert box["height"] >= row_h * (len(order) + 1)


def test_untrusted_completion_renders_as_text_and_runs_nothing(env, page):
    p = env["prepared"]
    open_page(page, env, f"completions?set={p.set_name}&prompt={p.script_id}", "Completions")
    page.get_by_text("<script>window.__pwned = 1; alert(1)</script>").first.wait_for()
    assert page.get_by_text('<b>bold</b> & <img src=x onerror="window.__pwned = 2">').count() >= 1
    open_page(page, env, f"acceptance?run={p.runs[1]}&prompt={p.script_id}", "Acceptance")
    # the token view's text (rejected drafts and depth superscripts left out) is the completion, verbatim
    page.wait_for_function(
        """(want) => [...document.querySelectorAll('.dfv')].some(v => {
        const c = v.cloneNode(true); c.querySelectorAll('.dfv-rej, sup').forEach(e => e.remove());
        return c.textContent.replaceAll('↵', '\\n').replaceAll('⇥', '').includes(want); })""",
        arg="<script>window.__pwned = 1; alert(1)</script>",
    )
    shot(page, "acceptance-script", focus=".dfv >> nth=-1")
    # no element was created from the completion, no script ran, no dialog opened
    assert page.evaluate("document.querySelectorAll('.dfv script, .dfv img, .dfv b').length") == 0
    assert page.evaluate("window.__pwned") is None
    assert page.dialogs == []


def test_fetch_from_the_button(env, page):
    ws = env["ws"]
    open_page(page, env, "completions", "Completions")
    before = job_ids(ws)
    page.get_by_label("completion set name").fill("e2e-fetch")
    page.get_by_label("max new tokens").fill("6")
    page.get_by_test_id("stCheckbox").get_by_text("chat template", exact=True).click()  # off: plain prompts
    page.get_by_role("button", name="Fetch").click()
    job = wait_job(ws, "fetch", before)
    assert job["status"] == "done", job
    assert job["args"]["server"] == env["server"].url and job["args"]["chat"] is False
    comps = Store(ws).completions("e2e-fetch")
    assert len(comps) == 10 and all(1 <= len(c["output_ids"]) <= 6 for c in comps)
    done_in_panel(page, "fetch", job["id"])
    page.get_by_text("e2e-fetch").first.wait_for()  # the page reran and lists the new set
    shot(page, "completions-fetched")


def test_replay_from_the_button(env, page):
    ws, p = env["ws"], env["prepared"]
    open_page(page, env, "acceptance", "Acceptance")
    before = job_ids(ws)
    n = len(Store(ws).runs())
    page.get_by_label("checkpoint folder (config.json + *.safetensors, or a SpecForge").fill(str(p.drafters[0]))
    page.get_by_role("button", name="Replay").click()
    job = wait_job(ws, "replay", before)
    assert job["status"] == "done", job
    runs = Store(ws).runs()
    assert len(runs) == n + 1 and runs[-1]["id"] == job["result"]["run"]
    done_in_panel(page, "replay", job["id"])
    shot(page, "acceptance-replayed")


def test_reextract_from_the_button(env, page):
    ws = env["ws"]
    open_page(page, env, "extraction", "Extraction")
    before = job_ids(ws)
    n = len(Store(ws).extractions())
    page.get_by_role("button", name="Re-extract").first.click()
    start = page.get_by_role("button", name="Start re-extraction")
    start.wait_for()
    again = page.get_by_role("checkbox", name="extract again anyway")

    def ready() -> bool:
        """The button enabled; this machine's defaults repeat the extraction there, so the duplicate box is ticked
        whenever it shows unticked (it is drawn in the run that draws the button, but a rerun may redraw it)."""
        settle(page)
        if again.count() and not again.is_checked():
            page.get_by_text("extract again anyway").click()
            return False
        return start.is_enabled()

    until(ready, timeout=60, what="Start re-extraction enabled (a refusal shows in the page's alerts)")
    start.click()
    job = wait_job(ws, "extract", before)
    assert job["status"] == "done", job
    exs = Store(ws).extractions()
    assert len(exs) == n + 1 and exs[-1]["id"] == job["result"]["extraction"]
    done_in_panel(page, "extract", job["id"])
    # the new extraction is listed, with its backend and its own Re-extract button
    page.locator("[data-testid=stMarkdownContainer]").filter(has_text=exs[-1]["id"]).filter(
        has_text="backend"
    ).first.wait_for()
    until(
        lambda: page.get_by_role("button", name="Re-extract").count() == n + 1,
        timeout=30,
        what="a Re-extract button per extraction",
    )
    shot(page, "extraction-reextracted")


def test_compare_by_url_shows_both_checkpoints(env, page):
    p = env["prepared"]
    a, b = p.runs
    open_page(page, env, f"compare?a={a}&b={b}", "Compare")
    page.locator(".dfv").nth(1).wait_for()  # the two aligned token views
    drawn(page)
    body = page.locator("[data-testid=stMain]").inner_text()
    for d in p.drafters:
        assert d.name in body and str(d) in body
    section(page, "Configs side by side", "config")  # drawn when chosen
    page.get_by_role("heading", name="Configs side by side").wait_for()
    drawn(page)
    body = page.locator("[data-testid=stMain]").inner_text()
    st = Store(env["ws"])
    n = sum(1 for r in config_diff(st.run_row(a)["config"], st.run_row(b)["config"]) if r["differs"])
    assert f"{n} {'key differs' if n == 1 else 'keys differ'}" in body
    assert f"a={a}" in page.url and f"b={b}" in page.url
    shot(page, "compare")
