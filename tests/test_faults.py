"""Fetch robustness: a fetch survives every server fault with nothing lost, a clear message, and a rerun that
fetches only the rest. The server here is the fault-injecting SGLang fake of tests/fakes.py, in a thread; the
stand-in server's own faults are in test_server.py."""

from __future__ import annotations

import json
import socket

import fakes
import pytest

from dflash_dash import ops, pipeline
from dflash_dash.engines import ServerError
from dflash_dash.store import Store

N = 6


def answer_for(ids: list[int]) -> list[int]:
    return [(sum(ids) + i) % 97 for i in range(5)]


def faults(mode: str) -> tuple:
    """The fault each mode injects into /generate of the failing prompt."""
    return {
        "500": (500, b"Internal Server Error"),
        "badjson": (200, b'{"text": "x", "output_ids": [1, 2'),
        "reset": fakes.RESET,  # RST in the middle of the exchange
        "slow": fakes.Slow(1.5),
    }[mode]  # longer than the 0.5 s request timeout


def fail_prompt(body) -> bool:
    """The failing prompt: p3 (by its first prompt id)."""
    return body["input_ids"][0] == 3


@pytest.fixture
def srv():
    with fakes.serve(answer=answer_for) as s:
        yield s


@pytest.fixture
def prompts(tmp_path):
    f = tmp_path / "prompts.jsonl"
    f.write_text("\n".join(json.dumps({"id": f"p{i} <b>", "prompt_ids": [i, 10 + i, 20]}) for i in range(N)))
    return str(f)


def fetch(st, srv, prompts, **kw):
    return pipeline.fetch(
        st, ops.Fetch(server=srv.url, prompt_set=prompts, name="set", max_new_tokens=5, **{"readiness_timeout": 5} | kw)
    )


def check_complete(st):
    rows = st.completions("set")
    assert [r["prompt_id"] for r in rows] == [f"p{i} <b>" for i in range(N)]  # order kept, no duplicates
    for r in rows:
        assert r["output_ids"] == answer_for(r["prompt_ids"])


def generated(srv, since: int = 0) -> list[list[int]]:
    """The input_ids of the /generate requests the fake received (from request number `since` on)."""
    return [b["input_ids"] for b in srv.bodies("/generate")[since:]]


@pytest.mark.parametrize(
    "mode,words",
    [
        ("500", "500"),
        ("badjson", "JSON"),
        ("reset", "reset"),
        ("slow", "timeout"),
    ],
)
def test_fault_keeps_fetched_and_rerun_fetches_the_rest(srv, prompts, tmp_path, mode, words):
    st = Store(tmp_path / "ws")
    srv.on("/generate", faults(mode), when=fail_prompt)
    with pytest.raises(ServerError) as e:
        fetch(st, srv, prompts, request_timeout=0.5)
    msg = str(e.value)
    assert "prompt 'p3 <b>'" in msg and "kept" in msg and "run the same fetch again" in msg
    assert words.lower() in msg.lower(), msg
    assert len(st.completions("set")) == 3  # everything before the fault is kept
    srv.on("/generate")  # the fault is over
    before = len(srv.bodies("/generate"))
    assert fetch(st, srv, prompts) == N - 3  # the rerun fetches only the rest
    assert generated(srv, before) == [[i, 10 + i, 20] for i in range(3, N)]
    check_complete(st)


@pytest.mark.parametrize("mode", ["500", "reset", "slow"])
def test_one_transient_fault_is_retried(srv, prompts, tmp_path, mode):
    st = Store(tmp_path / "ws")
    srv.on("/generate", faults(mode), when=fail_prompt, times=1)
    assert fetch(st, srv, prompts, request_timeout=0.5 if mode == "slow" else 600) == N
    assert generated(srv) == [[i, 10 + i, 20] for i in range(N) for _ in range(2 if i == 3 else 1)]  # p3 twice
    check_complete(st)


def test_503_longer_than_readiness_timeout(srv, prompts, tmp_path):
    st = Store(tmp_path / "ws")
    srv.on("/health", (503, b"warming up"))
    with pytest.raises(ServerError, match=r"not ready after .*503.*readiness_timeout"):
        fetch(st, srv, prompts, readiness_timeout=1.0)
    assert st.completions("set") == [] and generated(srv) == []


def test_refused(prompts, tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    st = Store(tmp_path / "ws")
    with pytest.raises(ServerError, match=r"not ready after .*refused"):
        pipeline.fetch(
            st,
            ops.Fetch(
                server=f"http://127.0.0.1:{port}",
                prompt_set=prompts,
                name="set",
                max_new_tokens=5,
                readiness_timeout=1.0,
            ),
        )


def test_fault_via_cli_is_one_clear_line(srv, prompts, tmp_path, capsys):
    from dflash_dash.cli import main

    srv.on("/generate", faults("500"), when=fail_prompt)
    rc = main(
        [
            "--workspace",
            str(tmp_path / "ws"),
            "fetch",
            "--server",
            srv.url,
            "--prompt-set",
            prompts,
            "--name",
            "set",
            "--max-new-tokens",
            "5",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "error: prompt 'p3 <b>'" in err and "run the same fetch again" in err
