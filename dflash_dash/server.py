"""A local stand-in for an SGLang server: one transformers causal LM, greedy decoding, stdlib HTTP.

Contract: this is NOT SGLang. It exists for tests, the demo and offline use, and speaks exactly this subset
of SGLang's HTTP protocol (SPEC section 4), with SGLang's shapes and startup behaviour:
- Startup: while loading (model load plus the first half of --startup-delay) the port is not bound
  (connection refused); then it binds and GET /health answers 503 for the second half ("warmup"), then
  200 with an empty body. /health also answers 503 while the memory is released; generation during
  warmup answers 503.
- GET /health: a real SGLang /health generates one token (after waiting about a second), so it is slow;
  with --health-delay S this one takes S seconds before answering 200 (503 answers at once).
- GET /model_info and /get_model_info -> {"model_path", "tokenizer_path", "is_generation"};
  GET /get_server_info -> {"enable_memory_saver": true, "model_path", ...}; GET /v1/models (OpenAI list).
- Load: GET /v1/loads -> {"timestamp", "version", "dp_rank_count": 1, "loads": [{"dp_rank": 0,
  "num_running_reqs", "num_waiting_reqs", "num_used_tokens"}]} (newer SGLang) and GET /get_load ->
  [{"dp_rank": 0, "num_reqs" (running + waiting), "num_waiting_reqs", "num_tokens"}] (older SGLang).
- POST /generate: {"text" | "input_ids", "sampling_params": {"temperature": 0 (required: greedy only),
  "max_new_tokens" (default 128), "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens",
  "no_stop_trim"}, "rid"} -> {"text", "output_ids", "meta_info": {"id", "prompt_tokens",
  "completion_tokens", "finish_reason": {"type": "stop", "matched": id | str} | {"type": "length",
  "length": n}, "e2e_latency"}}. output_ids include the matched stop token; text has the stop string trimmed.
- POST /v1/chat/completions: messages + chat_template_kwargs, applied with the model's tokenizer;
  OpenAI response shape with usage. Non-streaming only.
- POST /release_memory_occupation really frees the model (deleted, gc, CUDA cache emptied);
  POST /resume_memory_occupation reloads it from disk. Generation while released -> 400. SGLang asserts
  that its scheduler is idle when releasing; here a release while a generation runs or waits answers 400
  {"error": {"message": "release_memory_occupation needs an idle server: ..."}} and releases nothing.
- --api-key KEY: like SGLang's --api-key, every route except those under /health and /metrics wants
  `Authorization: Bearer KEY`; a missing or wrong header answers 401 {"error": "Unauthorized"} (SGLang's
  shape). The key is compared in constant time and never logged.
- Errors: 400 {"error": {"message"}} for bad JSON, bad fields, unsupported options; 404 same shape.
Generation is serialised by a lock (one request at a time); decoding uses the KV cache and stops at the
config's eos ids, at stop_token_ids and at stop strings. On CPU the torch path of the linear-attention
kernels is forced (`target.force_torch_kernels`; shown as `kernel_backend` in /get_server_info).
Without a tokenizer in the model folder only `input_ids` work and `text` answers "".
Speculative decoding (--speculative-draft CKPT): /generate and chat decode with a real greedy DFlash decoder
(`specdec`: one drafted block per verify step, one target forward verifies it, the cache is rolled back to the
accepted prefix, Gated DeltaNet states included); the tokens equal plain greedy decoding. meta_info then carries
SGLang's counters: spec_verify_ct, spec_accept_length (= completion_tokens / spec_verify_ct, as SGLang computes
it), spec_accept_rate, spec_accept_token_num / spec_draft_token_num (= spec_accepted_drafts /
spec_proposed_drafts: drafts accepted / proposed) and spec_accept_histogram (index = drafts accepted in a verify
step, value = steps); the first completion token comes from the prefill and no verify step. /get_server_info
reports speculative_algorithm "DFLASH", speculative_draft_model_path and speculative_num_draft_tokens (B).
--speculative-bug NAME (a test aid, never for real use) serves a deliberately broken decoder (`specdec.BUGS`).
"""

from __future__ import annotations

import argparse
import gc
import hmac
import inspect
import json
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch

from . import specdec
from .drafters import CheckpointError
from .target import force_torch_kernels

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
SAMPLING_KEYS = {
    "temperature",
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "no_stop_trim",
    "top_p",
    "top_k",
    "min_p",
    "n",
}
GENERATE_KEYS = {"text", "input_ids", "sampling_params", "rid", "stream", "return_logprob"}


class BadRequest(Exception):
    """A client error: answered 400 (or `status`) with {"error": {"message": str(self)}}."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def log(msg: str) -> None:
    print(f"[dflash-dash serve] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# model


def torch_kernels() -> str:
    """Force the torch path of the linear-attention kernels (fla cannot run on CPU); the backend bound."""
    return force_torch_kernels()


@dataclass
class Engine:
    model_dir: Path  # absolute path of the model folder
    device: str  # "cpu" or "cuda"
    model: Any = None  # the loaded AutoModelForCausalLM, None while released
    tokenizer: Any = None  # the folder's tokenizer, None when the folder has none
    eos_ids: set[int] = field(default_factory=set)  # the config's (and generation config's) eos ids
    vocab_size: int = 0  # rows of the LM head; input ids must be below it
    lock: threading.Lock = field(default_factory=threading.Lock)  # one generation / release at a time
    ready_at: float = float("inf")  # monotonic time after which /health answers 200
    backend: str = "default"  # linear-attention kernel backend bound ("torch" forced on CPU)
    health_delay: float = 0.0  # seconds a ready /health takes (a real one generates a token)
    running: int = 0  # generations decoding now (holding `lock`)
    waiting: int = 0  # generations queued for `lock`
    count_lock: threading.Lock = field(default_factory=threading.Lock)  # guards running / waiting
    spec: specdec.Speculator | None = None  # the DFlash speculative decoder (--speculative-draft), None: plain greedy

    # -- loading

    def load(self) -> None:
        """Load (or reload) the model from disk onto the device, fp32, eval mode."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32)
        if self.device == "cpu":
            self.backend = torch_kernels()  # after loading: the model's modeling module is imported now
        self.model = model.to(self.device).eval()
        cfg = model.config
        eos: set[int] = set()
        for src in (cfg, getattr(model, "generation_config", None)):
            e = getattr(src, "eos_token_id", None)
            eos |= set(e) if isinstance(e, (list, tuple)) else ({e} if e is not None else set())
        self.eos_ids = {int(i) for i in eos}
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        if self.spec is not None:  # the drafter, checked against this target (CheckpointError names the field)
            self.spec.device = self.device
            self.spec.load(self.model)

    def load_tokenizer(self) -> None:
        if not any((self.model_dir / f).exists() for f in TOKENIZER_FILES):
            return
        from transformers import AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        except Exception as e:  # noqa: BLE001  (a broken tokenizer leaves input_ids usable)
            log(f"no usable tokenizer in {self.model_dir}: {e}")

    def release(self) -> None:
        """Free the model's memory (the weights are reloaded by `resume`). Refused (400) unless idle: SGLang
        asserts that no request runs or waits when it releases."""
        if not self.lock.acquire(blocking=False):
            raise BadRequest(self._not_idle())
        try:
            if self.waiting:
                raise BadRequest(self._not_idle())
            self.model = None
            if self.spec is not None:
                self.spec.release()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        finally:
            self.lock.release()

    def _not_idle(self) -> str:
        with self.count_lock:
            running, waiting = self.running, self.waiting
        return (
            f"release_memory_occupation needs an idle server: {running} request(s) running, {waiting} "
            "waiting; SGLang asserts its scheduler is idle, so wait until GET /v1/loads reports none"
        )

    @contextmanager
    def generating(self):
        """Hold the generation lock, counted as waiting while queued and as running while held."""
        with self.count_lock:
            self.waiting += 1
        queued = True
        try:
            with self.lock:
                with self.count_lock:
                    self.waiting -= 1
                    self.running += 1
                queued = False
                try:
                    yield
                finally:
                    with self.count_lock:
                        self.running -= 1
        finally:
            if queued:
                with self.count_lock:
                    self.waiting -= 1

    def loads(self) -> dict:
        with self.count_lock:
            return {
                "dp_rank": 0,
                "num_running_reqs": self.running,
                "num_waiting_reqs": self.waiting,
                "num_used_tokens": 0,
            }

    def resume(self) -> None:
        with self.lock:
            if self.model is None:
                self.load()

    # -- decoding

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise BadRequest(
                f"`text` input needs a tokenizer, and the model folder {self.model_dir} has none; "
                "send `input_ids` instead or add tokenizer files to the folder"
            )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return "" if self.tokenizer is None else self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def live_model(self):
        """The loaded model; 400 while its memory is released."""
        if self.model is None:
            raise BadRequest(
                "the model's memory is released (POST /release_memory_occupation); "
                "POST /resume_memory_occupation before generating"
            )
        return self.model

    @torch.inference_mode()
    def greedy(
        self,
        ids: list[int],
        max_new: int,
        stop_ids: set[int],
        stops: list[str],
        skip_special: bool = True,
        trim: bool = True,
    ) -> tuple[list[int], str, dict]:
        """Greedy decode with the KV cache: (output ids, text, finish_reason). Caller holds the lock."""
        model = self.live_model()
        kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        out_ids: list[int] = []
        finish: dict = {"type": "length", "length": max_new}
        text = ""
        if max_new > 0:
            x = torch.tensor([ids], device=self.device)
            out = model(input_ids=x, use_cache=True, logits_to_keep=1)
            while True:
                tok = int(out.logits[0, -1].argmax())
                out_ids.append(tok)
                if tok in stop_ids:
                    finish = {"type": "stop", "matched": tok}
                    break
                if stops and self.tokenizer is not None:
                    text = self.decode(out_ids, skip_special)
                    hit = min(((text.find(s), s) for s in stops if s in text), default=None)
                    if hit is not None:
                        finish = {"type": "stop", "matched": hit[1]}
                        if trim:
                            text = text[: hit[0]]
                        return out_ids, text, finish
                if len(out_ids) >= max_new:
                    break
                cache = getattr(out, "cache", None)
                cache = out.past_key_values if cache is None else cache
                out = model(input_ids=torch.tensor([[tok]], device=self.device), use_cache=True, **{kw: cache})
        return out_ids, self.decode(out_ids, skip_special), finish

    def speculative(
        self,
        ids: list[int],
        max_new: int,
        stop_ids: set[int],
        stops: list[str],
        skip_special: bool = True,
        trim: bool = True,
    ) -> tuple[list[int], str, dict, dict]:
        """Greedy decode the speculative way (`specdec`), stopping as `greedy` does: (output ids, text,
        finish_reason, SGLang's speculative counters). Caller holds the lock."""
        model = self.live_model()

        def stop(out: list[int]) -> dict | None:
            if out[-1] in stop_ids:
                return {"type": "stop", "matched": out[-1]}
            if stops and self.tokenizer is not None:
                text = self.decode(out, skip_special)
                hit = min(((text.find(s), s) for s in stops if s in text), default=None)
                if hit is not None:
                    return {"type": "stop", "matched": hit[1]}
            return None

        out, finish, counters = self.spec.decode(model, ids, max_new, stop)
        text = self.decode(out, skip_special)
        if trim and isinstance(finish.get("matched"), str):
            text = text[: text.find(finish["matched"])]
        return out, text, finish, counters.meta(len(out))


# ---------------------------------------------------------------------------
# requests


def need_int(v: Any, name: str, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise BadRequest(f"`{name}` must be an integer >= {lo}, got {v!r}")
    return v


def need_strs(v: Any, name: str) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v] if v else []
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise BadRequest(f"`{name}` must be a string or a list of strings, got {v!r}")
    return [s for s in v if s]


def check_greedy(temperature: Any, top_k: Any = None) -> None:
    if top_k == 1:
        return
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature != 0:
        raise BadRequest(
            f"this stand-in server decodes greedily only: temperature must be 0, got {temperature!r} "
            "(SGLang's default is 1.0, so send temperature 0 explicitly)"
        )


def run_generate(eng: Engine, req: Any) -> dict:
    """POST /generate: validate `req`, decode, answer in SGLang's shape."""
    t0 = time.perf_counter()
    if not isinstance(req, dict):
        raise BadRequest("the body must be a JSON object")
    unknown = set(req) - GENERATE_KEYS
    if unknown:
        raise BadRequest(f"unsupported field(s) {sorted(unknown)}; this stand-in accepts {sorted(GENERATE_KEYS)}")
    if req.get("stream") or req.get("return_logprob"):
        raise BadRequest("`stream` and `return_logprob` are not supported by this stand-in server")
    if ("text" in req) == ("input_ids" in req):
        raise BadRequest("exactly one of `text` or `input_ids` must be given")
    sp = req.get("sampling_params", {})
    if not isinstance(sp, dict):
        raise BadRequest("`sampling_params` must be an object")
    unknown = set(sp) - SAMPLING_KEYS
    if unknown:
        raise BadRequest(f"unsupported sampling param(s) {sorted(unknown)}; supported: {sorted(SAMPLING_KEYS)}")
    check_greedy(sp.get("temperature", 1.0), sp.get("top_k"))
    if sp.get("n", 1) != 1:
        raise BadRequest("`n` must be 1")
    max_new = need_int(sp.get("max_new_tokens", 128), "max_new_tokens")
    stops = need_strs(sp.get("stop"), "stop")
    stop_tok = sp.get("stop_token_ids") or []
    if not isinstance(stop_tok, list):
        raise BadRequest("`stop_token_ids` must be a list of integers")
    stop_tok = [need_int(t, "stop_token_ids") for t in stop_tok]
    if stops and eng.tokenizer is None:
        raise BadRequest("`stop` strings need a tokenizer and the model folder has none; use `stop_token_ids`")
    if "text" in req:
        if not isinstance(req["text"], str) or not req["text"]:
            raise BadRequest("`text` must be a non-empty string")
        ids = eng.encode(req["text"])
    else:
        ids = req["input_ids"]
        if not isinstance(ids, list) or not ids:
            raise BadRequest("`input_ids` must be a non-empty list of integers")
        ids = [need_int(i, "input_ids") for i in ids]
    rid = req.get("rid") or uuid.uuid4().hex
    if not isinstance(rid, str):
        raise BadRequest("`rid` must be a string")
    with eng.generating():
        if eng.vocab_size and max(ids) >= eng.vocab_size:
            raise BadRequest(f"input id {max(ids)} is out of the vocabulary (size {eng.vocab_size})")
        eos = set() if sp.get("ignore_eos") else eng.eos_ids
        how = (eos | set(stop_tok), stops, bool(sp.get("skip_special_tokens", True)), not sp.get("no_stop_trim", False))
        spec: dict = {}
        if eng.spec is not None:
            out, text, finish, spec = eng.speculative(ids, max_new, *how)
        else:
            out, text, finish = eng.greedy(ids, max_new, *how)
    meta = {
        "id": rid,
        "prompt_tokens": len(ids),
        "completion_tokens": len(out),
        "cached_tokens": 0,
        "finish_reason": finish,
        "e2e_latency": time.perf_counter() - t0,
        **spec,
    }
    return {"text": text, "output_ids": out, "meta_info": meta}


def run_chat(eng: Engine, req: Any) -> dict:
    """POST /v1/chat/completions: apply the chat template locally, decode, answer in OpenAI's shape."""
    if not isinstance(req, dict):
        raise BadRequest("the body must be a JSON object")
    if eng.tokenizer is None:
        raise BadRequest(f"chat completions need a tokenizer and the model folder {eng.model_dir} has none")
    msgs = req.get("messages")
    if (
        not isinstance(msgs, list)
        or not msgs
        or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs
        )
    ):
        raise BadRequest("`messages` must be a non-empty list of {role, content} objects with string content")
    if req.get("stream"):
        raise BadRequest("`stream` is not supported by this stand-in server")
    if req.get("n", 1) != 1:
        raise BadRequest("`n` must be 1")
    kwargs = req.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest("`chat_template_kwargs` must be an object")
    check_greedy(req.get("temperature", 1.0), req.get("top_k"))
    max_new = req.get("max_completion_tokens", req.get("max_tokens"))
    max_new = 128 if max_new is None else need_int(max_new, "max_tokens")
    try:
        ids = eng.tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in msgs],
            add_generation_prompt=True,
            tokenize=True,
            **kwargs,
        )
    except Exception as e:  # noqa: BLE001  (template errors are the client's)
        raise BadRequest(f"chat template failed: {e}") from None
    if hasattr(ids, "keys") and "input_ids" in ids.keys():
        ids = ids["input_ids"]
    sp = {"temperature": 0, "max_new_tokens": max_new}
    if req.get("stop") is not None:
        sp["stop"] = req["stop"]
    body = {"input_ids": [int(i) for i in ids], "sampling_params": sp}
    gen = run_generate(eng, body)
    meta = gen["meta_info"]
    fin = meta["finish_reason"]
    return {
        "id": meta["id"],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(eng.model_dir),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": gen["text"]},
                "finish_reason": fin["type"],
                "matched_stop": fin.get("matched"),
            }
        ],
        "usage": {
            "prompt_tokens": meta["prompt_tokens"],
            "completion_tokens": meta["completion_tokens"],
            "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
        },
    }


# ---------------------------------------------------------------------------
# HTTP


class Handler(BaseHTTPRequestHandler):
    server_version = "dflash-dash-standin/1"
    protocol_version = "HTTP/1.1"

    @property
    def eng(self) -> Engine:
        return self.server.engine  # type: ignore[attr-defined]

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
        self.reply(status, {"error": {"message": message, "code": status}})

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
        if not key or path.startswith(("/health", "/metrics")):
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
        self.reply(401, {"error": "Unauthorized"})
        return False

    def do_GET(self) -> None:  # noqa: N802
        eng, path = self.eng, self.path.split("?", 1)[0]
        if not self.authorized(path):
            return
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
        if not self.authorized(path):
            return
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
        return {"speculative_algorithm": None, "speculative_draft_model_path": None}
    return {
        "speculative_algorithm": "DFLASH",
        "speculative_draft_model_path": str(Path(s.path).resolve()),
        "speculative_num_draft_tokens": s.drafter.c.block_size if s.drafter is not None else None,
        "speculative_bug": s.bug,
    }


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address) -> None:
        log(f"connection error with {client_address}: {sys.exc_info()[1]!r}")


# ---------------------------------------------------------------------------
# entry


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
) -> None:
    """Load `model` (and the DFlash drafter `speculative_draft`, when given) and serve it until interrupted
    (blocking). See the module docstring for the protocol."""
    t0 = time.monotonic()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    eng = Engine(model_dir=Path(model).resolve(), device=device, health_delay=max(0.0, health_delay))
    if not (eng.model_dir / "config.json").exists():
        raise SystemExit(f"no config.json in {eng.model_dir}: --model must be a Hugging Face model folder")
    if speculative_bug and not speculative_draft:
        raise SystemExit("--speculative-bug needs --speculative-draft CKPT (it breaks the speculative decoder)")
    if speculative_bug and speculative_bug not in specdec.BUGS:
        raise SystemExit(f"--speculative-bug {speculative_bug!r}: expected one of {', '.join(specdec.BUGS)}")
    if speculative_draft:
        eng.spec = specdec.Speculator(speculative_draft, device, speculative_bug)
    log(f"loading {eng.model_dir} on {device} (port {port} not bound until loaded)")
    try:
        eng.load()
    except CheckpointError as e:
        raise SystemExit(f"--speculative-draft {speculative_draft}: {e}") from None
    if eng.spec is not None:
        log(
            f"speculative decoding: DFLASH, drafter {eng.spec.path} (block {eng.spec.block_size})"
            + (
                f"; DELIBERATELY BROKEN decoder --speculative-bug {speculative_bug} (a test aid)"
                if speculative_bug
                else ""
            )
        )
    eng.load_tokenizer()
    log(f"linear-attention kernels: {eng.backend}")
    startup_delay = max(0.0, startup_delay)
    time.sleep(startup_delay / 2)
    try:
        httpd = Server((host, port), Handler)
    except OSError as e:
        raise SystemExit(f"cannot listen on {host}:{port}: {e}; choose another --port or stop what holds it") from None
    httpd.engine = eng  # type: ignore[attr-defined]
    httpd.api_key = api_key or None  # type: ignore[attr-defined]
    eng.ready_at = time.monotonic() + startup_delay / 2
    bound = httpd.server_address
    log(
        f"loaded in {time.monotonic() - t0:.1f} s; listening on http://{bound[0]}:{bound[1]} "
        f"(warming up {startup_delay / 2:g} s; tokenizer: {'yes' if eng.tokenizer else 'none'}; "
        f"/health takes {eng.health_delay:g} s; API key: {'required' if api_key else 'none'})"
    )
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        httpd.server_close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m dflash_dash.server",
        description="Local SGLang stand-in (tests, demo, offline): one transformers model, greedy decoding.",
    )
    p.add_argument("--model", required=True, help="Hugging Face model folder (config.json + safetensors)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port to bind (default 30000)")
    p.add_argument(
        "--startup-delay",
        type=float,
        default=0.0,
        help="extra startup seconds: first half with the port unbound, second half /health 503",
    )
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument(
        "--health-delay",
        type=float,
        default=0.0,
        help="seconds GET /health takes once ready (a real one generates a token; default 0)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require `Authorization: Bearer KEY` on every route except /health (as SGLang's --api-key)",
    )
    speculative_args(p)
    a = p.parse_args(argv)
    serve(
        a.model,
        a.host,
        a.port,
        a.startup_delay,
        a.device,
        a.health_delay,
        a.api_key,
        a.speculative_draft,
        a.speculative_bug,
    )


def speculative_args(p: argparse.ArgumentParser) -> None:
    """--speculative-draft / --speculative-bug (shared with `python -m dflash_dash serve`)."""
    p.add_argument(
        "--speculative-draft",
        default=None,
        metavar="CKPT",
        help="decode speculatively with this DFlash drafter (SGLang's --speculative-algorithm DFLASH "
        "--speculative-draft-model-path); meta_info then reports SGLang's spec_* counters",
    )
    p.add_argument(
        "--speculative-bug",
        default=None,
        choices=list(specdec.BUGS),
        help="TEST AID: serve a deliberately broken speculative decoder, for conformance tests "
        f"(truncate-context: the drafter sees only the last {specdec.TRUNCATE} context positions; "
        "layer-off-by-one: it gets decoder layer l-1's output for target layer id l)",
    )


if __name__ == "__main__":
    main()
