"""What one open, idle browser tab costs the dashboard's server: its CPU share while a tab shows each page in turn and
nobody touches it ("idle is idle"; goal: under 2 % of one core per page).

    python benchmarks/bench_idle.py                         # a small planted workspace built under --work (reused)
    python benchmarks/bench_idle.py --workspace cache       # the demo workspace `make run` uses
    python benchmarks/bench_idle.py --app /old/checkout/app.py   # another checkout's app on the same workspace

Figures (`name: value`): `idle_cpu_share_<page>` for Overview, Acceptance (a run with a prompt), Compare (two runs),
Completions, Extraction, Diagnostics and Conformance: the server process's CPU time (user + system, all its threads,
from /proc/PID/stat) over `--seconds` of wall time, as a share of one core, measured after the page is drawn and
`--settle` seconds have passed; `idle_cpu_share_max` the largest. No job runs in the workspace, so nothing should
poll. The notes give the 1-min load average before and after each page.
Contract: the dashboard is the product's own `streamlit run app.py` (bench_browser.serve); the planted workspace is
tools/planted.py's (tiny seeded models, completions imported, runs stored through the product's store step). Chromium
at /usr/bin/chromium (override with DFLASH_CHROMIUM).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from _common import note, report
from bench_browser import drawn, pages, serve

from dflash_dash import launch
from tools.browser import ARGS, CHROMIUM

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (every thread: the script runs, the health poller)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime: fields 14 and 15 of proc(5)


def workspace(a) -> Path:
    """--workspace as given, else the planted workspace under --work (built once: 8 completions, 2 runs)."""
    if a.workspace:
        return Path(a.workspace).resolve()
    ws = Path(a.work).resolve() / "ws"
    if not ws.is_dir():
        from tools import planted

        note(f"building the planted workspace {ws}")
        planted.build(a.work, prompts=8, tokens=256, runs=2)
    return ws


def args_(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", help="a workspace with two runs (default: a planted one under --work)")
    ap.add_argument("--work", default="/tmp/bench-idle", help="where the planted workspace is built")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured idle time per page")
    ap.add_argument("--settle", type=float, default=3.0, help="idle time after the page is drawn, not measured")
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--app", help="the app.py to serve (default: this checkout's)")
    return ap.parse_args(argv)


def main():
    a = args_()
    from playwright.sync_api import sync_playwright

    ws = workspace(a)
    urls = pages(ws) | {"conformance": "conformance"}
    if a.app:  # another checkout's pages on the same workspace (a before/after comparison)
        launch.ROOT = Path(a.app).resolve().parent
    log = Path("/tmp") / f"bench-idle-{os.getpid()}.log"
    app = serve(ws, a.port, log)
    note(f"serving {launch.ROOT / 'app.py'} on {ws}")
    figs: dict = {}
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            ctx = b.new_context(viewport={"width": 1500, "height": 1000})
            for name, path in urls.items():
                page = ctx.new_page()
                page.goto(f"http://127.0.0.1:{a.port}/{path}")
                page.locator("h1").first.wait_for(timeout=120_000)
                drawn(page, name)
                page.wait_for_timeout(a.settle * 1000)
                load0, c0, t0 = os.getloadavg()[0], cpu_s(app.pid), time.perf_counter()
                page.wait_for_timeout(a.seconds * 1000)  # the tab open and untouched
                share = (cpu_s(app.pid) - c0) / (time.perf_counter() - t0)
                figs[f"idle_cpu_share_{name}"] = share
                load1 = os.getloadavg()[0]
                note(f"{name}: {share:.3f} of a core (1-min load average {load0:.2f} before, {load1:.2f} after)")
                page.close()
            b.close()
        figs["idle_cpu_share_max"] = max(figs.values())
    finally:
        app.terminate()
        app.wait(15)
        report(figs)


if __name__ == "__main__":
    main()
