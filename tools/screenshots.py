"""Screenshots of the dashboard's pages on the demo workspace, for a person to look at (a development tool, not a test).

    .venv/bin/python -m tools.screenshots --workspace /tmp/shots-ws --out /tmp/shots

Contract: builds the demo in the workspace first (`python -m dflash_dash --workspace WS demo`) unless it holds every
demo run already (`demo.built`); starts the product's own `streamlit run app.py` on a free local port
(`launch.app_argv`, no file watcher, no demo server: the sidebar says the server is unreachable), opens each page by
its URL parameters in headless Debian Chromium (Playwright; path and flags from tools/browser.py) and saves one
full-page PNG per screen under OUT:
  overview.png                       the Overview (home page)
  acceptance-final.png               Acceptance of the final run on the torch extraction: the token view of its
                                     prompt with the most rejected drafts (struck through inline; the page's
                                     lowest-tau prompt when none has any) and the Failure patterns section (most
                                     frequent rejections, worst spans)
  acceptance-<bug>.png               the same for each bug run (runs named bug-...: rejections to see)
  compare-final-vs-<bug>.png         Compare, A = that final run, B = the bug run, its One-position draft lag section
  diagnostics-<bug>.png              Diagnostics, Training-bug signatures: the bug run against the final run
  conformance-<engine>.png           Conformance of the final run, one per engine with counters (sglang: conforms;
                                     sglang-faulty: the planted fault; the page shows one engine at a time)
  sweep.png                          Compare's Training sweep section on the healthy run's checkpoints folder
A page is shot once it is drawn (tools/browser.DRAWN: the script run over, no skeleton, every shown chart and table
drawn), never after a fixed delay. For each screenshot it prints the file, then the text of every Streamlit
exception box (`stException`) and error box (`st.error`: the page guard's "Unexpected error ...", or a page's own
finding such as a fault ranking's), indented; the app's log is OUT/streamlit.log. Exit status 1 when a page failed
to draw or showed an exception or the guard's "Unexpected error", else 0.
The app is stopped at the end (SIGTERM, then SIGKILL), and dies with this process (`launch.spawn`).
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

from dflash_dash import demo, launch
from dflash_dash.analysis.trace import trace
from dflash_dash.store import Run, Store
from tools import browser

VIEWPORT = {"width": 1500, "height": 1000}
MAX_HEIGHT = 16000  # px: the viewport grows to the page's height up to this (the PNG stays viewable)
TIMEOUT_MS = 180_000  # a page's first draw on 2 busy cores: Failure patterns computes its tables on first view
# boxes printed under each screenshot: exceptions, and error boxes (the page guard shows an exception as one)
BOXES = "[data-testid=stException], [data-testid=stAlertContentError]"
BUGGY = """(e) => e.dataset.testid === 'stException' || e.innerText.startsWith('Unexpected error')"""
GROW = """() => Math.max(...[...document.querySelectorAll('[data-testid=stMain], section, main')]
    .map(e => e.scrollHeight), document.body.scrollHeight)"""  # Streamlit scrolls inside its main section


def build(ws: Path) -> None:
    """Build the demo in `ws` unless `demo.built` says it holds every demo run (an interrupted build continues)."""
    if demo.built(ws):
        print(f"{ws}: demo already built", flush=True)
        return
    print(f"{ws}: building the demo (minutes on 2 cores)", flush=True)
    subprocess.run([sys.executable, "-m", "dflash_dash", "--workspace", str(ws), "demo"], check=True, cwd=launch.ROOT)


def rejecting(st: Store, run: Run) -> str:
    """`&prompt=P` for the run's prompt with the most rejected drafts in its chain walk, or '' when none has one."""
    comps = {c.prompt_id: c for c in st.completions(run.set_name)}
    B = run.summary["block_size"]
    n = {
        r["prompt_id"]: sum(x is not None for x in trace(r, comps[r["prompt_id"]], B).rejected)
        for r in st.run_prompts(run.id)
        if r["prompt_id"] in comps
    }
    best = max(n, key=n.__getitem__, default=None)
    return f"&prompt={best}" if best is not None and n[best] else ""


def acceptance(st: Store, name: str, run: Run) -> tuple[str, str, str]:
    """Acceptance of `run` on its most-rejecting prompt, with the Failure patterns section."""
    return (f"acceptance-{name}.png", f"acceptance?run={run.id}{rejecting(st, run)}&section=patterns", "worst spans")


def screens(ws: Path) -> list[tuple[str, str, str]]:
    """(file name, URL path with its query, text to wait for) of each screen, the runs found through demo.story."""
    st = Store(ws)
    runs = st.runs()
    story = demo.story(ws, runs)
    if story is None or story["final"]["run"] is None:
        raise SystemExit(f"{ws} is not a built demo workspace (python -m dflash_dash --workspace {ws} demo)")
    fin = next(r for r in runs if r.id == story["final"]["run"])
    torch = [r for r in runs if r.checkpoint == fin.checkpoint and r.backend == "torch"]  # oldest first
    if not torch:
        raise SystemExit(f"{ws}: the final checkpoint {fin.name} has no run on a torch extraction")
    final = next((r for r in torch if r.name == story["final"]["name"]), torch[0])  # not a sampled set's "@T0.7"
    out = [("overview.png", "", "Runs"), acceptance(st, "final", final)]
    by_id = {r.id: r for r in runs}
    for bug in story["bugs"]:
        if bug["run"] is None:
            print(f"  (bug {bug['name']} has no run: skipped)")
            continue
        out.append(acceptance(st, bug["name"], by_id[bug["run"]]))
        pair = f"compare?a={final.id}&b={bug['run']}&section=lag"  # the draft lag: the shortcut's signature
        out.append((f"compare-final-vs-{bug['name']}.png", pair, "draft lag, per slot"))
        out.append(
            (
                f"diagnostics-{bug['name']}.png",
                f"diagnostics?section=signatures&sig_run={bug['run']}&sig_ref={final.id}",
                "signatures separate",
            )
        )
    conf = (story.get("engine") or {}).get("run") or final.id
    set_name = next(r.set_name for r in runs if r.id == conf)
    for engine in st.engines(set_name):
        out.append((f"conformance-{engine}.png", f"conformance?run={conf}&engine={engine}", "Verdict"))
    out.append(("sweep.png", f"compare?section=sweep&sweep={story['folder']}", "tau (macro): mean over prompts"))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(ws: Path, port: int, log) -> subprocess.Popen:
    """The dashboard on `ws` at 127.0.0.1:port, polled until /_stcore/health answers (120 s at most)."""
    app = launch.spawn(launch.app_argv(ws, port, "127.0.0.1", watch=False), stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not launch.serving("127.0.0.1", port):
        if app.poll() is not None or time.monotonic() > deadline:
            launch.end(app)
            raise SystemExit(f"streamlit did not serve (exit status {app.returncode}); see {log.name}")
        time.sleep(0.2)  # polling the server this script started
    return app


def shoot(page, url: str, path: Path, wait_for: str) -> list[tuple[bool, str]]:
    """Open `url`, wait until `wait_for` shows and the page is drawn, grow the viewport to the page's height and
    save a full-page PNG at `path`; returns (an exception or the guard's?, text) of every exception and error box."""
    page.set_viewport_size(VIEWPORT)
    page.goto(url)
    page.get_by_text(wait_for).first.wait_for()
    page.wait_for_function(browser.DRAWN)
    page.set_viewport_size({"width": VIEWPORT["width"], "height": min(int(page.evaluate(GROW)) + 80, MAX_HEIGHT)})
    page.wait_for_function(browser.DRAWN)  # charts drawn again at the new size
    page.screenshot(path=str(path), full_page=True)
    boxes = page.locator(BOXES)
    return [(bool(boxes.nth(i).evaluate(BUGGY)), boxes.nth(i).inner_text().strip()) for i in range(boxes.count())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.screenshots", description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", type=Path, required=True, help="the demo workspace (built when it has no demo)")
    ap.add_argument("--out", type=Path, required=True, help="folder for the PNGs and streamlit.log")
    a = ap.parse_args(argv)
    ws = a.workspace.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    build(ws)
    todo = screens(ws)
    port, bad = free_port(), 0
    from playwright.sync_api import sync_playwright

    with (a.out / "streamlit.log").open("wb") as log:
        app = serve(ws, port, log)
        try:
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=browser.CHROMIUM, args=browser.ARGS)
                page = b.new_context(viewport=VIEWPORT).new_page()
                page.set_default_timeout(TIMEOUT_MS)
                for name, path, wait_for in todo:
                    t0 = time.perf_counter()
                    try:
                        boxes = shoot(page, f"http://127.0.0.1:{port}/{path}", a.out / name, wait_for)
                    except Exception as e:  # noqa: BLE001  (one page failing does not stop the others)
                        boxes = [(True, f"NOT SHOT: {type(e).__name__}: {str(e).splitlines()[0]}")]
                    print(f"{a.out / name}  ({time.perf_counter() - t0:.1f} s)  /{path}", flush=True)
                    for buggy, text in boxes:
                        print(f"    {'BUG' if buggy else 'box'}: " + text.replace("\n", "\n         "), flush=True)
                    bad += any(buggy for buggy, _ in boxes)
                b.close()
        finally:
            launch.end(app)
    print(f"{len(todo)} screens, {bad} failed to draw or showed an exception; app log {a.out / 'streamlit.log'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
