"""What `make run` runs: the dashboard, and beside it the demo workspace's local server, stopped together.

Contract: `python -m dflash_dash.launch [--workspace W] [--port P] [--address A]` starts
`streamlit run app.py -- --workspace W` on A:P (output on this terminal) and, when W is a demo workspace
(`W/demo/target` exists), the local SGLang stand-in serving that target (`python -m dflash_dash serve`, decoding
speculatively with the demo's final checkpoint: `demo.server_argv`) on the port
of `[server] url` in `W/config.toml` (written by `demo.configure` when absent), its output in
`W/logs/demo-server.log`. It does not start the server when the url is not on this machine or something already
listens on its port (the dashboard then uses what is there; one line says so). Both children run in their own
sessions and get SIGTERM if this process dies (Linux); SIGINT (Ctrl-C), SIGTERM or SIGHUP to this process, or the
dashboard exiting, stops both and reaps them: no orphans. The server exiting early is reported (one line naming
its log) and the dashboard runs on. Once the dashboard answers, the last two lines are its URL and where to
start. Exit status: 0 when stopped by a signal, else the dashboard's; 2 with a
one-line message for a bad config.toml.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from . import config as config_mod, demo
from .errors import UserError

ROOT = Path(__file__).resolve().parents[1]
STOP = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # signals that stop the dashboard and the server
GRACE_S = 10.0  # SIGKILL a child that outlives SIGTERM by this long
TICK_S = 0.5  # how often the children are looked at
LOCAL = ("127.0.0.1", "localhost", "::1")


def say(msg: str) -> None:
    print(f"dflash-dash: {msg}", file=sys.stderr, flush=True)


def _child_setup(parent: int, prctl) -> None:
    """In the child, before exec: die with the launcher (Linux PR_SET_PDEATHSIG)."""
    if prctl is not None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def spawn(argv: list[str], **kw) -> subprocess.Popen:
    prctl, parent = _prctl(), os.getpid()
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=lambda: _child_setup(parent, prctl),
        **kw,
    )


def listening(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def demo_server_argv(ws: Path, cfg: config_mod.WorkspaceConfig) -> list[str] | None:
    """The command that serves the demo target on the port of the workspace's server url, or None (with a line
    saying why) when there is nothing to start."""
    target = ws / "demo" / demo.TARGET
    if not (target / "config.json").is_file():
        return None
    u = urlsplit(cfg.server_url)
    if u.scheme != "http" or u.hostname not in LOCAL or not u.port:
        say(
            f"[server] url {cfg.server_url} in {config_mod.path_of(ws)} is not a port on this machine; the demo "
            "server is not started, the dashboard uses that url"
        )
        return None
    if listening(u.hostname, u.port):
        say(
            f"port {u.port} of {cfg.server_url} is already in use; the dashboard uses the server there (the demo "
            f"server is not started: stop that process, or change url in {config_mod.path_of(ws)})"
        )
        return None
    return demo.server_argv(target.resolve(), u.port, demo.served_drafter(ws))


def served_with(argv: list[str]) -> str:
    """' with drafter CKPT (speculative decoding)' for a server command that decodes speculatively, else ''."""
    flag = "--speculative-draft"
    return f" with drafter {argv[argv.index(flag) + 1]} (speculative decoding)" if flag in argv else ""


def app_argv(ws: Path, port: int, address: str, watch: bool = True) -> list[str]:
    """`streamlit run app.py -- --workspace ws` on address:port (`watch` False: no file watcher, for tests)."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ROOT / "app.py"),
        "--server.address",
        address,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        *([] if watch else ["--server.fileWatcherType", "none"]),
        "--",
        "--workspace",
        str(ws),
    ]


START_HERE = (
    "start on Overview (the demo's runs by extraction), then Compare: the final checkpoint against the buggy one; "
    "Ctrl-C stops the dashboard and the demo server"
)  # the last line `make run` prints on a demo workspace


def url_of(address: str, port: int) -> str:
    return f"http://{'127.0.0.1' if address in ('0.0.0.0', '::') else address}:{port}"


def serving(address: str, port: int) -> bool:
    """True once the dashboard answers /_stcore/health with 200 (its own startup lines are printed by then)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url_of(address, port) + "/_stcore/health", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def end(*procs: subprocess.Popen | None) -> None:
    """SIGTERM to every live process at once, then SIGKILL to any that outlives GRACE_S; reaps them."""
    live = [p for p in procs if p is not None and p.poll() is None]
    for p in live:
        p.terminate()
    for p in live:
        try:
            p.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run(workspace: str | Path, port: int, address: str) -> int:
    ws = Path(workspace).resolve()
    if (ws / "demo" / demo.TARGET).is_dir():
        demo.configure(ws)
    cfg = config_mod.load(ws)
    server_cmd = demo_server_argv(ws, cfg)
    stopped: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: stopped.append(signum)) for s in STOP}
    server = app = log = None
    try:
        if server_cmd:
            (ws / "logs").mkdir(parents=True, exist_ok=True)
            log_path = ws / "logs" / "demo-server.log"
            log = open(log_path, "ab")
            env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
            server = spawn(server_cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            say(
                f"demo server on {cfg.server_url} (the workspace's [server] url), serving {ws / 'demo' / demo.TARGET}"
                f"{served_with(server_cmd)}; log {log_path}; it stops with the dashboard"
            )
        app = spawn(app_argv(ws, port, address))
        started = False
        while not stopped and app.poll() is None:
            if not started and (started := serving(address, port)):
                say(f"the dashboard is ready: {url_of(address, port)}")
                say(START_HERE if (ws / "demo" / demo.TARGET).is_dir() else "start on Overview; Ctrl-C stops it")
            if server is not None and server.poll() is not None:
                say(
                    f"the demo server exited with status {server.returncode}; see {log_path}. The dashboard "
                    "runs on without it"
                )
                server = None
            try:
                app.wait(TICK_S)
            except subprocess.TimeoutExpired:
                pass
    finally:
        end(app, server)
        if log is not None:
            log.close()
        for s, h in old.items():
            signal.signal(s, h)
    return 0 if stopped else app.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash_dash.launch", description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", default="cache", help="workspace folder (default cache/)")
    ap.add_argument("--port", type=int, default=8501, help="dashboard port (default 8501)")
    ap.add_argument("--address", default="127.0.0.1", help="dashboard address (default 127.0.0.1)")
    a = ap.parse_args(argv)
    try:
        return run(a.workspace, a.port, a.address)
    except UserError as e:
        say(f"error: {e}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
