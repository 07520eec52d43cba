"""Test helpers (not tests): the one fault-injecting fake SGLang server, a ThreadingHTTPServer in a thread.

It speaks the subset of SGLang's HTTP protocol the client uses, in SGLang's shapes (the protocol); a test
switches routes off (404, as a server without them answers) and injects faults on top.

Protocol, each route answering only while it is in `routes` (default: all of ROUTES):
- GET /health -> 200 "" (exempt from the API key, as in SGLang).
- GET /model_info, /get_model_info -> {"model_path", "tokenizer_path", "is_generation": true}.
- GET /get_server_info, /server_info -> {"model_path", "enable_memory_saver"}.
- GET /v1/loads -> {"dp_rank_count", "loads": [{"dp_rank", "num_running_reqs", "num_waiting_reqs",
  "num_used_tokens"}]}; GET /get_load -> [{"dp_rank", "num_reqs" (running + waiting), "num_waiting_reqs",
  "num_tokens"}], from `loads` (one (running, waiting) pair per data-parallel rank).
- POST /generate {"input_ids", "sampling_params": {"max_new_tokens"}} -> {"text", "output_ids":
  answer(input_ids)[:max_new_tokens], "meta_info": {"prompt_tokens", "completion_tokens", "finish_reason"}}.
- POST /release_memory_occupation, /resume_memory_occupation -> 200 {}.
- `api_key`: every route but /health wants `Authorization: Bearer KEY`, else 401 {"error": "Unauthorized"}.
Any other path, or a route switched off -> 404 {"error": {"message": "no route"}}.

Faults (injected answers win over the key check and the protocol):
- `on(path, *answers, times=None, when=None)`: requests to `path` (whose JSON body satisfies `when`) take
  `answers` in order, the last one repeating; with `times`, only that many requests in all, then the
  protocol answers again (e.g. 503-then-200 readiness: `on("/health", (503, b""), times=2)`).
  An answer is `(status, body)` (any status, any bytes: malformed JSON too), DROP (close the connection
  without an answer), RESET (a TCP reset in the middle of the exchange) or Slow(seconds[, then]) (answer
  `then`, or the protocol, after a delay).
- `gates[path] = threading.Event()`: requests to `path` wait for the event (up to 30 s) before answering.
Records: `seen` (method, path, body bytes) and `auth` (the Authorization header or None) of every request, in
order of arrival; `bodies(path)` the JSON bodies sent to a path.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROUTES = frozenset(
    {
        "/health",
        "/model_info",
        "/get_model_info",
        "/get_server_info",
        "/server_info",
        "/v1/loads",
        "/get_load",
        "/generate",
        "/release_memory_occupation",
        "/resume_memory_occupation",
    }
)
NO_ROUTE = b'{"error": {"message": "no route"}}'
UNAUTHORIZED = b'{"error": "Unauthorized"}'
DROP = "drop"
RESET = "reset"


@dataclass(frozen=True)
class Slow:
    """Answer after `seconds` (a slow server): `then` (a (status, body) answer) or else the protocol."""

    seconds: float
    then: tuple[int, bytes] | None = None


def default_answer(ids: list[int]) -> list[int]:
    return [(sum(ids) + i) % 97 for i in range(8)]


class FakeSGLang(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        *,
        routes=ROUTES,
        model_path: str = "/models/fake",
        tokenizer_path: str | None = None,
        answer: Callable[[list[int]], list[int]] = default_answer,
        text: str = "",
        loads: list[tuple[int, int]] | None = None,
        memory_saver: bool = True,
        api_key: str | None = None,
    ):
        super().__init__(("127.0.0.1", 0), Handler)
        self.routes = set(routes)
        self.model_path, self.tokenizer_path = model_path, tokenizer_path
        self.answer, self.text = answer, text
        self.loads = [(0, 0)] if loads is None else loads
        self.memory_saver, self.api_key = memory_saver, api_key
        self.injected: dict[str, dict] = {}  # path -> {"answers", "left", "when"}
        self.gates: dict[str, threading.Event] = {}  # path -> answered once the event is set
        self.seen: list[tuple[str, str, bytes]] = []  # (method, path, body) received
        self.auth: list[str | None] = []  # Authorization header of each request
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def on(self, path: str, *answers, times: int | None = None, when: Callable[[object], bool] | None = None):
        """Inject `answers` for `path` (see the module doc); no answers: remove the injection."""
        with self.lock:
            if answers:
                self.injected[path] = {"answers": list(answers), "left": times, "when": when}
            else:
                self.injected.pop(path, None)

    def bodies(self, path: str = "/generate") -> list:
        return [json.loads(b) for _, p, b in self.seen if p == path]

    def take(self, path: str, body: object):
        """The injected answer for this request, or None (the protocol answers)."""
        with self.lock:
            inj = self.injected.get(path)
            if inj is None or inj["left"] == 0 or (inj["when"] is not None and not inj["when"](body)):
                return None
            if inj["left"] is not None:
                inj["left"] -= 1
            answers = inj["answers"]
            return answers.pop(0) if len(answers) > 1 else answers[0]


class Handler(BaseHTTPRequestHandler):
    server: FakeSGLang

    def log_message(self, *a):
        pass

    def send(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:  # the client gave up (a slow answer after its timeout)
            self.close_connection = True

    def reply(self, status: int, obj) -> None:
        self.send(status, json.dumps(obj).encode())

    def do_GET(self):  # noqa: N802
        self.handle_request("GET")

    def do_POST(self):  # noqa: N802
        self.handle_request("POST")

    def handle_request(self, method: str) -> None:
        s, path = self.server, self.path.split("?", 1)[0]
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        with s.lock:
            s.seen.append((method, path, raw))
            s.auth.append(self.headers.get("Authorization"))
        gate = s.gates.get(path)
        if gate is not None:
            gate.wait(30)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        fault = s.take(path, body)
        if isinstance(fault, Slow):
            time.sleep(fault.seconds)  # the injected fault itself: a server slower than the client's timeout
            fault = fault.then
        if fault == DROP:
            self.close_connection = True
            return
        if fault == RESET:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        if fault is not None:
            return self.send(*fault)
        if path not in s.routes:
            return self.send(404, NO_ROUTE)
        if s.api_key and path != "/health" and self.headers.get("Authorization") != f"Bearer {s.api_key}":
            return self.send(401, UNAUTHORIZED)
        self.protocol_answer(method, path, body)

    def protocol_answer(self, method: str, path: str, body) -> None:
        s = self.server
        if method == "GET" and path == "/health":
            return self.send(200)
        if method == "GET" and path in ("/model_info", "/get_model_info"):
            return self.reply(
                200, {"model_path": s.model_path, "tokenizer_path": s.tokenizer_path, "is_generation": True}
            )
        if method == "GET" and path in ("/get_server_info", "/server_info"):
            return self.reply(200, {"model_path": s.model_path, "enable_memory_saver": s.memory_saver})
        if method == "GET" and path == "/v1/loads":
            return self.reply(
                200,
                {
                    "dp_rank_count": len(s.loads),
                    "loads": [
                        {"dp_rank": i, "num_running_reqs": r, "num_waiting_reqs": w, "num_used_tokens": 0}
                        for i, (r, w) in enumerate(s.loads)
                    ],
                },
            )
        if method == "GET" and path == "/get_load":
            return self.reply(
                200,
                [
                    {"dp_rank": i, "num_reqs": r + w, "num_waiting_reqs": w, "num_tokens": 0}
                    for i, (r, w) in enumerate(s.loads)
                ],
            )
        if method == "POST" and path in ("/release_memory_occupation", "/resume_memory_occupation"):
            return self.reply(200, {})
        if method == "POST" and path == "/generate":
            ids = body.get("input_ids") if isinstance(body, dict) else None
            if not isinstance(ids, list):
                return self.reply(400, {"error": {"message": "this fake answers `input_ids` requests only"}})
            limit = (body.get("sampling_params") or {}).get("max_new_tokens")
            out = s.answer(ids)[:limit]
            return self.reply(
                200,
                {
                    "text": s.text,
                    "output_ids": out,
                    "meta_info": {
                        "prompt_tokens": len(ids),
                        "completion_tokens": len(out),
                        "finish_reason": {"type": "length", "length": len(out)},
                    },
                },
            )
        self.send(404, NO_ROUTE)


@contextlib.contextmanager
def serve(**kw) -> Iterator[FakeSGLang]:
    """A FakeSGLang(**kw) serving in a daemon thread for the `with` block."""
    s = FakeSGLang(**kw)
    t = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield s
    finally:
        s.shutdown()
        s.server_close()
