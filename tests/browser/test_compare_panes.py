"""Compare in the browser: scrolling pane A scrolls pane B to the same token, and "next difference" moves both
panes to an outlined position (the positions where the acceptance outcome differs, from a hand chain walk)."""

from __future__ import annotations

import shutil

import pytest
from chainwalk import outcome_walk
from web import CHROMIUM, NO_CHROMIUM, dashboard, open_page

from dflash_dash.store import Store

# ---------------------------------------------------------------------------
# the browser: synced scrolling and the next-difference jump

TOP = """(pane) => {  // index of the first token of a pane not entirely above its top edge
  const toks = [...pane.children].filter(e => e.tagName === 'SPAN' && !e.classList.contains('dfv-rej'));
  const top = pane.getBoundingClientRect().top;
  return toks.findIndex(t => t.getBoundingClientRect().bottom > top + 2);
}"""

AT = """(pane, i) => {  // height of token i below the top edge of its pane
  const toks = [...pane.children].filter(e => e.tagName === 'SPAN' && !e.classList.contains('dfv-rej'));
  return toks[i].getBoundingClientRect().top - pane.getBoundingClientRect().top;
}"""


@pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)
def test_panes_scroll_together_and_next_difference_jumps(prepared, tmp_path, page):
    ws = tmp_path / "ws"
    shutil.copytree(prepared.workspace, ws, ignore=shutil.ignore_patterns("*.lock"))
    st_ = Store(ws)
    a_id, b_id = prepared.runs
    comps = {c["prompt_id"]: c for c in st_.completions(prepared.set_name)}
    ra = {r["prompt_id"]: r for r in st_.run_prompts(a_id)}
    rb = {r["prompt_id"]: r for r in st_.run_prompts(b_id)}
    pid = "drafted"  # A drafted this completion itself: long accepted runs in A, not in B
    c = comps[pid]
    P, T = len(c["prompt_ids"]), len(c["prompt_ids"]) + len(c["output_ids"])
    oa, ob = outcome_walk(ra[pid]["accepted_at"], P, T), outcome_walk(rb[pid]["accepted_at"], P, T)
    diff = [i for i in range(T - P) if oa[i] != ob[i]]
    assert len(diff) >= 2
    with dashboard(ws, tmp_path) as url:
        open_page(page, {"url": url}, f"compare?a={a_id}&b={b_id}&prompt={pid}", "Compare")
        root = page.locator(".dfcmp")
        root.wait_for()
        page.wait_for_function("() => document.querySelectorAll('.dfcmp .dfv').length === 2")
        # narrow, short panes, so that these few tokens overflow them and scroll
        page.set_viewport_size({"width": 820, "height": 1000})
        page.add_style_tag(content=".dfcmp .dfv{max-height:56px !important}")
        a, b = root.locator(".dfv").nth(0), root.locator(".dfv").nth(1)
        a.scroll_into_view_if_needed()
        sizes = a.evaluate("e => [e.scrollHeight, e.clientHeight]")
        assert sizes[0] > sizes[1] + 40, sizes
        assert root.locator(".dfv-x").count() == 2 * len(diff)
        # scrolling A scrolls B to the same token
        a.evaluate("e => { e.scrollTop = e.scrollHeight / 3; }")
        page.wait_for_function("() => document.querySelectorAll('.dfcmp .dfv')[1].scrollTop > 0")
        i = a.evaluate(TOP)  # the token at the top of A is at the same height in B
        ya, yb = a.evaluate(AT, i), b.evaluate(AT, i)
        assert i > 0 and abs(ya - yb) <= 2, (i, ya, yb)
        # and scrolling B back to the top scrolls A back
        b.evaluate("e => { e.scrollTop = 0; }")
        page.wait_for_function("() => document.querySelectorAll('.dfcmp .dfv')[0].scrollTop === 0")
        # next difference: both panes move to the first outlined position, then to the next one
        seen = []
        for _ in range(2):
            before = root.get_attribute("data-current")
            root.get_by_role("button", name="next difference ↓").click()
            page.wait_for_function(
                "(b) => document.querySelector('.dfcmp').dataset.current !== b",
                arg=before if before is not None else "undefined",
            )
            i = int(root.get_attribute("data-current"))
            seen.append(i)
            for pane in (a, b):
                cur = pane.locator(".dfcmp-cur")
                assert cur.count() == 1 and "dfv-x" in cur.get_attribute("class")
                assert cur.get_attribute("title").startswith(f"pos {P + i} ")
                assert pane.evaluate("""(p) => { const c = p.querySelector('.dfcmp-cur').getBoundingClientRect(),
                    r = p.getBoundingClientRect(); return c.top >= r.top - 1 && c.bottom <= r.bottom + 1; }""")
            assert root.locator(".dfcmp-where").inner_text().startswith(f"difference {len(seen)} of {len(diff)}")
        assert seen == diff[:2]
        assert a.evaluate("e => e.scrollTop") > 0 or diff[1] < 3
        assert page.evaluate("window.__pwned") is None
