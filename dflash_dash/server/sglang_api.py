"""SGLang's HTTP protocol as the local stand-in speaks it (`serve --protocol sglang`, the default): routes, API keys,
startup, errors; the request and answer shapes of /generate and /v1/chat/completions are `protocol`'s.

Contract: this is NOT SGLang; it speaks exactly this subset of SGLang's HTTP protocol, with SGLang's startup
behaviour (a registered stand-in protocol, `protocols`):
- Startup: while loading (model load plus the first half of --startup-delay) the port is not bound
  (connection refused); then it binds and GET /health answers 503 for the second half ("warmup"), then
  200 with an empty body. /health also answers 503 while the memory is released; generation during
  warmup answers 503.
- GET /health: a real SGLang /health generates one token (after waiting about a second), so it is slow;
  with --health-delay S this one takes S seconds before answering 200 (503 answers at once).
- GET /model_info and /get_model_info -> {"model_path", "tokenizer_path", "is_generation"};
  GET /get_server_info (and /server_info) -> {"enable_memory_saver": true, "model_path", ...}; GET /v1/models
  (OpenAI list). With a drafter /get_server_info reports speculative_algorithm (SGLang's name of the drafter's
  family: DFLASH, DSPARK, DOMINO, DFLASH2), speculative_draft_model_path, speculative_num_draft_tokens (the verify
  width) and speculative_dflash_block_size (B), as SGLang's ServerArgs name them (python/sglang/srt/server_args.py);
  null without a drafter.
- Load: GET /v1/loads -> {"timestamp", "version", "dp_rank_count": 1, "loads": [{"dp_rank": 0,
  "num_running_reqs", "num_waiting_reqs", "num_used_tokens"}]} (newer SGLang) and GET /get_load ->
  [{"dp_rank": 0, "num_reqs" (running + waiting), "num_waiting_reqs", "num_tokens"}] (older SGLang).
- POST /generate, /v1/chat/completions (`protocol.run_generate`, `protocol.run_chat`);
  POST /release_memory_occupation and /resume_memory_occupation (`Engine.release`, `Engine.resume`); a release
  while a generation runs or waits answers 400 {"error": {"message": "release_memory_occupation needs an idle
  server: ..."}} and releases nothing.
- --api-key KEY: like SGLang's --api-key, every route except those under /health and /metrics wants
  `Authorization: Bearer KEY`; a missing or wrong header answers 401 {"error": "Unauthorized"} (SGLang's
  shape).
- Errors: 400 {"error": {"message", "code"}} for bad JSON, bad fields, unsupported options; 404 "no route".
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..drafters import read_config
from .protocol import log, not_ready, run_chat, run_generate

if TYPE_CHECKING:
    from .model import Engine

NAME = "sglang"
GENERATE = "/generate"  # the generation route (named in --protocol's help)
LOADING = None  # SGLang binds its port only after loading: no "loading" answer
WARMUP = 0.5  # share of --startup-delay the bound port answers /health 503 (the rest: not bound)
POSTS = frozenset({"/generate", "/v1/chat/completions", "/release_memory_occupation", "/resume_memory_occupation"})
VERSION = "dflash-dash-standin/1"  # the server's version string


def open_path(path: str) -> bool:
    """SGLang's --api-key exempts /health and /metrics only."""
    return path.startswith(("/health", "/metrics"))


def unauthorized() -> Any:
    return {"error": "Unauthorized"}


def error(status: int, message: str) -> dict:
    return {"error": {"message": message, "code": status}}


def not_found(method: str, path: str) -> dict:
    return error(404, f"no route {method} {path}")


def info(eng: Engine) -> dict:
    """GET /model_info's answer."""
    return {
        "model_path": str(eng.model_dir),
        "tokenizer_path": str(eng.model_dir) if eng.tokenizer else None,
        "is_generation": True,
    }


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


def health(eng: Engine) -> tuple:
    why = not_ready(eng)
    if why is None and eng.health_delay > 0:
        time.sleep(eng.health_delay)  # stands for SGLang generating its one health token
        why = not_ready(eng)
    return (200, None) if why is None else (503, None, why)


def get(eng: Engine, path: str, query: str) -> tuple | None:
    """(status, JSON body) or (status, None, text) of a GET route, None when there is none."""
    if path == "/health":
        return health(eng)
    if path == "/v1/loads":
        load = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "version": VERSION, "dp_rank_count": 1}
        return 200, load | {"loads": [eng.loads()]}
    if path == "/get_load":
        ld = eng.loads()
        n = ld["num_running_reqs"] + ld["num_waiting_reqs"]
        return 200, [{"dp_rank": 0, "num_reqs": n, "num_waiting_reqs": ld["num_waiting_reqs"], "num_tokens": 0}]
    if path in ("/model_info", "/get_model_info"):
        return 200, info(eng)
    if path in ("/get_server_info", "/server_info"):
        return 200, {
            **info(eng),
            "enable_memory_saver": True,
            "device": eng.device,
            "dtype": "float32",
            "kernel_backend": eng.backend,
            "memory_released": eng.model is None,
            "version": f"dflash-dash stand-in ({VERSION})",
            **speculative_info(eng),
        }
    if path == "/v1/models":
        model = {"id": str(eng.model_dir), "object": "model", "created": 0, "owned_by": "sglang"}
        return 200, {"object": "list", "data": [model | {"root": str(eng.model_dir)}]}
    return None


def post(eng: Engine, path: str, req: Any) -> tuple | None:
    """(status, JSON body) of a POST route (one of POSTS), None when there is none."""
    if path in ("/generate", "/v1/chat/completions") and time.monotonic() < eng.ready_at:
        return 503, error(503, "the server is warming up; wait until GET /health answers 200")
    if path == "/generate":
        return 200, run_generate(eng, req)
    if path == "/v1/chat/completions":
        return 200, run_chat(eng, req)
    if path == "/release_memory_occupation":
        eng.release()
        log("memory released")
        return 200, {"success": True, "message": "memory released"}
    if path == "/resume_memory_occupation":
        t0 = time.perf_counter()
        eng.resume()
        log(f"memory resumed in {time.perf_counter() - t0:.1f} s")
        return 200, {"success": True, "message": "memory resumed"}
    return None
