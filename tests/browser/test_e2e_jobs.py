"""In a real browser (headless Chromium, as tests/test_e2e.py): a failed job is dismissed from the jobs panel and
stays gone after a reload; an Overview row opens its run; a Completions row opens its completion's text; the
Extraction page's streaming form evaluates a training folder without feature files and links its runs."""

from __future__ import annotations

import shutil

import pytest
from prepared import CODE_TEXT
from serving import status_now, until
from web import CHROMIUM, dashboard, drawn, open_page, settle

from dflash_dash.jobs import lifecycle
from dflash_dash.store import Store

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian chromium is not installed at /usr/bin/chromium (apt-get install -y chromium)"
)
ROW_H = 35  # glide-data-grid default row height; the header row is as tall


@pytest.fixture(scope="module")
def env(prepared, tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e_jobs")
    ws = base / "ws"
    shutil.copytree(prepared.workspace, ws, ignore=shutil.ignore_patterns("*.lock"))
    with dashboard(ws, base) as url:
        yield {"ws": ws, "url": url, "prepared": prepared, "base": base}


def click_row(page, table, row: int) -> None:
    table.scroll_into_view_if_needed()
    drawn(page)
    table.click(position={"x": 14, "y": ROW_H * (1 + row) + ROW_H / 2})


def test_a_failed_job_is_dismissed_and_stays_gone(env, page):
    ws, p = env["ws"], env["prepared"]
    folder = env["base"] / "not-a-checkpoint"
    folder.mkdir()
    (folder / "notes.txt").write_text("no config.json, no weights")
    st = Store(ws)
    job_id = lifecycle.start(st, "replay", {"drafter": str(folder), "extraction": p.extraction})
    until(lambda: status_now(st, job_id) == "failed", timeout=180, every=0.3, what="the replay job to fail")
    error = st.job(job_id)["error"]
    open_page(page, env, "acceptance", "Acceptance")
    page.locator("[data-testid=stMarkdownContainer]").filter(has_text=job_id).filter(
        has_text="· failed"
    ).first.wait_for(timeout=30_000)
    assert error.splitlines()[0][:60] in page.locator("[data-testid=stMain]").inner_text()
    dismiss = page.get_by_role("button", name="Dismiss")  # the one failed job of this workspace has one
    until(lambda: dismiss.count() == 1, timeout=30, what="the Dismiss button of the failed job")
    dismiss.click()
    until(lambda: st.job(job_id)["dismissed"], timeout=30, what="the job to be dismissed in the store")
    until(lambda: page.get_by_text(job_id).count() == 0, timeout=30, what="the job to leave the panel")
    page.reload()
    page.get_by_role("heading", name="Acceptance").first.wait_for()
    settle(page)
    page.get_by_text("No replay / sweep jobs yet.").wait_for(timeout=30_000)  # the panel has drawn, without it
    assert job_id not in page.locator("[data-testid=stMain]").inner_text()
    listed = {j["id"]: j["dismissed"] for j in lifecycle.recent(st, 50)}  # the CLI's `jobs` still lists it
    assert listed[job_id] is True


def test_an_overview_row_opens_its_run(env, page):
    st = Store(env["ws"])
    runs = sorted(st.runs(), key=lambda r: r["name"])  # by checkpoint within the one extraction
    open_page(page, env, "", "dflash-dash")
    click_row(page, page.locator("[data-testid=stDataFrame]").first, 1)
    page.get_by_role("heading", name="Acceptance").first.wait_for()
    until(
        lambda: f"checkpoint {runs[1]['checkpoint']}" in page.locator("[data-testid=stMain]").inner_text(),
        timeout=60,
        what="the Acceptance page to show the selected run",
    )


def test_a_completions_row_opens_its_text(env, page):
    p = env["prepared"]
    order = [c["prompt_id"] for c in Store(env["ws"]).completions(p.set_name)]
    open_page(page, env, f"completions?set={p.set_name}", "Completions")
    assert order[0] != "code-add"  # the one shown by default is another
    click_row(page, page.locator("[data-testid=stDataFrame]").first, order.index("code-add"))
    page.get_by_text(CODE_TEXT.splitlines()[2].strip()).first.wait_for()  # "return a + b": only code-add's text
    assert page.get_by_text("Write an add function.").count() >= 1  # and its prompt


def test_the_streaming_form_sweeps_a_training_folder_without_feature_files(env, page):
    ws, p = env["ws"], env["prepared"]
    st = Store(ws)
    before = {j["id"] for j in st.jobs()}
    files = set((ws / "features").rglob("*"))
    open_page(page, env, "extraction", "Extraction")
    form = page.locator("[data-testid=stForm]").filter(has=page.get_by_role("button", name="Stream"))
    form.get_by_role("textbox", name="checkpoint folder, or a training output folder").fill(str(p.train))
    form.get_by_role("button", name="Stream").click()

    def done():
        new = [j for j in st.jobs() if j["id"] not in before]
        return new[0] if new and new[0]["status"] not in lifecycle.ACTIVE else None

    job = until(done, timeout=180, every=0.3, what="the streaming job to end")
    assert (job["kind"], job["status"], job["args"]["stream"]) == ("sweep", "done", True), job["error"]
    runs = job["result"]["runs"]
    assert len(runs) == 2 and set((ws / "features").rglob("*")) == files  # no feature file written
    link = page.get_by_role("link", name=runs[0])  # the job panel's result links each run to its Acceptance page
    link.wait_for(timeout=30_000)
    assert link.get_attribute("href").endswith(f"acceptance?run={runs[0]}")  # Streamlit opens it in a new tab
    page.goto(f"{env['url']}/acceptance?run={runs[0]}")
    page.get_by_role("heading", name="Acceptance").first.wait_for()
    until(
        lambda: "computed by streaming" in page.locator("[data-testid=stMain]").inner_text(),
        timeout=60,
        what="Acceptance to say the run was streamed",
    )
