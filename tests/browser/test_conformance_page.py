"""The Conformance page in the browser, on the workspace fetched from the speculative stand-in with the broken
engine's counters imported (session fixture `spec_workspace`, tests/speculative.py): the table and the scatter are
drawn, the CSV download holds the table sorted by gap (a flagged prompt first), and a flagged prompt's link opens
its token view on the Acceptance page (screenshot under out/screenshots/)."""

from __future__ import annotations

from pathlib import Path

import pytest
from serving import until
from speculative import IDS, private_copy
from web import CHROMIUM, NO_CHROMIUM, dashboard, drawn, settle, shot

from dflash_dash.store import Store

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)


def test_browser_shows_table_scatter_and_downloads_csv(spec_workspace, page, tmp_path):
    ws = private_copy(spec_workspace["ws"], tmp_path / "ws")
    run = Store(ws).runs()[-1]["id"]
    page.set_viewport_size({"width": 1500, "height": 1400})
    with dashboard(ws, tmp_path) as url:
        page.goto(f"{url}/conformance?run={run}&engine=bug")
        page.get_by_role("heading", name="Conformance").first.wait_for()
        settle(page)
        page.get_by_text("prompt(s) below the replay").first.wait_for()
        page.locator("[data-testid=stPlotlyChart] .main-svg").first.wait_for()
        page.locator("[data-testid=stDataFrame] canvas").first.wait_for()
        drawn(page)
        assert page.locator("[data-testid=stException]").count() == 0
        shot(page, "conformance")  # the whole page, under out/screenshots/
        with page.expect_download() as dl:
            page.get_by_role("button", name="Download the table (CSV)").click()
        lines = Path(dl.value.path()).read_text().splitlines()
        assert dl.value.suggested_filename == f"conformance-{run}-bug.csv"
        assert lines[0].startswith("prompt,flagged,above,engine_tau,replay_tau,gap") and len(lines) == len(IDS) + 1
        assert lines[1].split(",")[1] == "True"  # most negative gap first: a flagged prompt
        # a flagged prompt's link opens its token view
        first = lines[1].split(",")[0]
        page.locator("a", has_text=first).first.click()
        page.get_by_text(f"Token view · {first}").wait_for()
        until(
            lambda: "acceptance" in page.url and f"prompt={first}" in page.url,
            timeout=10,
            what="the deep link to open the Acceptance page",
        )


def test_browser_round_by_round_and_fault_ranking_open_the_divergent_step(spec_workspace, page, tmp_path):
    """An engine with a planted fault (the stand-in's context-window bug, per-step counters, serving the demo's
    final drafter: a weaker one accepts almost nothing under the fault, so several faults reproduce it and none
    is named with a clear margin): the page shows the round-by-round summary, the fault ranking naming
    context-window with its evidence and margin, and a flagged prompt's first divergent step opens in the token
    view with that step outlined."""
    from speculative import DEMO, one_torch_thread, plant

    from dflash_dash import demo, ops, pipeline
    from dflash_dash.analysis import steps
    from dflash_dash.pipeline import diagnose

    ws = private_copy(spec_workspace["ws"], tmp_path / "ws")
    st = Store(ws)
    healthy = next(c for c in demo.checkpoints(DEMO / demo.CHECKPOINTS) if c.role == "final").path
    with one_torch_thread():
        run = pipeline.replay(st, ops.Replay(drafter=str(healthy), extraction=spec_workspace["extraction"]))["id"]
    plant(st, "context-window", "broken", IDS[:2], drafter=healthy)
    with one_torch_thread():
        got = diagnose.rank_faults(st, run, "broken")
    assert got["explained_by"] == "context-window"
    page.set_viewport_size({"width": 1500, "height": 1400})
    with dashboard(ws, tmp_path) as url:
        page.goto(f"{url}/conformance?run={run}&engine=broken")
        page.get_by_role("heading", name="Round by round").wait_for()
        settle(page)
        page.get_by_text(steps.EVIDENCE["context-window"]).first.wait_for()
        page.get_by_text(f"{got['margin']:.3f} above").first.wait_for()  # the winner's margin over the runner-up
        page.get_by_text("prompts diverging").first.wait_for()
        assert page.locator("[data-testid=stException]").count() == 0
        shot(page, "conformance-faults")
        link = page.locator("a", has_text="step ").filter(has_text="token ").first
        href = link.get_attribute("href")
        assert "pos=" in href and "round=" in href
        pid = link.inner_text().split(":")[0]
        link.click()
        page.get_by_text(f"Token view · {pid}").wait_for()
        page.get_by_text("Outlined: positions").first.wait_for()
        until(lambda: f"prompt={pid}" in page.url, timeout=10, what="the link to open the Acceptance page")
        assert page.locator("[data-testid=stException]").count() == 0
        shot(page, "conformance-divergent-step")


def test_browser_shows_other_drafter_verdict_first(spec_workspace, page, tmp_path):
    """The demo's healthy checkpoint replayed on the completions an engine serving a weaker snapshot produced:
    the page opens on the verdict other-drafter, with the evidence (the engine's draft model beside the replayed
    one, their fingerprints differing) before any number."""
    from speculative import DRAFT, FINAL, one_torch_thread

    from dflash_dash import ops, pipeline

    ws = private_copy(spec_workspace["ws"], tmp_path / "ws")
    with one_torch_thread():
        run = pipeline.replay(
            Store(ws),
            ops.Replay(drafter=str(FINAL), extraction=spec_workspace["extraction"]),
        )["id"]
    page.set_viewport_size({"width": 1500, "height": 1400})
    with dashboard(ws, tmp_path) as url:
        page.goto(f"{url}/conformance?run={run}&engine=sglang")
        page.get_by_role("heading", name="Conformance").first.wait_for()
        settle(page)
        box = page.locator("[data-testid=stAlert]", has_text="Verdict: other-drafter").first
        box.wait_for()
        assert DRAFT.name in box.inner_text() and FINAL.name in box.inner_text()
        page.locator("[data-testid=stDataFrame] canvas").first.wait_for()
        drawn(page)
        first_metric = page.locator("[data-testid=stMetric]").first.bounding_box()
        assert box.bounding_box()["y"] < first_metric["y"]  # the verdict first, the numbers after
        assert page.get_by_text("Conforms").count() == 0
        assert page.locator("[data-testid=stException]").count() == 0
        shot(page, "conformance-other-drafter")


def test_browser_conforming_engine_has_nothing_to_rank(spec_workspace, page, tmp_path):
    """The engine that matches the replay on every prompt (a torch-path replay): the verdict names both taus with two
    decimals, the fault section says there is nothing to rank (no Rank button), and no torch-path caveat is shown
    (it could only explain an engine above the replay)."""
    import re

    ws = private_copy(spec_workspace["ws"], tmp_path / "ws")
    page.set_viewport_size({"width": 1500, "height": 1400})
    with dashboard(ws, tmp_path) as url:
        page.goto(f"{url}/conformance?run={spec_workspace['run']}&engine=sglang")
        page.get_by_role("heading", name="Which fault explains the gap?").wait_for()
        settle(page)
        box = page.locator("[data-testid=stAlert]", has_text="Verdict: conforms").first
        box.wait_for()
        assert re.search(r"engine tau \d+\.\d\d against the replay's \d+\.\d\d ", box.inner_text()), box.inner_text()
        page.get_by_text("nothing to rank").first.wait_for()
        assert page.get_by_role("button", name=re.compile("Rank the faults")).count() == 0
        assert page.get_by_text("torch-path").count() == 0
        assert page.locator("[data-testid=stException]").count() == 0
