"""Field checks of the operations (`ops`): the one place a user-given value is validated, whatever layer takes it.

Contract: each check takes a value as a user gave it (command line, form, job record, file) and returns it
normalised or raises `InputError`, the UserError of bad input whose message starts with the field's name and says
the fix; `InputError.field` carries that name so a page can say its form label instead (pages.forms.said).
`check_name` is the one validator of names (completion sets, prompt sets, runs, extractions, engines, display
names): no path separator, no `..`, no control character, so a name never acts as a path. `check_url` takes a
server's http(s) URL; dtype, device, layers, checkpoint lists, GPUs and Ray addresses are checked here only. `ops`
re-exports all of them (callers name them `ops.check_name`, ...). Pure Python: no torch, no store, no disk.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import UserError

DTYPES = ("float32", "bfloat16")  # compute dtypes an operation can run in
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
_RAY_ADDRESS = re.compile(r"[A-Za-z0-9_.\-\[\]:]+:\d{1,5}")  # a Ray cluster's GCS address HOST:PORT


class InputError(UserError, ValueError):
    """Bad user input (an operation's argument, a file's line); the message names the field or line and the fix.
    `field`: the operation field it is about (pages show that field's form label in its place: pages.forms.said)."""

    def __init__(self, msg: str, field: str | None = None):
        super().__init__(msg)
        self.field = field


_NOT_A_NAME = re.compile(r"(?:[/\\\x00-\x1f\x7f]|\.\.)+")  # path separators, a parent step, control characters


def check_name(value: Any, name: str = "name", what: str = "a name", optional: bool = False) -> str | None:
    """A user-given name (completion set, run, extraction, engine, display name) trimmed: refused when empty (unless
    `optional`: None), or when it could act as a path or hides characters (/, \\, .., control characters)."""
    v = value.strip() if isinstance(value, str) else value
    if optional and v in (None, ""):
        return None
    if not isinstance(v, str) or not v:
        raise InputError(f"{name} {value!r}: give {what}", name)
    if _NOT_A_NAME.search(v):
        like = _NOT_A_NAME.sub("-", v).strip("-. ") or "my-set"
        raise InputError(
            f"{name} {v!r}: a name holds no /, \\, .. or control characters; give {what} like {like!r}", name
        )
    return v


def check_url(value: Any, name: str = "server") -> str:
    """A server's base URL http(s)://HOST[:PORT][/PATH], without its trailing slash."""
    from urllib.parse import urlsplit

    v = value.strip() if isinstance(value, str) else ""
    try:
        u = urlsplit(v)
        ok = u.scheme in ("http", "https") and bool(u.hostname) and (u.port is None or u.port > 0)
    except ValueError:  # a port that is not a number
        ok = False
    if not ok:
        raise InputError(
            f"{name} {value!r}: expected the server's http:// or https:// URL, like http://127.0.0.1:30000", name
        )
    return v.rstrip("/")


def check_dtype(value: Any, name: str = "dtype", optional: bool = False) -> None:
    """Refuse a compute dtype that is not one of DTYPES."""
    if not (optional and value is None) and value not in DTYPES:
        raise InputError(f"{name} {value!r}: expected one of {', '.join(DTYPES)}")


def check_device(value: Any, name: str = "device", optional: bool = False) -> None:
    """Refuse a device that is not cpu, cuda or cuda:N."""
    if not (optional and value is None) and not (isinstance(value, str) and _DEVICE.fullmatch(value)):
        raise InputError(f"{name} {value!r}: expected cpu, cuda or cuda:N (N = the GPU's index)")


def parse_layers(value: Any) -> list[int] | None:
    """Target layer ids from "1,16,31" or a list of ints; None for none given."""
    if value in (None, "", []):
        return None
    if isinstance(value, str):
        try:
            value = [int(x) for x in value.split(",") if x.strip()]
        except ValueError:
            raise InputError(f"layers {value!r}: expected comma-separated integers like 1,16,31") from None
    value = list(value)
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise InputError(f"layers {value!r}: expected a list of integer layer ids like [1, 16, 31]")
    return value or None


def parse_paths(value: Any, name: str = "drafter") -> list[str]:
    """Checkpoint folders from one path (a job record written before the field was a list) or a list of paths;
    [] for none. Paths are kept as given (a comma may be part of one)."""
    if value in (None, ""):
        return []
    items = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(x, str) for x in items):
        raise InputError(f"{name} {value!r}: expected checkpoint folders (paths), one per --{name}")
    return [x.strip() for x in items if x.strip()]


def missing_layers(have: list[int], need: list[int]) -> list[int]:
    """The layer ids of `need` that `have` (an extraction's layers) lacks, in `need`'s order."""
    held = set(have)
    return [x for x in need if x not in held]


def layer_blocks(have: list[int], need: list[int]) -> list[int] | None:
    """Where each layer of `need` sits in `have` (features [T, K*H] hold K blocks of H values in `have`'s order):
    None when `need` equals `have` (every column, in order: nothing to select), else the block index of each needed
    layer in `need`'s order. Every layer of `need` must be in `have` (`missing_layers` first)."""
    have, need = list(have), list(need)
    if need == have:
        return None
    at = {x: i for i, x in enumerate(have)}
    return [at[x] for x in need]


def parse_gpus(value: Any) -> list[str]:
    """Worker devices from "0,1" (CUDA indices), "cuda:0,cuda:1", "cpu,cpu" or a list of those; [] for none."""
    if value in (None, ""):
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for x in items:
        x = str(x).strip()
        dev = f"cuda:{x}" if x.isdigit() else x
        if not _DEVICE.fullmatch(dev):
            raise InputError(
                f"gpus {value!r}: {x!r} is not a device; give CUDA indices like 0,1 (one worker per GPU), "
                "cuda:N entries, or cpu,cpu for CPU workers"
            )
        out.append(dev)
    return out


def check_ray(value: Any) -> str:
    """A Ray cluster address: "auto" or the GCS address HOST:PORT that `ray start --head` prints."""
    if isinstance(value, str) and (value == "auto" or _RAY_ADDRESS.fullmatch(value)):
        return value
    hint = "; a ray:// address is a Ray Client's: give the GCS address itself" if str(value).startswith("ray:") else ""
    raise InputError(f"ray {value!r}: expected auto or the cluster's HOST:PORT (as `ray start --head` prints it){hint}")
