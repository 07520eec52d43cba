"""Acceptance of a run at T = 0.7 in the browser: tau beside tau_expected with its bound and
rule, the predicted speedup priced on a cost table measured on this CPU (labelled as CPU costs, its measured times
shown), and the "What to serve" advisor with its best setting. The workspace is built by the CLI on the tiny seeded
models of `prepared` (its extraction keeps the target's top-64: extract --target-topk's default): replay
--temperature 0.7, then profile on the CPU at small contexts and sizes (screenshot under out/screenshots/)."""

from __future__ import annotations

import shutil

import pytest
from web import CHROMIUM, dashboard, drawn, open_page, shot

from dflash_dash import cli, metrics
from dflash_dash.pipeline import speed
from dflash_dash.store import Store

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"Debian chromium is not installed at {CHROMIUM}")


@pytest.fixture(scope="module")
def env(prepared, tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e-speed")
    ws = base / "ws"
    shutil.copytree(prepared.workspace, ws, ignore=shutil.ignore_patterns("*.lock"))
    store = Store(ws)
    assert store.extraction(prepared.extraction)["versions"]["target_topk"] == 64

    def run(*args: str) -> None:
        assert cli.main(["--workspace", str(ws), *args]) == 0, args

    run("replay", "--drafter", str(prepared.drafters[0]), "--extraction", prepared.extraction, "--temperature", "0.7")
    rid = store.runs()[-1]["id"]
    run("profile", "--target", str(prepared.target), "--drafter", str(prepared.drafters[0]), "--contexts", "8,64",
        "--sizes", "1,2", "--repeats", "3")  # fmt: skip
    tid = speed.tables(store)[0]["id"]
    got = speed.predicted(store, rid, speed.table(store, tid))
    adv = speed.advise(store, rid, tid)
    (hot,) = [r for r in adv["rows"] if r["kind"] == "temperature"]
    (best,) = [r for r in adv["rows"] if r["best"]]
    with dashboard(ws, base) as url:
        yield {"url": url, "run": store.run_row(rid), "costs": tid, "got": got, "hot": hot, "best": best}


def metric(page, label: str, last: bool = False) -> str:
    """The value of the (first, or `last`) st.metric labelled `label`."""
    box = page.locator("[data-testid=stMetric]").filter(
        has=page.locator("[data-testid=stMetricLabel]").get_by_text(label, exact=True)
    )
    return (box.last if last else box.first).locator("[data-testid=stMetricValue]").inner_text().strip()


def test_acceptance_at_a_temperature_shows_tau_expected_the_speedup_and_the_advisor(env, page):
    s, got = env["run"]["summary"], env["got"]
    open_page(page, env, f"acceptance?run={env['run']['id']}", "Acceptance")
    page.get_by_role("heading", name="What to serve").wait_for()
    drawn(page)
    lo, hi = s["tau_expected_bound"]
    assert (
        metric(page, f"{metrics.label('tau_expected', s)} [low, high]")
        == f"{s['tau_expected']:.2f} [{lo:.2f}, {hi:.2f}]"
    )
    text = page.locator("[data-testid=stMain]").inner_text()
    assert "T = 0.7" in text and "teacher-forced" in text and "target-sample" in text
    assert metric(page, "Predicted speedup") == f"{got['speedup']:.2f}×"
    assert metric(page, "Predicted speedup at T = 0.7") == f"{env['hot']['speedup']:.2f}×"  # tau_expected priced
    cpu = (
        page.locator("[data-testid=stMetric]")
        .filter(has_text="Predicted speedup")
        .locator("[data-testid=stMetricDelta]")
    )
    assert cpu.all_inner_texts() == ["CPU costs", "CPU costs"]
    assert metric(page, "tau (pooled), greedy") == f"{got['tau']:.3f}"
    assert f"cost table {env['costs']}" in text and "CPU costs" in text  # the table named, CPU costs labelled
    best = env["best"]  # a setting under 1x on these CPU costs is no recommendation: said so
    said = f"Best setting to serve: {best['setting']}" if best["speedup"] >= 1 else "No setting beats plain decoding"
    assert said in text and best["setting"] in text
    costs = page.locator("[data-testid=stDataFrame]").filter(has_text="drafter block").first
    costs.scroll_into_view_if_needed()
    drawn(page)
    cells = [c.strip() for c in costs.locator("td").all_text_contents()]
    assert {"8", "64"} <= set(cells), cells  # one row per profiled context length
    table = page.locator("[data-testid=stDataFrame]").filter(has_text="predicted speedup").last
    table.scroll_into_view_if_needed()
    drawn(page)
    shot(page, "acceptance-speed-T0.7")
    cells = [c.strip() for c in table.locator("td").all_text_contents()]  # the grid's accessible table (hidden)
    assert cells.count("★ best") == 1, cells
