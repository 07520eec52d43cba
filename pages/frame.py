"""The app's frame: the page list and routing (st.navigation over PAGES from app.py; a page script opened alone runs
the app instead: `routed`), the page config and the sidebar (workspace, server readiness, running jobs).

Contract: `app()` is one script run of the whole app; every page script calls `routed()` first. No reads of its own
beyond the store session a page runs in (pages.reads)."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import streamlit as st

from pages import jobs_view, reads, server_view

PAGES = [  # (script, title, icon, URL path): the home page at /, every view at its file name
    ("pages/overview.py", "Overview", ":material/home:", None),
    ("pages/acceptance.py", "Acceptance", ":material/track_changes:", "acceptance"),
    ("pages/compare.py", "Compare", ":material/compare_arrows:", "compare"),
    ("pages/completions.py", "Completions", ":material/description:", "completions"),
    ("pages/extraction.py", "Extraction", ":material/memory:", "extraction"),
    ("pages/diagnostics.py", "Diagnostics", ":material/monitor_heart:", "diagnostics"),
    ("pages/conformance.py", "Conformance", ":material/rule:", "conformance"),
]

_router = threading.local()  # per script thread: set while app.py runs the chosen page


def navigation():
    """st.navigation over PAGES: the page the URL asks for (declaring them ends the pages/-directory mode)."""
    pages = [st.Page(p, title=t, icon=i, **({"url_path": u} if u else {"default": True})) for p, t, i, u in PAGES]
    return st.navigation(pages)


@contextmanager
def routing():
    """`app()` runs the chosen page inside this: `routed()` then knows the page runs under the router."""
    _router.on = True
    try:
        yield
    finally:
        _router.on = False


def app() -> None:
    """One script run of the app (app.py): page config, st.navigation picking the page from the URL, the sidebar,
    the page in one store session (one connection for its reads; jobs' writes wait at most one page render)."""
    page_config()
    page = navigation()
    jobs_slot = sidebar()
    with reads.store().session(), routing():
        page.run()
    with jobs_slot.container():  # after the page: a job it started is listed (and followed) at once
        jobs_view.running_jobs()


def routed() -> None:
    """A page script run alone (a deep link opened first after the server starts: Streamlit's pages/-directory
    mode, on until some script declares st.navigation) runs the app here instead, as app.py would, and stops the
    bare run; same script run, so a click that came with it still counts."""
    if not getattr(_router, "on", False):
        app()
        st.stop()


def page_config() -> None:
    # an emoji icon: the browser draws it as an inline SVG (data: URL); a :material/...: icon would be fetched from
    # fonts.gstatic.com (console errors offline, a request off this machine)
    st.set_page_config(page_title="dflash-dash", page_icon="⚡", layout="wide")


def sidebar():
    """The app's sidebar: the workspace and the server's readiness; returns the slot of the running jobs (drawn after
    the page, `jobs_view.running_jobs`)."""
    with st.sidebar:
        st.markdown("**Workspace**")
        st.text(reads.workspace())  # not st.code: its syntax highlighter costs every page load ~0.2 s of browser time
        server_view.server_status(server_view.server_url())
        st.markdown("**Jobs**")
        return st.empty()
