"""The local SGLang stand-in as a real subprocess on a real port, driven by the SGLang client.

Greedy output is checked against a local transformers `generate` of the same model (fp32, CPU)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from serving import end, free_port

from dflash_dash import server
from dflash_dash.engines import ServerError, SGLangClient, chat_ids
from tools.tiny import TinyTarget, write_target, write_tokenizer

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [5, 6, 7, 8, 9, 10, 11]
N = 24


# ---------------------------------------------------------------------------
# fixtures


class Proc:
    """A stand-in server subprocess: its client, the health states seen while starting, its log."""

    def __init__(self, model: Path, log: Path, delay: float):
        self.port = free_port()
        self.log = log
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = SGLangClient(self.url, timeout=60, retries=0)
        self.states: list[str] = []
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dflash_dash.server",
                "--model",
                str(model),
                "--port",
                str(self.port),
                "--startup-delay",
                str(delay),
                "--device",
                "cpu",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=open(log, "wb"),
        )

    def progress(self, elapsed: float, state: str) -> None:
        self.states.append(state)
        if self.proc.poll() is not None:
            raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        end(self.proc)


def start(model: Path, log: Path, delay: float) -> Proc:
    p = Proc(model, log, delay)
    try:
        p.client.wait_ready(timeout=120, progress=p.progress, poll=0.1)
    except BaseException:
        p.stop()
        raise
    return p


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hybrid")
    write_target(d, TinyTarget())
    write_tokenizer(d, vocab_size=512)
    return d


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    return write_target(tmp_path_factory.mktemp("plain"), TinyTarget(model_type="qwen3", seed=1))


@pytest.fixture(scope="module")
def srv(hybrid, tmp_path_factory):
    p = start(hybrid, tmp_path_factory.mktemp("log") / "server.log", delay=2.0)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def reference(hybrid):
    """Local greedy decoding of the hybrid model with transformers: prompt ids -> new ids."""
    return greedy_fn(hybrid)


def greedy_fn(model_dir: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    server.torch_kernels()

    def run(ids: list[int], n: int = N) -> list[int]:
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
        return out[0, len(ids) :].tolist()

    return run


def post(url: str, body: bytes | dict) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# ---------------------------------------------------------------------------
# startup and info


def test_startup_passes_through_refused_then_503(srv):
    assert "refused" in srv.states
    assert any(s.startswith("503") for s in srv.states)
    assert srv.states[-1] == "ready"
    first_503 = next(i for i, s in enumerate(srv.states) if s.startswith("503"))
    assert "refused" not in srv.states[first_503:]  # bound once, never unbound again
    assert srv.client.health() == (True, "ready")


def test_model_info_and_models(srv, hybrid):
    info = srv.client.model_info()
    path = str(hybrid.resolve())
    assert info == {"model_path": path, "tokenizer_path": path, "is_generation": True}
    with urllib.request.urlopen(srv.url + "/get_model_info") as r:
        assert json.loads(r.read()) == info
    with urllib.request.urlopen(srv.url + "/v1/models") as r:
        assert json.loads(r.read())["data"][0]["id"] == str(hybrid.resolve())
    assert srv.client.supports_memory_release() is True
    assert srv.client.server_info()["kernel_backend"] == "torch"  # forced on CPU


# ---------------------------------------------------------------------------
# generation


def test_generate_ids_equal_local_greedy(srv, reference):
    out = srv.client.generate(input_ids=PROMPT, max_new_tokens=N)
    want = reference(PROMPT)
    assert out["output_ids"] == want
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == len(PROMPT) and meta["completion_tokens"] == len(want)
    assert meta["finish_reason"]["type"] in ("stop", "length") and meta["e2e_latency"] > 0
    assert out["request"] == {"input_ids": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": N}}


def test_text_input_and_stop_strings(srv, hybrid, reference):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hybrid))
    text = "def main(argv):\n    return"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    want = reference(ids)
    out = srv.client.generate(text=text, max_new_tokens=N)
    assert out["output_ids"] == want and out["meta_info"]["prompt_tokens"] == len(ids)
    assert out["text"] == tok.decode(want, skip_special_tokens=True)

    full = out["text"]
    pieces = [full[i : i + 2] for i in range(len(full) // 2, len(full))]
    stop = next(s for s in pieces if s.strip() and "\ufffd" not in s)  # a string the model does produce
    cut = srv.client.generate(text=text, max_new_tokens=N, stop=[stop])
    got = cut["output_ids"]
    assert got == want[: len(got)] and cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    decoded = tok.decode(got, skip_special_tokens=True)
    assert cut["text"] == decoded[: decoded.index(stop)]


def test_stop_token_ids(srv, reference):
    want = reference(PROMPT)
    t = want[3]
    out = srv.client.generate(input_ids=PROMPT, max_new_tokens=N, extra={"sampling_params": {"stop_token_ids": [t]}})
    assert out["output_ids"] == want[: want.index(t) + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": t}


def test_400_message_passes_through_unchanged(srv):
    body = {"input_ids": PROMPT, "sampling_params": {"temperature": 0.7, "top_p": 0, "max_new_tokens": 4}}
    status, raw = post(srv.url + "/generate", body)
    assert status == 400
    with pytest.raises(ServerError) as ei:
        srv.client.generate(input_ids=PROMPT, extra={"sampling_params": {"temperature": 0.7, "top_p": 0}})
    assert ei.value.status == 400 and not ei.value.transient
    assert ei.value.detail == raw["error"]["message"] and raw["error"]["message"] in str(ei.value)
    assert ei.value.detail == "top_p must be in (0, 1], got 0.0."  # SGLang's SamplingParams.verify message


@pytest.mark.parametrize(
    "body,words",
    [
        (b"{not json", "not valid JSON"),
        ({"input_ids": [], "sampling_params": {"temperature": 0}}, "input_ids"),
        ({"input_ids": [1], "sampling_params": {"temperature": -1}}, "temperature"),
        ({"input_ids": [1, "x"], "sampling_params": {"temperature": 0}}, "input_ids"),
        ({"input_ids": [99999], "sampling_params": {"temperature": 0}}, "vocabulary"),
        ({"text": "a", "input_ids": [1], "sampling_params": {"temperature": 0}}, "exactly one"),
        ({"input_ids": [1], "sampling_params": {"temperature": 0, "max_new_tokens": -1}}, "max_new_tokens"),
        ({"input_ids": [1], "sampling_params": {"temperature": 0, "bogus": 1}}, "bogus"),
    ],
)
def test_bad_requests_are_400_with_message(srv, body, words):
    status, raw = post(srv.url + "/generate", body)
    assert status == 400 and words in raw["error"]["message"]


def test_unknown_path_is_404(srv):
    status, raw = post(srv.url + "/nope", {})
    assert status == 404 and "/nope" in raw["error"]["message"]
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(srv.url + "/nope")
    assert ei.value.code == 404 and "message" in json.loads(ei.value.read())["error"]


def test_client_disconnect_does_not_crash(srv):
    body = json.dumps({"input_ids": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": N}}).encode()
    for data in (  # half a request, then a whole request whose answer nobody reads
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"input",
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
    ):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(data)
        s.close()
    assert srv.client.generate(input_ids=PROMPT, max_new_tokens=2)["output_ids"]
    assert srv.proc.poll() is None


def test_chat_completions(srv, hybrid, reference):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hybrid))
    ids = chat_ids(tok, "hello", enable_thinking=False)
    want = reference(ids, 8)
    status, raw = post(
        srv.url + "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hello"}],
            "temperature": 0,
            "max_tokens": 8,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    )
    assert status == 200 and raw["object"] == "chat.completion"
    content = tok.decode(want, skip_special_tokens=True)
    assert raw["choices"][0]["message"] == {"role": "assistant", "content": content}
    n, m = len(ids), len(want)
    assert raw["usage"] == {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}
    cold = {"messages": [{"role": "user", "content": "hi"}], "temperature": -1}
    status, raw = post(srv.url + "/v1/chat/completions", cold)
    assert status == 400 and "temperature" in raw["error"]["message"]


# ---------------------------------------------------------------------------
# memory release (last: it reloads the model)


def test_release_then_resume(srv, reference):
    c = srv.client
    c.release_memory()
    ok, state = c.health()
    assert not ok and state.startswith("503")
    with pytest.raises(ServerError) as ei:
        c.generate(input_ids=PROMPT, max_new_tokens=4)
    assert ei.value.status == 400 and "released" in str(ei.value) and "resume" in str(ei.value)
    c.resume_memory()
    c.wait_ready(timeout=30, poll=0.1)
    assert c.generate(input_ids=PROMPT, max_new_tokens=N)["output_ids"] == reference(PROMPT)


# ---------------------------------------------------------------------------
# a model folder without a tokenizer


def test_plain_model_without_tokenizer(plain, tmp_path):
    p = start(plain, tmp_path / "plain.log", delay=0.0)
    try:
        c = p.client
        assert c.model_info()["tokenizer_path"] is None
        out = c.generate(input_ids=PROMPT, max_new_tokens=N)
        assert out["output_ids"] == greedy_fn(plain)(PROMPT) and out["text"] == ""
        with pytest.raises(ServerError, match="tokenizer") as ei:
            c.generate(text="hello")
        assert ei.value.status == 400
        status, raw = post(p.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
        assert status == 400 and "tokenizer" in raw["error"]["message"]
        assert "POST /generate" in p.log.read_text()  # one log line per request
    finally:
        p.stop()
