"""Fixtures of the browser tests (headless Debian Chromium through Playwright): one browser per module and a
fresh page per test, screenshotted under out/screenshots/ when the test fails, its alerts and text added to the
failure's report (CI keeps the report, not always the screenshot). Helpers are in tests/web.py."""

from __future__ import annotations

import pytest
from web import ARGS, CHROMIUM, SCREENSHOTS


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


def said(pg) -> str:
    """The page's alerts (errors, warnings) and the start of its main text: what the user saw at the failure."""
    alerts = pg.locator("[data-testid=stAlert]").all_inner_texts()
    main = pg.locator("[data-testid=stMain]")
    text = main.inner_text() if main.count() else pg.content()
    return "\n".join([f"url: {pg.url}", *(f"alert: {a}" for a in alerts), "text:", text[:4000]])


@pytest.fixture
def page(browser, request):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    ctx = browser.new_context(viewport={"width": 1500, "height": 1000})
    pg = ctx.new_page()
    pg.dialogs = []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.set_default_timeout(60_000)
    yield pg
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        pg.screenshot(path=str(SCREENSHOTS / f"FAILED-{request.node.name}.png"), full_page=True)
        rep.sections.append(("page when the test failed", said(pg)))
    ctx.close()
