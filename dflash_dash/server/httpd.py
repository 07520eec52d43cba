"""The stand-in's HTTP server: routes, API keys, startup and readiness, in the shapes and behaviour of the engine
named by --protocol: SGLang (default, below), vLLM (`vllm_api`) or llama.cpp (`llamacpp_api`), whose modules hold
their routes, shapes and startup. Every protocol decodes through `protocol.decode` (greedy, or speculatively with
--speculative-draft, --speculative-bug faults included).

Contract: this is NOT SGLang. It exists for tests, the demo and offline use, and speaks exactly this subset of
SGLang's HTTP protocol (`protocol` holds the request and answer shapes), with SGLang's startup behaviour:
- Startup: while loading (model load plus the first half of --startup-delay) the port is not bound
  (connection refused); then it binds and GET /health answers 503 for the second half ("warmup"), then
  200 with an empty body. /health also answers 503 while the memory is released; generation during
  warmup answers 503.
- GET /health: a real SGLang /health generates one token (after waiting about a second), so it is slow;
  with --health-delay S this one takes S seconds before answering 200 (503 answers at once).
- GET /model_info and /get_model_info -> {"model_path", "tokenizer_path", "is_generation"};
  GET /get_server_info -> {"enable_memory_saver": true, "model_path", ...}; GET /v1/models (OpenAI list).
  With a drafter /get_server_info reports speculative_algorithm (SGLang's name of the drafter's family: DFLASH,
  DSPARK, DOMINO, DFLASH2), speculative_draft_model_path, speculative_num_draft_tokens (the verify width) and
  speculative_dflash_block_size (B), as SGLang's ServerArgs name them; null without a drafter.
- Load: GET /v1/loads -> {"timestamp", "version", "dp_rank_count": 1, "loads": [{"dp_rank": 0,
  "num_running_reqs", "num_waiting_reqs", "num_used_tokens"}]} (newer SGLang) and GET /get_load ->
  [{"dp_rank": 0, "num_reqs" (running + waiting), "num_waiting_reqs", "num_tokens"}] (older SGLang).
- POST /release_memory_occupation and /resume_memory_occupation (`Engine.release`, `Engine.resume`); a release
  while a generation runs or waits answers 400 {"error": {"message": "release_memory_occupation needs an idle
  server: ..."}} and releases nothing.
- --api-key KEY: like SGLang's --api-key, every route except those under /health and /metrics wants
  `Authorization: Bearer KEY`; a missing or wrong header answers 401 {"error": "Unauthorized"} (SGLang's
  shape). The key is compared in constant time and never logged.
- Errors: 400 {"error": {"message"}} for bad JSON, bad fields, unsupported options; 404 same shape.
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

from ..drafters import CheckpointError, read_config
from . import faults, llamacpp_api, specdec, vllm_api
from .model import Engine
from .protocol import BadRequest, log, run_chat, run_generate


class Handler(BaseHTTPRequestHandler):
    server_version = "dflash-dash-standin/1"
    protocol_version = "HTTP/1.1"

    @property
    def eng(self) -> Engine:
        return self.server.engine  # type: ignore[attr-defined]

    @property
    def proto(self):
        """The protocol module of --protocol vllm | llamacpp (`vllm_api`, `llamacpp_api`); None: SGLang's, here."""
        return getattr(self.server, "protocol", None)

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
        body = self.proto.error(status, message) if self.proto else {"error": {"message": message, "code": status}}
        self.reply(status, body)

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

    def ready(self) -> str | None:
        """None when ready, else why /health answers 503."""
        if time.monotonic() < self.eng.ready_at:
            return "warming up"
        if self.eng.model is None:
            return "memory released"
        return None

    def authorized(self, path: str) -> bool:
        """True when the request may proceed; else answers 401 as SGLang's --api-key middleware does."""
        key = getattr(self.server, "api_key", None)
        exempt = self.proto.open_path(path) if self.proto else path.startswith(("/health", "/metrics"))
        if not key or exempt:
            return True
        got = self.headers.get("Authorization") or ""
        if hmac.compare_digest(got.encode(), f"Bearer {key}".encode()):
            return True
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n, self.close_connection = 0, True
        if n > 0:
            self.rfile.read(n)
        self.reply(401, self.proto.unauthorized() if self.proto else {"error": "Unauthorized"})
        return False

    def loading(self) -> bool:
        """llama-server answers every route 503 "Loading model" until loaded: True when it answered so."""
        if self.proto is None or self.proto.NAME != "llamacpp" or self.ready() is None:
            return False
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n, self.close_connection = 0, True
        if n > 0:
            self.rfile.read(n)
        self.error(503, self.proto.LOADING)
        return True

    def other_get(self, path: str) -> None:
        """GET in the vLLM or llama.cpp protocol (`self.proto`)."""
        if path == "/health" and self.proto.NAME == "vllm":
            return self.reply(200) if self.ready() is None else self.error(503, "the engine is not running")
        if path == "/server_info" and self.proto.NAME == "vllm" and vllm_api.dev_mode():
            return self.reply(200, vllm_api.server_info(self.eng, self.path))
        got = self.proto.get(self.eng, path)
        if got is None:
            return self.reply(404, self.proto.not_found(path))
        self.reply(*got)

    def other_post(self, path: str) -> None:
        """POST in the vLLM or llama.cpp protocol (`self.proto`)."""
        req = self.body()
        got = self.proto.post(self.eng, path, req)
        if got is None:
            return self.reply(404, self.proto.not_found(path))
        self.reply(*got)

    def guarded(self, verb: str, path: str, handle, shown: str) -> None:
        """`handle(path)` of another engine's protocol: a BadRequest answered with its status, any other error
        logged and answered 500 (`shown`: how the message shows the error, "{e}" or "{e!r}")."""
        try:
            handle(path)
        except BadRequest as e:
            self.error(e.status, str(e))
        except Exception as e:  # noqa: BLE001  (a handler bug must not kill the server)
            log(f"error on {verb} {path}: {e!r}")
            self.error(500, "internal error: " + shown.format(e=e))

    def do_GET(self) -> None:  # noqa: N802
        eng, path = self.eng, self.path.split("?", 1)[0]
        if self.loading() or not self.authorized(path):
            return
        if self.proto is not None:
            return self.guarded("GET", path, self.other_get, "{e}")
        info = {
            "model_path": str(eng.model_dir),
            "tokenizer_path": str(eng.model_dir) if eng.tokenizer else None,
            "is_generation": True,
        }
        try:
            if path == "/health":
                why = self.ready()
                if why is None and eng.health_delay > 0:
                    time.sleep(eng.health_delay)  # stands for SGLang generating its one health token
                    why = self.ready()
                if why is None:
                    self.reply(200)
                else:
                    self.reply(503, text=why)
            elif path == "/v1/loads":
                self.reply(
                    200,
                    {
                        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        "version": self.server_version,
                        "dp_rank_count": 1,
                        "loads": [eng.loads()],
                    },
                )
            elif path == "/get_load":
                ld = eng.loads()
                self.reply(
                    200,
                    [
                        {
                            "dp_rank": 0,
                            "num_reqs": ld["num_running_reqs"] + ld["num_waiting_reqs"],
                            "num_waiting_reqs": ld["num_waiting_reqs"],
                            "num_tokens": 0,
                        }
                    ],
                )
            elif path in ("/model_info", "/get_model_info"):
                self.reply(200, info)
            elif path in ("/get_server_info", "/server_info"):
                self.reply(
                    200,
                    {
                        **info,
                        "enable_memory_saver": True,
                        "device": eng.device,
                        "dtype": "float32",
                        "kernel_backend": eng.backend,
                        "memory_released": eng.model is None,
                        "version": f"dflash-dash stand-in ({self.server_version})",
                        **speculative_info(eng),
                    },
                )
            elif path == "/v1/models":
                self.reply(
                    200,
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": info["model_path"],
                                "object": "model",
                                "created": 0,
                                "owned_by": "sglang",
                                "root": info["model_path"],
                            }
                        ],
                    },
                )
            else:
                self.error(404, f"no route GET {path}")
        except Exception as e:  # noqa: BLE001  (a handler bug must not kill the server)
            log(f"error on GET {path}: {e!r}")
            self.error(500, f"internal error: {e}")

    def do_POST(self) -> None:  # noqa: N802
        eng, path = self.eng, self.path.split("?", 1)[0]
        if self.loading() or not self.authorized(path):
            return
        if self.proto is not None:
            return self.guarded("POST", path, self.other_post, "{e!r}")
        try:
            if path not in (
                "/generate",
                "/v1/chat/completions",
                "/release_memory_occupation",
                "/resume_memory_occupation",
            ):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                return self.error(404, f"no route POST {path}")
            req = self.body()
            if path in ("/generate", "/v1/chat/completions") and time.monotonic() < eng.ready_at:
                return self.error(503, "the server is warming up; wait until GET /health answers 200")
            if path == "/generate":
                self.reply(200, run_generate(eng, req))
            elif path == "/v1/chat/completions":
                self.reply(200, run_chat(eng, req))
            elif path == "/release_memory_occupation":
                eng.release()
                log("memory released")
                self.reply(200, {"success": True, "message": "memory released"})
            else:
                t0 = time.perf_counter()
                eng.resume()
                log(f"memory resumed in {time.perf_counter() - t0:.1f} s")
                self.reply(200, {"success": True, "message": "memory resumed"})
        except BadRequest as e:
            self.error(e.status, str(e))
        except Exception as e:  # noqa: BLE001  (a handler bug must not kill the server)
            log(f"error on POST {path}: {e!r}")
            self.error(500, f"internal error: {e!r}")


def speculative_info(eng: Engine) -> dict:
    """The speculative fields of /get_server_info, as SGLang names them (None when decoding plainly)."""
    s = eng.spec
    if s is None:
        return {
            "speculative_algorithm": None,
            "speculative_draft_model_path": None,
            "speculative_num_draft_tokens": None,
            "speculative_dflash_block_size": None,
        }
    cfg = read_config(s.path)
    return {  # python/sglang/srt/server_args.py: DFLASH sets num_steps and eagle_topk to 1
        "speculative_algorithm": cfg.family.upper(),
        "speculative_draft_model_path": str(Path(s.path).resolve()),
        "speculative_num_steps": 1,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": cfg.width,
        "speculative_dflash_block_size": cfg.block_size,
        "speculative_bug": s.bug,
    }


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address) -> None:
        log(f"connection error with {client_address}: {sys.exc_info()[1]!r}")


PROTOCOLS = ("sglang", "vllm", "llamacpp")  # --protocol: the engine whose HTTP protocol the stand-in speaks


def bind(host: str, port: int, eng: Engine, api_key: str | None, protocol: str) -> Server:
    try:
        httpd = Server((host, port), Handler)
    except OSError as e:
        raise SystemExit(f"cannot listen on {host}:{port}: {e}; choose another --port or stop what holds it") from None
    httpd.engine = eng  # type: ignore[attr-defined]
    httpd.api_key = api_key or None  # type: ignore[attr-defined]
    httpd.protocol = {"vllm": vllm_api, "llamacpp": llamacpp_api}.get(protocol)  # type: ignore[attr-defined]
    return httpd


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
    until interrupted (blocking), starting up as that engine does: SGLang binds after loading and answers /health
    503 for the second half of `startup_delay`; vLLM binds only after loading and the whole delay; llama.cpp binds
    first and answers 503 "Loading model" while loading and for the delay; `metrics`: llama.cpp's GET /metrics served
    (llama-server's --metrics). See the module docstrings."""
    t0 = time.monotonic()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if protocol not in PROTOCOLS:
        raise SystemExit(f"--protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
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
    if protocol == "llamacpp":  # bound first, 503 "Loading model" until loaded and the delay is over
        httpd = bind(host, port, eng, api_key, protocol)
        log(f"{protocol} protocol on {host}:{port}; loading {eng.model_dir} on {device} (/health 503 until loaded)")
        loader = threading.Thread(target=run_forever, args=(httpd,), name="serve", daemon=True)
        loader.start()
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
    warmup = startup_delay / 2 if protocol == "sglang" else 0.0  # vLLM: no /health 503 phase once bound
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
