"""The SGLang client against a scripted in-test HTTP server: retries, validation, readiness, fallbacks."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dflash_dash.sglang import Client, HealthPoller, NotReady, ServerError, chat_ids, parse_generate
from serving import free_port as closed_port

OK = json.dumps({"text": "hi", "output_ids": [1, 2, 3], "meta_info": {"completion_tokens": 3}}).encode()


# ---------------------------------------------------------------------------
# a scripted fake server


class Fake(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), FakeHandler)
        self.script: dict[str, list[tuple[int | None, bytes]]] = {}  # path -> answers, last one repeats
        self.seen: list[tuple[str, str, bytes]] = []                  # (method, path, body) received
        self.auth: list[str | None] = []                              # Authorization header of each request
        self.gates: dict[str, threading.Event] = {}                   # path -> answered once the event is set

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class FakeHandler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def answer(self, method: str):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        self.server.seen.append((method, self.path, body))
        self.server.auth.append(self.headers.get("Authorization"))
        gate = self.server.gates.get(self.path)
        if gate is not None:
            gate.wait(30)
        answers = self.server.script.get(self.path) or [(404, b'{"error": {"message": "no route"}}')]
        status, payload = answers.pop(0) if len(answers) > 1 else answers[0]
        if status is None:  # drop the connection without an answer
            self.close_connection = True
            return
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):  # noqa: N802
        self.answer("GET")

    def do_POST(self):  # noqa: N802
        self.answer("POST")


@pytest.fixture
def fake():
    srv = Fake()
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def client(url: str, **kw) -> Client:
    return Client(url, **({"timeout": 5.0, "retries": 3, "backoff": 0.01} | kw))


# ---------------------------------------------------------------------------
# generate


def test_generate_sends_greedy_body_and_returns_server_ids(fake):
    fake.script["/generate"] = [(200, OK)]
    out = client(fake.url).generate(input_ids=[5, 6], max_new_tokens=7, stop=["\n\n"])
    body = {"input_ids": [5, 6], "sampling_params": {"temperature": 0, "max_new_tokens": 7, "stop": ["\n\n"]}}
    assert out == {"request": body, "text": "hi", "output_ids": [1, 2, 3], "meta_info": {"completion_tokens": 3}}
    assert [json.loads(b) for _, p, b in fake.seen if p == "/generate"] == [body]


def test_generate_text_and_extra_merge(fake):
    fake.script["/generate"] = [(200, OK)]
    out = client(fake.url).generate(text="x", extra={"rid": "r1", "sampling_params": {"stop_token_ids": [9]}})
    assert out["request"] == {
        "text": "x", "rid": "r1",
        "sampling_params": {"temperature": 0, "max_new_tokens": 256, "stop_token_ids": [9]},
    }
    with pytest.raises(ValueError):
        client(fake.url).generate()


def test_500_then_success_retries(fake):
    fake.script["/generate"] = [(500, b"boom"), (503, b""), (200, OK)]
    out = client(fake.url).generate(input_ids=[1])
    assert out["output_ids"] == [1, 2, 3]
    assert len(fake.seen) == 3


def test_persistent_500_gives_transient_error_after_bounded_retries(fake):
    fake.script["/generate"] = [(500, b'{"error": {"message": "CUDA out of memory"}}')]
    with pytest.raises(ServerError) as ei:
        client(fake.url, retries=2).generate(input_ids=[1])
    e = ei.value
    assert e.status == 500 and e.transient and "CUDA out of memory" in str(e) and "3 attempts" in str(e)
    assert len(fake.seen) == 3


def test_dropped_connection_is_retried(fake):
    fake.script["/generate"] = [(None, b""), (200, OK)]
    assert client(fake.url).generate(input_ids=[1])["output_ids"] == [1, 2, 3]
    assert len(fake.seen) == 2


def test_400_message_passes_through_without_retry(fake):
    msg = "temperature must be 0, got 0.7 <exactly as sent>"
    fake.script["/generate"] = [(400, json.dumps({"error": {"message": msg}}).encode())]
    with pytest.raises(ServerError) as ei:
        client(fake.url).generate(input_ids=[1])
    e = ei.value
    assert e.status == 400 and not e.transient and e.detail == msg and msg in str(e)
    assert len(fake.seen) == 1


@pytest.mark.parametrize("body,words", [
    (b'{"text": "a", "output_ids": [1, 2', "malformed JSON"),
    (b'{"text": "a", "meta_info": {}}', "no `output_ids`"),
    (b'{"text": "a", "output_ids": [1, "2"]}', "ill-typed `output_ids`"),
    (b'{"text": "a", "output_ids": [1, true]}', "ill-typed `output_ids`"),
    (b'[1, 2]', "expected an object"),
])
def test_bad_answers_name_the_problem(fake, body, words):
    fake.script["/generate"] = [(200, body)]
    with pytest.raises(ServerError) as ei:
        client(fake.url).generate(input_ids=[1])
    assert words in str(ei.value) and not ei.value.transient
    assert len(fake.seen) == 1


def test_refused_is_transient_and_says_so():
    with pytest.raises(ServerError) as ei:
        client(f"http://127.0.0.1:{closed_port()}", retries=1).generate(input_ids=[1])
    assert ei.value.transient and ei.value.status is None and "refused" in str(ei.value)


def test_parse_generate_defaults():
    assert parse_generate(b'{"output_ids": []}') == {"text": "", "output_ids": [], "meta_info": {}}
    assert parse_generate(b'[{"output_ids": [4], "text": "d"}]')["output_ids"] == [4]


# ---------------------------------------------------------------------------
# readiness


def test_wait_ready_timeout_says_what_to_do(fake):
    fake.script["/health"] = [(503, b"warming up")]
    seen = []
    with pytest.raises(NotReady) as ei:
        client(fake.url).wait_ready(timeout=0.3, progress=lambda t, s: seen.append(s), poll=0.05)
    msg = str(ei.value)
    assert fake.url in msg and "not ready after 0.3 s" in msg and "503 warming up" in msg
    assert "readiness_timeout" in msg
    assert seen and set(seen) == {"503 warming up"}


def test_wait_ready_refused_then_timeout():
    url = f"http://127.0.0.1:{closed_port()}"
    assert Client(url).health() == (False, "refused")
    with pytest.raises(NotReady, match="last: refused"):
        Client(url).wait_ready(timeout=0.2, poll=0.05)


def test_wait_ready_passes_503_then_ready(fake):
    fake.script["/health"] = [(503, b""), (503, b""), (200, b"")]
    seen = []
    waited = client(fake.url).wait_ready(timeout=10, progress=lambda t, s: seen.append(s), poll=0.01)
    assert seen == ["503", "503", "ready"] and waited >= 0
    assert {p for _, p, _ in fake.seen} == {"/health"}  # readiness never asks /v1/models or /model_info


# ---------------------------------------------------------------------------
# info and memory


def test_model_info_falls_back_to_get_model_info(fake):
    fake.script["/get_model_info"] = [(200, b'{"model_path": "/m", "tokenizer_path": "/m", "is_generation": true}')]
    assert client(fake.url).model_info()["model_path"] == "/m"
    assert [p for _, p, _ in fake.seen] == ["/model_info", "/get_model_info"]


def test_supports_memory_release(fake):
    c = client(fake.url)
    assert c.supports_memory_release() is False  # nothing answers: cannot tell
    fake.script["/server_info"] = [(200, b'{"enable_memory_saver": true}')]
    assert c.supports_memory_release() is True
    fake.script["/get_server_info"] = [(200, b'{"enable_memory_saver": false}')]
    assert c.supports_memory_release() is False
    assert all(m == "GET" for m, _, _ in fake.seen)


def test_release_and_resume_post_empty_objects(fake):
    fake.script["/release_memory_occupation"] = [(200, b"")]
    fake.script["/resume_memory_occupation"] = [(200, b"{}")]
    c = client(fake.url)
    c.release_memory()
    c.resume_memory()
    assert fake.seen == [("POST", "/release_memory_occupation", b"{}"), ("POST", "/resume_memory_occupation", b"{}")]


def test_release_failure_is_not_retried(fake):
    fake.script["/release_memory_occupation"] = [(500, b"")]
    with pytest.raises(ServerError, match="500"):
        client(fake.url).release_memory()
    assert len(fake.seen) == 1


# ---------------------------------------------------------------------------
# chat template


def test_chat_ids_applies_template_locally(tmp_path):
    from dflash_dash.tiny import write_tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(write_tokenizer(tmp_path, vocab_size=512)))
    ids = chat_ids(tok, "print(1)")
    assert isinstance(ids, list) and ids and all(type(i) is int for i in ids)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>user\nprint(1)<|im_end|>\n<|im_start|>assistant\n")
    assert text.endswith("<think>\n\n</think>\n\n")
    assert not tok.decode(chat_ids(tok, "print(1)", enable_thinking=True)).endswith("</think>\n\n")


def test_url_needs_a_scheme():
    with pytest.raises(ValueError, match="http://"):
        Client("localhost:30000")


# ---------------------------------------------------------------------------
# API key, load, background readiness


KEY = "sk-test-0123456789abcdef"


def test_api_key_is_sent_on_every_request_and_never_shown(fake):
    fake.script["/health"] = [(200, b"")]
    fake.script["/model_info"] = [(200, b'{"model_path": "/m"}')]
    fake.script["/generate"] = [(200, OK)]
    fake.script["/v1/loads"] = [(200, b'{"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0}]}')]
    fake.script["/release_memory_occupation"] = [(200, b"")]
    fake.script["/resume_memory_occupation"] = [(200, b"")]
    c = client(fake.url, api_key=KEY)
    assert c.health() == (True, "ready")
    c.model_info()
    c.generate(input_ids=[1, 2])
    assert c.running_requests() == 0
    c.release_memory()
    c.resume_memory()
    assert len(fake.auth) == 6 and fake.auth == [f"Bearer {KEY}"] * 6
    assert KEY not in repr(c)
    client(fake.url).model_info()
    assert fake.auth[-1] is None  # no key configured: no header


def test_401_names_the_variable_to_set_and_never_the_key(fake):
    fake.script["/model_info"] = [(401, b'{"error": "Unauthorized"}')]
    with pytest.raises(ServerError) as e:
        client(fake.url).model_info()
    msg = str(e.value)
    assert e.value.status == 401 and "Unauthorized" in msg and "--api-key" in msg
    assert "set the environment variable SGLANG_API_KEY" in msg
    assert len(fake.seen) == 1  # not retried
    fake.script["/generate"] = [(403, b'{"error": {"message": "Forbidden"}}')]
    with pytest.raises(ServerError) as e:
        client(fake.url, api_key=KEY, key_env="MY_KEY").generate(input_ids=[1])
    msg = str(e.value)
    assert e.value.status == 403 and "refused the API key" in msg and "MY_KEY" in msg and KEY not in msg


def test_running_requests_from_v1_loads_then_get_load(fake):
    c = client(fake.url)
    assert c.running_requests() is None  # neither endpoint: cannot tell
    fake.script["/get_load"] = [(200, b'[{"dp_rank": 0, "num_reqs": 2, "num_waiting_reqs": 1, "num_tokens": 9}, '
                                      b'{"dp_rank": 1, "num_reqs": 1, "num_waiting_reqs": 0, "num_tokens": 3}]')]
    assert c.running_requests() == 3  # num_reqs already counts the waiting ones
    fake.script["/v1/loads"] = [(200, b'{"dp_rank_count": 2, "loads": [{"dp_rank": 0, "num_running_reqs": 1, '
                                      b'"num_waiting_reqs": 2}, {"dp_rank": 1, "num_running_reqs": 0, '
                                      b'"num_waiting_reqs": 0}]}')]
    assert c.running_requests() == 3
    fake.script["/v1/loads"] = [(200, b'{"loads": [{"num_running_reqs": "many"}]}')]
    with pytest.raises(ServerError, match="num_running_reqs"):
        c.running_requests()


def test_health_poller_says_checking_until_a_slow_health_answers(fake):
    fake.script["/health"] = [(200, b"")]
    gate = fake.gates["/health"] = threading.Event()  # /health answers only once the gate opens
    p = HealthPoller(client(fake.url, retries=0), every=0.05)
    try:
        assert p.latest() == (None, "checking…")  # at once, while /health is still "generating"
        assert not p.wait(0.05)
        gate.set()
        assert p.wait(10)
        assert p.latest() == (True, "ready")
    finally:
        p.stop()
        gate.set()


def test_health_default_timeout_allows_a_real_servers_slow_check():
    from dflash_dash import sglang
    assert sglang.HEALTH_TIMEOUT_S >= 5
    import inspect
    assert inspect.signature(Client.health).parameters["timeout"].default == sglang.HEALTH_TIMEOUT_S
