"""Workspace configuration: `W/config.toml` as a validated dataclass.

Contract: `load(workspace)` reads the `[server]` table of `W/config.toml` (missing file: defaults) and
returns a `WorkspaceConfig`; an unknown table or key, a wrong type or a TOML syntax error raises
`ConfigError` naming the key and its line. Commands are argv lists run WITHOUT a shell
(`subprocess.run(list)`); a string value is split with `shlex`. They come only from this file, never from
browser input, and `describe_commands` shows them before they run.
`engine` names the serving engine the server is, one the engines' registry knows (`engines.registry`: sglang, the
default; vllm; llamacpp; ...), which picks the client (`engines.for_workspace`). The server's API key (`--api-key`)
is never in this file: it is read from the environment variable the engine declares (its spec's key_env:
SGLANG_API_KEY, VLLM_API_KEY, LLAMA_API_KEY), or from the one named by `api_key_env`. Example:

    [server]
    url = "http://127.0.0.1:30000"
    engine = "sglang"                # or "vllm" (vllm serve), "llamacpp" (llama-server)
    stop_command = ["systemctl", "--user", "stop", "sglang"]
    start_command = "systemctl --user start sglang"
    readiness_timeout = 600
    memory_release = true
    gpu_memory_margin_gb = 2.0
    api_key_env = "SGLANG_API_KEY"   # the NAME of the variable holding the key, never the key
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, fields
from pathlib import Path

import tomllib

from . import engines
from .errors import UserError

FILE_NAME = "config.toml"
DEFAULT_API_KEY_ENV = engines.spec(engines.DEFAULT_ENGINE).key_env  # the default engine's key variable


class ConfigError(UserError, ValueError):
    """config.toml cannot be used; the message names the file, key and line, and the fix."""


@dataclass
class WorkspaceConfig:
    server_url: str = "http://127.0.0.1:30000"  # serving engine the app fetches from and orchestrates
    engine: str = engines.DEFAULT_ENGINE  # which engine that server is: a registered one (picks the client)
    stop_command: list[str] | None = None  # argv that stops the server (frees the GPU), no shell
    start_command: list[str] | None = None  # argv that starts it again; may return at once or keep running
    readiness_timeout: float = 600.0  # seconds to wait for /health 200 (SGLang's own tests allow 600)
    memory_release: bool = True  # use /release_memory_occupation when the server supports it
    gpu_memory_margin_gb: float = 2.0  # free GPU memory required beyond the target's weights
    api_key_env: str | None = None  # NAME of the environment variable holding the server's --api-key
    # (None: the engine's own, its spec's key_env); the key itself is never in config.toml


# toml key -> (dataclass field, expected kind)
KEYS = {
    "url": ("server_url", "url"),
    "server_url": ("server_url", "url"),
    "engine": ("engine", "engine"),
    "stop_command": ("stop_command", "command"),
    "start_command": ("start_command", "command"),
    "readiness_timeout": ("readiness_timeout", "seconds"),
    "memory_release": ("memory_release", "bool"),
    "gpu_memory_margin_gb": ("gpu_memory_margin_gb", "number"),
    "api_key_env": ("api_key_env", "env"),
}


# ---------------------------------------------------------------------------
# loading


def path_of(workspace: str | Path) -> Path:
    return Path(workspace) / FILE_NAME


def load(workspace: str | Path) -> WorkspaceConfig:
    """The workspace's configuration; defaults when `W/config.toml` does not exist."""
    p = path_of(workspace)
    if not p.is_file():
        return WorkspaceConfig()
    text = p.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    for table in data:
        if table != "server":
            raise ConfigError(
                f"{p}{_line(text, table, table=True)}: unknown entry {table!r}; only a [server] table is read"
            )
    server = data.get("server", {})
    if not isinstance(server, dict):
        raise ConfigError(f"{p}{_line(text, 'server')}: 'server' must be a table ([server])")
    cfg = WorkspaceConfig()
    for key, value in server.items():
        if key not in KEYS:
            raise ConfigError(
                f"{p}{_line(text, key)}: unknown key {key!r} in [server]; known keys: {', '.join(sorted(KEYS))}"
            )
        name, kind = KEYS[key]
        setattr(cfg, name, _check(value, kind, f"{p}{_line(text, key)}: [server] {key}"))
    return cfg


def _check(v, kind: str, where: str):
    if kind == "url":
        if not isinstance(v, str) or not v.startswith(("http://", "https://")):
            raise ConfigError(f"{where} must be a URL string like \"http://127.0.0.1:30000\", got {v!r}")
        return v.rstrip("/")
    if kind == "command":
        if isinstance(v, str):
            try:
                v = shlex.split(v)
            except ValueError as e:
                raise ConfigError(f"{where}: cannot split the command ({e}); write it as a list of strings") from None
        if not isinstance(v, list) or not v or not all(isinstance(s, str) and s for s in v):
            raise ConfigError(
                f"{where} must be a command: a non-empty list of strings like "
                f"[\"systemctl\", \"stop\", \"sglang\"] (run without a shell), got {v!r}"
            )
        return v
    if kind == "engine":
        if v not in engines.ENGINES:
            known = ", ".join(repr(e) for e in engines.names())
            raise ConfigError(
                f"{where} must be one of {known}, got {v!r} (a new engine: docs/engines.md, \"Adding an engine\")"
            )
        return v
    if kind == "env":
        if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ConfigError(
                f"{where} must be the NAME of an environment variable (like \"SGLANG_API_KEY\") "
                "that holds the key, never the key itself; got a value that is not a variable name"
            )
        return v
    if kind == "bool":
        if not isinstance(v, bool):
            raise ConfigError(f"{where} must be true or false, got {v!r}")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (kind == "seconds" and v == 0):
        raise ConfigError(f"{where} must be a {'positive' if kind == 'seconds' else 'non-negative'} number, got {v!r}")
    return float(v)


def _line(text: str, key: str, table: bool = False) -> str:
    """' line N' where `key` is set (or its [table] opens), '' when not found."""
    pat = rf"^\s*\[\s*{re.escape(key)}\s*[\].]" if table else rf"^\s*[\"']?{re.escape(key)}[\"']?\s*="
    for n, line in enumerate(text.splitlines(), 1):
        if re.match(pat, line):
            return f" line {n}"
    return ""


# ---------------------------------------------------------------------------
# showing


def describe_commands(cfg: WorkspaceConfig) -> list[str]:
    """The configured commands as shell-quoted lines, to show before they run."""
    out = []
    for f in fields(cfg):
        if f.name.endswith("_command") and getattr(cfg, f.name):
            out.append(f"{f.name.removesuffix('_command')}: {shlex.join(getattr(cfg, f.name))}")
    return out


# ---------------------------------------------------------------------------
# the server's API key and client


def default_key_env(cfg: WorkspaceConfig) -> str:
    """The environment variable the workspace's engine itself reads its key from (its spec's key_env)."""
    return engines.spec(cfg.engine, "[server] engine").key_env


def api_key(cfg: WorkspaceConfig) -> tuple[str | None, str]:
    """(key or None, the environment variable it is read from): `api_key_env` of config.toml, else the engine's
    own (`default_key_env`). The key lives only in the environment (and in memory): never store or log it."""
    return engines.api_key(cfg)
