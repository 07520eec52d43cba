"""Fixtures of the browser tests (headless Debian Chromium through Playwright): one browser per module and a
fresh page per test, screenshotted under out/screenshots/ when the test fails. Helpers are in tests/web.py."""

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
    ctx.close()
