"""What every serving-engine client shares: the HTTP transport with retries and API keys, readiness, errors.

Contract: an engine client (`EngineClient`) answers in the engine's own shapes: is the server ready (`health`,
`wait_ready`, GET its spec's `ready_path`), what does it generate greedily (`generate`), what speculative statistics
did it report for a request (`spec_stats`, its spec's `stats`); what it declares (name, key variable, request fields,
its own figure, layer limits) is its class's `spec` (`registry.EngineSpec`). `generate` decodes greedily unless
given a `Sampled` (temperature, top-p, seed), which each client sends in its engine's own fields with every other
filter of the engine turned off (top-k all, min-p 0), so the server samples exactly softmax(logits / T) cut at top-p,
whatever defaults it holds (a model's generation_config, llama.cpp's top_k 40 / min_p 0.05). This module holds the
parts that do not depend on the engine:
- Readiness is GET of the spec's `ready_path` (/health) only: refused / reset and 503 mean "not ready yet", 200 ready.
  A real `/health` may generate one token (and wait a second first), so it is given HEALTH_TIMEOUT_S seconds.
- API keys: with `api_key` set, every request carries `Authorization: Bearer KEY`. A 401/403 is a ServerError
  naming the environment variable to set (`key_env`); the key itself never appears in a message or in
  `repr(client)`.
- Every failure is a `ServerError` whose message says what failed and what to do. Transient failures
  (5xx, refused, reset, timeout) are retried with exponential backoff; a 4xx is reported at once with the
  server's own message unchanged.
- Token ids come from the server, never from re-tokenising text. To use a chat template, apply it locally with
  `chat_ids` and send the ids.
Knows nothing of the store, of torch, or of the local stand-in server. Only the standard library is used.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import UserError
from .registry import EngineSpec

HEALTH_TIMEOUT_S = 8.0  # a real /health generates one token after waiting ~1 s: allow several seconds


# ---------------------------------------------------------------------------
# errors


class ServerError(UserError):
    """A request to the server failed; `status` is the HTTP status (None: no answer), `transient` says
    whether retrying later may help, `detail` is the server's own error message when it sent one."""

    def __init__(self, message: str, status: int | None = None, transient: bool = False, detail: str | None = None):
        super().__init__(message)
        self.status = status
        self.transient = transient
        self.detail = detail


class NotReady(ServerError):
    """The server did not become ready within the allowed time."""

    def __init__(self, message: str):
        super().__init__(message, status=None, transient=True)


def chat_ids(tokenizer, prompt: str, enable_thinking: bool = False) -> list[int]:
    """Apply `tokenizer`'s chat template to one user turn (generation prompt added) and return plain ids."""
    out = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}],
        add_generation_prompt=True,
        tokenize=True,
        enable_thinking=enable_thinking,
    )
    if not isinstance(out, (list, tuple)) and hasattr(out, "keys") and "input_ids" in out.keys():
        out = out["input_ids"]  # transformers 5: BatchEncoding
    if hasattr(out, "tolist"):
        out = out.tolist()
    out = list(out)
    if len(out) == 1 and isinstance(out[0], (list, tuple)):
        out = list(out[0])
    return [int(i) for i in out]


def error_message(body: bytes) -> str:
    """The server's own error message from an error body ({"error": {"message"}} or {"message"}), else the text."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return body.decode("utf-8", "replace").strip()
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
        if isinstance(data.get("message"), str):
            return data["message"]
        if isinstance(data.get("detail"), str):
            return data["detail"]
    return body.decode("utf-8", "replace").strip()


def snippet(body: bytes, n: int = 200) -> str:
    s = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else str(body)
    return repr(s[:n] + ("..." if len(s) > n else ""))


def _no_answer(e: BaseException) -> str | None:
    """'refused' / 'reset' / 'timeout' / 'unreachable: ...' when `e` means no HTTP answer came; else None."""
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        e = e.reason if isinstance(e.reason, BaseException) else OSError(str(e.reason))
    if isinstance(e, ConnectionRefusedError):
        return "refused"
    if isinstance(e, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, http.client.RemoteDisconnected)):
        return "reset"
    if isinstance(e, (TimeoutError, socket.timeout)):
        return "timeout"
    if isinstance(e, (OSError, http.client.HTTPException)):
        return f"unreachable: {e}"
    return None


@dataclass(frozen=True)
class Sampled:
    """How a request samples; greedy requests carry none."""

    temperature: float  # > 0
    top_p: float = 1.0  # nucleus mass kept, (0, 1]
    seed: int | None = None  # sent with the request (recorded with it); None: the engine's own randomness


@dataclass
class EngineClient:
    """The transport and readiness every engine client shares; an engine's client adds its routes (`generate`,
    `spec_stats`, and whatever else its protocol offers)."""

    url: str  # base URL of the server, e.g. http://127.0.0.1:30000
    timeout: float = 600.0  # per-request timeout in seconds (a long generation must fit)
    retries: int = 3  # extra attempts after a transient failure (5xx, refused, reset, timeout)
    backoff: float = 0.5  # first retry delay in seconds; doubles each attempt
    api_key: str | None = field(default=None, repr=False)  # sent as `Authorization: Bearer KEY`; never shown
    key_env: str | None = None  # where the key comes from (an environment variable), named in 401/403 errors;
    # None: the engine's own (its spec's key_env)

    spec: ClassVar[EngineSpec]  # what the engine declares: its name, key variable, statistics, figure, ...

    def __post_init__(self):
        self.key_env = self.key_env or self.spec.key_env
        self.url = self.url.rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"server URL {self.url!r} must start with http:// or https://")

    # -- transport

    def _once(self, method: str, path: str, body: dict | None, timeout: float) -> tuple[int, bytes]:
        """One HTTP exchange: (status, body) for any HTTP answer; raises OSError-like errors for no answer."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            try:
                payload = e.read()
            except Exception:  # noqa: BLE001  (body lost with the connection)
                payload = b""
            return e.code, payload

    def _call(self, method: str, path: str, body: dict | None = None, retry_sent: bool = True) -> bytes:
        """Request with bounded retries on transient failures; returns the 2xx body or raises ServerError.

        `retry_sent=False` (for requests with effects) retries only when the request surely never reached
        the server (connection refused), never a 5xx, reset or timeout."""
        what = f"{method} {self.url}{path}"
        delay, attempt = self.backoff, 0
        while True:
            try:
                status, payload = self._once(method, path, body, self.timeout)
            except Exception as e:  # noqa: BLE001  (classified below)
                kind = _no_answer(e)
                if kind is None:
                    raise
                hint = (
                    f" after {self.timeout:g} s; raise the request timeout or check the server log"
                    if kind == "timeout"
                    else "; is the server running and reachable? check the URL and the server log"
                )
                err = ServerError(f"{what} failed: connection {kind}{hint}", status=None, transient=True)
                retryable = retry_sent or kind == "refused"
            else:
                if 200 <= status < 300:
                    return payload
                msg = error_message(payload)
                if status >= 500:
                    err = ServerError(
                        f"{what} failed: HTTP {status}: {msg or '(empty body)'}; the server may be overloaded "
                        "or crashed, check its log",
                        status=status,
                        transient=True,
                        detail=msg,
                    )
                    retryable = retry_sent
                elif status in (401, 403):
                    err = ServerError(
                        f"{what} rejected: HTTP {status}: {msg or '(empty body)'}; {self._key_hint()}",
                        status=status,
                        detail=msg,
                    )
                    retryable = False
                else:
                    err = ServerError(f"{what} rejected: HTTP {status}: {msg}", status=status, detail=msg)
                    retryable = False
            if not retryable or attempt >= self.retries:
                if attempt:
                    err.args = (f"{err.args[0]} (gave up after {attempt + 1} attempts)",)
                raise err
            attempt += 1
            time.sleep(delay)
            delay *= 2

    def _key_hint(self) -> str:
        if not self.api_key:
            return (
                f"the server wants an API key (it runs with --api-key): set the environment variable "
                f"{self.key_env} to that key where dflash-dash runs (it is read from the environment only, "
                "never stored)"
            )
        return (
            f"the server refused the API key taken from the environment variable {self.key_env}: set it to "
            "the key the server was started with (--api-key)"
        )

    def _json(self, method: str, path: str, body: dict | None = None) -> Any:
        payload = self._call(method, path, body)
        try:
            return json.loads(payload) if payload.strip() else {}
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ServerError(f"{method} {self.url}{path} answered malformed JSON ({e}): {snippet(payload)}") from None

    # -- readiness

    def health(self, timeout: float = HEALTH_TIMEOUT_S) -> tuple[bool, str]:
        """(True, "ready") when GET /health (the spec's `ready_path`) answers 200; else (False, state) with state e.g.
        "refused", "reset", "timeout", "503 warming up". Never raises. A real /health generates a token, so it may
        take a second or more: keep `timeout` at several seconds."""
        try:
            status, payload = self._once("GET", self.spec.ready_path, None, timeout)
        except Exception as e:  # noqa: BLE001  (never raises)
            return False, _no_answer(e) or f"error: {e}"
        if status == 200:
            return True, "ready"
        text = payload.decode("utf-8", "replace").strip().replace("\n", " ")
        return False, f"{status} {text[:80]}".strip()

    def wait_ready(
        self, timeout: float = 600.0, progress: Callable[[float, str], None] | None = None, poll: float = 0.5
    ) -> float:
        """Poll GET /health until it answers 200; return the seconds waited. `progress(elapsed, state)` is
        called after each poll. Raises NotReady after `timeout` seconds."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        state = "not polled"
        while True:
            left = deadline - time.monotonic()
            ok, state = self.health(timeout=max(0.1, min(HEALTH_TIMEOUT_S, left)))
            elapsed = time.monotonic() - t0
            if progress is not None:
                progress(elapsed, state)
            if ok:
                return elapsed
            left = deadline - time.monotonic()
            if left <= 0:
                raise NotReady(
                    f"server at {self.url} not ready after {timeout:g} s (last: {state}); "
                    "check the server log or raise readiness_timeout"
                )
            time.sleep(min(poll, left))

    # -- the engine interface

    @property
    def name(self) -> str:
        """The engine's name (its spec's), recorded with every completion and engine-stats row."""
        return self.spec.name

    @property
    def stats_source(self) -> str:
        """Where its answers carry the speculative statistics (the stats rows' source)."""
        return self.spec.stats_source

    def model_info(self) -> dict:
        """What the server serves: {"model_path", "tokenizer_path" (None when the engine has no tokenizer folder),
        ...}. Raises ServerError."""
        raise NotImplementedError

    def supports_memory_release(self) -> bool:
        """Whether the server can free its GPU memory on request (`release_memory`); False unless an engine says so."""
        return False

    def no_release(self) -> str:
        """Why the server frees no GPU memory on request (`supports_memory_release` False), for the orchestration."""
        return f"{self.name} offers no memory release here"

    def running_requests(self) -> int | None:
        """Requests the server runs or queues; None when the engine has no load report."""
        return None

    def release_memory(self) -> None:
        raise ServerError(
            f"{self.name} has no memory-release API here: set [server] stop_command and start_command in "
            "config.toml, or extract with orchestrate none"
        )

    def resume_memory(self) -> None:
        self.release_memory()

    def generate(
        self,
        input_ids: list[int] | None = None,
        text: str | None = None,
        max_new_tokens: int = 256,
        stop: list[str] | None = None,
        extra: dict | None = None,
        sampled: Sampled | None = None,
    ) -> dict:
        """Generation of `input_ids` or `text`, greedy or as `sampled` says: {"request": the exact body sent, "text",
        "output_ids", "meta_info", and "prompt_ids" when the server reported the prompt's ids}, the meta information
        in the engine's own shape (`meta_info["finish_reason"]` a string or SGLang's {"type", ...}). Raises
        ServerError."""
        raise NotImplementedError

    def served_drafter(self) -> dict | None:
        """What the server says it decodes speculatively with (`served_row`), None when the engine does not say.
        Raises ServerError when the server cannot be asked."""
        return None

    @classmethod
    def spec_stats(cls, meta: dict, output_tokens: int) -> dict | None:
        """An engine-stats row (`stats_row`) from one request's meta information in the engine's own shape, None
        when the engine did not decode speculatively (or reported nothing of it): its spec's `stats`."""
        return cls.spec.stats(meta, output_tokens)

    @classmethod
    def read_request(cls, body: dict | None) -> dict:
        """The settings a stored request body of this engine asked for (its spec's `read_request`)."""
        return cls.spec.read_request(body)

    @classmethod
    def unservable(cls, layer_ids: list[int], num_layers: int) -> dict[int, str]:
        """The target layer ids this engine cannot serve a drafter from, each with why (its spec's `unservable`)."""
        return cls.spec.unservable(layer_ids, num_layers)


# ---------------------------------------------------------------------------
# engine-stats rows: what every engine's speculative statistics become


def count(v: Any) -> int | None:
    """`v` when it is an integer >= 0 (not a bool), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def counts(v: Any) -> list[int] | None:
    """`v` when it is a list of integers >= 0, else None."""
    return [int(x) for x in v] if isinstance(v, list) and all(count(x) is not None for x in v) else None


def stats_row(
    *,
    verify_steps: int | None,
    accepted_tokens: int | None,
    completion_tokens: int | None,
    drafted_tokens: int | None = None,
    accept_lengths: list[int] | None = None,
    histogram: list[int] | None = None,
    raw: Any = None,
    wanted: tuple[str, ...] = ("verify_steps", "accepted_tokens", "drafted_tokens"),
    why: dict[str, str] | None = None,
) -> dict:
    """One engine-stats row: verify steps, draft tokens accepted over them (bonus tokens not counted), draft tokens
    proposed, completion tokens, committed tokens per verify step (`accept_lengths`, bonus included, where the engine
    gives per-step arrays), the histogram of steps by accepted drafts, the engine's payload as it came (`raw`) and
    `missing`: "field: why" for each of `wanted` the engine did not report (never guessed)."""
    row = {
        "verify_steps": verify_steps,
        "accepted_tokens": accepted_tokens,
        "drafted_tokens": drafted_tokens,
        "completion_tokens": completion_tokens,
        "accept_lengths": accept_lengths,
        "histogram": histogram,
        "raw": raw,
    }
    why = why or {}
    row["missing"] = [f"{k}: {why.get(k, 'not reported')}" for k in wanted if row.get(k) is None]
    return row


# ---------------------------------------------------------------------------
# what an engine says it served: every engine's answer in one shape


def served_row(
    *,
    source: str,
    raw: dict,
    draft_model_path: str | None = None,
    algorithm: str | None = None,
    block_size: int | None = None,
    verify_width: int | None = None,
) -> dict:
    """The drafter an engine says it serves: the draft model's path, the speculative algorithm as the engine names
    it, the drafter's block size B and the verify width (tokens one verify step checks, the anchor's included; B
    unless the engine verifies fewer), None for what the engine does not say; `source` the route asked and `raw`
    the engine's speculative fields as they came."""
    return {
        "draft_model_path": draft_model_path if isinstance(draft_model_path, str) and draft_model_path else None,
        "algorithm": algorithm if isinstance(algorithm, str) and algorithm else None,
        "block_size": count(block_size) or None,
        "verify_width": count(verify_width) or None,
        "source": source,
        "raw": raw,
    }
