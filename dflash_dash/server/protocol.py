"""The SGLang HTTP protocol as the local stand-in speaks it: request validation and answer shapes.

Contract: `run_generate` (POST /generate) and `run_chat` (POST /v1/chat/completions) validate a request body,
decode with an `Engine` and answer in SGLang's (OpenAI's, for chat) shape; a client error raises `BadRequest`,
answered 400 (or its `status`) with {"error": {"message"}}.
- POST /generate: {"text" | "input_ids", "sampling_params": {"temperature" (default 1.0; below 1e-6 greedy),
  "top_p" (0, 1], "top_k" (-1: all; 1: greedy), "min_p", "sampling_seed", "max_new_tokens" (default 128), "stop",
  "stop_token_ids", "ignore_eos", "skip_special_tokens", "no_stop_trim"}, "rid"} (sampling fields and their checks
  as python/sglang/srt/sampling/sampling_params.py, SamplingParams.__post_init__ / verify, has them; sampled by
  `sampler.Sampling`) -> {"text", "output_ids", "meta_info": {"id", "prompt_tokens",
  "completion_tokens", "finish_reason": {"type": "stop", "matched": id | str} | {"type": "length",
  "length": n}, "e2e_latency"}}. output_ids include the matched stop token; text has the stop string trimmed.
  With speculative decoding meta_info also carries SGLang's spec_* counters (`specdec.Counters.meta`).
- POST /v1/chat/completions: messages + chat_template_kwargs, applied with the model's tokenizer; temperature,
  top_p, top_k, min_p and seed (SGLang's sampling_seed) sampled as /generate samples them; OpenAI response shape
  with usage. Non-streaming only.
Without a tokenizer in the model folder only `input_ids` work and `text` answers "".
"""

from __future__ import annotations

import math
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any

from .sampler import Sampling

if TYPE_CHECKING:
    from .model import Engine

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
    "sampling_seed",
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


def not_ready(eng: Engine) -> str | None:
    """None when `eng` is ready to generate, else why its readiness route answers 503 (every protocol's)."""
    if time.monotonic() < eng.ready_at:
        return "warming up"
    if eng.model is None:
        return "memory released"
    return None


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


def number(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise BadRequest(f"`{name}` must be a finite number, got {v!r}")
    return float(v)


def seed_of(v: Any, name: str) -> int | None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
        raise BadRequest(f"`{name}` must be an integer, got {v!r}")
    return v


SAMPLING_EPS = 1e-6  # SGLang: 0 <= temperature < 1e-6 is greedy (sampling_params.py, _SAMPLING_EPS)


def sglang_sampling(sp: dict) -> Sampling | None:
    """SGLang's sampling params as SamplingParams reads and verifies them: None when greedy (temperature below
    1e-6, or top_k 1), else the `Sampling` (temperature first, then top-k, top-p, min-p). 400 with SGLang's
    message on a bad value."""
    t = number(1.0 if sp.get("temperature") is None else sp["temperature"], "temperature")
    top_p = number(1.0 if sp.get("top_p") is None else sp["top_p"], "top_p")
    top_k = sp.get("top_k")
    top_k = -1 if top_k is None else top_k
    min_p = number(0.0 if sp.get("min_p") is None else sp["min_p"], "min_p")
    if t < 0.0:
        raise BadRequest(f"temperature must be a non-negative finite number, got {t}.")
    if not 0.0 < top_p <= 1.0:
        raise BadRequest(f"top_p must be in (0, 1], got {top_p}.")
    if not 0.0 <= min_p <= 1.0:
        raise BadRequest(f"min_p must be in [0, 1], got {min_p}.")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or (top_k < 1 and top_k != -1):
        raise BadRequest(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    seed = seed_of(sp.get("sampling_seed"), "sampling_seed")
    if t < SAMPLING_EPS or top_k == 1:
        return None
    return Sampling(t, top_p, max(top_k, 0), min_p, seed)


def decode(
    eng: Engine,
    ids: list[int],
    max_new: int,
    stop_ids: set[int],
    stops: list[str],
    skip: bool = True,
    trim: bool = True,
    sampling: Sampling | None = None,
) -> tuple[list[int], str, dict, Any]:
    """Decode `ids` under the generation lock, greedily or with `sampling`, speculatively when a drafter is loaded:
    (output ids, text, finish_reason {"type": "stop", "matched"} | {"type": "length", "length"}, the speculative
    counters or None). Every protocol decodes through here. An id outside the vocabulary answers 400."""
    with eng.generating():
        if eng.vocab_size and max(ids) >= eng.vocab_size:
            raise BadRequest(f"input id {max(ids)} is out of the vocabulary (size {eng.vocab_size})")
        if eng.spec is not None:
            return eng.speculative(ids, max_new, stop_ids, stops, skip, trim, sampling)
        return (*eng.plain(ids, max_new, stop_ids, stops, skip, trim, sampling), None)


def sglang_stats(counters, completion_tokens: int, level: str) -> dict:
    """SGLang's speculative meta_info: its spec_* counters (`specdec.Counters.meta`) and, at level summary or
    detailed, the speculative_decoding_stats object (detailed: per-step verify_lengths / accept_lengths, drafts + 1)
    as TokenizerManager._calculate_spec_decoding_metrics writes them; accepted drafts counted inside the completion
    (`Counters.within`), as SGLang's DFlash verify counts them."""
    out = counters.meta(completion_tokens)
    if level == "none":
        return out
    n, acc, k = counters.verify_ct, sum(counters.within), counters.block_size - 1
    stats = {
        "num_verification_steps": n,
        "num_verified_draft_tokens": n * k,
        "num_accepted_draft_tokens": acc,
        "draft_acceptance_rate": acc / (n * k) if n else 0.0,
        "mean_accept_length": (acc + n) / n if n else 0.0,
    }
    if level == "detailed":
        stats |= {"verify_lengths": [k + 1] * n, "accept_lengths": [a + 1 for a in counters.within]}
    return out | {"speculative_decoding_stats": stats}


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
    sampling = sglang_sampling(sp)
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
    eos = set() if sp.get("ignore_eos") else eng.eos_ids
    how = (eos | set(stop_tok), stops, bool(sp.get("skip_special_tokens", True)), not sp.get("no_stop_trim", False))
    out, text, finish, counters = decode(eng, ids, max_new, *how, sampling)
    spec = sglang_stats(counters, len(out), eng.spec_stats) if counters is not None else {}
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
    sp = {k: req[k] for k in ("temperature", "top_p", "top_k", "min_p") if req.get(k) is not None}
    if req.get("seed") is not None:
        sp["sampling_seed"] = req["seed"]
    sglang_sampling(sp)  # a bad value answers 400 before the template runs
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
    sp |= {"max_new_tokens": max_new}
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
