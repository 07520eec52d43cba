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
  draft_n > 0). llama.cpp's answers carry no count of verify steps and no per-position acceptance (per-position
  acceptance only in its server log, ggml-org/llama.cpp#24536); a current llama-server counts verify steps
  server-wide in GET /metrics (started with --metrics; tools/server/server-task.cpp,
  server_task_result_metrics::to_metrics: llamacpp:spec_decode_num_drafts_total "Total speculative decoding
  verification steps", _num_draft_tokens_total, _num_accepted_tokens_total, the gauges requests_processing and
  requests_deferred). `generate` reads /metrics before and after each request (`METRICS_KEY` in its meta), and a
  request's verify steps are the counter's difference when nothing else ran: no request processing or deferred
  before or after, and the draft counters rose by exactly this request's draft_n / draft_n_accepted. Otherwise
  (and without --metrics: 501 not_supported_error, server-context.cpp) they come from a fixed draft length where an
  older server reports one (generation_settings speculative.n_min == n_max), else are named missing with why.
- `read_request`: n_predict (or max_tokens, which llama-server reads when n_predict is absent), temperature, top_p,
  seed and the prompt's ids, as params_from_json_cmpl reads them.
- `unservable`: llama.cpp feeds a DFlash drafter the INPUT of the layer after each target layer, so it cannot serve
  the target's last layer (`LAST_LAYER`).
- Errors: {"error": {"code", "message", "type"}}; `base.error_message` reads it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import (
    HEALTH_TIMEOUT_S,
    EngineClient,
    Sampled,
    ServerError,
    _no_answer,
    count,
    counts,
    error_message,
    served_row,
    snippet,
    stats_row,
)
from .registry import EngineSpec, Figure

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
    speculative.n_min (every draft that length; older llama-servers report both), else None."""
    if not isinstance(settings, dict):
        return None
    hi, lo = count(settings.get("speculative.n_max")), count(settings.get("speculative.n_min"))
    return hi if hi and hi == lo else None


METRICS_KEY = "server_metrics"  # in a request's meta: the /metrics readings around it ({"before", "after"} or "off")
PROM = {  # llama-server's /metrics names (server-task.cpp, to_metrics) -> the reading's keys
    "spec_decode_num_drafts_total": "drafts",
    "spec_decode_num_draft_tokens_total": "draft_tokens",
    "spec_decode_num_accepted_tokens_total": "accepted",
    "requests_processing": "processing",
    "requests_deferred": "deferred",
}
NAME = {v: f"llamacpp:{k}" for k, v in PROM.items()}
PROM_LINE = re.compile(r"^llamacpp:([a-z_]+)(\{[^}]*\})?\s+(\S+)\s*$")


def parse_prometheus(text: str) -> dict:
    """One reading of llama-server's /metrics text: {"drafts", "draft_tokens", "accepted", "processing",
    "deferred"} (None where the text lacks it; labelled per-position series skipped) and "lossy": the names whose
    value came in exponent form. llama-server writes each value as a C++ double with the stream's default 6
    significant digits, so a counter past 999999 prints as e.g. 1.23457e+06 and is no longer exact."""
    out: dict[str, Any] = {k: None for k in PROM.values()} | {"lossy": []}
    for line in text.splitlines():
        m = PROM_LINE.match(line.strip())
        if not m or m.group(2) or m.group(1) not in PROM:
            continue
        try:
            out[PROM[m.group(1)]] = float(m.group(3))
        except ValueError:
            continue
        if "e" in m.group(3).lower():
            out["lossy"].append(f"llamacpp:{m.group(1)}")
    return out


def steps_of_metrics(readings: Any, drafted: int | None, accepted: int | None) -> tuple[int | None, str]:
    """(verify steps of one request, "") from the /metrics readings taken around it, or (None, why not): the
    difference of llamacpp:spec_decode_num_drafts_total counts this request only when no other request was
    processing or deferred before or after it and the draft counters rose by exactly its own draft_n and
    draft_n_accepted (requests that overlapped it would have added theirs)."""
    if not isinstance(readings, dict):
        return None, "no /metrics reading was taken around this request"
    if readings.get("off"):
        return None, str(readings["off"])
    b, a = readings.get("before") or {}, readings.get("after") or {}
    lack = [k for k in ("drafts", "draft_tokens", "accepted") if b.get(k) is None or a.get(k) is None]
    if lack:
        return None, f"this llama-server's /metrics has no {NAME[lack[0]]} (a build before its spec_decode_* counters)"
    busy = [
        f"{NAME[k]} {r[k]:g} {when}"
        for when, r in (("before", b), ("after", a))
        for k in ("processing", "deferred")
        if r.get(k)
    ]
    if busy:
        return None, (
            f"other requests may have run alongside this one ({', '.join(busy)} it): the server-wide counters "
            "cannot be split per request"
        )
    lossy = sorted(set(b.get("lossy") or []) | set(a.get("lossy") or []))
    if lossy:
        return None, (
            f"llama-server printed {', '.join(lossy)} with 6 significant digits (past 999999), so the difference "
            "around one request is not exact"
        )
    d = {k: a[k] - b[k] for k in ("drafts", "draft_tokens", "accepted")}
    if d["draft_tokens"] != drafted or d["accepted"] != accepted:
        return None, (
            f"the server's counters rose by {d['draft_tokens']:g} drafted / {d['accepted']:g} accepted tokens while "
            f"this request drafted {drafted} / accepted {accepted}: other requests overlapped it"
        )
    return int(d["drafts"]), ""


def spec_stats(meta: dict, output_tokens: int) -> dict | None:
    """An engine-stats row (`base.stats_row`) from llama.cpp's answer meta of one request, None when its timings
    carry no draft_n (no draft was made). Verify steps: the /metrics difference around the request
    (`steps_of_metrics`), else draft_n / k with a fixed draft length k (`draft_length`), else missing with every
    reason."""
    t = (meta or {}).get("timings")
    if not isinstance(t, dict) or "draft_n" not in t:
        return None
    drafted, acc = count(t.get("draft_n")), count(t.get("draft_n_accepted"))
    steps, why_metrics = steps_of_metrics(meta.get(METRICS_KEY), drafted, acc)
    source = f"the difference of {NAME['drafts']} around the request" if steps is not None else None
    settings = meta.get("generation_settings") if isinstance(meta.get("generation_settings"), dict) else {}
    k = draft_length(settings)
    if steps is None and k and drafted is not None and drafted % k == 0:
        steps, source = drafted // k, f"draft_n / the fixed draft length {k}"
    if k:
        why_length = f"draft_n is not a multiple of the fixed draft length {k}"
    elif "speculative.n_max" in settings:
        why_length = "its drafts have no fixed length (generation_settings speculative.n_min != speculative.n_max)"
    else:
        why_length = (
            "its generation_settings give no draft length (speculative.types "
            f"{settings.get('speculative.types', 'absent')!r}, no speculative.n_min / n_max)"
        )
    n = count(meta.get("tokens_predicted"))
    return stats_row(
        verify_steps=steps,
        accepted_tokens=acc,
        drafted_tokens=drafted,
        completion_tokens=output_tokens if n is None else n,
        raw={
            "timings": {k2: t[k2] for k2 in ("draft_n", "draft_n_accepted") if k2 in t},
            "draft_length": k,
            "verify_steps_from": source,
        },
        wanted=("verify_steps", "accepted_tokens", "drafted_tokens", "accept_lengths"),
        why={
            "verify_steps": f"llama.cpp's answers carry no verify-step count; /metrics: {why_metrics}; and "
            + why_length,
            "accepted_tokens": "timings has no draft_n_accepted",
            "accept_lengths": "llama.cpp reports no per-step or per-position acceptance in its answers",
        },
    )


# why llama.cpp cannot serve a drafter from the target's last layer: its converter (convert_hf_to_gguf.py, the DFlash
# model's set_gguf_parameters) writes target_layers = [l + 1 for l in dflash_config.target_layer_ids], the drafter's
# code (common/speculative.cpp, common_speculative_impl_draft_dflash; ggml-org/llama.cpp#22105) turns on
# llama_set_embeddings_layer_inp(ctx_tgt, id) for each, i.e. the INPUT of layer l + 1, and the target graph has
# layer inputs 0..n_layer-1 only: src/llama-graph.cpp asserts GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input
# tensor is null") on the first request
LAST_LAYER = (
    "llama.cpp feeds a DFlash drafter the input of layer l+1 for target layer l (llama_set_embeddings_layer_inp), "
    "and the target's last layer ({last}; layers 0..{last}) has no next layer: llama-server aborts on its first "
    "request (GGML_ASSERT t_layer_inp[il] != nullptr, src/llama-graph.cpp); for llama.cpp, use a drafter whose target "
    "layers stay below {last}"
)


def unservable(layer_ids: list[int], num_layers: int) -> dict[int, str]:
    """The target layer ids llama.cpp cannot feed a DFlash drafter from: the target's last layer (`LAST_LAYER`)."""
    return {int(i): LAST_LAYER.format(last=num_layers - 1) for i in layer_ids if int(i) >= num_layers - 1}


def acceptance(row: dict) -> float | None:
    """llama.cpp's draft acceptance: draft_n_accepted / draft_n (its answers' only figure)."""
    a, d = row.get("accepted_tokens"), row.get("drafted_tokens")
    return a / d if a is not None and d else None


@dataclass
class LlamaCppClient(EngineClient):
    """A llama-server's client: `EngineClient` plus its /props and /completion."""

    metrics_off: str | None = field(default=None, repr=False)  # why GET /metrics gives no counters, once known

    spec = EngineSpec(
        name="llamacpp",
        label="llama.cpp",
        key_env="LLAMA_API_KEY",  # what llama-server reads for --api-key (common/arg.cpp, set_env)
        stats=spec_stats,
        stats_source="timings",
        figure=Figure("draft acceptance", "draft_n_accepted / draft_n", acceptance),
        # POST /completion's body as params_from_json_cmpl reads it (tools/server/server-task.cpp): n_predict, else
        # max_tokens; the prompt a list of token ids (or a string)
        request_fields={
            "max_new_tokens": ("n_predict", "max_tokens"),
            "temperature": ("temperature",),
            "top_p": ("top_p",),
            "seed": ("seed",),
            "prompt_ids": ("prompt",),
        },
        unservable=unservable,
    )

    def reading(self) -> dict:
        """One reading of GET /metrics (`parse_prometheus`), or {"off": why there is none}. One attempt, no retries:
        the counters are optional. A 501 (llama-server without --metrics) or 404 is remembered and not asked again."""
        if self.metrics_off:
            return {"off": self.metrics_off}
        try:
            status, body = self._once("GET", "/metrics", None, min(self.timeout, HEALTH_TIMEOUT_S))
        except Exception as e:  # noqa: BLE001  (no answer: this reading is lost, a later one may come)
            return {"off": f"GET /metrics got no answer ({_no_answer(e) or e})"}
        if status == 200:
            return parse_prometheus(body.decode("utf-8", "replace"))
        why = f"GET /metrics answered {status} ({error_message(body) or 'empty body'})"
        if status == 501:
            why += ": llama-server runs without --metrics; start it with --metrics to count verify steps"
        if status in (404, 501):
            self.metrics_off = why
        return {"off": why}

    def model_info(self) -> dict:
        """GET /props: {"model_path", "tokenizer_path" (model_path when it is a folder here, else None: a GGUF file
        has no tokenizer files), "props": the answer}."""
        data = self._json("GET", "/props")
        if not isinstance(data, dict):
            raise ServerError(f"GET {self.url}/props answered {type(data).__name__}, expected an object")
        path = data.get("model_path")
        tok = path if isinstance(path, str) and Path(path).is_dir() else None
        return {"model_path": path, "tokenizer_path": tok, "props": data}

    def served_drafter(self) -> dict:
        """What llama-server says of its drafter, from GET /props: its default_generation_settings (the slot's
        settings, directly or under "params" in newer builds; tools/server/server-task.cpp, task_params::to_json)
        hold speculative.n_max / speculative.n_min (draft tokens per step) and speculative.type (newer:
        speculative.types). llama.cpp reports no draft model path, so the drafter itself is never known; the
        verify width is n_max + 1 only when every draft has that length (n_min == n_max)."""
        props = self.model_info()["props"]
        dgs = props.get("default_generation_settings")
        dgs = dgs if isinstance(dgs, dict) else {}
        st = dgs.get("params") if isinstance(dgs.get("params"), dict) else dgs
        raw = {k: v for k, v in st.items() if k.startswith("speculative.")}
        alg = st.get("speculative.types", st.get("speculative.type"))
        hi, lo = count(st.get("speculative.n_max")), count(st.get("speculative.n_min"))
        return served_row(
            source="GET /props",
            raw=raw,
            algorithm=None if alg in (None, "none", "") else str(alg),
            verify_width=hi + 1 if hi and hi == lo and alg not in (None, "none", "") else None,
        )

    def generate(
        self,
        input_ids: list[int] | None = None,
        text: str | None = None,
        max_new_tokens: int = 256,
        stop: list[str] | None = None,
        extra: dict | None = None,
        sampled: Sampled | None = None,
    ) -> dict:
        """POST /completion of `input_ids` (or `text`) with return_tokens, greedy (temperature 0, top_k 1) or
        `sampled`: temperature, top_p, top_k 0 and min_p 0 (off: llama-server's defaults are 40 and 0.05) and seed
        (a uint32; common/common.h, common_params_sampling). llama.cpp cuts top-p on the untempered distribution
        and tempers last (its sampler chain). Returns {"request": the exact JSON body sent, "text", "output_ids",
        "meta_info"}, meta_info holding the /metrics readings taken before and after it (`METRICS_KEY`). `extra`
        is merged into the body. Raises ServerError."""
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
        if sampled is not None:
            body |= {"temperature": sampled.temperature, "top_p": sampled.top_p, "top_k": 0, "min_p": 0.0}
            if sampled.seed is not None:
                body["seed"] = int(sampled.seed)
        if stop:
            body["stop"] = list(stop)
        body.update(extra or {})
        before = self.reading()  # the server-wide counters around the request: its verify steps (`spec_stats`)
        out = parse_completion(self._call("POST", "/completion", body))
        out["meta_info"][METRICS_KEY] = before if "off" in before else {"before": before, "after": self.reading()}
        return {"request": body, **out}
