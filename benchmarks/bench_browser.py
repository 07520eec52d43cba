"""Pages as a user feels them: from navigation to everything drawn, in headless Debian Chromium
(Playwright) against `streamlit run app.py` on the demo workspace, warm (each page opened once before timing).

    python benchmarks/bench_browser.py --workspace cache        # the demo workspace `make run` uses
    python benchmarks/bench_browser.py --workspace W --reps 5

Figures (`name: value`): `browser_page_s_<page>` for Overview, Acceptance (a run with its token view open), Compare,
Completions, Extraction and Diagnostics: the median over `--reps` of the seconds from `page.goto` to the page's heading
shown, Streamlit's script run finished (the app's script state `notRunning`: the status widget does not show in a
headless browser), no skeleton left, every shown plotly chart and table drawn; `browser_page_s_max` the slowest.
`browser_nav_s_<page>`: the same pages reached as a user moves between them in one open tab, by a click on the sidebar's
link (Streamlit switches the page without reloading its scripts; Acceptance and Compare open with their defaults: the
newest run with its lowest-tau prompt's token view, the newest pair), from the click to everything drawn;
`browser_nav_s_max` the slowest. With `--sections`, also `browser_section_s_<page>_<section>`: Acceptance, Compare and
Diagnostics opened with an optional section shown (drawn only when chosen, `section=...`). The notes give each page's
times with the machine's 1-min load average before and after.
Contract: reads the workspace only (the dashboard it starts is the product's own `streamlit run app.py`); it
builds nothing. Chromium at /usr/bin/chromium (override with DFLASH_CHROMIUM).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

from _common import ROOT, note, report

from dflash_dash import launch
from tools.browser import ARGS, CHROMIUM, DRAWN


def serve(ws: Path, port: int, log: Path) -> subprocess.Popen:
    """The dashboard on `ws`, polled until /_stcore/health answers."""
    app = subprocess.Popen(
        launch.app_argv(ws, port, "127.0.0.1", watch=False),
        cwd=ROOT,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if app.poll() is not None:
            raise RuntimeError(f"streamlit exited {app.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return app
        except OSError:
            time.sleep(0.2)  # a benchmark polling a server it started, not a test
    app.kill()
    raise RuntimeError("streamlit did not serve within 120 s")


def pages(ws: Path) -> dict[str, str]:
    """Page name -> URL path, the Acceptance and Compare pages on real runs of the workspace."""
    from dflash_dash.store import Store

    st = Store(ws)
    runs = st.runs()
    if len(runs) < 2:
        raise SystemExit(f"{ws}: needs two runs (build the demo: python -m dflash_dash --workspace {ws} demo)")
    a = runs[0]
    same = [r for r in runs if r["extraction_id"] == a["extraction_id"] and r["id"] != a["id"]]
    b = (same or runs[1:])[0]
    pid = st.completion_index(a["set_name"])[0]["prompt_id"]
    return {
        "overview": "",
        "acceptance": f"acceptance?run={a['id']}&prompt={pid}",
        "compare": f"compare?a={a['id']}&b={b['id']}&prompt={pid}",
        "completions": "completions",
        "extraction": "extraction",
        "diagnostics": "diagnostics",
    }


TITLES = {
    "overview": ("Overview", "dflash-dash"),
    "acceptance": ("Acceptance", "Acceptance"),  # link, heading
    "compare": ("Compare", "Compare"),
    "completions": ("Completions", "Completions"),
    "extraction": ("Extraction", "Extraction"),
    "diagnostics": ("Diagnostics", "Diagnostics"),
}


def drawn(page, name: str) -> None:
    try:
        page.wait_for_function(DRAWN, timeout=120_000)
    except Exception:
        page.screenshot(path=f"/tmp/bench-browser-{name}.png")
        raise RuntimeError(f"{name}: not drawn within 120 s (screenshot /tmp/bench-browser-{name}.png)") from None


def navigate(page, reps: int, figs: dict) -> None:
    """browser_nav_s_<page>: a click on each page's sidebar link in turn, `reps` rounds after one untimed round."""
    times: dict[str, list[float]] = {n: [] for n in TITLES}
    for rep in range(reps + 1):
        for name, (link, heading) in TITLES.items():
            t0 = time.perf_counter()
            page.locator("[data-testid=stSidebarNav] a").filter(has_text=link).first.click()
            page.get_by_role("heading", name=heading).first.wait_for(timeout=120_000)
            drawn(page, f"nav-{name}")
            if rep:
                times[name].append(time.perf_counter() - t0)
    for name, ts in times.items():
        figs[f"browser_nav_s_{name}"] = statistics.median(ts)
        note(f"nav {name}: {' '.join(f'{t:.2f}' for t in ts)} s")
    figs["browser_nav_s_max"] = max(figs[f"browser_nav_s_{n}"] for n in TITLES)


def sections(urls: dict[str, str]) -> dict[str, str]:
    """The optional sections, drawn only when chosen (&section=...): figures beside the goal, not in its max."""
    return {
        "acceptance_charts": urls["acceptance"] + "&section=charts",
        "acceptance_calibration": urls["acceptance"] + "&section=calibration",
        "acceptance_patterns": urls["acceptance"] + "&section=patterns",
        "compare_charts": urls["compare"] + "&section=charts",
        "compare_calibration": urls["compare"] + "&section=calibration",
        "compare_lag": urls["compare"] + "&section=lag",
        "diagnostics_parity": urls["diagnostics"] + "?section=parity",
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", default=str(ROOT / "cache"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument(
        "--sections",
        action="store_true",
        help="also time Acceptance and Compare with each optional section open (browser_section_s_*)",
    )
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    ws = Path(a.workspace).resolve()
    urls = pages(ws)
    goal = [f"browser_page_s_{n}" for n in urls]
    if a.sections:
        urls |= sections(urls)
    log = Path("/tmp") / f"bench-browser-{os.getpid()}.log"
    app = serve(ws, a.port, log)
    figs: dict = {}
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = b.new_context(viewport={"width": 1500, "height": 1000}).new_page()
            for name, path in urls.items():
                times, load0 = [], os.getloadavg()[0]
                for rep in range(a.reps + 1):  # the first opening warms the server's caches: not timed
                    t0 = time.perf_counter()
                    page.goto(f"http://127.0.0.1:{a.port}/{path}")
                    page.locator("h1").first.wait_for(timeout=120_000)
                    drawn(page, name)
                    if rep:
                        times.append(time.perf_counter() - t0)
                kind = "page" if f"browser_page_s_{name}" in goal else "section"
                figs[f"browser_{kind}_s_{name}"] = statistics.median(times)
                note(
                    f"{name}: {' '.join(f'{t:.2f}' for t in times)} s (1-min load average {load0:.2f} before, "
                    f"{os.getloadavg()[0]:.2f} after)"
                )
            load0 = os.getloadavg()[0]
            navigate(page, a.reps, figs)
            note(f"navigation: 1-min load average {load0:.2f} before, {os.getloadavg()[0]:.2f} after")
            b.close()
        figs["browser_page_s_max"] = max(figs[k] for k in goal)
    finally:
        app.terminate()
        app.wait(15)
        report(figs)


if __name__ == "__main__":
    main()
