"""Ray across hosts: `--ray HOST:PORT` joins a cluster that ANOTHER process started the default way, as a user on
another host would. The cluster is a Python process's `ray.init()` (Ray 2.60 turns token authentication on for it
and writes its token to that process's ~/.ray/auth_token), started once for this module and stopped in teardown.
The CLI runs as its own process with its own HOME (no token of its own): given the cluster's token by
RAY_AUTH_TOKEN_PATH, its replay runs on the cluster's workers and equals the one-process run; without a token, or
with one that is not the cluster's, it is refused in one line (exit 2) that says it is the token, names where the
token came from and the fix, and nothing is stored. Ray's side: ray/_private/worker.py (`ray.init` never turns
token mode on for an explicit address), ray/_private/authentication/authentication_token_setup.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_ray import same_runs

from dflash_dash.store import Store

ray = pytest.importorskip("ray")

CPUS = 2  # CPU slots of the other process's cluster (this machine's cores)

HEAD = """import sys, ray
ray.init(num_cpus=int(sys.argv[2]), include_dashboard=False, _temp_dir=sys.argv[1], logging_level="WARNING")
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # up until the test closes its stdin
ray.shutdown()
"""


@dataclass(frozen=True)
class Head:
    address: str  # the cluster's GCS address, HOST:PORT as the head process printed it
    token: Path  # the token file its ray.init() wrote (that process's ~/.ray/auth_token)


def env(home: Path, **extra: str) -> dict[str, str]:
    """This environment for a process whose HOME is `home`, without Ray's variables (a test process's own
    `ray.init()` leaves RAY_AUTH_MODE set), plus `extra`."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {"HOME": str(home)} | extra


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A Ray cluster started by another process the default way (its own HOME, no Ray variables), for this module."""
    base = tmp_path_factory.mktemp("head")
    (base / "home").mkdir()
    tmp = tempfile.mkdtemp(prefix="rayh", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    with open(base / "head.err", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", HEAD, tmp, str(CPUS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            text=True, env=env(base / "home"),
        )  # fmt: skip
    try:
        address = proc.stdout.readline().strip()  # its first line, once the cluster is up (empty: it ended)
        assert address, (base / "head.err").read_text()
        token = base / "home" / ".ray" / "auth_token"
        assert token.is_file()  # the default way: ray.init() turned token authentication on and wrote the token
        yield Head(address, token)
    finally:
        proc.stdin.close()  # the head shuts its cluster down and ends
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def cli(ws: Path, environ: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dflash_dash", "--workspace", str(ws), *args],
        env=environ, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def replay(prepared, head: Head) -> list[str]:
    return ["replay", "--drafter", str(prepared.drafters[0]), "--extraction", prepared.extraction, "--force",
            "--ray", head.address, "--ray-cpus", str(CPUS)]  # fmt: skip


def test_a_cluster_another_process_started_is_joined_by_address(prepared, workspace_copy, head, tmp_path):
    (tmp_path / "other").mkdir()  # another host's user: no ~/.ray of its own
    p = cli(workspace_copy, env(tmp_path / "other", RAY_AUTH_TOKEN_PATH=str(head.token)), *replay(prepared, head))
    assert p.returncode == 0, p.stderr
    assert f"{CPUS} cpu workers on the Ray cluster at {head.address}" in p.stderr
    assert "[worker 1," in p.stderr and "[worker 2," in p.stderr  # both of the cluster's workers had prompts
    same_runs(Store(workspace_copy), prepared.runs[0], json.loads(p.stdout)["id"])  # equal to the one-process run


def test_a_missing_or_wrong_token_is_refused_as_such(prepared, workspace_copy, head, tmp_path):
    st = Store(workspace_copy)
    before = len(st.runs())
    (tmp_path / "other").mkdir()
    wrong = tmp_path / "wrong_token"
    wrong.write_text(head.token.read_text()[::-1])  # the cluster's token, reversed
    for environ, said in [
        (env(tmp_path / "other"), "the cluster requires Ray's token authentication and this host has no token"),
        (
            env(tmp_path / "other", RAY_AUTH_TOKEN_PATH=str(wrong)),
            f"the cluster refused the authentication token from RAY_AUTH_TOKEN_PATH ({wrong}): it is not the "
            f"cluster's token; write the cluster's token (`ray get-auth-token` on its head prints it) into {wrong}",
        ),
    ]:
        p = cli(workspace_copy, environ, *replay(prepared, head))
        assert p.returncode == 2, p.stderr
        assert p.stderr.splitlines() == [p.stderr.strip()], p.stderr  # one line
        assert p.stderr.startswith(f"error: ray {head.address}: {said}"), p.stderr
        assert "ray get-auth-token" in p.stderr and "Failed to connect" not in p.stderr
    assert len(st.runs()) == before  # nothing was stored
