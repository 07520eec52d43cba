"""vLLM's HTTP protocol as the local stand-in speaks it (`serve --protocol vllm`): routes, request validation,
answer shapes, API keys, errors.

Contract: this is NOT vLLM; it speaks exactly this subset of `vllm serve`'s OpenAI-compatible protocol, in the
shapes vLLM's own code writes (the source beside each):
- Startup: vLLM binds its port only after the engine has loaded, so the port refuses connections for the whole
  load and --startup-delay; GET /health then answers 200 with an empty body (vllm/entrypoints/serve).
- GET /v1/models -> {"object": "list", "data": [{"id", "object": "model", "created", "owned_by": "vllm",
  "root": the model path, "parent": null, "max_model_len"}]} (models/protocol.py, ModelCard).
- POST /v1/completions (completion/protocol.py, CompletionRequest): "prompt" a list of token ids or a string,
  "max_tokens" (default 16), "temperature" (default 1.0; below 1e-5 greedy: vllm/sampling_params.py, _SAMPLING_EPS),
  "top_p" (0, 1], "top_k" (0 or -1: all), "min_p" [0, 1], "seed" (SamplingParams' checks; sampled by
  `sampler.Sampling`, temperature first), "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens",
  "return_token_ids", "model" (the served id, when given), "n" (1). Answer:
  CompletionResponse {"id": "cmpl-...", "object": "text_completion", "created", "model", "choices": [{"index",
  "text", "logprobs": null, "finish_reason": "stop" | "length", "stop_reason", "token_ids", "prompt_token_ids"}],
  "usage": {"prompt_tokens", "total_tokens", "completion_tokens"}, "metrics"}; token_ids and prompt_token_ids
  are null without return_token_ids. Other fields of the request are ignored, as vLLM ignores extra fields.
- metrics.speculative_decoding (generate/base/protocol.py, SpeculativeDecodingMetrics) with
  --speculative-stats summary|detailed (vLLM's --per-request-spec-decode-metrics) and a drafter:
  mean_acceptance_length, draft_acceptance_rate, acceptance_histogram, num_spec_steps,
  num_accepted_draft_tokens, num_draft_tokens, num_spec_tokens; detailed adds per_step_accepted /
  per_step_drafted. Without it, "metrics" is null.
- GET /server_info (vllm/entrypoints/serve/instrumentator/server_info.py), only when the stand-in runs with
  VLLM_SERVER_DEV_MODE=1 as vLLM registers it: {"vllm_config", "vllm_env", "system_env"}, the config a string
  unless ?config_format=json; its speculative_config holds method, model (the draft's path) and
  num_speculative_tokens (B-1). Without the variable the route answers 404, and the stand-in, like vLLM, does not
  say which drafter it serves.
- GET /metrics: the Prometheus counters vllm:spec_decode_num_drafts_total, _num_draft_tokens_total,
  _num_accepted_tokens_total and _num_accepted_tokens_per_pos_total{position} (vllm/v1/spec_decode/metrics.py,
  SpecDecodingProm), summed over every request served (with a drafter).
- --api-key: every route under /v1 wants `Authorization: Bearer KEY`, else 401 {"error": "Unauthorized"}
  (vLLM's AuthenticationMiddleware); /health is open.
- Errors: 400 {"error": {"message", "type": "BadRequestError", "param": null, "code": 400}} (ErrorResponse);
  an unknown route 404 {"detail": "Not Found"} (FastAPI); a model name that is not served 404 in the error shape.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from .protocol import BadRequest, decode, need_int, need_strs, not_ready, number, seed_of
from .sampler import Sampling

if TYPE_CHECKING:
    from .model import Engine

NAME = "vllm"
GENERATE = "/v1/completions"  # the generation route (named in --protocol's help)
LOADING = None  # vLLM binds its port only once the engine has loaded
WARMUP = 0.0  # and answers /health 200 from then on: the whole --startup-delay unbound
POSTS = frozenset({"/v1/completions"})
ERROR_TYPES = {400: "BadRequestError", 401: "UnauthorizedError", 404: "NotFoundError", 503: "ServiceUnavailableError"}


def open_path(path: str) -> bool:
    """Routes that need no API key: everything outside /v1."""
    return not path.startswith("/v1")


def unauthorized() -> dict:
    return {"error": "Unauthorized"}


def error(status: int, message: str) -> dict:
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "InternalServerError"),
            "param": None,
            "code": status,
        }
    }


def not_found(method: str, path: str) -> dict:
    return {"detail": "Not Found"}


def served_id(eng: Engine) -> str:
    return str(eng.model_dir)  # vllm serve PATH serves the model under its path unless --served-model-name


def models(eng: Engine) -> dict:
    return {
        "object": "list",
        "data": [
            {
                "id": served_id(eng),
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": str(eng.model_dir),
                "parent": None,
                "max_model_len": None,
            }
        ],
    }


def count(eng: Engine, counters) -> None:
    """Add one request's steps to the server's Prometheus counters (eng.totals)."""
    if counters is None:
        return
    k = counters.block_size - 1
    with eng.count_lock:
        t = eng.totals
        t["num_drafts"] = t.get("num_drafts", 0) + counters.verify_ct
        t["num_draft_tokens"] = t.get("num_draft_tokens", 0) + counters.verify_ct * k
        t["num_accepted_tokens"] = t.get("num_accepted_tokens", 0) + sum(counters.accepted)
        pos = t.setdefault("per_pos", [0] * k)
        for a in counters.accepted:
            for j in range(a):
                pos[j] += 1


def prometheus(eng: Engine) -> str:
    """The speculative-decoding counters in Prometheus' text format, as vLLM's /metrics writes them."""
    if eng.spec is None:
        return ""
    labels = f'engine="0",model_name="{served_id(eng)}"'
    with eng.count_lock:
        t = dict(eng.totals)
        pos = list(t.get("per_pos") or [0] * (eng.spec.block_size - 1))
    lines = []
    for name, help_ in (
        ("num_drafts", "Number of spec decoding drafts."),
        ("num_draft_tokens", "Number of draft tokens."),
        ("num_accepted_tokens", "Number of accepted tokens."),
    ):
        full = f"vllm:spec_decode_{name}_total"
        lines += [f"# HELP {full} {help_}", f"# TYPE {full} counter", f"{full}{{{labels}}} {float(t.get(name, 0))}"]
    full = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    lines += [f"# HELP {full} Accepted tokens per draft position.", f"# TYPE {full} counter"]
    lines += [f'{full}{{{labels},position="{j}"}} {float(a)}' for j, a in enumerate(pos)]
    return "\n".join(lines) + "\n"


def dev_mode() -> bool:
    """VLLM_SERVER_DEV_MODE=1 in the server's environment (vllm/envs.py reads it as bool(int(...)))."""
    return os.environ.get("VLLM_SERVER_DEV_MODE", "0").strip() not in ("", "0")


def server_info(eng: Engine, query: str) -> dict:
    """GET /server_info (only with VLLM_SERVER_DEV_MODE=1): {"vllm_config", "vllm_env", "system_env"}, the config
    as a string unless the query (`query`: the request's, after "?") asks config_format=json."""
    s = eng.spec
    spec = (
        None
        if s is None
        else {
            "method": s.drafter.c.family if s.drafter is not None else None,
            "model": str(Path(s.path).resolve()),
            "num_speculative_tokens": s.block_size - 1 if s.drafter is not None else None,
        }
    )
    cfg = {"model_config": {"model": str(eng.model_dir)}, "speculative_config": spec}
    as_json = parse_qs(query).get("config_format", ["text"])[-1] == "json"
    return {"vllm_config": cfg if as_json else str(cfg), "vllm_env": {"VLLM_SERVER_DEV_MODE": True}, "system_env": {}}


def get(eng: Engine, path: str, query: str) -> tuple | None:
    """(status, JSON body, or text for /metrics) of a GET route, None when there is none."""
    if path == "/health":  # 200 with an empty body; 503 when the engine died (here: its memory released)
        return (200, None) if not_ready(eng) is None else (503, error(503, "the engine is not running"))
    if path == "/server_info" and dev_mode():
        return 200, server_info(eng, query)
    if path == "/metrics":
        return 200, None, prometheus(eng)
    if path == "/v1/models":
        return 200, models(eng)
    if path == "/version":
        return 200, {"version": "dflash-dash stand-in"}
    return None


def post(eng: Engine, path: str, req: Any) -> tuple[int, Any] | None:
    if path == "/v1/completions":
        return 200, run_completion(eng, req)
    return None


def spec_metrics(counters, level: str) -> dict | None:
    """SpeculativeDecodingMetrics of one request from the stand-in's counters (None: not collected)."""
    if level == "none" or counters is None:
        return None
    n, acc, k = counters.verify_ct, sum(counters.accepted), counters.block_size - 1
    hist = [0] * (k + 1)
    for a in counters.accepted:
        hist[a] += 1
    out = {
        "mean_acceptance_length": 1 + acc / n if n else 1.0,
        "draft_acceptance_rate": acc / (n * k) if n else 0.0,
        "acceptance_histogram": hist,
        "num_spec_steps": n,
        "num_accepted_draft_tokens": acc,
        "num_draft_tokens": n * k,
        "num_spec_tokens": k,
    }
    if level == "detailed":
        out |= {"per_step_accepted": list(counters.accepted), "per_step_drafted": [k] * n}
    return out


def prompt_ids(eng: Engine, prompt: Any) -> list[int]:
    if isinstance(prompt, str) and prompt:
        return eng.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
        return [need_int(i, "prompt") for i in prompt]
    raise BadRequest("`prompt` must be a non-empty string or a non-empty list of token ids (one prompt)")


SAMPLING_EPS = 1e-5  # vLLM: a temperature below this is greedy (vllm/sampling_params.py, _SAMPLING_EPS)


def sampling(req: dict) -> Sampling | None:
    """vLLM's sampling fields as SamplingParams checks them (_verify_args): None when greedy, else the `Sampling`."""
    t = number(1.0 if req.get("temperature") is None else req["temperature"], "temperature")
    top_p = number(1.0 if req.get("top_p") is None else req["top_p"], "top_p")
    min_p = number(0.0 if req.get("min_p") is None else req["min_p"], "min_p")
    top_k = 0 if req.get("top_k") is None else req["top_k"]
    if t < 0.0:
        raise BadRequest(f"temperature must be non-negative, got {t}.")
    if not 0.0 < top_p <= 1.0:
        raise BadRequest(f"top_p must be in (0, 1], got {top_p}.")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1:
        raise BadRequest(f"top_k must be 0 (disable), or at least 1, got {top_k}.")
    if not 0.0 <= min_p <= 1.0:
        raise BadRequest(f"min_p must be in [0, 1], got {min_p}.")
    seed = seed_of(req.get("seed"), "seed")
    if t < SAMPLING_EPS:
        return None
    return Sampling(t, top_p, max(top_k, 0), min_p, seed)


def run_completion(eng: Engine, req: Any) -> dict:
    """POST /v1/completions: validate `req`, decode, answer as vLLM's CompletionResponse."""
    if not isinstance(req, dict):
        raise BadRequest("the body must be a JSON object")
    if req.get("model") not in (None, served_id(eng)):
        raise BadRequest(f"The model `{req['model']}` does not exist.", status=404)
    if req.get("stream"):
        raise BadRequest("`stream` is not supported by this stand-in server")
    if req.get("n", 1) != 1:
        raise BadRequest("`n` must be 1")
    how = sampling(req)
    ids = prompt_ids(eng, req.get("prompt"))
    max_new = need_int(req.get("max_tokens", 16), "max_tokens")
    stops = need_strs(req.get("stop"), "stop")
    stop_tok = req.get("stop_token_ids") or []
    if not isinstance(stop_tok, list):
        raise BadRequest("`stop_token_ids` must be a list of integers")
    stop_tok = {need_int(t, "stop_token_ids") for t in stop_tok}
    eos = set() if req.get("ignore_eos") else eng.eos_ids
    out, text, finish, counters = decode(
        eng, ids, max_new, eos | stop_tok, stops, bool(req.get("skip_special_tokens", True)), sampling=how
    )
    count(eng, counters)
    matched = finish.get("matched")
    with_ids = bool(req.get("return_token_ids"))
    spec = spec_metrics(counters, eng.spec_stats)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": served_id(eng),
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish["type"],
                "stop_reason": matched if isinstance(matched, str) or matched in stop_tok else None,
                "token_ids": out if with_ids else None,
                "prompt_logprobs": None,
                "prompt_token_ids": ids if with_ids else None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {"prompt_tokens": len(ids), "total_tokens": len(ids) + len(out), "completion_tokens": len(out)},
        "kv_transfer_params": None,
        "metrics": None
        if eng.spec_stats == "none"
        else {
            "time_to_first_token_ms": None,
            "generation_time_ms": None,
            "queue_time_ms": None,
            "mean_itl_ms": None,
            "tokens_per_second": None,
            "speculative_decoding": spec,
        },
    }
