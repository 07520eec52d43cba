"""The stand-in's HTTP server: routing, API keys, startup and readiness, knowing no engine. Each request goes to the
stand-in protocol that --protocol names (`protocols`: SGLang's `sglang_api`, the default, vLLM's `vllm_api`,
llama.cpp's `llamacpp_api`, or one registered by a caller), which holds its routes, answer and error shapes, its
open routes and its startup; every protocol decodes through `protocol.decode` (greedy, or speculatively with
--speculative-draft, --speculative-bug faults included).

Contract: not a real engine; for tests, the demo and offline use.
- Startup: a protocol whose LOADING is None binds after loading: the port refuses connections for the load and
  the first 1 - WARMUP of --startup-delay, then its readiness route answers 503 for the rest. Otherwise the port
  binds first and every route answers 503 LOADING until the model is loaded and the delay is over.
- --api-key KEY: every route the protocol does not leave open (`open_path`) wants `Authorization: Bearer KEY`,
  else 401 in the protocol's shape. The key is compared in constant time and never logged.
- A POST to a route outside the protocol's POSTS answers 404 before the body is read; a body that is not JSON
  answers 400; a `BadRequest` its status; any other error 500 ("internal error: ..."), never a dead server.
"""

from __future__ import annotations

import hmac
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch

from ..drafters import CheckpointError
from . import faults, protocols, specdec
from .model import Engine
from .protocol import BadRequest, log, not_ready


class Handler(BaseHTTPRequestHandler):
    server_version = "dflash-dash-standin/1"
    protocol_version = "HTTP/1.1"

    @property
    def eng(self) -> Engine:
        return self.server.engine  # type: ignore[attr-defined]

    @property
    def proto(self) -> Any:
        """The stand-in protocol --protocol names (`protocols`)."""
        return self.server.protocol  # type: ignore[attr-defined]

    def log_message(self, fmt: str, *args) -> None:
        log(f"{self.address_string()} {fmt % args}")

    def reply(self, status: int, body: Any = None, text: str | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else (text or "").encode()
        try:
            self.send_response(status)
            if body is not None:
                self.send_header("Content-Type", "application/json")
            elif data:
                self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            log(f"client {self.address_string()} went away before the answer to {self.path}")
            self.close_connection = True

    def error(self, status: int, message: str) -> None:
        self.reply(status, self.proto.error(status, message))

    def drain(self) -> None:
        """Read and drop the request's body (an answer sent before reading it)."""
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n, self.close_connection = 0, True
        if n > 0:
            self.rfile.read(n)

    def body(self) -> Any:
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise BadRequest("bad Content-Length header") from None
        raw = self.rfile.read(n) if n > 0 else b""
        if not raw.strip():
            raise BadRequest("the request body is empty; send a JSON object")
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BadRequest(f"the request body is not valid JSON: {e}") from None

    def authorized(self, path: str) -> bool:
        """True when the request may proceed; else answers 401 as the protocol's --api-key does."""
        key = getattr(self.server, "api_key", None)
        if not key or self.proto.open_path(path):
            return True
        got = self.headers.get("Authorization") or ""
        if hmac.compare_digest(got.encode(), f"Bearer {key}".encode()):
            return True
        self.drain()
        self.reply(401, self.proto.unauthorized())
        return False

    def loading(self) -> bool:
        """A protocol bound before loading (LOADING set) answers every route 503 LOADING until ready: True when
        it answered so."""
        if self.proto.LOADING is None or not_ready(self.eng) is None:
            return False
        self.drain()
        self.error(503, self.proto.LOADING)
        return True

    def route(self, method: str) -> None:
        path, _, query = self.path.partition("?")
        if self.loading() or not self.authorized(path):
            return
        try:
            if method == "GET":
                got = self.proto.get(self.eng, path, query)
            elif path in self.proto.POSTS:
                got = self.proto.post(self.eng, path, self.body())
            else:
                self.drain()
                got = None
            if got is None:
                return self.reply(404, self.proto.not_found(method, path))
            self.reply(*got)
        except BadRequest as e:
            self.error(e.status, str(e))
        except Exception as e:  # noqa: BLE001  (a handler bug must not kill the server)
            log(f"error on {method} {path}: {e!r}")
            self.error(500, f"internal error: {e if method == 'GET' else repr(e)}")

    def do_GET(self) -> None:  # noqa: N802
        self.route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self.route("POST")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address) -> None:
        log(f"connection error with {client_address}: {sys.exc_info()[1]!r}")


def bind(host: str, port: int, eng: Engine, api_key: str | None, protocol: str) -> Server:
    """A server on `host`:`port` (0: a free port, `server_address` says which) answering for `eng` in engine
    `protocol`'s stand-in protocol (`protocols.get`); not serving until `run_forever` or `background`."""
    proto = protocols.get(protocol)
    try:
        httpd = Server((host, port), Handler)
    except OSError as e:
        raise SystemExit(f"cannot listen on {host}:{port}: {e}; choose another --port or stop what holds it") from None
    httpd.engine = eng  # type: ignore[attr-defined]
    httpd.api_key = api_key or None  # type: ignore[attr-defined]
    httpd.protocol = proto  # type: ignore[attr-defined]
    return httpd


def background(httpd: Server) -> threading.Thread:
    """Serve `httpd` in a daemon thread (`httpd.shutdown()` ends it)."""
    thread = threading.Thread(target=run_forever, args=(httpd,), name="serve", daemon=True)
    thread.start()
    return thread


def load(eng: Engine, speculative_draft: str | None, speculative_bug: str | None) -> None:
    """Load the model, the drafter and the tokenizer (SystemExit naming a bad drafter)."""
    try:
        eng.load()
    except CheckpointError as e:
        raise SystemExit(f"--speculative-draft {speculative_draft}: {e}") from None
    if eng.spec is not None:
        log(
            f"speculative decoding: {eng.spec.drafter.c.family.upper()}, drafter {eng.spec.path} "
            f"(block {eng.spec.block_size})"
            + (
                f"; DELIBERATELY BROKEN decoder --speculative-bug {speculative_bug} (a test aid)"
                if speculative_bug
                else ""
            )
        )
    eng.load_tokenizer()
    log(f"linear-attention kernels: {eng.backend}")


def serve(
    model: str,
    host: str = "127.0.0.1",
    port: int = 30000,
    startup_delay: float = 0.0,
    device: str | None = None,
    health_delay: float = 0.0,
    api_key: str | None = None,
    speculative_draft: str | None = None,
    speculative_bug: str | None = None,
    token_delay: float = 0.0,
    protocol: str = "sglang",
    speculative_stats: str = "none",
    metrics: bool = False,
) -> None:
    """Load `model` (and the DFlash drafter `speculative_draft`, when given) and serve it in `protocol`'s shapes
    until interrupted (blocking), starting up as that engine does (its protocol's LOADING and WARMUP): SGLang binds
    after loading and answers /health 503 for the second half of `startup_delay`; vLLM binds only after loading and
    the whole delay; llama.cpp binds first and answers 503 "Loading model" while loading and for the delay;
    `metrics`: llama.cpp's GET /metrics served (llama-server's --metrics). See the module docstrings."""
    t0 = time.monotonic()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    proto = protocols.get(protocol)
    eng = Engine(
        model_dir=Path(model).resolve(),
        device=device,
        health_delay=max(0.0, health_delay),
        token_delay=max(0.0, token_delay),
        spec_stats=speculative_stats,
        metrics=bool(metrics),
    )
    if not (eng.model_dir / "config.json").exists():
        raise SystemExit(f"no config.json in {eng.model_dir}: --model must be a Hugging Face model folder")
    if speculative_bug and not speculative_draft:
        raise SystemExit("--speculative-bug needs --speculative-draft CKPT (it breaks the speculative decoder)")
    if speculative_bug and speculative_bug not in faults.BUGS:
        raise SystemExit(f"--speculative-bug {speculative_bug!r}: expected one of {', '.join(faults.BUGS)}")
    if speculative_draft:
        eng.spec = specdec.Speculator(speculative_draft, device, speculative_bug)
    startup_delay = max(0.0, startup_delay)
    if proto.LOADING is not None:  # bound first, 503 LOADING until loaded and the delay is over
        httpd = bind(host, port, eng, api_key, protocol)
        log(f"{protocol} protocol on {host}:{port}; loading {eng.model_dir} on {device} (/health 503 until loaded)")
        loader = background(httpd)
        load(eng, speculative_draft, speculative_bug)
        eng.ready_at = time.monotonic() + startup_delay
        log(f"loaded in {time.monotonic() - t0:.1f} s; ready in {startup_delay:g} s")
        try:
            while loader.is_alive():
                loader.join(0.5)
        except KeyboardInterrupt:
            log("interrupted")
        return
    log(f"loading {eng.model_dir} on {device} (port {port} not bound until loaded)")
    load(eng, speculative_draft, speculative_bug)
    warmup = startup_delay * proto.WARMUP  # bound for this share of the delay, readiness 503
    time.sleep(startup_delay - warmup)
    httpd = bind(host, port, eng, api_key, protocol)
    eng.ready_at = time.monotonic() + warmup
    bound = httpd.server_address
    log(
        f"loaded in {time.monotonic() - t0:.1f} s; {protocol} protocol on http://{bound[0]}:{bound[1]} "
        f"(warming up {warmup:g} s; tokenizer: {'yes' if eng.tokenizer else 'none'}; "
        f"/health takes {eng.health_delay:g} s; API key: {'required' if api_key else 'none'})"
    )
    run_forever(httpd)


def run_forever(httpd: Server) -> None:
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        httpd.server_close()
