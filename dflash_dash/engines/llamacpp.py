"""HTTP client for a llama.cpp server (`llama-server`): model info, greedy completions of token ids, draft counts.

Contract: `LlamaCppClient` speaks only llama-server's native HTTP protocol (tools/server/) on top of the shared
transport and readiness of `base.EngineClient`, and would behave the same against a real llama-server.
- Readiness: llama-server binds its port before loading the model; while loading GET /health (and every other
  route) answers 503 {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}, then 200
  {"status": "ok"}.
- `--api-key` (or LLAMA_API_KEY on the server): every route except /health, /v1/health, /models and /v1/models
  wants `Authorization: Bearer KEY`; otherwise 401 {"error": {"code": 401, "message": "Invalid API Key",
  "type": "authentication_error"}}.
- Model: GET /props -> {"model_path", "default_generation_settings", ...}; the model is a GGUF file, so the
  tokenizer comes from `--tokenizer` (or a Hugging Face folder at model_path).
- Generation: POST /completion {"prompt": [ids], "n_predict", "temperature": 0, "top_k": 1, "return_tokens":
  true, "cache_prompt": false} (server-task.cpp, params_from_json_cmpl); the answer
  (server_task_result_cmpl_final::to_json_non_oaicompat) holds "content", "tokens" (the generated ids, filled
  with return_tokens), "stop_type" ("eos" | "word" | "limit" | "none"), "stopping_word", "tokens_predicted",
  "tokens_evaluated", "generation_settings" and "timings".
- `spec_stats` reads timings.draft_n / draft_n_accepted (result_timings::to_json, present only when
  draft_n > 0). llama.cpp reports no count of verify steps and no per-position acceptance in its answers
  (per-position acceptance only in its server log, ggml-org/llama.cpp#24536): verify steps are derived only when
  every draft had the same length (generation_settings speculative.n_min == speculative.n_max and draft_n a
  multiple of it), and are otherwise named missing.
- Errors: {"error": {"code", "message", "type"}}; `base.error_message` reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import EngineClient, ServerError, count, counts, snippet, stats_row

FINISH = {"eos": "stop", "word": "stop", "limit": "length"}  # llama.cpp's stop_type -> the finish reason stored


def parse_completion(body: bytes) -> dict:
    """Parse and validate a /completion answer: {"text", "output_ids", "meta_info"}, meta_info being the answer
    without its content and tokens (stop_type, timings, generation_settings, ... as they came) plus
    "finish_reason" and "completion_tokens". Raises ServerError naming the problem."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ServerError(f"/completion answered malformed JSON ({e}): {snippet(body)}") from None
    if not isinstance(data, dict):
        raise ServerError(f"/completion answered JSON {type(data).__name__}, expected an object: {snippet(body)}")
    ids = counts(data.get("tokens"))
    if ids is None:
        raise ServerError(f"/completion answer has no list of token ids in `tokens`: {snippet(body)}")
    n = count(data.get("tokens_predicted"))
    if not ids and n:
        raise ServerError(
            f"/completion answer has empty `tokens` for {n} predicted tokens; token ids must come from the "
            "server (the request sends return_tokens: true, which needs a llama-server from 2025 or later)"
        )
    text = data.get("content") or ""
    if not isinstance(text, str):
        raise ServerError(f"/completion answer has ill-typed `content` ({type(text).__name__}, expected a string)")
    meta = {k: v for k, v in data.items() if k not in ("content", "tokens")}
    meta["finish_reason"] = FINISH.get(data.get("stop_type"), data.get("stop_type"))
    meta["completion_tokens"] = n if n is not None else len(ids)
    return {"text": text, "output_ids": ids, "meta_info": meta}


def draft_length(settings: Any) -> int | None:
    """The fixed draft length of a request's generation_settings: speculative.n_max when it equals
    speculative.n_min (every draft that length), else None."""
    if not isinstance(settings, dict):
        return None
    hi, lo = count(settings.get("speculative.n_max")), count(settings.get("speculative.n_min"))
    return hi if hi and hi == lo else None


def spec_stats(meta: dict, output_tokens: int) -> dict | None:
    """An engine-stats row (`base.stats_row`) from llama.cpp's answer meta of one request, None when its timings
    carry no draft_n (no draft was made). Verify steps = draft_n / k only with a fixed draft length k
    (`draft_length`); else missing, named."""
    t = (meta or {}).get("timings")
    if not isinstance(t, dict) or "draft_n" not in t:
        return None
    drafted, acc = count(t.get("draft_n")), count(t.get("draft_n_accepted"))
    k = draft_length(meta.get("generation_settings"))
    steps = drafted // k if k and drafted is not None and drafted % k == 0 else None
    why = (
        "llama.cpp reports no verify-step count, and its drafts have no fixed length "
        "(generation_settings speculative.n_min != speculative.n_max)"
        if not k
        else f"draft_n is not a multiple of the fixed draft length {k}"
    )
    n = count(meta.get("tokens_predicted"))
    return stats_row(
        verify_steps=steps,
        accepted_tokens=acc,
        drafted_tokens=drafted,
        completion_tokens=output_tokens if n is None else n,
        raw={"timings": {k2: t[k2] for k2 in ("draft_n", "draft_n_accepted") if k2 in t}, "draft_length": k},
        wanted=("verify_steps", "accepted_tokens", "drafted_tokens", "accept_lengths"),
        why={
            "verify_steps": why,
            "accepted_tokens": "timings has no draft_n_accepted",
            "accept_lengths": "llama.cpp reports no per-step or per-position acceptance in its answers",
        },
    )


@dataclass
class LlamaCppClient(EngineClient):
    """A llama-server's client: `EngineClient` plus its /props and /completion."""

    key_env: str = "LLAMA_API_KEY"  # where the key comes from, named in 401/403 errors

    name = "llamacpp"
    stats_source = "timings"
    spec_stats = staticmethod(spec_stats)

    def model_info(self) -> dict:
        """GET /props: {"model_path", "tokenizer_path" (model_path when it is a folder here, else None: a GGUF file
        has no tokenizer files), "props": the answer}."""
        data = self._json("GET", "/props")
        if not isinstance(data, dict):
            raise ServerError(f"GET {self.url}/props answered {type(data).__name__}, expected an object")
        path = data.get("model_path")
        tok = path if isinstance(path, str) and Path(path).is_dir() else None
        return {"model_path": path, "tokenizer_path": tok, "props": data}

    def generate(
        self,
        input_ids: list[int] | None = None,
        text: str | None = None,
        max_new_tokens: int = 256,
        stop: list[str] | None = None,
        extra: dict | None = None,
    ) -> dict:
        """Greedy POST /completion of `input_ids` (or `text`) with return_tokens. Returns {"request": the exact
        JSON body sent, "text", "output_ids", "meta_info"}. `extra` is merged into the body. Raises ServerError."""
        if (input_ids is None) == (text is None):
            raise ValueError("generate needs exactly one of input_ids or text")
        body: dict[str, Any] = {
            "prompt": [int(i) for i in input_ids] if input_ids is not None else text,
            "n_predict": int(max_new_tokens),
            "temperature": 0,
            "top_k": 1,
            "return_tokens": True,
            "cache_prompt": False,
            "stream": False,
        }
        if stop:
            body["stop"] = list(stop)
        body.update(extra or {})
        out = parse_completion(self._call("POST", "/completion", body))
        return {"request": body, **out}
