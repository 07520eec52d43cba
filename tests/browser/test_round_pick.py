"""The Acceptance page in the browser: picking a round of the chain walk shows that round's block, the target's
token beside the drafter's top-K candidates per slot, and puts the round in the URL."""

from __future__ import annotations

import shutil

import pytest
from chainwalk import walk_by_hand
from web import CHROMIUM, NO_CHROMIUM, choose, dashboard, open_page, settle, shot

from dflash_dash import replay as rp
from dflash_dash.store import Store

K = rp.ROUND_TOPK

# ---------------------------------------------------------------------------
# the browser


@pytest.fixture(scope="module")
def served(prepared, tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e-rounds")
    ws = base / "ws"
    shutil.copytree(prepared.workspace, ws, ignore=shutil.ignore_patterns("*.lock"))
    with dashboard(ws, base) as url:
        yield {"ws": ws, "url": url, "prepared": prepared}


@pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)
def test_browser_picks_a_round_and_sees_its_block(served, page):
    rid, pid = served["prepared"].runs[0], "drafted"
    st = Store(served["ws"])
    row = {r["prompt_id"]: r for r in st.run_prompts(rid)}[pid]
    comp = {c["prompt_id"]: c for c in st.completions(served["prepared"].set_name)}[pid]
    tokens = comp["prompt_ids"] + comp["output_ids"]
    rounds = walk_by_hand(row, comp)
    T = len(tokens)
    B = st.run_row(rid)["summary"]["block_size"]
    default = next(i for i, (q, x) in enumerate(rounds, 1) if x < min(B - 1, T - 1 - q))  # the first rejection
    n = 3 if default == 2 else 2  # another round than the one shown first
    p, a = rounds[n - 1]
    open_page(page, served, f"acceptance?run={rid}&prompt={pid}", "Acceptance")
    page.get_by_text(f"Token view · {pid}").wait_for()
    box = page.get_by_test_id("stSelectbox").filter(has_text="round of the chain walk")
    choose(page, box, f"round {n} · anchor {p} · accepted {a}/")
    page.locator(".dfr-note", has_text=f"round {n} · anchor {p} (").wait_for()
    settle(page)
    first = page.locator("table.dfr tr").nth(1)  # slot 1: the target's token id beside the drafter's candidates
    assert first.locator("td").nth(0).inner_text() == "1"
    assert first.locator("td").nth(1).inner_text() == str(p + 1)
    assert first.locator("td").nth(2).locator(".dfr-p").inner_text() == str(tokens[p + 1])
    assert page.locator("table.dfr td[title^='token ']").count() == (B - 1) * K
    assert f"round={n}" in page.url
    shot(page, "acceptance-round-detail", focus="table.dfr")
