"""Serving-engine clients, one module per engine, behind one interface (`base.EngineClient`): readiness, greedy
generation, speculative statistics in the engine's own shapes; each declares itself in one `registry.EngineSpec`.

Contract: ENGINES (`registry.ENGINES`) maps an engine's name to its client class (sglang, vllm, llamacpp, and any a
caller registers: the names a workspace's config.toml may give as [server] engine); `spec(name)` is its
declaration, an unknown name a `registry.UnknownEngine` naming the fix. `for_workspace(cfg)` builds the client of a
workspace's server (the engine its config names) with the API key from the environment, and is how every client
of a workspace is made. Each client's `spec_stats` reads its engine's speculative statistics in the shapes they
come in; `tau(engine, row)` turns them into the replay's tau with the engine's own figure beside
(`metrics.engine_tau`). `layer_limits` names the target layers of a drafter an engine cannot serve (each spec's
`unservable`), before anyone deploys it there. `health.HealthPoller` polls readiness in the background for callers
that must not block.
"""

from __future__ import annotations

from ..metrics import engine_tau
from .base import HEALTH_TIMEOUT_S, EngineClient, NotReady, Sampled, ServerError, chat_ids
from .health import HealthPoller
from .llamacpp import LlamaCppClient
from .registry import (
    DEFAULT as DEFAULT_ENGINE,
    ENGINES,
    EngineSpec,
    Figure,
    UnknownEngine,
    api_key,
    client_of,
    names,
    register,
    spec,
)
from .sglang import SGLangClient
from .vllm import VLLMClient

for _client in (SGLangClient, VLLMClient, LlamaCppClient):  # the built-in engines; a new one adds its client here
    register(_client)

__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "HEALTH_TIMEOUT_S",
    "EngineClient",
    "EngineSpec",
    "Figure",
    "HealthPoller",
    "LlamaCppClient",
    "NotReady",
    "SGLangClient",
    "Sampled",
    "ServerError",
    "UnknownEngine",
    "VLLMClient",
    "api_key",
    "chat_ids",
    "client_of",
    "for_workspace",
    "layer_limits",
    "names",
    "register",
    "spec",
    "tau",
]


def for_workspace(cfg, url: str | None = None, engine: str | None = None, **kw) -> EngineClient:
    """The client for a workspace's server (`url`, default [server] url of its config.toml) speaking `engine`'s
    protocol (default [server] engine), sending the API key from the environment (`registry.api_key`). Every client
    built from a workspace is made here. UnknownEngine for an engine no client is registered for."""
    client = client_of(engine or cfg.engine, "engine" if engine else "[server] engine")
    key, name = api_key(cfg)
    hint = name if name == spec(cfg.engine).key_env else f"{name} (named by api_key_env in config.toml)"
    return client(url or cfg.server_url, api_key=key, key_env=hint, **kw)


def tau(engine: str, row: dict) -> engine_tau.EngineTau:
    """The replay's tau from engine `engine`'s stats row, with the engine's own figure beside (its spec's `figure`);
    an engine no client is registered for (stats imported from a file) has no figure of its own."""
    own = ENGINES[engine].spec.own_figure(row) if engine in ENGINES else (None, None, None)
    return engine_tau.convert(engine, row, own)


def layer_limits(layer_ids: list[int], num_layers: int, names: list[str] | None = None) -> list[str]:
    """One line per engine (of `names`, default all) and target layer of a drafter reading `layer_ids` from a
    target of `num_layers` layers that the engine cannot serve: "ENGINE cannot serve target layer L: why"."""
    return [
        f"{n} cannot serve target layer {layer}: {why}"
        for n in (names if names is not None else list(ENGINES))
        if n in ENGINES
        for layer, why in sorted(ENGINES[n].spec.unservable(list(layer_ids), num_layers).items())
    ]
