"""Serving-engine clients, one per engine, behind one interface (`base.EngineClient`): readiness, greedy
generation, speculative statistics in the engine's own shapes.

Contract: ENGINES maps an engine's name to its client class; `for_workspace(cfg)` builds the client of a
workspace's server with the API key from the environment, and is how every client of a workspace is made.
`health.HealthPoller` polls readiness in the background for callers that must not block.
"""

from __future__ import annotations

from ..config import DEFAULT_API_KEY_ENV, api_key
from .base import HEALTH_TIMEOUT_S, EngineClient, NotReady, ServerError, chat_ids
from .health import HealthPoller
from .sglang import SGLangClient

ENGINES: dict[str, type[EngineClient]] = {"sglang": SGLangClient}
DEFAULT_ENGINE = "sglang"  # the engine a workspace's server speaks

__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "HEALTH_TIMEOUT_S",
    "EngineClient",
    "HealthPoller",
    "NotReady",
    "SGLangClient",
    "ServerError",
    "chat_ids",
    "for_workspace",
]


def for_workspace(cfg, url: str | None = None, engine: str = DEFAULT_ENGINE, **kw) -> SGLangClient:
    """The client for a workspace's server (`url`, default [server] url of its config.toml), sending the API
    key from the environment (`config.api_key`). Every client built from a workspace is made here."""
    key, name = api_key(cfg)
    hint = name if name == DEFAULT_API_KEY_ENV else f"{name} (named by api_key_env in config.toml)"
    return ENGINES[engine](url or cfg.server_url, api_key=key, key_env=hint, **kw)
