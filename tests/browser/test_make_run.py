"""`make run` as a user meets it: the Makefile's own recipe (`make -o demo run WORKSPACE=W PORT=P`; -o demo: the
session's demo workspace is already built) on a copy of the demo workspace whose config.toml points at a free port.

Checks that the startup output holds no warning or file-watcher lines, that the demo server runs beside the dashboard
on the port of the workspace's config.toml, decoding speculatively with the demo's final checkpoint (a fetch from the
Completions page's button lists its completions and stores the server's speculative counters; an extraction with
`--orchestrate release` frees and restores it), and that SIGTERM to make stops the dashboard and the server with no
process left behind. Nothing sleeps to synchronise: every wait polls a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from serving import ENV, ROOT, free_port, until
from waiting import job_ids, wait_job
from web import ARGS, CHROMIUM, SCREENSHOTS, done_in_panel, open_page

from dflash_dash import demo
from dflash_dash.store import Store

STARTUP_TIMEOUT = 300.0  # a cold start on 2 shared cores: torch imports in the server, Streamlit's own start
NOISE = re.compile(r"warning|inotify|watch", re.I)


@dataclass
class Product:
    ws: Path
    url: str  # the dashboard
    server_url: str  # the demo server: [server] url of ws/config.toml
    make: subprocess.Popen
    log: Path  # make's stdout + stderr (the launcher's and the dashboard's output)
    startup: str  # the log when both answered


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def processes_of(ws: Path) -> list[str]:
    """Command lines of the live processes that name the workspace."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(ws) in cmd:
                out.append(f"{d.name}: {cmd}")
    return out


@pytest.fixture(scope="module")
def product(demo_workspace, tmp_path_factory):
    base = tmp_path_factory.mktemp("makerun")
    ws = base / "ws"
    shutil.copytree(demo_workspace, ws, ignore=shutil.ignore_patterns("*.lock"))
    server_port, port = free_port(), free_port()
    cfg = ws / "config.toml"
    text = cfg.read_text()
    assert re.search(r'(?m)^url = "http://127\.0\.0\.1:\d+"$', text), text  # written by the demo build
    cfg.write_text(re.sub(r"(?m)^url = .*$", f'url = "http://127.0.0.1:{server_port}"', text))
    env = {k: v for k, v in ENV.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    log = base / "make-run.log"
    out = open(log, "wb")
    make = subprocess.Popen(
        ["make", "-o", "demo", "run", f"WORKSPACE={ws}", f"PORT={port}"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    p = Product(ws, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{server_port}", make, log, "")

    def up():
        if make.poll() is not None:
            raise RuntimeError(f"make run exited {make.returncode}:\n{log.read_text()[-3000:]}")
        return answers(p.url + "/_stcore/health") and answers(p.server_url + "/health")

    try:
        until(up, timeout=STARTUP_TIMEOUT, every=0.2, what="the dashboard and the demo server to answer")
        p.startup = log.read_text()
        yield p
    finally:
        if make.poll() is None:
            make.send_signal(signal.SIGTERM)
            try:
                make.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(make.pid, signal.SIGKILL)  # make and the launcher; the children die with the launcher
                make.wait()
        out.close()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed at /usr/bin/chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, request):
    ctx = browser.new_context(viewport={"width": 1500, "height": 1000})
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    yield pg
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(SCREENSHOTS / f"FAILED-{request.node.name}.png"), full_page=True)
    ctx.close()


# ---------------------------------------------------------------------------
# tests (in this order: the last one stops the product)


def test_startup_output_is_quiet(product):
    lines = product.startup.splitlines()
    assert not [line for line in lines if NOISE.search(line)], product.startup
    assert any(f"demo server on {product.server_url}" in line and "(speculative decoding)" in line for line in lines), (
        product.startup
    )
    assert any(product.url in line for line in lines), product.startup  # Streamlit says where it serves


def test_startup_ends_with_the_url_and_where_to_start(product):
    """`make run` ended with a JSON dump and library lines. Once the dashboard answers, its output ends
    with the URL and one line on where to start."""
    from dflash_dash import launch

    until(lambda: launch.START_HERE in product.log.read_text(), timeout=60, every=0.2, what="the where-to-start line")
    lines = [line.strip() for line in product.log.read_text().splitlines() if line.strip()]
    assert lines[-2:] == [f"dflash-dash: the dashboard is ready: {product.url}", f"dflash-dash: {launch.START_HERE}"]


def test_fetch_from_the_demo_server_by_the_button(product, page):
    ws = product.ws
    open_page(page, {"url": product.url}, "completions", "Completions")
    before = job_ids(ws)
    page.get_by_label("completion set name").fill("from-demo")
    page.get_by_label("max new tokens").fill("4")
    page.get_by_test_id("stCheckbox").get_by_text("chat template", exact=True).click()  # off: plain prompts
    page.get_by_role("button", name="Fetch").click()
    job = wait_job(ws, "fetch", before)
    assert job["status"] == "done", job
    assert job["args"]["server"] == product.server_url
    comps = Store(ws).completions("from-demo")
    assert len(comps) == 10 and all(1 <= len(c["output_ids"]) <= 4 for c in comps)
    assert Store(ws).engines("from-demo") == ["sglang"]  # served speculatively: the Conformance page's statistics
    done_in_panel(page, "fetch", job["id"])
    page.get_by_text("from-demo").first.wait_for()  # the page reran and lists the new set


def test_extract_with_orchestration_frees_and_restores_the_demo_server(product):
    ws = product.ws
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "dflash_dash",
            "--workspace",
            str(ws),
            "extract",
            "--target",
            str(ws / "demo" / "target"),
            "--completions",
            "coding-10",
            "--layers",
            "1",
            "--orchestrate",
            "release",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    server_log = (ws / "logs" / "demo-server.log").read_text()
    assert "POST /release_memory_occupation" in server_log and "POST /resume_memory_occupation" in server_log
    assert answers(product.server_url + "/health")
    info = json.loads(urllib.request.urlopen(product.server_url + "/get_server_info", timeout=10).read())
    assert Path(info["model_path"]).resolve() == (ws / "demo" / "target").resolve()
    assert info["speculative_draft_model_path"] == str(demo.served_drafter(ws))  # the final checkpoint


def test_sigterm_to_make_stops_the_dashboard_and_the_server(product):
    product.make.send_signal(signal.SIGTERM)
    until(lambda: product.make.poll() is not None, timeout=60, what="make run to exit")
    until(lambda: not processes_of(product.ws), timeout=60, what=f"no process left: {processes_of(product.ws)}")
    assert not answers(product.url + "/_stcore/health") and not answers(product.server_url + "/health")
    assert "Traceback" not in product.log.read_text(), product.log.read_text()[-3000:]


def test_launcher_refuses_a_bad_config(tmp_path):
    (tmp_path / "config.toml").write_text("[server]\nurl = 3\n")
    p = subprocess.run(
        [sys.executable, "-m", "dflash_dash.launch", "--workspace", str(tmp_path), "--port", str(free_port())],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "url" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_launcher_leaves_a_busy_port_alone(tmp_path, capsys):
    """Something already listens on the configured port: the demo server is not started, one line says why; a free
    port gets the demo server."""
    import socket

    from dflash_dash import config, launch

    (tmp_path / "demo" / "target").mkdir(parents=True)
    (tmp_path / "demo" / "target" / "config.json").write_text("{}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        (tmp_path / "config.toml").write_text(f'[server]\nurl = "http://127.0.0.1:{port}"\n')
        assert launch.demo_server_argv(tmp_path, config.load(tmp_path)) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"port {port}" in err[0] and "already in use" in err[0], err
    argv = launch.demo_server_argv(tmp_path, config.load(tmp_path))
    assert argv[-4:] == ["--model", str((tmp_path / "demo" / "target").resolve()), "--port", str(port)]
