"""Serving-engine clients, one per engine, behind one interface (`base.EngineClient`): readiness, greedy
generation, speculative statistics in the engine's own shapes.

Contract: ENGINES maps an engine's name to its client class (sglang, vllm, llamacpp: the names a workspace's
config.toml may give as [server] engine); `for_workspace(cfg)` builds the client of a workspace's server (the
engine its config names) with the API key from the environment, and is how every client of a workspace is made.
Each client's `spec_stats` reads its engine's speculative statistics in the shapes they come in;
`metrics.engine_tau` turns them into the replay's tau. `layer_limits` names the target layers of a drafter an engine
cannot serve (each client's `unservable`), before anyone deploys it there.
`health.HealthPoller` polls readiness in the background for callers that must not block.
"""

from __future__ import annotations

from ..config import DEFAULT_ENGINE, ENGINE_NAMES, api_key, default_key_env
from .base import HEALTH_TIMEOUT_S, EngineClient, NotReady, Sampled, ServerError, chat_ids
from .health import HealthPoller
from .llamacpp import LlamaCppClient
from .sglang import SGLangClient
from .vllm import VLLMClient

ENGINES: dict[str, type[EngineClient]] = {"sglang": SGLangClient, "vllm": VLLMClient, "llamacpp": LlamaCppClient}
assert tuple(ENGINES) == ENGINE_NAMES, "config.ENGINE_NAMES must list the registry's engines"

__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "HEALTH_TIMEOUT_S",
    "EngineClient",
    "HealthPoller",
    "LlamaCppClient",
    "NotReady",
    "SGLangClient",
    "Sampled",
    "ServerError",
    "VLLMClient",
    "chat_ids",
    "for_workspace",
    "layer_limits",
]


def for_workspace(cfg, url: str | None = None, engine: str | None = None, **kw) -> EngineClient:
    """The client for a workspace's server (`url`, default [server] url of its config.toml) speaking `engine`'s
    protocol (default [server] engine), sending the API key from the environment (`config.api_key`). Every client
    built from a workspace is made here."""
    key, name = api_key(cfg)
    hint = name if name == default_key_env(cfg) else f"{name} (named by api_key_env in config.toml)"
    return ENGINES[engine or cfg.engine](url or cfg.server_url, api_key=key, key_env=hint, **kw)


def layer_limits(layer_ids: list[int], num_layers: int, names: list[str] | None = None) -> list[str]:
    """One line per engine (of `names`, default all) and target layer of a drafter reading `layer_ids` from a
    target of `num_layers` layers that the engine cannot serve: "ENGINE cannot serve target layer L: why"."""
    return [
        f"{n} cannot serve target layer {layer}: {why}"
        for n in (names if names is not None else list(ENGINES))
        if n in ENGINES
        for layer, why in sorted(ENGINES[n].unservable(list(layer_ids), num_layers).items())
    ]
