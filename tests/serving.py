"""Test helpers (not tests): the local SGLang stand-in as a real subprocess, tiny model folders, polling.

`Served(model, log, delay, extra=[...], engine=..., env={...})` starts `python -m dflash_dash serve` on a free port
speaking `engine`'s protocol (sglang, vllm, llamacpp; `extra`: more serve options, e.g. --health-delay S, --api-key
KEY; `env`: more environment, e.g. VLLM_SERVER_DEV_MODE=1) with that engine's client; `.wait()` polls /health with a
deadline; `.stop()` ends only that process. `until(fn, timeout)` polls a condition with a deadline (the tests never
sleep to synchronise).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from dflash_dash.engines import ENGINES

ROOT = Path(__file__).resolve().parents[1]
# one thread per process: the 2 shared cores are oversubscribed, and torch's thread pool then slows 10x
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def end(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Terminate a child process, killing it if it outlives `grace` seconds; reaps it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def until(fn, timeout: float = 60.0, every: float = 0.05, what: str = "condition"):
    """Poll `fn()` until it returns something truthy; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def status_now(store, job: str) -> str:
    """The job's status after a refresh (which notices dead processes)."""
    from dflash_dash.jobs import lifecycle

    lifecycle.refresh(store)
    return store.job(job)["status"]


def stop_jobs(store) -> None:
    """Cancel the store's jobs still running (cleanup after a failed test)."""
    from dflash_dash.jobs import lifecycle

    for j in lifecycle.active(store):
        lifecycle.cancel(store, j["id"], grace=5)


def tiny_model(folder: Path) -> Path:
    """A tiny hybrid target with a tokenizer (seeded)."""
    from tools import tiny

    tiny.write_target(folder, tiny.TinyTarget())
    tiny.write_tokenizer(folder, vocab_size=512)
    return folder


def serve_argv(model: Path, port: int, delay: float = 0.0, extra: list[str] | None = None) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dflash_dash",
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--startup-delay",
        str(delay),
        *(extra or []),
    ]


class Served:
    """A stand-in server subprocess on a free port."""

    def __init__(
        self,
        model: Path,
        log: Path,
        delay: float = 0.0,
        port: int | None = None,
        extra: list[str] | None = None,
        api_key: str | None = None,
        engine: str = "sglang",
        env: dict[str, str] | None = None,
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.engine = engine
        self.client = ENGINES[engine](self.url, timeout=60, retries=0, api_key=api_key)
        extra = list(extra or []) + (["--api-key", api_key] if api_key else []) + ["--protocol", engine]
        self.proc = subprocess.Popen(
            serve_argv(model, self.port, delay, extra),
            cwd=ROOT,
            env={**ENV, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=open(log, "ab"),
        )

    def wait(self, timeout: float = 120.0) -> Served:
        def check(elapsed, state):
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")

        self.client.wait_ready(timeout, progress=check, poll=0.1)
        return self

    def stop(self) -> None:
        end(self.proc)

    def generates(self) -> int:
        """How many generation requests the server has answered (from its log): its engine's POST route."""
        route = {"sglang": "/generate", "vllm": "/v1/completions", "llamacpp": "/completion"}[self.engine]
        return self.log.read_text().count(f'"POST {route} ')
