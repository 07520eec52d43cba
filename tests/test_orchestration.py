"""Extraction jobs that free the GPU from a real stand-in server process and restore it: the memory-release
path, the stop/start command path (a pid-file script that really stops and starts a server process), the
restore after a failed extraction, rerun resuming the partial extraction; and the workspace config."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
from dataclasses import asdict
from pathlib import Path

import pytest
from serving import ENV, Served, free_port, serve_argv, stop_jobs, tiny_model, until

from dflash_dash import config
from dflash_dash.engines import SGLangClient
from dflash_dash.jobs import dispatch, gpu, lifecycle, orchestrate
from dflash_dash.store import Store

LAYERS = [1, 4]
CTL = '''"""Test stand-in for `systemctl start|stop sglang`: a server process tracked by a pid file."""
import json, os, signal, subprocess, sys, time
from pathlib import Path

cmd, state = sys.argv[1], Path(sys.argv[2])
pidfile = state / "server.pid"


def alive(pid):
    try:
        os.kill(pid, 0)
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (ProcessLookupError, FileNotFoundError):
        return False


if cmd == "start":
    p = subprocess.Popen(json.loads((state / "argv.json").read_text()), start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=open(state / "server.log", "ab"))
    pidfile.write_text(str(p.pid))
    print(f"started server pid {p.pid}")
else:
    pid = int(pidfile.read_text())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while alive(pid):
        if time.monotonic() > deadline:
            sys.exit(f"server pid {pid} did not stop")
        time.sleep(0.05)
    pidfile.unlink()
    print(f"stopped server pid {pid}")
'''


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def srv(model, tmp_path_factory):
    s = Served(model, tmp_path_factory.mktemp("srvlog") / "server.log").wait()
    yield s
    s.stop()


STORES: list[Store] = []  # workspaces of the running test


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # inherited by job processes (2 shared cores)
    yield
    while STORES:
        stop_jobs(STORES.pop())


def workspace(tmp_path: Path, url: str, extra: str = "") -> Store:
    ws = tmp_path / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "config.toml").write_text(f'[server]\nurl = "{url}"\nreadiness_timeout = 120\n{extra}')
    STORES.append(Store(ws))
    return STORES[-1]


def completions(n: int, bad: int | None = None) -> list[dict]:
    """n completions of token ids (< 512); `bad`: that one holds an id outside the target's vocabulary."""
    out = [
        {"id": f"p{i}", "prompt_ids": [10 + i, 20, 30, 40, 50], "output_ids": [60 + i, 70, 80, 90, 100, 110]}
        for i in range(n)
    ]
    if bad is not None:
        out[bad]["output_ids"] = [60, 9999]
    return out


def add_set(store: Store, name: str, recs: list[dict]) -> None:
    store.add_set(name, "test")
    for i, r in enumerate(recs):
        store.add_completion(name, r | {"idx": i})


def finish(store: Store, job: str, watch=None) -> dict:
    """Wait for the job to end; at that very moment also record the server's health."""
    until(lambda: store.job(job)["status"] not in lifecycle.ACTIVE, 180, every=0.02, what=f"job {job}")
    health = watch() if watch else None
    return asdict(store.job(job)) | {"health_at_end": health}  # the row's columns and the health, as a plain dict


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def in_order(text: str, *parts: str) -> bool:
    pos = 0
    for p in parts:
        pos = text.find(p, pos)
        if pos < 0:
            return False
    return True


class Watcher:
    """Polls /health in a thread while a job runs: the states seen."""

    def __init__(self, client):
        self.client, self.states, self.stop = client, [], threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            self.states.append(self.client.health(timeout=2)[1])
            self.stop.wait(0.03)

    def end(self) -> list[str]:
        self.stop.set()
        self.t.join()
        return self.states


# ---------------------------------------------------------------------------
# memory-release path


def test_release_path_frees_and_restores_the_server_also_after_a_failure(srv, model, tmp_path):
    store = workspace(tmp_path, srv.url)
    add_set(store, "s", completions(3, bad=2))
    released = srv.log.read_text().count("memory released")

    # 1. the extraction fails after the GPU was freed: the server is restored all the same
    job = lifecycle.start(
        store,
        "extract",
        {"target": str(model), "completions": "s", "layers": LAYERS, "device": "cpu", "orchestrate": "release"},
    )
    row = finish(store, job, srv.client.health)
    log = lifecycle.log_tail(store, job)
    assert row["status"] == "failed", log
    assert row["error"] == (
        "prompt 'p2': token id 9999 is outside the target's vocabulary (512); wrong target for this completion set?"
    )
    assert row["health_at_end"] == (True, "ready")
    assert in_order(
        log,
        "releasing server memory (POST /release_memory_occupation)",
        "extraction stopped (InputError",
        "restoring server (POST /resume_memory_occupation)",
        "server ready",
        "error: prompt 'p2'",
    )
    ex = row["result"]["extraction"]
    assert store.extraction(ex)["status"] == "failed"
    kept = {r["prompt_id"]: Path(r["file"]).stat().st_mtime_ns for r in store.items(ex)}
    assert sorted(kept) == ["p0", "p1"]

    # 2. fix the bad completion and rerun: the same extraction continues with the missing prompt only
    store.add_completion("s", completions(3)[2] | {"idx": 2})
    again = lifecycle.rerun(store, job)
    assert store.job(again)["args"]["extraction_id"] == ex
    w = Watcher(srv.client)
    row = finish(store, again, srv.client.health)
    states = w.end()
    log = lifecycle.log_tail(store, again)
    assert row["status"] == "done", log
    assert row["result"] == {"extraction": ex}
    assert row["health_at_end"] == (True, "ready")  # ready BEFORE the job reported done
    assert "503 memory released" in states  # the server really had no model while the job extracted
    assert in_order(
        log,
        "disk: writes ",  # the bytes of the one prompt left and the free space, before the server is touched
        "over 1 prompts, margin included",
        "releasing server memory (POST /release_memory_occupation)",
        "checking GPU memory",
        "device cpu: no CUDA device in use, GPU memory check skipped",
        "loading target",
        "extracting 3/3",
        "restoring server (POST /resume_memory_occupation)",
        "waiting for /health",
        "server ready",
        "done: ",
    )
    items = {r["prompt_id"]: Path(r["file"]).stat().st_mtime_ns for r in store.items(ex)}
    assert sorted(items) == ["p0", "p1", "p2"] and all(items[k] == v for k, v in kept.items())
    assert store.extraction(ex)["status"] == "done"
    assert [e["id"] for e in store.extractions()] == [ex]
    server_log = srv.log.read_text()
    assert server_log.count("memory released") == released + 2
    assert in_order(server_log, "memory released", "memory resumed", "memory released", "memory resumed")


def test_cancelled_extraction_restores_the_server(srv, model, tmp_path):
    store = workspace(tmp_path, srv.url)
    add_set(
        store,
        "long",
        [{"id": f"p{i}", "prompt_ids": list(range(10, 110)), "output_ids": list(range(110, 210))} for i in range(40)],
    )
    job = lifecycle.start(
        store,
        "extract",
        {"target": str(model), "completions": "long", "layers": LAYERS, "device": "cpu", "orchestrate": "release"},
    )
    until(
        lambda: (store.job(job)["step"] or "").startswith("extracting"),
        120,
        every=0.02,
        what="the job to extract its first prompt",
    )
    assert srv.client.health() == (False, "503 memory released")
    row = lifecycle.cancel(store, job)
    assert row["status"] == "cancelled" and row["error"] == "cancelled by user"
    assert srv.client.health() == (True, "ready")  # restored before the job process ended
    log = lifecycle.log_tail(store, job)
    assert in_order(
        log,
        "releasing server memory",
        "extraction stopped (Cancelled",
        "restoring server",
        "server ready",
        "cancelled (SIGTERM)",
    )
    ex = store.extraction(row["result"]["extraction"])
    assert ex["status"] == "cancelled" and 1 <= len(store.items(ex["id"])) < 40


def test_release_impossible_without_stop_command_is_a_clear_error(srv, model, tmp_path, capsys):
    store = workspace(tmp_path, srv.url, "memory_release = false\n")
    add_set(store, "s", completions(1))
    store.add_job(
        "job-x",
        "extract",
        {"target": str(model), "completions": "s", "layers": LAYERS, "orchestrate": "release"},
        "x.log",
    )
    assert dispatch.execute(store, "job-x") == 2
    err = store.job("job-x")["error"]
    assert (
        err.startswith(
            "cannot free the GPU: memory_release = false in config.toml, and [server] stop_command is not set in"
        )
        and "orchestrate none" in err
    )
    assert srv.client.health() == (True, "ready")  # nothing was touched


# ---------------------------------------------------------------------------
# command path


@pytest.fixture
def managed(model, tmp_path):
    """A server started by the pid-file control script, as `systemctl` would; stopped at the end."""
    state = tmp_path / "state"
    state.mkdir()
    port = free_port()
    (state / "argv.json").write_text(json.dumps(serve_argv(model, port, delay=2.0)))
    ctl = tmp_path / "ctl.py"
    ctl.write_text(CTL)
    argv = {c: [sys.executable, str(ctl), c, str(state)] for c in ("start", "stop")}
    subprocess.run(argv["start"], check=True, env=ENV)
    client = SGLangClient(f"http://127.0.0.1:{port}", timeout=60, retries=0)
    client.wait_ready(120, poll=0.1)
    yield client, argv, state
    if (state / "server.pid").exists():
        subprocess.run(argv["stop"], env=ENV, timeout=60)


def test_command_path_stops_and_restarts_the_server(managed, model, tmp_path):
    client, argv, state = managed
    old_pid = int((state / "server.pid").read_text())
    store = workspace(
        tmp_path,
        client.url,
        f"stop_command = {json.dumps(argv['stop'])}\nstart_command = {json.dumps(shlex.join(argv['start']))}\n",
    )
    add_set(store, "s", completions(2))
    job = lifecycle.start(
        store,
        "extract",
        {"target": str(model), "completions": "s", "layers": LAYERS, "device": "cpu", "orchestrate": "command"},
    )
    row = finish(store, job, client.health)
    log = lifecycle.log_tail(store, job)
    assert row["status"] == "done", log
    assert row["health_at_end"] == (True, "ready")  # the job waited for the new server's /health 200
    new_pid = int((state / "server.pid").read_text())
    assert new_pid != old_pid and gone(old_pid) and not gone(new_pid)
    assert in_order(
        log,
        "configured commands: stop: " + shlex.join(argv["stop"]),
        "stopping server: " + shlex.join(argv["stop"]),
        f"stopped server pid {old_pid}",
        "waiting for the server to stop",
        "extracting 2/2",
        "restoring server: " + shlex.join(argv["start"]),
        "waiting for /health",
        "server ready",
        "done: ",
    )
    waits = [line for line in log.splitlines() if "waiting for /health: " in line]
    assert any("refused" in w or "503" in w for w in waits), waits  # the restarted server was not ready at once
    assert len(store.items(row["result"]["extraction"])) == 2
    # the restarted server is a normal process: its stop command stops it (SIGTERM was not inherited as ignored)
    assert subprocess.run(argv["stop"], env=ENV, timeout=60).returncode == 0
    assert gone(new_pid) and not client.health()[0]


# ---------------------------------------------------------------------------
# config and GPU memory


def test_config_defaults_and_values(tmp_path):
    assert config.load(tmp_path) == config.WorkspaceConfig()
    (tmp_path / "config.toml").write_text(
        '[server]\nurl = "http://gpu-box:30000/"\nstop_command = "systemctl --user stop \'sglang svc\'"\n'
        'start_command = ["systemctl", "--user", "start", "sglang"]\nreadiness_timeout = 900\n'
        'memory_release = false\ngpu_memory_margin_gb = 4\n'
    )
    cfg = config.load(tmp_path)
    assert cfg.server_url == "http://gpu-box:30000" and cfg.readiness_timeout == 900.0
    assert cfg.stop_command == ["systemctl", "--user", "stop", "sglang svc"]
    assert cfg.memory_release is False and cfg.gpu_memory_margin_gb == 4.0
    assert config.describe_commands(cfg) == [
        "stop: systemctl --user stop 'sglang svc'",
        "start: systemctl --user start sglang",
    ]


@pytest.mark.parametrize(
    "body, message",
    [
        ('[server]\nurl = "http://x:1"\nstop_cmd = "x"\n', "line 3: unknown key 'stop_cmd' in [server]"),
        ('[server]\nreadiness_timeout = "soon"\n', "line 2: [server] readiness_timeout must be a positive number"),
        ('[server]\nstop_command = []\n', "line 2: [server] stop_command must be a command"),
        ('[server]\nmemory_release = 1\n', "line 2: [server] memory_release must be true or false"),
        ('[server]\nurl = "localhost:30000"\n', "line 2: [server] url must be a URL string"),
        ('[servr]\nurl = "http://x:1"\n', "line 1: unknown entry 'servr'"),
        ('[server]\nurl = \n', "not valid TOML"),
    ],
)
def test_config_errors_name_key_and_line(tmp_path, body, message):
    (tmp_path / "config.toml").write_text(body)
    with pytest.raises(config.ConfigError) as e:
        config.load(tmp_path)
    assert message in str(e.value) and str(tmp_path / "config.toml") in str(e.value)


def test_gpu_memory_is_empty_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    assert gpu.gpu_memory() == []


def test_weights_bytes_sums_the_safetensors_else_the_bin_files(tmp_path):
    sizes = {
        "model-00001-of-00002.safetensors": 1000,
        "model-00002-of-00002.safetensors": 2345,
        "pytorch_model-00001-of-00002.bin": 777,
        "pytorch_model-00002-of-00002.bin": 4096,
        "config.json": 50,
        "tokenizer.json": 300,
    }
    for name, n in sizes.items():
        (tmp_path / name).write_bytes(os.urandom(n))

    def on_disk(suffix: str) -> int:
        return sum(os.stat(tmp_path / name).st_size for name in sizes if name.endswith(suffix))

    assert on_disk(".safetensors") == 3345 and on_disk(".bin") == 4873
    assert orchestrate.weights_bytes(tmp_path) == on_disk(".safetensors")  # safetensors win over .bin
    assert orchestrate.weights_bytes(str(tmp_path)) == on_disk(".safetensors")
    for name in sizes:
        if name.endswith(".safetensors"):
            (tmp_path / name).unlink()
    assert orchestrate.weights_bytes(tmp_path) == on_disk(".bin")  # else the .bin files
    for name in sizes:
        if name.endswith(".bin"):
            (tmp_path / name).unlink()
    assert orchestrate.weights_bytes(tmp_path) == 0  # no weights: config and tokenizer only


def test_cli_extract_with_orchestration(srv, model, tmp_path, capsys):
    """`extract --orchestrate release` from the CLI: the same job, followed to the end; the server is ready
    again before the command returns the extraction id."""
    from dflash_dash import cli

    store = workspace(tmp_path, srv.url)
    add_set(store, "s", completions(2))
    released = srv.log.read_text().count("memory released")
    rc = cli.main(
        [
            "--workspace",
            str(store.workspace),
            "extract",
            "--target",
            str(model),
            "--completions",
            "s",
            "--layers",
            ",".join(map(str, LAYERS)),
            "--orchestrate",
            "release",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert srv.client.health() == (True, "ready")
    ex = out.strip()
    assert store.extraction(ex)["status"] == "done" and len(store.items(ex)) == 2
    assert srv.log.read_text().count("memory released") == released + 1
    (job,) = store.jobs()
    assert job["id"] in err and job["status"] == "done"
    assert in_order(
        lifecycle.log_tail(store, job["id"]),
        "releasing server memory",
        "extracting 2/2",
        "restoring server",
        "server ready",
    )
