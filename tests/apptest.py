"""Test helpers (not tests): the dashboard through streamlit.testing AppTest, and readers of what a page shows.

Contract: `app(ws, monkeypatch, page, **query)` opens app.py on workspace `ws` (at /, then on `page` with the query
parameters) exactly as a browser's first visit would: app.py's own routing, no Streamlit internals patched.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PAGES = ["acceptance", "compare", "completions", "extraction", "diagnostics", "conformance"]
TITLES = {p: p.capitalize() for p in PAGES} | {"overview": "dflash-dash"}


def app(ws: Path, monkeypatch, page: str | None = None, **params) -> AppTest:
    monkeypatch.setenv("DFLASH_WORKSPACE", str(ws))
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    if page:
        at.switch_page(f"pages/{page}.py")
    for k, v in params.items():
        at.query_params[k] = v
    return at.run()


def clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def htmls(at: AppTest) -> list[str]:
    return [h.proto.body for h in at.get("html")]


def visible_text(view: str) -> str:
    """The text a token view shows for its tokens (rejected drafts and depth superscripts left out)."""
    body = view[view.index('<div class="dfv">') :]
    body = re.sub(r'<span class="dfv-rej"[^>]*>.*?</span>|<sup>\d+</sup>|<br>', "", body)
    return html.unescape(re.sub(r"<[^>]+>", "", body)).replace("↵", "\n").replace("⇥", "")


def by_label(widgets, prefix: str):
    got = [w for w in widgets if w.label.startswith(prefix)]
    assert got, f"no widget labelled {prefix!r}: {[w.label for w in widgets]}"
    return got[0]
