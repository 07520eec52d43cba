"""HTTP client for an SGLang server: readiness, model info, load, greedy generation, memory release.

Contract: the client knows nothing of the store, of torch, or of the local stand-in (`server.py`); it speaks
only the SGLang HTTP protocol (SPEC section 4) and would behave the same against a real SGLang server.
- Readiness is `/health` only: connection refused / reset and 503 mean "not ready yet", 200 means ready.
  `/v1/models` and `/model_info` answer before the server can generate, so they are never readiness checks.
  A real `/health` generates one token (and waits a second first), so it is given HEALTH_TIMEOUT_S seconds;
  `HealthPoller` runs it in a background thread for callers that must not block (the dashboard).
- API keys: with `api_key` set, every request carries `Authorization: Bearer KEY` (SGLang's `--api-key`
  exempts only /health and /metrics). A 401/403 is a ServerError naming the environment variable to set
  (`key_env`); the key itself never appears in a message or in `repr(client)`.
- Load: `running_requests()` reads `/v1/loads` (newer SGLang) or `/get_load` (older): running plus waiting
  requests, None when the server has neither. SGLang asserts the scheduler is idle when it releases memory.
- Token ids come from the server's `output_ids`, never from re-tokenising text. To use a chat template,
  apply it locally with `chat_ids` and send `input_ids`.
- Every failure is a `ServerError` whose message says what failed and what to do. Transient failures
  (5xx, refused, reset, timeout) are retried with exponential backoff; a 4xx is reported at once with the
  server's own message unchanged.
Only the standard library is used (urllib, threading).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import UserError

HEALTH_TIMEOUT_S = 8.0  # a real /health generates one token after waiting ~1 s: allow several seconds
DEFAULT_KEY_ENV = "SGLANG_API_KEY"  # environment variable read for the server's --api-key


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


# ---------------------------------------------------------------------------
# pure helpers


def parse_generate(body: bytes) -> dict:
    """Parse and validate the body of a `/generate` answer: {"text", "output_ids", "meta_info"}.

    Raises ServerError (not transient) naming the problem when the body is not what SGLang sends."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ServerError(f"/generate answered malformed JSON ({e}): {_snippet(body)}") from None
    if isinstance(data, list) and len(data) == 1:  # a batch of one
        data = data[0]
    if not isinstance(data, dict):
        raise ServerError(f"/generate answered JSON {type(data).__name__}, expected an object: {_snippet(body)}")
    ids = data.get("output_ids")
    if ids is None:
        raise ServerError(
            "/generate answer has no `output_ids`; token ids must come from the server (is this SGLang? "
            f"set skip_tokenizer_init or upgrade the server): {_snippet(body)}"
        )
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ServerError(f"/generate answer has ill-typed `output_ids` (expected a list of ints): {_snippet(body)}")
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


def _snippet(body: bytes, n: int = 200) -> str:
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


# ---------------------------------------------------------------------------
# client


@dataclass
class Client:
    url: str  # base URL of the server, e.g. http://127.0.0.1:30000
    timeout: float = 600.0  # per-request timeout in seconds (a long generation must fit)
    retries: int = 3  # extra attempts after a transient failure (5xx, refused, reset, timeout)
    backoff: float = 0.5  # first retry delay in seconds; doubles each attempt
    api_key: str | None = field(default=None, repr=False)  # sent as `Authorization: Bearer KEY`; never shown
    key_env: str = DEFAULT_KEY_ENV  # where the key comes from (an environment variable), named in 401/403 errors

    def __post_init__(self):
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
            raise ServerError(f"{method} {self.url}{path} answered malformed JSON ({e}): {_snippet(payload)}") from None

    # -- readiness

    def health(self, timeout: float = HEALTH_TIMEOUT_S) -> tuple[bool, str]:
        """(True, "ready") when GET /health answers 200; else (False, state) with state e.g. "refused",
        "reset", "timeout", "503 warming up". Never raises. A real /health generates a token, so it may take
        a second or more: keep `timeout` at several seconds."""
        try:
            status, payload = self._once("GET", "/health", None, timeout)
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
                f"the load report of {self.url} is not a list of objects: {_snippet(json.dumps(data).encode())}"
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

    # -- generation

    def generate(
        self,
        input_ids: list[int] | None = None,
        text: str | None = None,
        max_new_tokens: int = 256,
        stop: list[str] | None = None,
        extra: dict | None = None,
    ) -> dict:
        """Greedy POST /generate of `input_ids` or `text`. Returns {"request": the exact JSON body sent,
        "text", "output_ids", "meta_info"}. `extra` is merged into the body (its "sampling_params" into the
        sampling params). Raises ServerError."""
        if (input_ids is None) == (text is None):
            raise ValueError("generate needs exactly one of input_ids or text")
        params: dict[str, Any] = {"temperature": 0, "max_new_tokens": int(max_new_tokens)}
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


# ---------------------------------------------------------------------------
# background readiness


class HealthPoller:
    """GET /health of one server in a daemon thread, every `every` seconds, so that a caller that must not
    block (a dashboard redraw) reads the latest answer at once. `latest()` is (None, "checking…") until the
    first answer; `wait(timeout)` blocks until there is one. Polling pauses when nobody has read the state
    for `idle_after` seconds and resumes on the next read. Holds a `Client` (its key stays in memory)."""

    def __init__(
        self, client: Client, every: float = 3.0, timeout: float = HEALTH_TIMEOUT_S, idle_after: float = 120.0
    ):
        self.client, self.every, self.timeout, self.idle_after = client, every, timeout, idle_after
        self._lock = threading.Lock()
        self._state: tuple[bool, str, float] | None = None  # (ok, state, monotonic time of the answer)
        self._answered = threading.Event()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._read = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"health {client.url}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            ok, state = self.client.health(self.timeout)
            with self._lock:
                self._state = (ok, state, time.monotonic())
            self._answered.set()
            self._wake.wait(self.every)
            self._wake.clear()
            while not self._stop.is_set() and time.monotonic() - self._read > self.idle_after:
                self._wake.wait()  # nobody reads: sleep until the next read
                self._wake.clear()

    def latest(self) -> tuple[bool | None, str]:
        """(True, "ready"), (False, why) or (None, "checking…") before the first answer. Never blocks."""
        paused = time.monotonic() - self._read > self.idle_after
        self._read = time.monotonic()
        if paused:
            self._wake.set()
        with self._lock:
            st = self._state
        if st is None:
            return None, "checking…"
        ok, state, when = st
        age = time.monotonic() - when
        if age > max(3 * self.every, self.every + self.timeout) + 1.0:
            return None, f"checking… (last answer {age:.0f} s ago: {state})"
        return ok, state

    def wait(self, timeout: float) -> bool:
        """Block until the first answer (True) or `timeout` seconds (False)."""
        self._read = time.monotonic()
        return self._answered.wait(timeout)

    def refresh(self) -> None:
        """Poll again now rather than at the next period."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()


# ---------------------------------------------------------------------------
# workspace


def for_workspace(cfg, url: str | None = None, **kw) -> Client:
    """The Client for a workspace's server (`url`, default [server] url of its config.toml), sending the API
    key from the environment (`config.api_key`). Every Client built from a workspace is made here."""
    from .config import DEFAULT_API_KEY_ENV, api_key

    key, name = api_key(cfg)
    hint = name if name == DEFAULT_API_KEY_ENV else f"{name} (named by api_key_env in config.toml)"
    return Client(url or cfg.server_url, api_key=key, key_env=hint, **kw)
