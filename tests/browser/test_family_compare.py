"""Families side by side in the browser: one extraction holding the union of a DFlash, a DSpark and a DFlash2
drafter's target layers, three runs on it, Compare between the DFlash and the DSpark run (both token panes drawn,
each titled with its family), and the family sections of Acceptance: the DSpark run's confidence head and the
DFlash2 run's top-K headroom."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest
from web import CHROMIUM, NO_CHROMIUM, dashboard, open_page, settle, shot

from dflash_dash import cli
from dflash_dash.store import Store
from tools import tiny

FAMILIES = {  # name -> (TinyDrafter fields): each family taps other target layers
    "dspark": dict(
        architecture="DSparkDraftModel",
        target_layer_ids=[2, 5],
        family_fields=dict(
            projector_type="dspark",
            markov_rank=4,
            markov_head_type="gated",
            enable_confidence_head=True,
            confidence_head_with_markov=True,
        ),
    ),
    "dflash2": dict(
        architecture="DFlash2DraftModel",
        target_layer_ids=[3, 4],
        family_fields=dict(conv_kernel_size=2, conv_group_size=16, selector_rank=4, selector_top_k=8),
    ),
}


def run_cli(ws, *args: str) -> dict | None:
    """The CLI in-process; its stdout as JSON when it is one document."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = cli.main(["--workspace", str(ws), *args])
    assert rc == 0, (args, out.getvalue()[-2000:])
    with contextlib.suppress(ValueError):
        return json.loads(out.getvalue())
    return None


@pytest.fixture(scope="module")
def families(prepared, tmp_path_factory):
    base = tmp_path_factory.mktemp("families")
    ws = base / "ws"
    shutil.copytree(prepared.workspace, ws, ignore=shutil.ignore_patterns("*.lock"))
    cks = {"dflash": prepared.drafters[0]}
    for name, fields in FAMILIES.items():
        cks[name] = tiny.write_drafter(base / name, tiny.TinyDrafter(seed=5, **fields))
    st = Store(ws)
    before = {e["id"] for e in st.extractions()}
    drafters = [a for ck in cks.values() for a in ("--drafter", str(ck))]
    run_cli(ws, "extract", "--target", str(prepared.target), "--completions", prepared.set_name, *drafters)
    (ex,) = [e for e in st.extractions() if e["id"] not in before]
    assert ex["layer_ids"] == [1, 2, 3, 4, 5]  # the union of [1, 4], [2, 5] and [3, 4]
    runs = {}
    for name, ck in cks.items():
        run_cli(ws, "replay", "--drafter", str(ck), "--extraction", ex["id"], "--tree-budget", "0", "--name", name)
        runs[name] = next(r for r in reversed(st.runs()) if r["name"] == name and r["extraction_id"] == ex["id"])
    assert {r["summary"]["family"] for r in runs.values()} == {"DFlash", "DSpark", "DFlash2"}
    assert runs["dspark"]["summary"]["block_size"] == 5  # DSpark drafts B = 4 tokens from the anchor's slot
    with dashboard(ws, base) as url:
        yield {"url": url, "runs": runs}


@pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)
def test_compare_between_families_on_one_extraction(families, page):
    a, b = families["runs"]["dflash"]["id"], families["runs"]["dspark"]["id"]
    open_page(page, families, f"compare?a={a}&b={b}&prompt=drafted", "Compare")
    root = page.locator(".dfcmp")
    root.wait_for()
    page.wait_for_function("() => document.querySelectorAll('.dfcmp .dfv').length === 2")
    text = root.inner_text()
    assert "A · dflash (DFlash)" in text and "B · dspark (DSpark)" in text
    assert page.locator("[data-testid=stException]").count() == 0
    shot(page, "compare-families")


@pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)
def test_family_sections_of_acceptance(families, page):
    runs = families["runs"]
    open_page(page, families, f"acceptance?run={runs['dspark']['id']}&section=confidence", "Acceptance")
    page.get_by_text("confidence head ECE").first.wait_for()
    page.get_by_text("stop threshold t").first.wait_for()
    settle(page)
    assert page.locator("[data-testid=stException]").count() == 0
    shot(page, "acceptance-confidence-head")
    open_page(page, families, f"acceptance?run={runs['dflash2']['id']}&section=headroom", "Acceptance")
    page.get_by_text("oracle tau over the top-8").first.wait_for()  # DFlash2 keeps its 8 candidates
    assert page.get_by_text("DFlash2", exact=False).count() > 0
    assert page.locator("[data-testid=stException]").count() == 0
    shot(page, "acceptance-headroom")
