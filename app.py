"""dflash-dash: the dashboard. `streamlit run app.py -- --workspace W` (default cache/).

The router: st.navigation over the page scripts in pages/ (home at /, then URL paths completions, extraction,
acceptance, compare, diagnostics, conformance: pages/frame.PAGES), inside the app's frame (pages/frame.sidebar: the
workspace, the server's readiness and the running jobs).
Pages read the store and the feature cache only, a page run in one store session; long work runs as jobs (separate
processes).
"""

from __future__ import annotations

from pages import frame

frame.app()  # page config, st.navigation over pages/frame.PAGES, the sidebar, the page in a store session
