"""Training-bug signatures in the browser: Diagnostics opened on a planted anchor-visible run and its healthy reference
(tests/conftest.py `bug_pair`) from a link shows the draft-lag row with this run's figure beside the reference's
(screenshot under out/screenshots/)."""

from __future__ import annotations

import re
import shutil

import pytest
from web import CHROMIUM, dashboard, drawn, open_page, shot

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"Debian chromium is not installed at {CHROMIUM}")

FIGURE = re.compile(r"^(\d\.\d{3}) \[(\d\.\d{3}), (\d\.\d{3})\]$")  # '0.600 [0.575, 0.621]'


@pytest.fixture(scope="module")
def env(bug_pair, tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e-signatures")
    ws = base / "ws"
    shutil.copytree(bug_pair["ws"], ws, ignore=shutil.ignore_patterns("*.lock"))
    with dashboard(ws, base) as url:
        yield {"url": url, **bug_pair}


def test_the_bug_runs_lag_row_shows_beside_the_reference(env, page):
    open_page(page, env, f"diagnostics?sig_run={env['buggy']}&sig_ref={env['healthy']}", "Diagnostics")
    page.get_by_role("heading", name="Training-bug signatures").wait_for()
    table = page.locator("[data-testid=stDataFrame]").filter(has_text="separates?").first
    table.scroll_into_view_if_needed()
    drawn(page)
    row = table.locator("tr").filter(has_text="draft lag at slot 1").first  # the grid's accessible table (hidden)
    row.wait_for(state="attached")
    cells = [c.strip() for c in row.locator("td").all_text_contents()]
    run, ref = (FIGURE.match(c) for c in cells[1:3])
    assert run and ref, cells
    assert float(run[1]) > 0.4 and float(ref[1]) < 0.05  # this run lags; the healthy reference does not
    assert float(run[2]) > float(ref[3])  # the intervals part
    assert cells[4] == "yes" and "anchor-visible" in cells[5], cells
    page.locator("[data-testid=stPlotlyChart]").filter(has_text="this run against the reference").first.wait_for()
    shot(page, "diagnostics-signatures", focus='[data-testid=stDataFrame]:has-text("separates?")')
