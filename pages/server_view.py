"""The serving engine as the pages see it: the workspace's server URL and client, and its readiness from a
background /health poller (a real /health generates a token and takes seconds, so it never runs on the script thread).

Contract: streamlit only through the badges' fragments; the key comes from the environment variable the workspace
config names, never from the browser.
"""

from __future__ import annotations

import streamlit as st

from pages import reads

HEALTH_S = (3.0, 30.0)  # the readiness badges' redraw: while the first answer is pending, and after it (cheap, rare)


def server_status(url: str) -> None:
    """The server's readiness from its background /health poller (never blocks: a real /health takes seconds),
    redrawn every 3 s until it has an answer, then every 30 s: an idle tab costs the server almost nothing."""
    st.fragment(run_every=HEALTH_S[health(url)[0] is not None])(_server_badge)(url)


def _server_badge(url: str) -> None:
    ok, state = health(url)
    st.markdown(f"**Server** {health_badge(ok)}")
    st.caption(f"{url} · {state}")


def config():
    from dflash_dash import config as cfg_mod

    return cfg_mod.load(reads.workspace())


def server_url() -> str:
    """The server URL of the workspace's config.toml (an invalid file is reported, and the default used)."""
    from dflash_dash import config as cfg_mod

    try:
        return config().server_url
    except cfg_mod.ConfigError as e:
        st.error(str(e))
        return cfg_mod.WorkspaceConfig().server_url


def client(url: str | None = None, **kw):
    """The client of the workspace's engine (config.toml [server] engine) for `url` (default: the workspace's server)
    with the API key from the environment (engines.for_workspace); raises ConfigError for an invalid config.toml,
    ValueError for a bad URL."""
    from dflash_dash import engines

    return engines.for_workspace(config(), url, **kw)


def _key_env() -> str:
    from dflash_dash import config as cfg_mod

    try:
        return cfg_mod.api_key(config())[1]
    except cfg_mod.ConfigError:
        return cfg_mod.DEFAULT_API_KEY_ENV


@st.cache_resource(max_entries=8, show_spinner=False)
def health_poller(url: str, key_env: str):
    """One background /health poller per server URL (and key variable), shared by every session: a real
    /health takes seconds, so it never runs on the script thread. None for a URL a client cannot use."""
    from dflash_dash import config as cfg_mod, engines

    cfg = cfg_mod.WorkspaceConfig(api_key_env=key_env)  # only the key's variable matters here
    try:
        c = engines.for_workspace(cfg, url, timeout=engines.HEALTH_TIMEOUT_S, retries=0)
    except ValueError:
        return None
    return engines.HealthPoller(c, every=3.0)


def health(url: str) -> tuple[bool | None, str]:
    """(ready, state) of the server at `url` from its background poller, without blocking: (None,
    "checking…") until the first answer, which a fast answer (refused, 503) gives within a moment."""
    poller = health_poller(url, _key_env())
    if poller is None:
        return False, f"server URL {url!r} must start with http:// or https://"
    ok, state = poller.latest()
    if ok is None and poller.wait(0.2):  # the very first look: a quick answer shows at once
        ok, state = poller.latest()
    return ok, state


def health_badge(ok: bool | None) -> str:
    if ok is None:
        return ":gray[:material/hourglass_empty: checking…]"
    return ":green[:material/check_circle: ready]" if ok else ":red[:material/cancel: not ready]"
