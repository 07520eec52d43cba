"""SGLang as it really behaves, against the stand-in in a real subprocess: a slow /health (it generates a
token), `--api-key` (the key from the environment on every request, never written anywhere), memory release
only when idle (never under load), a tokenizer_path that is a hub id (found in the local Hugging Face cache,
offline), and the speculative counters SGLang reports."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import fakes
import pytest
from serving import ENV, ROOT, Served, status_now, stop_jobs, tiny_model, until

from dflash_dash import config, engines, ops, pipeline
from dflash_dash.engines import ServerError, SGLangClient
from dflash_dash.jobs import lifecycle, orchestrate
from dflash_dash.render.tables import SPEC_KEYS, completion_table
from dflash_dash.store import CompletionEntry, Store

KEY = "sk-dflash-test-7f3a9c2e5b1d4086"
PROMPTS = [{"id": "a", "prompt": "def add(a, b):\n"}, {"id": "b", "prompt": "import json\n"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def srv(model, tmp_path_factory):
    """A stand-in that behaves like a real keyed SGLang: --api-key, a /health that takes 1.5 s, and tokens that take
    5 ms each, so a 600-token generation is still running seconds after it started, whatever the machine."""
    extra = ["--health-delay", "1.5", "--token-delay", "0.005"]
    s = Served(model, tmp_path_factory.mktemp("srvlog") / "server.log", extra=extra, api_key=KEY)
    try:
        s.wait()
    except BaseException:
        s.stop()
        raise
    yield s
    s.stop()


@pytest.fixture
def no_key_env(monkeypatch):
    for name in ("SGLANG_API_KEY", "MY_SGLANG_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def workspace(tmp_path: Path, url: str, extra: str = "") -> Store:
    ws = tmp_path / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "config.toml").write_text(f'[server]\nurl = "{url}"\nreadiness_timeout = 120\n{extra}')
    return Store(ws)


def prompts_file(tmp_path: Path) -> Path:
    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return f


def raw(url: str, method: str = "GET", body: dict | None = None, key: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# ---------------------------------------------------------------------------
# the stand-in models the real server


def test_stand_in_wants_the_key_except_on_health_and_health_is_slow(srv):
    t0 = time.monotonic()
    assert raw(srv.url + "/health") == (200, b"")  # exempt, as in SGLang
    assert time.monotonic() - t0 >= 1.4  # "generating" its health token
    for path, body in (
        ("/model_info", None),
        ("/v1/loads", None),
        ("/get_server_info", None),
        ("/generate", {"input_ids": [5, 6], "sampling_params": {"temperature": 0}}),
    ):
        method = "GET" if body is None else "POST"
        assert raw(srv.url + path, method, body) == (401, b'{"error": "Unauthorized"}'), path
        assert raw(srv.url + path, method, body, key="wrong")[0] == 401, path
        assert raw(srv.url + path, method, body, key=KEY)[0] == 200, path
    assert srv.log.read_text().count(KEY) == 0  # the server does not log the key either


def test_client_default_health_timeout_sees_a_slow_server_ready(srv):
    assert SGLangClient(srv.url).health() == (True, "ready")  # 1.5 s: within the default, not "timeout"


def test_stand_in_refuses_release_while_generating_and_reports_load(srv):
    c = srv.client
    assert c.running_requests() == 0
    out: dict = {}
    t = threading.Thread(
        target=lambda: out.update(
            c.generate(input_ids=[5, 6, 7], max_new_tokens=600, extra={"sampling_params": {"ignore_eos": True}})
        )
    )
    t.start()
    try:
        until(lambda: c.running_requests() == 1, 30, what="the generation to run")
        got = raw(srv.url + "/get_load", key=KEY)
        assert got[0] == 200 and json.loads(got[1])[0]["num_reqs"] == 1
        with pytest.raises(ServerError) as e:
            c.release_memory()
        assert e.value.status == 400 and "idle" in str(e.value) and "1 request(s) running" in str(e.value)
        assert c.health() == (True, "ready")  # nothing was released
    finally:
        t.join()
    assert len(out["output_ids"]) == 600  # the generation was not disturbed
    assert c.running_requests() == 0


# ---------------------------------------------------------------------------
# API key from the environment


def test_fetch_sends_the_key_from_the_environment(srv, tmp_path, monkeypatch, no_key_env):
    store = workspace(tmp_path, srv.url)
    f = prompts_file(tmp_path)
    with pytest.raises(ServerError) as e:  # no key in the environment: named, not a traceback
        pipeline.fetch(
            store, ops.Fetch(server=srv.url, prompt_set=str(f), name="s", max_new_tokens=4, readiness_timeout=60)
        )
    assert e.value.status == 401 and "set the environment variable SGLANG_API_KEY" in str(e.value)
    monkeypatch.setenv("SGLANG_API_KEY", KEY)
    assert (
        pipeline.fetch(
            store, ops.Fetch(server=srv.url, prompt_set=str(f), name="s", max_new_tokens=4, readiness_timeout=60)
        )
        == 2
    )
    assert [c["prompt_id"] for c in store.completions("s")] == ["a", "b"]


def test_api_key_env_names_another_variable(srv, tmp_path, monkeypatch, no_key_env):
    store = workspace(tmp_path, srv.url, 'api_key_env = "MY_SGLANG_KEY"\n')
    f = prompts_file(tmp_path)
    monkeypatch.setenv("SGLANG_API_KEY", KEY)  # not the variable this workspace reads
    with pytest.raises(ServerError) as e:
        pipeline.fetch(
            store, ops.Fetch(server=srv.url, prompt_set=str(f), name="s", max_new_tokens=4, readiness_timeout=60)
        )
    assert "MY_SGLANG_KEY" in str(e.value) and "api_key_env" in str(e.value)
    monkeypatch.setenv("MY_SGLANG_KEY", KEY)
    assert (
        pipeline.fetch(
            store, ops.Fetch(server=srv.url, prompt_set=str(f), name="s", max_new_tokens=4, readiness_timeout=60)
        )
        == 2
    )


def test_the_key_is_written_to_no_workspace_file(srv, tmp_path, monkeypatch, no_key_env):
    monkeypatch.setenv("SGLANG_API_KEY", KEY)
    store = workspace(tmp_path, srv.url)
    f = prompts_file(tmp_path)
    try:  # a fetch job (a separate process: the key reaches it through the environment, not its args)
        job = lifecycle.start(store, "fetch", {"prompt_set": str(f), "name": "j", "max_new_tokens": 4})
        until(lambda: status_now(store, job) not in lifecycle.ACTIVE, 180, what=f"job {job}")
        assert store.job(job)["status"] == "done", lifecycle.log_tail(store, job)
    finally:
        stop_jobs(store)
    monkeypatch.delenv("SGLANG_API_KEY")
    rc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dflash_dash",
            "--workspace",
            str(store.workspace),
            "fetch",
            "--prompt-set",
            str(f),
            "--name",
            "cli",
            "--max-new-tokens",
            "4",
        ],
        capture_output=True,
        text=True,
        env={**ENV, "SGLANG_API_KEY": KEY},
        cwd=ROOT,
        timeout=300,
    )
    assert rc.returncode == 0, rc.stderr
    assert len(store.completions("j")) == 2 and len(store.completions("cli")) == 2
    files = [p for p in store.workspace.rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in files) and len(files) >= 3
    leaked = [str(p) for p in files if KEY.encode() in p.read_bytes()]
    assert leaked == []
    assert KEY not in rc.stdout + rc.stderr


def test_config_api_key_env_is_a_variable_name(tmp_path, monkeypatch, no_key_env):
    assert config.api_key(config.WorkspaceConfig()) == (None, "SGLANG_API_KEY")
    monkeypatch.setenv("SGLANG_API_KEY", KEY)
    c = engines.for_workspace(config.WorkspaceConfig(), "http://127.0.0.1:1")
    assert c.api_key == KEY and c.key_env == "SGLANG_API_KEY" and KEY not in repr(c)
    (tmp_path / "config.toml").write_text('[server]\napi_key_env = "MY_SGLANG_KEY"\n')
    cfg = config.load(tmp_path)
    assert cfg.api_key_env == "MY_SGLANG_KEY" and config.api_key(cfg) == (None, "MY_SGLANG_KEY")
    (tmp_path / "config.toml").write_text(f'[server]\napi_key_env = "{KEY}"\n')  # the key pasted by mistake
    with pytest.raises(config.ConfigError) as e:
        config.load(tmp_path)
    assert "line 2" in str(e.value) and "NAME of an environment variable" in str(e.value)
    assert KEY not in str(e.value)


# ---------------------------------------------------------------------------
# memory release only when idle


class Rep:
    """A job reporter that records its lines (free_gpu's `rep`)."""

    def __init__(self, store):
        self.store, self.lines = store, []

    def __call__(self, done, total, msg):
        self.lines.append(msg)

    def step(self, msg):
        self.lines.append(msg)

    note = step


def test_release_waits_for_idle_and_never_releases_under_load(srv, tmp_path, monkeypatch, no_key_env):
    monkeypatch.setenv("SGLANG_API_KEY", KEY)
    store = workspace(tmp_path, srv.url)
    cfg = config.load(store.workspace)
    client = engines.for_workspace(cfg)
    released_at: list[int | None] = []
    real_release = client.release_memory

    def release():  # what the server reports at the moment free_gpu releases
        released_at.append(srv.client.running_requests())
        real_release()

    monkeypatch.setattr(client, "release_memory", release)
    before = srv.log.read_text().count("memory released")
    out: dict = {}
    t = threading.Thread(
        target=lambda: out.update(
            srv.client.generate(
                input_ids=[5, 6, 7], max_new_tokens=600, extra={"sampling_params": {"ignore_eos": True}}
            )
        )
    )
    t.start()
    try:
        until(lambda: srv.client.running_requests() == 1, 30, what="the generation to run")
        # 1. a short wait under load: a named error, nothing released
        rep = Rep(store)
        with pytest.raises(orchestrate.OrchestrationError) as e:
            orchestrate.wait_idle(client, cfg, rep, timeout=0.3)
        assert "still has 1 running or waiting request(s)" in str(e.value) and "nothing was released" in str(e.value)
        assert released_at == [] and srv.client.health() == (True, "ready")
        # 2. the extraction's free_gpu waits until the generation is over, then releases
        rep = Rep(store)
        assert orchestrate.free_gpu(client, cfg, "release", rep) == "release"
    finally:
        t.join()
    assert len(out["output_ids"]) == 600  # the running generation finished undisturbed
    assert released_at == [0]
    assert any(m.startswith("waiting for the server to be idle: 1 request(s)") for m in rep.lines), rep.lines
    assert rep.lines.index("server idle: no running or waiting requests") < rep.lines.index(
        "releasing server memory (POST /release_memory_occupation)"
    )
    assert srv.client.health() == (False, "503 memory released")
    assert srv.log.read_text().count("memory released") == before + 1
    orchestrate.restore(client, cfg, "release", Rep(store))
    assert srv.client.health() == (True, "ready")


def test_release_refused_while_a_fetch_job_runs_against_the_server(srv, tmp_path, monkeypatch, no_key_env):
    monkeypatch.setenv("SGLANG_API_KEY", KEY)
    store = workspace(tmp_path, srv.url)
    cfg = config.load(store.workspace)
    client = engines.for_workspace(cfg)
    monkeypatch.setattr(client, "release_memory", lambda: pytest.fail("released while a fetch job runs"))
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:  # a fetch job of this workspace, running (its process alive), against this server
        store.add_job("job-fetching", "fetch", {"prompt_set": "coding-10", "name": "x"}, str(tmp_path / "f.log"))
        store.update_job("job-fetching", status="running", pid=holder.pid)
        monkeypatch.setitem(lifecycle._CHILDREN, "job-fetching", holder)
        with pytest.raises(orchestrate.OrchestrationError) as e:
            orchestrate.free_gpu(client, cfg, "release", Rep(store))
        assert "fetch job job-fetching is running against" in str(e.value) and "cancel" in str(e.value)
    finally:
        holder.stdin.close()
        holder.wait(30)
    assert srv.client.health() == (True, "ready")


# ---------------------------------------------------------------------------
# tokenizer_path as a hub id


@pytest.fixture
def hub_server():
    """The SGLang fake (tests/fakes.py) whose model_path/tokenizer_path is a hub id (as `--model-path Org/Name`
    gives)."""
    with fakes.serve(
        model_path="test-org/tiny-target", tokenizer_path="test-org/tiny-target", answer=lambda ids: [7, 8], text="x"
    ) as s:
        yield s


def fake_hf_cache(home: Path, repo: str) -> Path:
    """HF_HOME/hub/models--org--name/{refs/main, snapshots/HASH/<tokenizer files>} as huggingface_hub lays it out."""
    from tools import tiny

    base = home / "hub" / ("models--" + repo.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = tiny.write_tokenizer(base / "snapshots" / commit, vocab_size=512)
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    return snap


def test_hub_id_tokenizer_found_in_the_local_cache_offline(hub_server, tmp_path, monkeypatch, no_key_env):
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    snap = fake_hf_cache(tmp_path / "hf", "test-org/tiny-target")
    assert pipeline.hub_snapshot("test-org/tiny-target") == snap
    assert pipeline.hub_snapshot("test-org/absent") is None
    store = workspace(tmp_path, hub_server.url)
    seen: list[str] = []
    n = pipeline.fetch(
        store,
        ops.Fetch(server=hub_server.url, prompt_set=str(prompts_file(tmp_path)), name="s", max_new_tokens=2, chat=True),
        progress=lambda d, t, m: seen.append(m),
    )
    assert n == 2
    assert any("from the local Hugging Face cache" in m for m in seen), seen
    tok = AutoTokenizer.from_pretrained(str(snap))
    from dflash_dash.engines import chat_ids

    assert [b["input_ids"] for b in hub_server.bodies("/generate")] == [chat_ids(tok, p["prompt"]) for p in PROMPTS]


def test_hub_id_not_in_the_cache_says_both_ways_out(hub_server, tmp_path, monkeypatch, no_key_env):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    store = workspace(tmp_path, hub_server.url)
    with pytest.raises(pipeline.InputError) as e:
        pipeline.fetch(
            store,
            ops.Fetch(
                server=hub_server.url, prompt_set=str(prompts_file(tmp_path)), name="s", max_new_tokens=2, chat=True
            ),
        )
    msg = str(e.value)
    assert "'test-org/tiny-target'" in msg and "--tokenizer DIR" in msg
    assert str(tmp_path / "empty-hf" / "hub") in msg and "Hugging Face" in msg and "nothing is downloaded" in msg
    assert hub_server.bodies("/generate") == []


# ---------------------------------------------------------------------------
# speculative counters


def test_spec_keys_are_the_names_sglang_sends():
    assert SPEC_KEYS == (
        "spec_verify_ct",
        "spec_accept_length",
        "spec_accept_rate",
        "spec_accept_token_num",
        "spec_draft_token_num",
        "spec_accepted_drafts",
        "spec_proposed_drafts",
        "spec_accept_histogram",
    )


def test_completion_table_shows_the_counters_present():
    meta = {
        "completion_tokens": 12,
        "e2e_latency": 0.2,
        "spec_verify_ct": 4,
        "spec_accept_length": 3.0,
        "spec_accept_rate": 0.5,
        "spec_accept_token_num": 8,
        "spec_draft_token_num": 16,
        "spec_accepted_drafts": 8,
        "spec_proposed_drafts": 16,
        "spec_accept_histogram": [1, 0, 2, 1],
        "spec_num_accepted_tokens": 99,
    }
    rows = [
        {"prompt_id": "p", "prompt_tokens": 1, "output_tokens": 12, "meta_info": meta},
        {"prompt_id": "q", "prompt_tokens": 1, "output_tokens": 2, "meta_info": {"spec_accept_rate": 0.25}},
    ]
    a, b = completion_table([CompletionEntry.of(r) for r in rows])
    assert a["server_tau"] == pytest.approx(3.0)  # completion_tokens / spec_verify_ct
    assert a["spec_accept_histogram"] == "0:1 2:2 3:1"
    assert all(a[k] == meta[k] for k in SPEC_KEYS if k != "spec_accept_histogram")
    assert "spec_num_accepted_tokens" not in a
    assert b["spec_accept_rate"] == 0.25 and "server_tau" not in b and "spec_verify_ct" not in b
