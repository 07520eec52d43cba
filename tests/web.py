"""Browser test helpers (not tests): the dashboard as a `streamlit run` subprocess, and the waits and
screenshots the browser tests share. The Playwright fixtures (`browser`, `page`) are in tests/browser/conftest.py.

Contract: Chromium's path and flags and the "page is drawn" predicate come from tools/browser.py (shared with the
benchmarks); screenshots go under out/screenshots/.
"""

from __future__ import annotations

import re
import subprocess
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from serving import ENV, ROOT, end, free_port, until

from dflash_dash import launch
from tools import browser as browser_mod

CHROMIUM = Path(browser_mod.CHROMIUM)
ARGS = browser_mod.ARGS
SCREENSHOTS = ROOT / "out" / "screenshots"
NO_CHROMIUM = "Debian chromium is not installed at /usr/bin/chromium (apt-get install -y chromium)"


@contextmanager
def dashboard(ws: Path, base: Path):
    """`streamlit run app.py -- --workspace ws` as a subprocess, polled until it serves; yields its URL."""
    port = free_port()
    log = open(base / "streamlit.log", "wb")
    app = subprocess.Popen(
        launch.app_argv(ws, port, "127.0.0.1", watch=False),
        cwd=ROOT,
        env=ENV,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def serving():
        if app.poll() is not None:
            raise RuntimeError(f"streamlit exited {app.returncode}:\n{(base / 'streamlit.log').read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        until(serving, timeout=90, every=0.2, what="streamlit to serve")
        yield url
    finally:
        end(app, 15)
        log.close()


def open_page(page, env, path: str, title: str):
    page.goto(f"{env['url']}/{path}")
    page.get_by_role("heading", name=title).first.wait_for()
    settle(page)


def choose(page, box, option: str, *, exact: bool = False, typed: str | None = None) -> None:
    """Pick `option` from the Streamlit selectbox `box`: open its list, optionally type `typed` to filter it, and
    click the option; all again (up to 5 times) when a rerun closed the list first. Waits on the list and the option,
    never a fixed delay."""
    from playwright.sync_api import TimeoutError as PwTimeout

    listbox = page.get_by_role("listbox")
    for attempt in range(5):  # a rerun may close the list before it shows, or before the option is clicked
        settle(page)
        box.scroll_into_view_if_needed()
        box.locator("input").click()
        try:
            listbox.first.wait_for(state="visible", timeout=5_000)
            if typed:
                page.keyboard.type(typed)
            page.get_by_role("option", name=option, exact=exact).click(timeout=10_000)
            return
        except PwTimeout:
            if attempt == 4:
                raise


def section(page, label: str, param: str | None = None) -> None:
    """Choose an optional section of the page (drawn only when chosen, so the page draws fast) in its section picker;
    with `param`, wait until the URL names it (&section=param)."""
    btn = page.locator("[data-testid=stButtonGroup] button").filter(has_text=label).first
    btn.scroll_into_view_if_needed()
    btn.click()
    if param:  # location.href read in the page (page.url is refreshed only while Playwright handles a call)
        until(
            lambda: f"section={param}" in page.evaluate("() => location.href"),
            timeout=30,
            what=f"the URL to name section {param}",
        )


def settle(page) -> None:
    """Wait until Streamlit has finished running the script: its status widget is gone and the app's script state
    is no longer running (the status widget alone is not enough: a headless browser never shows it)."""
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]') && !['initial', 'running', "
        "'rerunRequested', 'stopRequested'].includes(document.querySelector('[data-testid=stApp]')?.dataset"
        ".testScriptState)",
        timeout=60_000,
    )


def drawn(page, timeout: float = 20_000) -> None:
    """Wait until placeholders are replaced: no skeletons, every shown plotly chart drawn, every shown table drawn
    (one inside a collapsed expander or an unselected tab is never drawn: it is not waited for)."""
    from playwright.sync_api import TimeoutError as PwTimeout

    try:
        page.wait_for_function(browser_mod.PLACEHOLDERS_GONE, timeout=timeout)
    except PwTimeout:
        pass  # a screenshot with a placeholder still shows the page; the assertions are elsewhere


def shot(page, name: str, focus: str | None = None) -> None:
    """A screenshot of the whole page: Streamlit scrolls inside its main section, so the viewport is grown to
    the content's height first. `focus`: scroll that element into view instead (viewport only)."""
    size = page.viewport_size
    if focus:
        page.locator(focus).first.scroll_into_view_if_needed()
    else:
        drawn(page)
        h = page.evaluate(
            "Math.max(...[...document.querySelectorAll('[data-testid=stMain], section, main')]"
            ".map(e => e.scrollHeight), document.body.scrollHeight)"
        )
        page.set_viewport_size({"width": size["width"], "height": min(int(h) + 80, 8000)})
    drawn(page)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
    page.set_viewport_size(size)


def done_in_panel(page, kind: str, job_id: str):
    """The job panel shows the job as done (the fragment polls the store every second)."""
    page.locator("[data-testid=stMarkdownContainer]").filter(has_text=job_id).filter(
        has_text=re.compile(r"·\s*done")
    ).first.wait_for(timeout=30_000)
