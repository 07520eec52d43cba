"""Background readiness: GET /health of one server polled in a daemon thread, for callers that must not block.

Contract: `HealthPoller(client)` works with any engine client (`base.EngineClient.health`); a dashboard redraw
reads the latest answer at once, never waiting on the network. Polling pauses while nobody reads.
"""

from __future__ import annotations

import threading
import time

from .base import HEALTH_TIMEOUT_S, EngineClient


class HealthPoller:
    """GET /health of one server in a daemon thread, every `every` seconds, so that a caller that must not
    block (a dashboard redraw) reads the latest answer at once. `latest()` is (None, "checking…") until the
    first answer; `wait(timeout)` blocks until there is one. Polling pauses when nobody has read the state
    for `idle_after` seconds and resumes on the next read. Holds the client (its key stays in memory)."""

    def __init__(
        self, client: EngineClient, every: float = 3.0, timeout: float = HEALTH_TIMEOUT_S, idle_after: float = 120.0
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
