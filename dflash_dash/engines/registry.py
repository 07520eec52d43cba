"""The serving engines, by name: each engine's client module declares everything about it in one `EngineSpec`, and
this registry is where the rest of the product finds it (config.toml's [server] engine, the key variable, the
request fields a stored request is read back through, the engine's own tau figure, the layers it cannot serve).

Contract: `register(client_class)` adds an engine under its spec's name (the built-ins below; a test's toy engine
too); `spec(name)` finds one or raises `UnknownEngine` (a UserError naming the engine, the known ones and the fix);
`names()` lists them in registration order, the default (`DEFAULT`) first. Standard library only: no torch, no
store, no HTTP at import.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import UserError

if TYPE_CHECKING:
    from .base import EngineClient

DEFAULT = "sglang"  # the engine of a workspace whose config.toml names none, and of rows stored without one
SETTINGS = ("max_new_tokens", "temperature", "top_p", "seed", "prompt_ids")  # what `read_request` reads back


def _no_limit(layer_ids: list[int], num_layers: int) -> dict[int, str]:
    return {}


@dataclass(frozen=True)
class Figure:
    """The engine's own acceptance figure, under its own definition (shown beside the replay's tau, never compared
    with it)."""

    label: str  # the engine's name for it, e.g. "spec_accept_length"
    formula: str  # how the engine computes it, in its own field names
    of: Callable[[dict], float | None]  # its value from an engine-stats row (`base.stats_row`); None: not given


@dataclass(frozen=True)
class EngineSpec:
    """Everything the product knows of one serving engine beside its client's methods (generate, model_info,
    served_drafter, ...)."""

    name: str  # config.toml's [server] engine, --protocol of the stand-in, recorded with every completion
    label: str  # how people write it ("SGLang", "vLLM", "llama.cpp")
    key_env: str  # the environment variable the engine itself reads its --api-key from (a workspace may name another)
    stats: Callable[[dict, int], dict | None]  # (meta_info, output tokens) -> an engine-stats row, None: no drafts
    stats_source: str  # where its answers carry the speculative statistics (the stats rows' source)
    figure: Figure | None  # its own acceptance figure, None when it reports none
    # where its request body (what `generate` sends) holds each of SETTINGS: setting -> the body's field (dotted:
    # nested), or several fields, the first present wins
    request_fields: dict[str, tuple[str, ...]] = field(default_factory=dict)
    ready_path: str = "/health"  # GET it: 200 ready; refused, reset or 503 not yet
    # (target layer ids, target layers) -> {layer it cannot feed a drafter from: why}
    unservable: Callable[[list[int], int], dict[int, str]] = _no_limit

    def read_request(self, body: dict | None) -> dict:
        """The settings a stored request body of this engine asked for, read from its own fields (`request_fields`):
        {"max_new_tokens", "temperature", "top_p", "seed", "prompt_ids" (the ids sent; None when text was sent)},
        each None when the body lacks it."""
        out: dict[str, Any] = {}
        for key in SETTINGS:
            out[key] = None
            for path in self.request_fields.get(key, ()):
                v: Any = body if isinstance(body, dict) else None
                for part in path.split("."):
                    v = v.get(part) if isinstance(v, dict) else None
                if v is not None:
                    out[key] = v
                    break
        ids = out["prompt_ids"]
        whole = isinstance(ids, list) and ids and all(type(i) is int and i >= 0 for i in ids)
        out["prompt_ids"] = [int(i) for i in ids] if whole else None
        for key in ("max_new_tokens", "temperature", "top_p", "seed"):
            v = out[key]
            out[key] = v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        return out

    def own_figure(self, row: dict) -> tuple[float | None, str | None, str | None]:
        """(the engine's own figure, its name, its formula) from an engine-stats row; Nones without one."""
        if self.figure is None:
            return None, None, None
        return self.figure.of(row), self.figure.label, self.figure.formula


class UnknownEngine(UserError):
    """An engine name no client is registered for."""


ENGINES: dict[str, type[EngineClient]] = {}  # engine name -> its client class (whose `spec` declares it)


def register(client: type[EngineClient]) -> type[EngineClient]:
    """Add the engine `client.spec` declares (replacing one of that name); returns the class (a decorator)."""
    spec = getattr(client, "spec", None)
    if not isinstance(spec, EngineSpec):
        raise TypeError(f"{client.__name__} declares no EngineSpec as its `spec`")
    ENGINES[spec.name] = client
    return client


def names() -> list[str]:
    """The registered engines' names."""
    return list(ENGINES)


def client_of(name: str, where: str = "engine") -> type[EngineClient]:
    """The client class of engine `name`; UnknownEngine (`where` names the setting that gave it) when none is
    registered."""
    if name not in ENGINES:
        known = ", ".join(repr(n) for n in ENGINES)
        raise UnknownEngine(
            f"{where} {name!r} is not a known serving engine: use one of {known}, or add a client for it "
            "(docs/engines.md, \"Adding an engine\")"
        )
    return ENGINES[name]


def spec(name: str, where: str = "engine") -> EngineSpec:
    """The spec of engine `name` (UnknownEngine as `client_of`)."""
    return client_of(name, where).spec


def api_key(cfg: Any) -> tuple[str | None, str]:
    """(key or None, the environment variable it is read from) for a workspace config (`cfg.api_key_env`, else its
    engine's own `key_env`). The key lives only in the environment (and in memory): never store or log it."""
    name = cfg.api_key_env or spec(cfg.engine, "[server] engine").key_env
    return os.environ.get(name) or None, name
