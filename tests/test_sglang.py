"""The SGLang client against the fault-injecting fake server (tests/fakes.py): retries, validation, readiness,
fallbacks."""

from __future__ import annotations

import json
import threading

import fakes
import pytest
from serving import free_port as closed_port

from dflash_dash.engines import HEALTH_TIMEOUT_S, HealthPoller, NotReady, ServerError, SGLangClient, chat_ids
from dflash_dash.engines.sglang import parse_generate

OK = json.dumps({"text": "hi", "output_ids": [1, 2, 3], "meta_info": {"completion_tokens": 3}}).encode()


# ---------------------------------------------------------------------------
# the fake server (tests/fakes.py): here with every route off, so that only what a test injects answers


@pytest.fixture
def fake():
    with fakes.serve(routes=()) as srv:
        yield srv


def client(url: str, **kw) -> SGLangClient:
    return SGLangClient(url, **({"timeout": 5.0, "retries": 3, "backoff": 0.01} | kw))


# ---------------------------------------------------------------------------
# generate


def test_generate_sends_greedy_body_and_returns_server_ids(fake):
    fake.on("/generate", (200, OK))
    out = client(fake.url).generate(input_ids=[5, 6], max_new_tokens=7, stop=["\n\n"])
    body = {"input_ids": [5, 6], "sampling_params": {"temperature": 0, "max_new_tokens": 7, "stop": ["\n\n"]}}
    assert out == {"request": body, "text": "hi", "output_ids": [1, 2, 3], "meta_info": {"completion_tokens": 3}}
    assert [json.loads(b) for _, p, b in fake.seen if p == "/generate"] == [body]


def test_generate_text_and_extra_merge(fake):
    fake.on("/generate", (200, OK))
    out = client(fake.url).generate(text="x", extra={"rid": "r1", "sampling_params": {"stop_token_ids": [9]}})
    assert out["request"] == {
        "text": "x",
        "rid": "r1",
        "sampling_params": {"temperature": 0, "max_new_tokens": 256, "stop_token_ids": [9]},
    }
    with pytest.raises(ValueError):
        client(fake.url).generate()


def test_500_then_success_retries(fake):
    fake.on("/generate", (500, b"boom"), (503, b""), (200, OK))
    out = client(fake.url).generate(input_ids=[1])
    assert out["output_ids"] == [1, 2, 3]
    assert len(fake.seen) == 3


def test_persistent_500_gives_transient_error_after_bounded_retries(fake):
    fake.on("/generate", (500, b'{"error": {"message": "CUDA out of memory"}}'))
    with pytest.raises(ServerError) as ei:
        client(fake.url, retries=2).generate(input_ids=[1])
    e = ei.value
    assert e.status == 500 and e.transient and "CUDA out of memory" in str(e) and "3 attempts" in str(e)
    assert len(fake.seen) == 3


def test_dropped_connection_is_retried(fake):
    fake.on("/generate", fakes.DROP, (200, OK))
    assert client(fake.url).generate(input_ids=[1])["output_ids"] == [1, 2, 3]
    assert len(fake.seen) == 2


def test_400_message_passes_through_without_retry(fake):
    msg = "temperature must be 0, got 0.7 <exactly as sent>"
    fake.on("/generate", (400, json.dumps({"error": {"message": msg}}).encode()))
    with pytest.raises(ServerError) as ei:
        client(fake.url).generate(input_ids=[1])
    e = ei.value
    assert e.status == 400 and not e.transient and e.detail == msg and msg in str(e)
    assert len(fake.seen) == 1


@pytest.mark.parametrize(
    "body,words",
    [
        (b'{"text": "a", "output_ids": [1, 2', "malformed JSON"),
        (b'{"text": "a", "meta_info": {}}', "no `output_ids`"),
        (b'{"text": "a", "output_ids": [1, "2"]}', "ill-typed `output_ids`"),
        (b'{"text": "a", "output_ids": [1, true]}', "ill-typed `output_ids`"),
        (b'[1, 2]', "expected an object"),
    ],
)
def test_bad_answers_name_the_problem(fake, body, words):
    fake.on("/generate", (200, body))
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
    fake.on("/health", (503, b"warming up"))
    seen = []
    with pytest.raises(NotReady) as ei:
        client(fake.url).wait_ready(timeout=0.3, progress=lambda t, s: seen.append(s), poll=0.05)
    msg = str(ei.value)
    assert fake.url in msg and "not ready after 0.3 s" in msg and "503 warming up" in msg
    assert "readiness_timeout" in msg
    assert seen and set(seen) == {"503 warming up"}


def test_wait_ready_refused_then_timeout():
    url = f"http://127.0.0.1:{closed_port()}"
    assert SGLangClient(url).health() == (False, "refused")
    with pytest.raises(NotReady, match="last: refused"):
        SGLangClient(url).wait_ready(timeout=0.2, poll=0.05)


def test_wait_ready_passes_503_then_ready(fake):
    fake.routes = set(fakes.ROUTES)  # a whole server that answers 503 twice while it warms up, then 200
    fake.on("/health", (503, b""), times=2)
    seen = []
    waited = client(fake.url).wait_ready(timeout=10, progress=lambda t, s: seen.append(s), poll=0.01)
    assert seen == ["503", "503", "ready"] and waited >= 0
    assert [p for _, p, _ in fake.seen] == ["/health"] * 3  # readiness never asks /v1/models or /model_info


# ---------------------------------------------------------------------------
# info and memory


def test_model_info_falls_back_to_get_model_info(fake):
    fake.on("/get_model_info", (200, b'{"model_path": "/m", "tokenizer_path": "/m", "is_generation": true}'))
    assert client(fake.url).model_info()["model_path"] == "/m"
    assert [p for _, p, _ in fake.seen] == ["/model_info", "/get_model_info"]


def test_supports_memory_release(fake):
    c = client(fake.url)
    assert c.supports_memory_release() is False  # nothing answers: cannot tell
    fake.on("/server_info", (200, b'{"enable_memory_saver": true}'))
    assert c.supports_memory_release() is True
    fake.on("/get_server_info", (200, b'{"enable_memory_saver": false}'))
    assert c.supports_memory_release() is False
    assert all(m == "GET" for m, _, _ in fake.seen)


def test_release_and_resume_post_empty_objects(fake):
    fake.on("/release_memory_occupation", (200, b""))
    fake.on("/resume_memory_occupation", (200, b"{}"))
    c = client(fake.url)
    c.release_memory()
    c.resume_memory()
    assert fake.seen == [("POST", "/release_memory_occupation", b"{}"), ("POST", "/resume_memory_occupation", b"{}")]


def test_release_failure_is_not_retried(fake):
    fake.on("/release_memory_occupation", (500, b""))
    with pytest.raises(ServerError, match="500"):
        client(fake.url).release_memory()
    assert len(fake.seen) == 1


# ---------------------------------------------------------------------------
# chat template


def test_chat_ids_applies_template_locally(tmp_path):
    from transformers import AutoTokenizer

    from tools.tiny import write_tokenizer

    tok = AutoTokenizer.from_pretrained(str(write_tokenizer(tmp_path, vocab_size=512)))
    ids = chat_ids(tok, "print(1)")
    assert isinstance(ids, list) and ids and all(type(i) is int for i in ids)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>user\nprint(1)<|im_end|>\n<|im_start|>assistant\n")
    assert text.endswith("<think>\n\n</think>\n\n")
    assert not tok.decode(chat_ids(tok, "print(1)", enable_thinking=True)).endswith("</think>\n\n")


def test_url_needs_a_scheme():
    with pytest.raises(ValueError, match="http://"):
        SGLangClient("localhost:30000")


# ---------------------------------------------------------------------------
# API key, load, background readiness


KEY = "sk-test-0123456789abcdef"


@pytest.fixture
def keyed():
    """The fake with every route, wanting the key (401 without it, except /health), as `sglang --api-key KEY`."""
    with fakes.serve(api_key=KEY, model_path="/m") as srv:
        yield srv


def test_api_key_is_sent_on_every_request_and_never_shown(keyed):
    c = client(keyed.url, api_key=KEY)
    assert c.health() == (True, "ready")
    assert c.model_info()["model_path"] == "/m"
    assert c.generate(input_ids=[1, 2], max_new_tokens=3)["output_ids"] == fakes.default_answer([1, 2])[:3]
    assert c.running_requests() == 0
    c.release_memory()
    c.resume_memory()
    assert [p for _, p, _ in keyed.seen] == [
        "/health",
        "/model_info",
        "/generate",
        "/v1/loads",
        "/release_memory_occupation",
        "/resume_memory_occupation",
    ]
    assert keyed.auth == [f"Bearer {KEY}"] * 6
    assert KEY not in repr(c)
    with pytest.raises(ServerError) as e:
        client(keyed.url).model_info()
    assert e.value.status == 401
    assert keyed.auth[-1] is None  # no key configured: no header


def test_401_names_the_variable_to_set_and_never_the_key(keyed):
    with pytest.raises(ServerError) as e:
        client(keyed.url).model_info()  # no key: the fake answers 401 {"error": "Unauthorized"}, as SGLang does
    msg = str(e.value)
    assert e.value.status == 401 and "Unauthorized" in msg and "--api-key" in msg
    assert "set the environment variable SGLANG_API_KEY" in msg
    assert len(keyed.seen) == 1  # not retried
    keyed.on("/generate", (403, b'{"error": {"message": "Forbidden"}}'))
    with pytest.raises(ServerError) as e:
        client(keyed.url, api_key=KEY, key_env="MY_KEY").generate(input_ids=[1])
    msg = str(e.value)
    assert e.value.status == 403 and "refused the API key" in msg and "MY_KEY" in msg and KEY not in msg
    assert len(keyed.seen) == 2  # not retried either


def test_running_requests_from_v1_loads_then_get_load(fake):
    c = client(fake.url)
    assert c.running_requests() is None  # neither endpoint: cannot tell
    fake.on(
        "/get_load",
        (
            200,
            b'[{"dp_rank": 0, "num_reqs": 2, "num_waiting_reqs": 1, "num_tokens": 9}, '
            b'{"dp_rank": 1, "num_reqs": 1, "num_waiting_reqs": 0, "num_tokens": 3}]',
        ),
    )
    assert c.running_requests() == 3  # num_reqs already counts the waiting ones
    fake.on(
        "/v1/loads",
        (
            200,
            b'{"dp_rank_count": 2, "loads": [{"dp_rank": 0, "num_running_reqs": 1, '
            b'"num_waiting_reqs": 2}, {"dp_rank": 1, "num_running_reqs": 0, '
            b'"num_waiting_reqs": 0}]}',
        ),
    )
    assert c.running_requests() == 3
    fake.on("/v1/loads", (200, b'{"loads": [{"num_running_reqs": "many"}]}'))
    with pytest.raises(ServerError, match="num_running_reqs"):
        c.running_requests()


def test_health_poller_says_checking_until_a_slow_health_answers(fake):
    fake.on("/health", (200, b""))
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
    assert HEALTH_TIMEOUT_S >= 5
    import inspect

    assert inspect.signature(SGLangClient.health).parameters["timeout"].default == HEALTH_TIMEOUT_S
