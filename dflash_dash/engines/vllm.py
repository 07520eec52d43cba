"""HTTP client for a vLLM server (`vllm serve`): model info, greedy completions of token ids, speculative statistics.

Contract: `VLLMClient` speaks only vLLM's OpenAI-compatible HTTP protocol on top of the shared transport and
readiness of `base.EngineClient`, and would behave the same against a real vLLM server.
- Readiness: vLLM binds its port only once the engine is loaded (connection refused until then); GET /health
  answers 200 with an empty body, 503 when the engine died.
- `--api-key` (or VLLM_API_KEY on the server): every route under /v1 wants `Authorization: Bearer KEY`;
  /health does not.
- Generation: POST /v1/completions {"prompt": [ids], "max_tokens", "temperature": 0 (or T with "top_p", "top_k":
  -1, "min_p": 0, "seed"), "return_token_ids": true}
  (vllm/entrypoints/openai/completion/protocol.py, CompletionRequest): the answer's choices[0].token_ids are the
  generated ids and prompt_token_ids the prompt's (CompletionResponseChoice); `parse_completion` refuses an
  answer without token_ids (a vLLM older than return_token_ids).
- `spec_stats` reads `metrics.speculative_decoding` (vllm/entrypoints/generate/base/protocol.py,
  SpeculativeDecodingMetrics; the server started with --per-request-spec-decode-metrics summary|detailed):
  num_spec_steps, num_accepted_draft_tokens, num_draft_tokens, acceptance_histogram and, with `detailed`, the
  per-step arrays per_step_accepted / per_step_drafted.
- `spec_counters` reads the server-wide Prometheus counters of GET /metrics (vllm/v1/spec_decode/metrics.py,
  SpecDecodingProm): vllm:spec_decode_num_drafts_total, _num_draft_tokens_total, _num_accepted_tokens_total and
  _num_accepted_tokens_per_pos_total{position="k"}, summed over engines; per-position acceptance =
  accepted at position k / drafts. They count every request, so per request only as the difference around it on
  an otherwise idle server.
- Errors: vLLM answers {"error": {"message", "type", "param", "code"}} (older: {"object": "error", "message"});
  `base.error_message` reads both.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .base import EngineClient, Sampled, ServerError, count, counts, served_row, snippet, stats_row
from .registry import EngineSpec, Figure

SPEC_KEY = "speculative_decoding"  # under the answer's top-level `metrics` object


def parse_completion(body: bytes) -> dict:
    """Parse and validate a /v1/completions answer: {"text", "output_ids", "prompt_ids", "meta_info"}, meta_info
    holding the answer's id, model, usage, finish_reason, stop_reason and metrics as they came.

    Raises ServerError (not transient) naming the problem when the body is not what vLLM sends."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ServerError(f"/v1/completions answered malformed JSON ({e}): {snippet(body)}") from None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise ServerError(f"/v1/completions answer has no single choice (`choices`): {snippet(body)}")
    ch = choices[0]
    ids = ch.get("token_ids")
    if ids is None:
        raise ServerError(
            "/v1/completions answer has no `token_ids`; token ids must come from the server (the request sends "
            f"return_token_ids: true, which needs a recent vLLM): {snippet(body)}"
        )
    if counts(ids) is None:
        raise ServerError(f"/v1/completions answer has ill-typed `token_ids` (expected ints): {snippet(body)}")
    text = ch.get("text") or ""
    if not isinstance(text, str):
        raise ServerError(f"/v1/completions answer has ill-typed `text` ({type(text).__name__}, expected a string)")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    meta = {
        "id": data.get("id"),
        "model": data.get("model"),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "finish_reason": ch.get("finish_reason"),
        "stop_reason": ch.get("stop_reason"),
        "usage": usage,
        "metrics": data.get("metrics"),
    }
    return {"text": text, "output_ids": list(ids), "prompt_ids": counts(ch.get("prompt_token_ids")), "meta_info": meta}


def spec_stats(meta: dict, output_tokens: int) -> dict | None:
    """An engine-stats row (`base.stats_row`) from vLLM's `metrics.speculative_decoding` of one request, None when
    it is absent or null (no speculative decoding, --per-request-spec-decode-metrics none, or n > 1).
    accept_lengths = per_step_accepted + 1 (committed per step, bonus included) at the `detailed` level."""
    metrics = (meta or {}).get("metrics")
    sd = metrics.get(SPEC_KEY) if isinstance(metrics, dict) else None
    if not isinstance(sd, dict):
        return None
    steps = counts(sd.get("per_step_accepted"))
    n = count((meta or {}).get("completion_tokens"))
    return stats_row(
        verify_steps=count(sd.get("num_spec_steps")),
        accepted_tokens=count(sd.get("num_accepted_draft_tokens")),
        drafted_tokens=count(sd.get("num_draft_tokens")),
        completion_tokens=output_tokens if n is None else n,
        accept_lengths=[a + 1 for a in steps] if steps is not None else None,
        histogram=counts(sd.get("acceptance_histogram")),
        raw={SPEC_KEY: sd},
        why={k: f"metrics.speculative_decoding has no {f}" for k, f in FIELDS.items()},
    )


FIELDS = {  # stats-row field -> vLLM's name
    "verify_steps": "num_spec_steps",
    "accepted_tokens": "num_accepted_draft_tokens",
    "drafted_tokens": "num_draft_tokens",
}


def per_position(meta: dict) -> list[float] | None:
    """Per-position acceptance of one request, P(draft k accepted | drafted), k = 1.., from the `detailed`
    per-step arrays (verification stops at the first rejection, so position k is accepted in a step when more
    than k-1 drafts were); None without them."""
    metrics = (meta or {}).get("metrics")
    sd = metrics.get(SPEC_KEY) if isinstance(metrics, dict) else None
    acc = counts((sd or {}).get("per_step_accepted"))
    dr = counts((sd or {}).get("per_step_drafted"))
    if acc is None or dr is None or len(acc) != len(dr) or not dr:
        return None
    out = []
    for k in range(max(dr)):
        drafted = sum(d > k for d in dr)
        out.append(sum(a > k for a in acc) / drafted if drafted else 0.0)
    return out


PROM = "vllm:spec_decode_"  # the prefix of vLLM's speculative-decoding Prometheus counters
PROM_LINE = re.compile(r"^(vllm:spec_decode_[a-z_]+?)(?:_total)?(\{[^}]*\})?\s+([-+0-9.eE]+|NaN)\s*$")


def parse_prometheus(text: str) -> dict:
    """vLLM's speculative-decoding counters from a /metrics text: {"num_drafts", "num_draft_tokens",
    "num_accepted_tokens", "accepted_per_pos": [position 0, 1, ...]}, each summed over label sets (engines); a
    counter the text lacks is None (accepted_per_pos: [])."""
    out: dict = {"num_drafts": None, "num_draft_tokens": None, "num_accepted_tokens": None}
    per: dict[int, float] = {}
    for line in text.splitlines():
        m = PROM_LINE.match(line.strip())
        if not m or m.group(3) == "NaN":
            continue
        name, labels, value = m.group(1)[len(PROM) :], m.group(2) or "", float(m.group(3))
        if name == "num_accepted_tokens_per_pos":
            pos = re.search(r'position="(\d+)"', labels)
            if pos:
                per[int(pos.group(1))] = per.get(int(pos.group(1)), 0.0) + value
        elif name in out:
            out[name] = (out[name] or 0.0) + value
    out["accepted_per_pos"] = [per.get(k, 0.0) for k in range(max(per) + 1)] if per else []
    return out


def per_position_of(counters: dict) -> list[float] | None:
    """Per-position acceptance from the Prometheus counters (`parse_prometheus`): accepted at position k / drafts,
    k = 0.. (vLLM's own definition, SpecDecodingLogging); None without drafts."""
    n = counters.get("num_drafts")
    if not n:
        return None
    return [a / n for a in counters.get("accepted_per_pos") or []]


def acceptance_length(row: dict) -> float | None:
    """vLLM's mean_acceptance_length: 1 + num_accepted_draft_tokens / num_spec_steps (accepted drafts counted before
    the completion is cut at max_tokens or a stop, so the last step may count drafts past the end)."""
    a, v = row.get("accepted_tokens"), row.get("verify_steps")
    return 1 + a / v if a is not None and v else None


@dataclass
class VLLMClient(EngineClient):
    """A vLLM server's client: `EngineClient` plus vLLM's model list and completions."""

    served: str | None = field(default=None, repr=False)  # the served model's id (GET /v1/models), once read

    spec = EngineSpec(
        name="vllm",
        label="vLLM",
        key_env="VLLM_API_KEY",  # what vllm serve reads when --api-key is not given (vllm/envs.py)
        stats=spec_stats,
        stats_source="metrics.speculative_decoding",
        figure=Figure("mean_acceptance_length", "1 + num_accepted_draft_tokens / num_spec_steps", acceptance_length),
        # POST /v1/completions' body (vllm/entrypoints/openai/completion/protocol.py, CompletionRequest)
        request_fields={
            "max_new_tokens": ("max_tokens",),
            "temperature": ("temperature",),
            "top_p": ("top_p",),
            "seed": ("seed",),
            "prompt_ids": ("prompt",),
        },
    )

    def model_info(self) -> dict:
        """GET /v1/models: {"model_path": the served model's root (its path), "tokenizer_path": the same folder,
        "served_model_name": its id}."""
        data = self._json("GET", "/v1/models")
        rows = data.get("data") if isinstance(data, dict) else None
        if not isinstance(rows, list) or not rows or not isinstance(rows[0], dict) or "id" not in rows[0]:
            raise ServerError(f"GET {self.url}/v1/models lists no model: {snippet(json.dumps(data).encode())}")
        m = rows[0]
        self.served = m["id"]
        root = m.get("root") or m["id"]
        return {"model_path": root, "tokenizer_path": root, "served_model_name": m["id"]}

    def served_drafter(self) -> dict | None:
        """The drafter vLLM serves, from GET /server_info?config_format=json, which vLLM registers only when the
        server runs with VLLM_SERVER_DEV_MODE=1 (vllm/entrypoints/serve/instrumentator/__init__.py and
        server_info.py: {"vllm_config": the VllmConfig as JSON}); its speculative_config (vllm/config/speculative.py,
        SpeculativeConfig) holds method, model (the draft model) and num_speculative_tokens (drafts per step: the
        verify width is one more). None when the route is absent (404): vLLM then does not say what it serves."""
        try:
            data = self._json("GET", "/server_info?config_format=json")
        except ServerError as e:
            if e.status == 404:
                return None
            raise
        cfg = data.get("vllm_config") if isinstance(data, dict) else None
        if not isinstance(cfg, dict):  # config_format text (an older vLLM): nothing to read
            return None
        sc = cfg.get("speculative_config")
        sc = sc if isinstance(sc, dict) else {}
        k = count(sc.get("num_speculative_tokens"))
        return served_row(
            source="GET /server_info?config_format=json",
            raw={"speculative_config": cfg.get("speculative_config")},
            draft_model_path=sc.get("model"),
            algorithm=sc.get("method"),
            verify_width=k + 1 if k else None,
        )

    def spec_counters(self) -> dict:
        """The server-wide speculative-decoding counters of GET /metrics (`parse_prometheus`). Raises ServerError."""
        return parse_prometheus(self._call("GET", "/metrics").decode("utf-8", "replace"))

    def generate(
        self,
        input_ids: list[int] | None = None,
        text: str | None = None,
        max_new_tokens: int = 256,
        stop: list[str] | None = None,
        extra: dict | None = None,
        sampled: Sampled | None = None,
    ) -> dict:
        """POST /v1/completions of `input_ids` (or `text`) with return_token_ids, greedy (temperature 0) or
        `sampled`: CompletionRequest's temperature, top_p, top_k -1 (all tokens), min_p 0 and seed (a per-request
        generator in vLLM). Returns {"request": the exact JSON body sent, "text", "output_ids", "prompt_ids",
        "meta_info"}. `extra` is merged into the body. Raises ServerError."""
        if (input_ids is None) == (text is None):
            raise ValueError("generate needs exactly one of input_ids or text")
        if self.served is None:
            self.model_info()
        body: dict[str, Any] = {
            "model": self.served,
            "prompt": [int(i) for i in input_ids] if input_ids is not None else text,
            "max_tokens": int(max_new_tokens),
            "temperature": 0,
            "return_token_ids": True,
        }
        if sampled is not None:
            body |= {"temperature": sampled.temperature, "top_p": sampled.top_p, "top_k": -1, "min_p": 0.0}
            if sampled.seed is not None:
                body["seed"] = int(sampled.seed)
        if stop:
            body["stop"] = list(stop)
        body.update(extra or {})
        out = parse_completion(self._call("POST", "/v1/completions", body))
        return {"request": body, **out}
