"""llama.cpp's HTTP protocol as the local stand-in speaks it (`serve --protocol llamacpp`): routes, request
validation, answer shapes, API keys, errors.

Contract: this is NOT llama-server; it speaks exactly this subset of llama-server's native protocol, in the shapes
llama.cpp's own code writes (ggml-org/llama.cpp tools/server/; the source beside each):
- Startup: llama-server binds its port first and loads the model after; while loading (and for --startup-delay
  after) every route answers 503 {"error": {"code": 503, "message": "Loading model", "type":
  "unavailable_error"}}; then GET /health answers 200 {"status": "ok"}.
- GET /props -> {"default_generation_settings", "total_slots": 1, "model_path", "chat_template", "build_info"};
  GET /v1/models (OpenAI list).
- POST /completion (server-task.cpp, params_from_json_cmpl): "prompt" a list of token ids or a string, "n_predict"
  (-1: until end of generation, capped here at MAX_PREDICT), "temperature" (default 0.8; <= 0 greedy), "top_k"
  (default 40; <= 0 all; 1 greedy), "top_p" (default 0.95), "min_p" (default 0.05), "seed" (default 4294967295:
  random), as common/common.h's common_params_sampling defaults them; sampled by `sampler.Sampling` in llama.cpp's
  chain order (top-k, top-p, min-p on the untempered distribution, temperature last), "stop" (strings),
  "ignore_eos", "return_tokens", "cache_prompt", "stream" (false). Answer
  (server_task_result_cmpl_final::to_json_non_oaicompat): {"index", "content", "tokens" (the generated ids with
  return_tokens, else []), "id_slot", "stop": true, "model", "tokens_predicted", "tokens_evaluated",
  "generation_settings", "prompt", "has_new_line", "truncated", "stop_type" ("eos" | "word" | "limit"),
  "stopping_word", "tokens_cached", "timings"}; timings (result_timings::to_json) carry draft_n and
  draft_n_accepted when a drafter made drafts. generation_settings (task_params::to_json) carry
  "speculative.types" as a current llama-server writes it (common_speculative_type_name_str: "draft-dflash" with a
  drafter, "none" without), and no speculative.n_max / n_min.
- GET /metrics, only when started with --metrics (llama-server's flag; else 501 {"error": {"code": 501, "message":
  "This server does not support metrics endpoint. Start it with `--metrics`", "type": "not_supported_error"}},
  server-context.cpp get_metrics): the Prometheus text of server_task_result_metrics::to_metrics (server-task.cpp),
  "# HELP" / "# TYPE" / "llamacpp:NAME VALUE" per item, values written as C++ doubles with the stream's default
  6 significant digits (`%g`: 1234567 prints 1.23457e+06): counters tokens_predicted_total,
  spec_decode_num_draft_tokens_total, spec_decode_num_accepted_tokens_total, spec_decode_num_drafts_total (verify
  steps), gauges requests_processing and requests_deferred, and
  spec_decode_num_accepted_tokens_per_pos_total{position="i"} once a draft was accepted or rejected. Each counter
  grows when a request ends (before its answer is sent), summed over every request served. /props says
  "endpoint_metrics".
- --api-key: every route except /health, /v1/health, /models and /v1/models wants `Authorization: Bearer KEY`,
  else 401 {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}.
- Errors: {"error": {"code", "message", "type"}}: 400 invalid_request_error, 404 not_found_error.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .protocol import BadRequest, decode, need_int, need_strs, number
from .sampler import Sampling

if TYPE_CHECKING:
    from .model import Engine

NAME = "llamacpp"
MAX_PREDICT = 4096  # n_predict -1 (generate until the end) stops here at the latest
OPEN = {"/health", "/v1/health", "/models", "/v1/models"}  # routes without the API key (llama-server's public ones)
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    501: "not_supported_error",
    503: "unavailable_error",
}
LOADING = "Loading model"  # the 503 message every route answers while the model loads (llama-server binds first)
WARMUP = 0.0  # unused: bound before loading, LOADING answers for the whole --startup-delay
GENERATE = "/completion"  # the generation route (named in --protocol's help)
POSTS = frozenset({"/completion", "/completions"})
DEFAULT_SEED = 4294967295  # LLAMA_DEFAULT_SEED (include/llama.h): a random seed per request


def open_path(path: str) -> bool:
    return path in OPEN


def unauthorized() -> dict:
    return error(401, "Invalid API Key")


def error(status: int, message: str) -> dict:
    return {"error": {"code": status, "message": message, "type": TYPES.get(status, "server_error")}}


def not_found(method: str, path: str) -> dict:
    return error(404, "File Not Found")


def settings(eng: Engine, n_predict: int = -1, req: dict | None = None) -> dict:
    """generation_settings (task_params::to_json): the sampling fields of `req` (a greedy request's when None) and
    the speculative one."""
    drafts = eng.spec is not None and eng.spec.drafter is not None
    req = req or {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0}
    return {
        "seed": req.get("seed", DEFAULT_SEED),
        "temperature": req.get("temperature", 0.8),
        "top_k": req.get("top_k", 40),
        "top_p": req.get("top_p", 0.95),
        "min_p": req.get("min_p", 0.05),
        "max_tokens": n_predict,
        "n_predict": n_predict,
        "ignore_eos": False,
        "stream": False,
        "speculative.types": "draft-dflash" if drafts else "none",  # llama-server's --spec-type name
    }


NOT_SUPPORTED = "This server does not support metrics endpoint. Start it with `--metrics`"  # get_metrics' 501
COUNTERS = (  # (name, HELP) of to_metrics' counters the stand-in keeps, in llama-server's order
    ("tokens_predicted_total", "Number of generation tokens processed"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps"),
)


def count(eng: Engine, predicted: int, counters) -> None:
    """Add one ended request to the server's counters (eng.totals, as server_metrics::on_prediction does)."""
    with eng.count_lock:
        t = eng.totals
        t["tokens_predicted_total"] = t.get("tokens_predicted_total", 0) + predicted
        if counters is None or not counters.verify_ct:
            return
        k = counters.block_size - 1
        t["spec_decode_num_draft_tokens_total"] = (
            t.get("spec_decode_num_draft_tokens_total", 0) + counters.verify_ct * k
        )
        t["spec_decode_num_accepted_tokens_total"] = t.get("spec_decode_num_accepted_tokens_total", 0) + sum(
            counters.accepted
        )
        t["spec_decode_num_drafts_total"] = t.get("spec_decode_num_drafts_total", 0) + counters.verify_ct
        pos = t.setdefault("per_pos", [0] * k)
        for a in counters.accepted:
            for j in range(a):
                pos[j] += 1


def prometheus(eng: Engine) -> str:
    """The /metrics text as to_metrics writes it (values through `%g`, C++'s default 6 significant digits)."""
    with eng.count_lock:
        t = dict(eng.totals)
        pos = list(t.get("per_pos") or [])
        busy = eng.running
        waiting = eng.waiting
    lines = []
    for kind, items in (
        ("counter", [(n, h, t.get(n, 0)) for n, h in COUNTERS]),
        (
            "gauge",
            [
                ("requests_processing", "Number of requests processing", busy),
                ("requests_deferred", "Number of requests deferred", waiting),
            ],
        ),
    ):
        for name, help_, value in items:
            lines += [f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value:g}"]
    if pos:
        name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
        lines += [f"# HELP {name} Accepted tokens per draft position", f"# TYPE {name} counter"]
        lines += [f'{name}{{position="{i}"}} {a:g}' for i, a in enumerate(pos)]
    return "\n".join(lines) + "\n"


def models(eng: Engine) -> dict:
    name = str(eng.model_dir)
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": int(time.time()), "owned_by": "llamacpp"}],
    }


def get(eng: Engine, path: str, query: str) -> tuple | None:
    if path == "/health" or path == "/v1/health":
        return 200, {"status": "ok"}
    if path == "/props":
        return 200, {
            "default_generation_settings": settings(eng),
            "total_slots": 1,
            "model_path": str(eng.model_dir),
            "chat_template": "",
            "build_info": "dflash-dash stand-in",
            "endpoint_metrics": eng.metrics,
        }
    if path == "/metrics":
        return (200, None, prometheus(eng)) if eng.metrics else (501, error(501, NOT_SUPPORTED))
    if path in ("/models", "/v1/models"):
        return 200, models(eng)
    return None


def post(eng: Engine, path: str, req: Any) -> tuple[int, Any] | None:
    if path in ("/completion", "/completions"):
        return 200, run_completion(eng, req)
    return None


def prompt_ids(eng: Engine, prompt: Any) -> list[int]:
    if isinstance(prompt, str) and prompt:
        return eng.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
        return [need_int(i, "prompt") for i in prompt]
    raise BadRequest("\"prompt\" must be a non-empty string or a non-empty list of token ids")


def sampling(req: dict) -> Sampling | None:
    """llama-server's sampling fields with its defaults (params_from_json_cmpl over common_params_sampling): None
    when greedy (temperature <= 0, or top_k 1), else the `Sampling` in llama.cpp's chain order."""
    t = number(req.get("temperature", 0.8), "temperature")
    top_p = number(req.get("top_p", 0.95), "top_p")
    min_p = number(req.get("min_p", 0.05), "min_p")
    top_k, seed = req.get("top_k", 40), req.get("seed", DEFAULT_SEED)
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise BadRequest(f"\"top_k\" must be an integer, got {top_k!r}")
    seed = None if seed == DEFAULT_SEED else need_int(seed, "seed")  # a uint32_t in llama.cpp
    if t <= 0 or top_k == 1:
        return None
    top_p = top_p if 0 < top_p < 1 else 1.0  # llama_sampler_top_p: p >= 1 keeps every token
    return Sampling(t, top_p, max(top_k, 0), max(min_p, 0.0), seed, top_p_first=True)


def run_completion(eng: Engine, req: Any) -> dict:
    """POST /completion: validate `req`, decode, answer as llama-server's native completion."""
    t0 = time.perf_counter()
    if not isinstance(req, dict):
        raise BadRequest("the body must be a JSON object")
    if req.get("stream"):
        raise BadRequest("\"stream\" is not supported by this stand-in server")
    how = sampling(req)
    ids = prompt_ids(eng, req.get("prompt"))
    n_predict = req.get("n_predict", req.get("max_tokens", -1))
    if n_predict != -1:
        n_predict = need_int(n_predict, "n_predict")
    stops = need_strs(req.get("stop"), "stop")
    eos = set() if req.get("ignore_eos") else eng.eos_ids
    limit = MAX_PREDICT if n_predict == -1 else n_predict
    t1 = time.perf_counter()
    out, text, finish, counters = decode(eng, ids, limit, eos, stops, sampling=how)
    t2 = time.perf_counter()
    matched = finish.get("matched")
    stop_type = "limit" if finish["type"] == "length" else ("word" if isinstance(matched, str) else "eos")
    timings = {
        "cache_n": 0,
        "prompt_n": len(ids),
        "prompt_ms": (t1 - t0) * 1000,
        "prompt_per_token_ms": (t1 - t0) * 1000 / len(ids),
        "prompt_per_second": len(ids) / max(t1 - t0, 1e-9),
        "predicted_n": len(out),
        "predicted_ms": (t2 - t1) * 1000,
        "predicted_per_token_ms": (t2 - t1) * 1000 / max(len(out), 1),
        "predicted_per_second": len(out) / max(t2 - t1, 1e-9),
    }
    if counters is not None and counters.verify_ct:
        timings["draft_n"] = counters.verify_ct * (counters.block_size - 1)
        timings["draft_n_accepted"] = sum(counters.accepted)
    count(eng, len(out), counters)  # the slot's stats reach the server's metrics before the answer is sent
    return {
        "index": 0,
        "content": text,
        "tokens": out if req.get("return_tokens") else [],
        "id_slot": 0,
        "stop": True,
        "model": str(eng.model_dir),
        "tokens_predicted": len(out),
        "tokens_evaluated": len(ids),
        "generation_settings": settings(eng, n_predict, req),
        "prompt": "",
        "has_new_line": "\n" in text,
        "truncated": False,
        "stop_type": stop_type,
        "stopping_word": matched if isinstance(matched, str) else "",
        "tokens_cached": len(ids) + len(out),
        "timings": timings,
    }
