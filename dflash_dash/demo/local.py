"""The demo's local server and what the demo fetches from it: `LocalServer` runs the stand-in on a free port of
127.0.0.1 in a subprocess (`server_argv`), stopped on exit; PROMPT_SET is fetched into SET_NAME, MAX_NEW_TOKENS per
completion. Apart from the build (the package's __init__) so the extras' fetches use it without importing the build.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

PROMPT_SET = "coding-10"  # built-in prompt set the demo fetches (plain text, no chat template)
SET_NAME = "coding-10"  # completion set name in the workspace
MAX_NEW_TOKENS = 256  # completion length cap of the demo fetch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_argv(model: Path, port: int, drafter: Path | None) -> list[str]:
    """The stand-in serving the demo target on `port`, decoding speculatively with `drafter` (the final checkpoint)
    when given: the same greedy completions, and SGLang's per-request statistics with per-step lengths
    (`--speculative-stats detailed`), which the fetch stores as engine `sglang` for the Conformance page."""
    spec = ["--speculative-draft", str(drafter), "--speculative-stats", "detailed"] if drafter else []
    return [sys.executable, "-m", "dflash_dash", "serve", "--model", str(model), "--port", str(port), *spec]


class LocalServer:
    """`python -m dflash_dash serve --model TARGET [--speculative-draft DRAFTER] [EXTRA...]` in a subprocess (one CPU
    thread: fastest for this tiny model, and immune to other processes sharing the cores); stopped on exit."""

    def __init__(self, model: Path, log_file: Path, drafter: Path | None = None, extra: list[str] | None = None):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
        self.log = open(log_file, "ab")
        self.proc = subprocess.Popen(
            [*server_argv(model, self.port, drafter), *(extra or [])],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(Path(__file__).parents[2]),
        )

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
