"""The stand-in's protocols: one module per serving engine (`server/<name>_api.py`), registered here by the engine's
name; `httpd` routes every request through the one that --protocol names and knows no engine.

Contract: a protocol is a module (or any object) holding
- NAME: the engine's name, as `engines.registry` and config.toml's [server] engine name it;
- GENERATE: its generation route (named in --protocol's help);
- LOADING: None when the engine binds its port only after loading (SGLang, vLLM), else the 503 message every
  route answers while the model loads and for --startup-delay after (llama-server binds first);
- WARMUP: the share of --startup-delay during which a port bound after loading still answers its readiness route
  503 (SGLang 0.5; vLLM 0: bound only when ready); the rest of the delay the port is not bound;
- POSTS: its POST routes (any other POST answers `not_found` before the body is read);
- open_path(path): True for routes its --api-key leaves open; unauthorized(): the 401 body;
- error(status, message): its error body; not_found(method, path): its 404 body;
- get(eng, path, query) / post(eng, path, request JSON): (status, JSON body) or (status, None, text), None for
  a route it does not have; a `protocol.BadRequest` is answered with its status in the protocol's error shape.
`register(protocol)` adds one (a test's toy protocol too); `get(name)` finds one, SystemExit naming the known ones.
"""

from __future__ import annotations

from typing import Any

from . import llamacpp_api, sglang_api, vllm_api

REQUIRED = ("NAME", "GENERATE", "LOADING", "WARMUP", "POSTS", "open_path", "unauthorized", "error", "not_found")
REQUIRED += ("get", "post")
PROTOCOLS: dict[str, Any] = {}  # engine name -> its stand-in protocol, in registration order


def register(protocol: Any) -> Any:
    """Add `protocol` under its NAME (replacing one of that name); TypeError naming what it lacks."""
    lacks = [a for a in REQUIRED if not hasattr(protocol, a)]
    if lacks:
        raise TypeError(f"stand-in protocol {getattr(protocol, 'NAME', protocol)!r} lacks {', '.join(lacks)}")
    PROTOCOLS[protocol.NAME] = protocol
    return protocol


def get(name: str) -> Any:
    """The protocol of engine `name`; SystemExit naming the known ones when there is none."""
    if name not in PROTOCOLS:
        raise SystemExit(f"--protocol {name!r}: expected one of {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]


for _p in (sglang_api, vllm_api, llamacpp_api):  # the built-in engines; a new one adds its module here
    register(_p)
