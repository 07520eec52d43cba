"""URL-synced selection: selects, windows and section pickers whose value lives in `st.query_params`, so a link
opens what it names (a run, an extraction, a window of positions, a page's section)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from dflash_dash.render import tokens as token_render
from dflash_dash.render.labels import run_label

if TYPE_CHECKING:
    from dflash_dash.store import Run


def select_param(label: str, options: list, param: str, key: str, default=None, format_func=str, **kw):
    """A selectbox whose value lives in `st.query_params[param]`: a link with ?param=X opens X."""
    if not options:
        return None
    qv = st.query_params.get(param)
    seen = st.session_state.get(f"_qp_{key}")
    if qv in options and qv != seen:
        st.session_state[key] = qv
    elif qv is not None and qv not in options and qv != seen:
        st.warning(f"The link asks for {param}={qv!r}, which this workspace does not have; showing another.")
        st.session_state[key] = default if default in options else options[0]
    elif st.session_state.get(key) not in options:
        st.session_state[key] = default if default in options else options[0]
    val = st.selectbox(label, options, key=key, format_func=format_func, **kw)
    st.query_params[param] = val
    st.session_state[f"_qp_{key}"] = val
    return val


def window_param(n: int, P: int, key: str, owner: str, around: int | None = None) -> tuple[int, int]:
    """The completion offsets [lo, hi) a token view of n positions draws: all up to `render.tokens.WINDOW`, else
    the window picked (`&win=K` in the URL); a link's outlined offset `around` opens its window when the URL names
    none. The window belongs to `owner` (the prompt shown): another prompt opens at its own default."""
    spans, W = token_render.windows(n), token_render.WINDOW
    labels = {str(k): f"positions {P + lo:,}–{P + hi - 1:,}" for k, (lo, hi) in enumerate(spans)}
    last, st.session_state[f"_win_owner_{key}"] = st.session_state.get(f"_win_owner_{key}"), owner
    if "win" in st.query_params and (last not in (None, owner) or st.query_params.get("win") not in labels):
        del st.query_params["win"]
        for k in (f"_qp_{key}", key):
            st.session_state.pop(k, None)
    if len(spans) == 1:
        return spans[0]
    if around is not None and "win" not in st.query_params:
        st.query_params["win"] = str(min(max(around, 0) // W, len(spans) - 1))
    label = f"positions shown ({W:,} at a time, {n:,} in all)"
    return spans[int(select_param(label, list(labels), "win", key, format_func=labels.get))]


def section_param(label: str, options: dict[str, str], param: str, key: str, default: str | None = None) -> str | None:
    """Which optional section of a page to draw (a segmented control, none chosen by default): a heavy section is
    drawn only when asked, so the page opens fast. Its value lives in `st.query_params[param]`: a link with
    ?param=X opens section X; choosing none removes the parameter. `default` opens a section on the session's
    first visit to the page when the link names none (a link carrying that section's own parameters)."""
    qv = st.query_params.get(param)
    if qv is None and default in options and f"_qp_{key}" not in st.session_state:
        qv = default
    seen = st.session_state.get(f"_qp_{key}")
    if qv != seen:  # a link (or the URL) chose
        if qv is not None and qv not in options:
            st.warning(f"The link asks for {param}={qv!r}, which this page does not have; showing none.")
        st.session_state[key] = qv if qv in options else None
    val = st.segmented_control(label, list(options), format_func=options.get, key=key)
    if val is None:
        st.query_params.pop(param, None)
    else:
        st.query_params[param] = val
    st.session_state[f"_qp_{key}"] = val
    return val


def set_param(key: str, param: str, value) -> None:
    """Programmatic change of a URL-synced select (before the select is drawn)."""
    st.session_state[key] = value
    st.query_params[param] = value


def select_run(label: str, runs: list[Run], param: str, key: str, default=None, skip: str | None = None):
    """`select_param` over `runs` (oldest first, as Store.runs lists them) shown newest first with `run_label`;
    `skip`: a run id left out of the options. Returns the chosen run id."""
    by_id = {r.id: r for r in runs}
    ids = [r.id for r in reversed(runs) if r.id != skip]
    return select_param(label, ids, param, key, default=default, format_func=run_label(by_id))
