"""Security in the browser: untrusted text (prompt ids, set and run names, completion text, job logs) holding
<script>, HTML, markdown and control characters is shown as text on every page and executes nothing."""

from __future__ import annotations

import json

import pytest
from serving import until
from web import CHROMIUM, dashboard, open_page, settle

from dflash_dash import cli
from dflash_dash.jobs import lifecycle
from dflash_dash.store import Store
from tools import tiny

PWN = "<img src=x onerror=\"window.__pwned='{}'\">"
PID = "<script>window.__pwned='id'</script>" + PWN.format("id2") + " **bold** `code`\x07"
RUN = "<b>run" + PWN.format("run")  # names hold no "/" (ops.check_name): the tag is left open
SET = "set<i>" + PWN.format("set")
OUT = "# Title\n<script>window.__pwned='text'</script>\n" + PWN.format("text") + "\n\x1b[31m[link](javascript:x)"
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"Debian chromium is not installed at {CHROMIUM}")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    from transformers import AutoTokenizer

    base = tmp_path_factory.mktemp("hostile")
    target = tiny.write_target(base / "target", tiny.TinyTarget())
    tiny.write_tokenizer(target, vocab_size=512)
    d = tiny.write_drafter(base / "d", tiny.TinyDrafter(seed=1))
    tok = AutoTokenizer.from_pretrained(target)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    f = base / "c.jsonl"
    f.write_text(
        json.dumps({"id": PID, "prompt": PID, "prompt_ids": enc("def f():\n"), "output": OUT, "output_ids": enc(OUT)})
        + "\n"
    )
    ws = base / "ws"
    for args in (
        ["import-completions", str(f), "--name", SET],
        ["extract", "--target", str(target), "--completions", SET, "--drafter", str(d)],
        ["replay", "--drafter", str(d), "--name", RUN],
        ["replay", "--drafter", str(d), "--tree-budget", "2"],
    ):
        assert cli.main(["--workspace", str(ws), *args]) == 0
    st = Store(ws)
    # a job whose log and error hold hostile text: a replay of a checkpoint path that does not exist
    job = lifecycle.start(st, "replay", {"drafter": str(base / PWN.format("log")), "extraction": "latest"})
    until(lambda: st.job(job)["status"] == "failed", 120, what="the hostile job to fail")
    runs = [r["id"] for r in st.runs()]
    with dashboard(ws, base) as url:
        yield {"url": url, "runs": runs, "ws": ws}


def clean(page) -> None:
    assert page.evaluate("window.__pwned") is None
    assert page.evaluate("document.querySelectorAll('img[src=x], b > img, i > img').length") == 0
    assert page.evaluate("[...document.scripts].filter(s => s.textContent.includes('__pwned')).length") == 0
    assert page.dialogs == []


def test_hostile_text_is_shown_as_text_everywhere(hostile, page):
    a, b = hostile["runs"]
    from urllib.parse import quote

    pid = quote(PID, safe="")
    for path, title, literal in [
        (
            f"completions?set={quote(SET, safe='')}&prompt={pid}",
            "Completions",
            "<script>window.__pwned='text'</script>",
        ),
        (f"acceptance?run={a}&prompt={pid}", "Acceptance", "<script>window.__pwned='id'</script>"),
        (f"acceptance?run={a}&prompt={pid}&section=patterns", "Acceptance", "<script>window.__pwned='id'</script>"),
        (f"compare?a={a}&b={b}&prompt={pid}", "Compare", "<b>run<img"),
        (f"compare?a={a}&b={b}&prompt={pid}&section=calibration", "Compare", "<b>run<img"),
        ("extraction", "Extraction", "set<i>"),
        ("diagnostics", "Diagnostics", None),
    ]:
        open_page(page, hostile, path, title)
        settle(page)
        if literal:  # shown as visible text (innerText skips hidden nodes such as the grid's a11y mirror)
            page.wait_for_function("(s) => document.body.innerText.includes(s)", arg=literal)
        clean(page)


def test_job_log_with_hostile_text_is_text(hostile, page):
    """The failed replay job's error (it names the hostile checkpoint path) shows as text in the job panel."""
    open_page(page, hostile, f"acceptance?run={hostile['runs'][0]}", "Acceptance")
    settle(page)
    page.wait_for_function("(s) => document.body.innerText.includes(s)", arg="window.__pwned='log'")
    clean(page)
