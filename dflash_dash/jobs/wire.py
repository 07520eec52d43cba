"""The wire format between the worker pool and its worker processes: the only data that crosses a process.

Contract: the pool writes a worker's spec (an `ops` worker spec: ExtractWork, ReplayWork, StreamWork) with
`encode_spec` (one JSON object {"kind", "args": its to_json(), "prompts"} on its stdin) and the worker reads it
back, typed, with `decode_spec`; the worker writes its events and progress as JSON lines
through a `Writer` (in order, from one thread), its dataclasses (a replay's `metrics.Prompt`) as dicts whose
arrays and number lists are `pack`ed (numpy bytes in base64, the empty rows left out), and the pool reads each
event back with `unpacked`, its "result" a `metrics.Prompt` again. `unpack(pack(x))` gives x back as a numpy
array; ragged lists and anything that is not numbers travel as they are. Numpy, ops and metrics only: no torch,
no store.
"""

from __future__ import annotations

import base64
import json
import queue
import threading
from dataclasses import fields, is_dataclass
from typing import IO

import numpy as np

from .. import ops
from ..metrics import Prompt


def encode_spec(spec: ops.Work, prompts: list) -> bytes:
    """A worker's spec as it goes to its stdin: the work's kind, its fields (the worker's device among them) and
    the prompt ids of its shard."""
    return json.dumps({"kind": spec.kind, "args": spec.to_json(), "prompts": prompts}).encode()


def decode_spec(stream: IO) -> tuple[ops.Work, list]:
    """The spec `encode_spec` wrote, read from `stream`: (the worker spec, prompt ids)."""
    got = json.load(stream)
    return ops.work_of(got["kind"], got["args"]), got["prompts"]


class Writer:
    """The worker's event lines, packed (`plain`) and written in order by one thread. A failure there (a result
    that is not JSON data, a closed pipe) is raised by the next `emit` or by `close`."""

    def __init__(self, out):
        self.out, self.q, self.error = out, queue.Queue(), None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (obj := self.q.get()) is not None:
            if self.error is None:  # after a failure the rest is dropped, never written out of order
                try:
                    self.out.write(json.dumps(obj, default=plain) + "\n")
                except BaseException as e:  # noqa: BLE001  (raised in the producing thread)
                    self.error = e

    def emit(self, obj: dict) -> None:
        if self.error is not None:
            raise self.error
        self.q.put(obj)

    def close(self, check: bool = True) -> None:
        """Write what is queued, end the thread; `check`: raise its failure."""
        self.q.put(None)
        self.thread.join()
        if check and self.error is not None:
            raise self.error


def plain(o):
    """JSON for the worker's events: dataclasses (a `metrics.Prompt`) as dicts of their fields, packed (`pack`)."""
    if is_dataclass(o):
        return {f.name: pack(getattr(o, f.name)) for f in fields(o)}
    raise TypeError(f"{type(o).__name__} is not JSON data")


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(a.tobytes()).decode("ascii")


def _fill(dtype: np.dtype):
    """The value of an empty row: NaN (floats), -1 (integers: an anchor or slot not computed)."""
    return np.nan if dtype.kind == "f" else -1


def pack(v):
    """A numpy array or rectangular list of numbers as {"packed": [dtype, shape, base64 of its bytes]}, or, when
    most rows of a 2-D+ array are empty (all -1 or all NaN: the anchors a chain-only replay did not compute),
    [dtype, shape, base64 of the other rows, base64 of their indices]; anything else as it is.
    JSON text would cost the worker about 0.3 s and the parent 0.05 s per 2,560-token prompt (drafts and
    log-probabilities at every anchor), more than the prompt's replay; sending a chain-only prompt's empty rows
    would make its message about six times longer than its results."""
    if isinstance(v, np.ndarray) or (isinstance(v, list) and v):
        try:
            a = np.ascontiguousarray(v)
        except ValueError:  # ragged
            return v
        if a.dtype.kind == "i" and a.size and -(2**31) <= a.min() and a.max() < 2**31:
            a = a.astype(np.int32)  # lossless: token ids, counts
        if a.dtype.kind in "if":
            head = [a.dtype.str, list(a.shape)]
            if a.ndim >= 2 and a.size:
                flat = a.reshape(len(a), -1)  # [rows, rest]
                empty = (np.isnan(flat) if a.dtype.kind == "f" else flat == -1).all(1)  # [rows]
                if 2 * int(empty.sum()) > len(a):
                    rows = np.flatnonzero(~empty).astype(np.int32)
                    return {"packed": head + [_b64(a[rows]), _b64(rows)]}
            return {"packed": head + [_b64(a)]}
    return v


def unpack(v):
    """The inverse of `pack`: a numpy array (the store step reads arrays: lists of a prompt's 30,000 drafts and
    log-probabilities would cost the parent more than storing them)."""
    if isinstance(v, dict) and set(v) == {"packed"}:
        dt, shape, b, *rows = v["packed"]
        a = np.frombuffer(base64.b64decode(b), dtype=dt)
        if rows:  # only the non-empty rows travelled
            at = np.frombuffer(base64.b64decode(rows[0]), dtype=np.int32)
            out = np.full(shape, _fill(a.dtype), dtype=dt)
            out[at] = a.reshape(len(at), *shape[1:])
            return out
        return a.reshape(shape)
    return v


def unpacked(ev: dict) -> dict:
    """A worker's event with the packed fields of its dict values unpacked; its "result" a `metrics.Prompt`."""
    out = {k: {f: unpack(x) for f, x in v.items()} if isinstance(v, dict) else v for k, v in ev.items()}
    if isinstance(out.get("result"), dict):
        out["result"] = Prompt(**out["result"])
    return out
