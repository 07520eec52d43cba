"""dflash-dash: the dashboard. `streamlit run app.py -- --workspace W` (default cache/).

Routes with st.navigation to the page scripts in pages/ (home at /, then URL paths completions, extraction,
acceptance, compare, diagnostics, conformance); the sidebar shows the workspace, the server's readiness and the
running jobs.
Pages read the store and the feature cache only, a page run in one store session; long work runs as jobs (separate
processes).
"""

from __future__ import annotations

import streamlit as st

from pages import common

st.set_page_config(page_title="dflash-dash", page_icon=":material/bolt:", layout="wide")

page = common.navigation()  # the pages and their URL paths: pages/common.PAGES


@st.fragment(run_every=2.0)
def running_jobs() -> None:
    try:
        active = common.job_lifecycle().active(common.store())
    except Exception as e:  # noqa: BLE001  (the sidebar must never break the page)
        st.caption(f"jobs unavailable: {e}")
        return
    if not active:
        st.caption("no running jobs")
    for j in active:
        st.progress(
            min(1.0, max(0.0, float(j["progress"] or 0.0))),
            text=f"{j['kind']} · {j['status']} · {str(j['step'] or '')[:60]}",
        )


@st.fragment(run_every=3.0)
def server_status(url: str) -> None:
    """The server's readiness from its background /health poller (never blocks: a real /health takes seconds)."""
    ok, state = common.health(url)
    st.markdown(f"**Server** {common.health_badge(ok)}")
    st.caption(f"{url} · {state}")


with st.sidebar:
    st.markdown("**Workspace**")
    st.text(common.workspace())  # not st.code: its syntax highlighter costs every page load ~0.2 s of browser time
    server_status(common.server_url())
    st.markdown("**Jobs**")
    running_jobs()

# one store connection for the page's reads (one open, not one per query); the lock is held for the run, so jobs'
# writes wait at most one page render
with common.store().session(), common.routing():
    page.run()
