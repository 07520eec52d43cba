"""HTTP client for an SGLang server: model info, load, greedy generation, memory release, speculative counters.

Contract: `SGLangClient` speaks only the SGLang HTTP protocol on top of the shared transport and readiness of
`base.EngineClient`, and would behave the same against a real SGLang server.
- `/v1/models` and `/model_info` answer before the server can generate, so they are never readiness checks.
- SGLang's `--api-key` exempts only /health and /metrics.
- Load: `running_requests()` reads `/v1/loads` (newer SGLang) or `/get_load` (older): running plus waiting
  requests, None when the server has neither. SGLang asserts the scheduler is idle when it releases memory.
- Token ids come from the server's `output_ids` (`parse_generate` refuses an answer without them).
- `spec_stats` reads SGLang's per-request speculative counters (meta_info `spec_verify_ct`, ... under all
  their names across versions, and `speculative_decoding_stats` with per-step `accept_lengths`) into an
  engine-stats row; what is not reported is named, never guessed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .base import EngineClient, Sampled, ServerError, count, counts, served_row, snippet, stats_row
from .registry import EngineSpec, Figure


def parse_generate(body: bytes) -> dict:
    """Parse and validate the body of a `/generate` answer: {"text", "output_ids", "meta_info"}.

    Raises ServerError (not transient) naming the problem when the body is not what SGLang sends."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ServerError(f"/generate answered malformed JSON ({e}): {snippet(body)}") from None
    if isinstance(data, list) and len(data) == 1:  # a batch of one
        data = data[0]
    if not isinstance(data, dict):
        raise ServerError(f"/generate answered JSON {type(data).__name__}, expected an object: {snippet(body)}")
    ids = data.get("output_ids")
    if ids is None:
        raise ServerError(
            "/generate answer has no `output_ids`; token ids must come from the server (is this SGLang? "
            f"set skip_tokenizer_init or upgrade the server): {snippet(body)}"
        )
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ServerError(f"/generate answer has ill-typed `output_ids` (expected a list of ints): {snippet(body)}")
    text = data.get("text", "")
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise ServerError(f"/generate answer has ill-typed `text` ({type(text).__name__}, expected a string)")
    meta = data.get("meta_info", {})
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise ServerError(f"/generate answer has ill-typed `meta_info` ({type(meta).__name__}, expected an object)")
    return {"text": text, "output_ids": list(ids), "meta_info": meta}


# SGLang's per-request speculative counters under every name they have had (python/sglang/srt/managers/
# tokenizer_manager.py, TokenizerManager._calculate_spec_decoding_metrics): the first name found wins.
VERIFY_KEYS = ("spec_verify_ct",)
ACCEPTED_KEYS = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")  # new, alias, old
DRAFTED_KEYS = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")  # new, alias, old
HISTOGRAM_KEYS = ("spec_correct_drafts_histogram", "spec_accept_histogram")  # new, old alias
STEP_KEYS = ("verify_lengths", "accept_lengths")  # per-step arrays, where the server gives them
BLOCK_ALGORITHMS = ("dflash", "dflash2", "dspark", "domino")  # speculative_algorithm of block drafters (lowercase)
STATS_KEY = "speculative_decoding_stats"  # newer SGLang (--speculative-decoding-stats summary|detailed): an object


def _first(meta: dict, keys: tuple[str, ...], parse=count):
    for k in keys:
        if k in meta:
            return parse(meta[k])
    return None


def _speculative(meta: dict) -> dict:
    """The speculative part of `meta` as it came: every spec_* key, the speculative_decoding_stats object and
    per-step verify_lengths / accept_lengths."""
    return {k: v for k, v in meta.items() if k.startswith("spec_") or k in (STATS_KEY, *STEP_KEYS)}


def spec_stats(meta: dict, output_tokens: int) -> dict | None:
    """An engine-stats row (`base.stats_row`) from SGLang's meta_info of one request, None when the server did not
    decode speculatively (no spec_* key, no speculative_decoding_stats). Counters are read under all their names
    (VERIFY_KEYS, ACCEPTED_KEYS, DRAFTED_KEYS, HISTOGRAM_KEYS), else from speculative_decoding_stats
    (num_verification_steps, num_accepted_draft_tokens, num_verified_draft_tokens), else from the per-step
    `accept_lengths` (committed tokens per verify step, bonus included) and `verify_lengths` (drafts verified + 1)
    of speculative_decoding_stats or meta_info itself.
    completion_tokens from meta_info, else the output ids' count. What SGLang did not report is named in
    `missing`, never guessed."""
    raw = _speculative(meta or {})
    if not raw:
        return None
    det = meta.get(STATS_KEY) if isinstance(meta.get(STATS_KEY), dict) else {}
    verify = _first(meta, VERIFY_KEYS)
    if verify is None:
        verify = count(det.get("num_verification_steps"))
    acc = _first(meta, ACCEPTED_KEYS)
    if acc is None:
        acc = count(det.get("num_accepted_draft_tokens"))
    drafted = _first(meta, DRAFTED_KEYS)
    if drafted is None:
        drafted = count(det.get("num_verified_draft_tokens"))
    lens = counts(det.get("accept_lengths", meta.get("accept_lengths")))
    if lens is not None and verify is None:
        verify = len(lens)
    if lens is not None and acc is None:
        acc = sum(lens) - len(lens)
    vlens = counts(det.get("verify_lengths", meta.get("verify_lengths")))  # drafts verified per step + 1
    if vlens is not None and drafted is None:
        drafted = sum(vlens) - len(vlens)
    n = count(meta.get("completion_tokens"))
    return stats_row(
        verify_steps=verify,
        accepted_tokens=acc,
        drafted_tokens=drafted,
        completion_tokens=output_tokens if n is None else n,
        accept_lengths=lens,
        histogram=_first(meta, HISTOGRAM_KEYS, counts),
        raw=raw,
        why={
            "verify_steps": "no spec_verify_ct or speculative_decoding_stats.num_verification_steps",
            "accepted_tokens": f"none of {', '.join(ACCEPTED_KEYS)}",
            "drafted_tokens": f"none of {', '.join(DRAFTED_KEYS)}",
        },
    )


def accept_length(row: dict) -> float | None:
    """SGLang's spec_accept_length: completion_tokens / spec_verify_ct, the prefill's token counted too (so it sits
    above the replay's tau by 1 / verify_steps)."""
    n, v = row.get("completion_tokens"), row.get("verify_steps")
    return n / v if n is not None and v else None


@dataclass
class SGLangClient(EngineClient):
    """An SGLang server's client: `EngineClient` plus SGLang's info, load, generation and memory routes."""

    spec = EngineSpec(
        name="sglang",
        label="SGLang",
        key_env="SGLANG_API_KEY",  # SGLang takes --api-key only; the variable its clients conventionally read
        stats=spec_stats,
        stats_source="meta_info",
        figure=Figure(
            "spec_accept_length", "completion_tokens / spec_verify_ct (prefill token included)", accept_length
        ),
        # POST /generate's body (python/sglang/srt/managers/io_struct.py, GenerateReqInput; sampling_params.py)
        request_fields={
            "max_new_tokens": ("sampling_params.max_new_tokens",),
            "temperature": ("sampling_params.temperature",),
            "top_p": ("sampling_params.top_p",),
            "seed": ("sampling_params.sampling_seed",),
            "prompt_ids": ("input_ids",),
        },
    )

    # -- information

    def model_info(self) -> dict:
        """GET /model_info (falling back to /get_model_info of older SGLang): model_path, tokenizer_path, ..."""
        try:
            data = self._json("GET", "/model_info")
        except ServerError as e:
            if e.status != 404:
                raise
            data = self._json("GET", "/get_model_info")
        if not isinstance(data, dict):
            raise ServerError(f"GET {self.url}/model_info answered {type(data).__name__}, expected an object")
        return data

    def server_info(self) -> dict:
        """GET /get_server_info (falling back to /server_info): the server's arguments and state."""
        try:
            data = self._json("GET", "/get_server_info")
        except ServerError as e:
            if e.status != 404:
                raise
            data = self._json("GET", "/server_info")
        if not isinstance(data, dict):
            raise ServerError(f"GET {self.url}/get_server_info answered {type(data).__name__}, expected an object")
        return data

    def served_drafter(self) -> dict:
        """The drafter SGLang serves, from /get_server_info (`server_info`): SGLang answers with its ServerArgs as
        they are after startup (python/sglang/srt/entrypoints/http_server.py, get_server_info:
        dataclasses.asdict(server_args)), whose speculative fields are speculative_algorithm,
        speculative_draft_model_path, speculative_num_draft_tokens and, for DFLASH, speculative_dflash_block_size
        (python/sglang/srt/server_args.py; for DFLASH the draft tokens default to the block size and may be set
        narrower: the verify width)."""
        info = self.server_info()
        raw = {k: v for k, v in info.items() if k.startswith("speculative_")}
        alg = info.get("speculative_algorithm")
        block = count(info.get("speculative_dflash_block_size"))
        width = count(info.get("speculative_num_draft_tokens"))
        if block is None and isinstance(alg, str) and alg.lower() in BLOCK_ALGORITHMS:
            block = width
        return served_row(
            source="GET /get_server_info",
            raw=raw,
            draft_model_path=info.get("speculative_draft_model_path"),
            algorithm=alg,
            block_size=block,
            verify_width=width if block is not None else None,
        )

    def running_requests(self) -> int | None:
        """Requests the server is running or has queued, summed over its data-parallel ranks: GET /v1/loads
        (`loads[].num_running_reqs + num_waiting_reqs`), falling back to /get_load of older SGLang
        (`[].num_reqs`, which counts running and waiting). None when the server has neither endpoint."""
        try:
            data = self._json("GET", "/v1/loads")
            rows = data.get("loads") if isinstance(data, dict) else None
            keys: tuple[str, ...] = ("num_running_reqs", "num_waiting_reqs")
        except ServerError as e:
            if e.status != 404:
                raise
            try:
                data = self._json("GET", "/get_load")
            except ServerError as e2:
                if e2.status != 404:
                    raise
                return None
            rows, keys = (data if isinstance(data, list) else [data]), ("num_reqs",)
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ServerError(
                f"the load report of {self.url} is not a list of objects: {snippet(json.dumps(data).encode())}"
            )
        total = 0
        for r in rows:
            for k in keys:
                v = r.get(k, 0)
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise ServerError(f"the load report of {self.url} has ill-typed `{k}`: {v!r}")
                total += int(v)
        return total

    def supports_memory_release(self) -> bool:
        """True when the server says it runs with `enable_memory_saver`; False when it says otherwise or
        cannot tell. SGLang has no capability endpoint, so this only reads info endpoints."""
        for fetch in (self.server_info, self.model_info):
            try:
                info = fetch()
            except ServerError:
                continue
            if info.get("enable_memory_saver") is True:
                return True
            args = info.get("server_args")
            if isinstance(args, dict) and args.get("enable_memory_saver") is True:
                return True
        return False

    def no_release(self) -> str:
        return "the server does not report enable_memory_saver (start SGLang with --enable-memory-saver)"

    # -- generation

    def generate(
        self,
        input_ids: list[int] | None = None,
        text: str | None = None,
        max_new_tokens: int = 256,
        stop: list[str] | None = None,
        extra: dict | None = None,
        sampled: Sampled | None = None,
    ) -> dict:
        """POST /generate of `input_ids` or `text`, greedy (temperature 0) or `sampled`: SamplingParams'
        temperature, top_p, top_k -1 (the whole vocabulary), min_p 0 and sampling_seed
        (python/sglang/srt/sampling/sampling_params.py; SGLang draws with that seed only when the server runs with
        --enable-deterministic-inference, sampling_batch_info.py). Returns {"request": the exact JSON body sent,
        "text", "output_ids", "meta_info"}. `extra` is merged into the body (its "sampling_params" into the
        sampling params). Raises ServerError."""
        if (input_ids is None) == (text is None):
            raise ValueError("generate needs exactly one of input_ids or text")
        params: dict[str, Any] = {"temperature": 0, "max_new_tokens": int(max_new_tokens)}
        if sampled is not None:
            params |= {"temperature": sampled.temperature, "top_p": sampled.top_p, "top_k": -1, "min_p": 0.0}
            if sampled.seed is not None:
                params["sampling_seed"] = int(sampled.seed)
        if stop:
            params["stop"] = list(stop)
        body: dict[str, Any] = {"input_ids": [int(i) for i in input_ids]} if input_ids is not None else {"text": text}
        extra = dict(extra or {})
        params.update(extra.pop("sampling_params", None) or {})
        body["sampling_params"] = params
        body.update(extra)
        out = parse_generate(self._call("POST", "/generate", body))
        return {"request": body, **out}

    # -- memory

    def release_memory(self) -> None:
        """POST /release_memory_occupation: the server frees its GPU memory (needs --enable-memory-saver)."""
        self._call("POST", "/release_memory_occupation", {}, retry_sent=False)

    def resume_memory(self) -> None:
        """POST /resume_memory_occupation: the server takes its GPU memory back (then wait_ready)."""
        self._call("POST", "/resume_memory_occupation", {}, retry_sent=False)
