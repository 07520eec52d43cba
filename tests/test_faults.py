"""Issue 5: a fetch survives every server fault with nothing lost, a clear message, and a rerun that
fetches only the rest. The server here is a fault-injecting SGLang fake in a thread (the real protocol
subset: /health, /model_info, /generate); the stand-in server's own faults are in test_server.py."""
from __future__ import annotations

import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dflash_dash import pipeline
from dflash_dash.sglang import ServerError
from dflash_dash.store import Store

N = 6


def answer_for(ids: list[int]) -> list[int]:
    return [(sum(ids) + i) % 97 for i in range(5)]


class Faulty(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.mode = None       # None | "500" | "badjson" | "reset" | "slow" | "503"
        self.fail_prompt = 3   # index of the prompt (by first prompt id) that fails
        self.times = 10**9     # how many times it fails before it recovers
        self.calls = 0         # /generate requests answered

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def send(self, status, body: bytes):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        s = self.server
        if self.path == "/health":
            return self.send(503, b"warming up") if s.mode == "503" else self.send(200, b"")
        if self.path in ("/model_info", "/get_model_info"):
            return self.send(200, json.dumps({"model_path": "/models/fake", "tokenizer_path": None}).encode())
        self.send(404, b'{"error": {"message": "no route"}}')

    def do_POST(self):  # noqa: N802
        s = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ids = body["input_ids"]
        if s.mode and ids[0] == s.fail_prompt and s.times > 0:
            s.times -= 1
            if s.mode == "500":
                return self.send(500, b"Internal Server Error")
            if s.mode == "badjson":
                return self.send(200, b'{"text": "x", "output_ids": [1, 2')
            if s.mode == "reset":  # RST in the middle of the exchange
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                return
            if s.mode == "slow":
                time.sleep(1.5)
        s.calls += 1
        out = answer_for(ids)
        self.send(200, json.dumps({"text": "", "output_ids": out, "meta_info": {
            "prompt_tokens": len(ids), "completion_tokens": len(out), "finish_reason": {"type": "length"},
            "spec_verify_ct": 2}}).encode())


@pytest.fixture
def srv():
    s = Faulty()
    t = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield s
    s.shutdown()
    s.server_close()


@pytest.fixture
def prompts(tmp_path):
    f = tmp_path / "prompts.jsonl"
    f.write_text("\n".join(json.dumps({"id": f"p{i} <b>", "prompt_ids": [i, 10 + i, 20]}) for i in range(N)))
    return str(f)


def fetch(st, srv, prompts, **kw):
    return pipeline.fetch(st, srv.url, prompts, "set", max_new_tokens=5, **({"readiness_timeout": 5} | kw))


def check_complete(st):
    rows = st.completions("set")
    assert [r["prompt_id"] for r in rows] == [f"p{i} <b>" for i in range(N)]   # order kept, no duplicates
    for r in rows:
        assert r["output_ids"] == answer_for(r["prompt_ids"])


@pytest.mark.parametrize("mode,words", [
    ("500", "500"),
    ("badjson", "JSON"),
    ("reset", "reset"),
    ("slow", "timeout"),
])
def test_fault_keeps_fetched_and_rerun_fetches_the_rest(srv, prompts, tmp_path, mode, words):
    st = Store(tmp_path / "ws")
    srv.mode = mode
    with pytest.raises(ServerError) as e:
        fetch(st, srv, prompts, request_timeout=0.5)
    msg = str(e.value)
    assert "prompt 'p3 <b>'" in msg and "kept" in msg and "run the same fetch again" in msg
    assert words.lower() in msg.lower(), msg
    assert len(st.completions("set")) == 3                 # everything before the fault is kept
    srv.mode, before = None, srv.calls
    assert fetch(st, srv, prompts) == N - 3                # the rerun fetches only the rest
    assert srv.calls - before == N - 3
    check_complete(st)


@pytest.mark.parametrize("mode", ["500", "reset", "slow"])
def test_one_transient_fault_is_retried(srv, prompts, tmp_path, mode):
    st = Store(tmp_path / "ws")
    srv.mode, srv.times = mode, 1
    assert fetch(st, srv, prompts, request_timeout=0.5 if mode == "slow" else 600) == N
    check_complete(st)


def test_503_longer_than_readiness_timeout(srv, prompts, tmp_path):
    st = Store(tmp_path / "ws")
    srv.mode = "503"
    with pytest.raises(ServerError, match=r"not ready after .*503.*readiness_timeout"):
        fetch(st, srv, prompts, readiness_timeout=1.0)
    assert st.completions("set") == [] and srv.calls == 0


def test_refused(prompts, tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    st = Store(tmp_path / "ws")
    with pytest.raises(ServerError, match=r"not ready after .*refused"):
        pipeline.fetch(st, f"http://127.0.0.1:{port}", prompts, "set", max_new_tokens=5, readiness_timeout=1.0)


def test_fault_via_cli_is_one_clear_line(srv, prompts, tmp_path, capsys):
    from dflash_dash.cli import main

    srv.mode = "500"
    rc = main(["--workspace", str(tmp_path / "ws"), "fetch", "--server", srv.url, "--prompt-set", prompts,
               "--name", "set", "--max-new-tokens", "5"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "error: prompt 'p3 <b>'" in err and "run the same fetch again" in err
