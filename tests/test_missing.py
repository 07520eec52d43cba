"""Raw `None` never shows: every page of the prepared workspace, with each of its optional sections open,
is scanned for the literal "None" in what it writes (titles, captions, markdown, alerts, metrics, texts) and in its
tables; a table with a missing cell must draw it as the dash (`st.dataframe(placeholder=...)`: Streamlit draws a
missing cell as "None" otherwise) and say why in its column's help.
"""

from __future__ import annotations

import re

import pytest

from dflash_dash.render.missing import DASH
from tests.apptest import app, clean

NONE = re.compile(r"\bNone\b")
TEXTS = ("title", "header", "subheader", "caption", "markdown", "text", "info", "warning", "success", "error")


def shown_none(at) -> list[str]:
    """Where a script run shows "None": text elements holding the word, tables with a missing cell drawn as None
    or holding the string, missing cells whose column has no help."""
    bad = [f"{k}: {e.value[:120]!r}" for k in TEXTS for e in getattr(at, k) if NONE.search(str(e.value))]
    bad += [f"metric {m.label}: {m.value!r}" for m in at.metric if NONE.search(f"{m.value} {m.label}")]
    for d in at.dataframe:
        df = d.value
        cols = [str(c) for c in df.columns if df[c].isna().any()]
        if cols and d.proto.placeholder != DASH:
            bad.append(
                f"table {list(df.columns)[:6]}: missing cells in {cols} drawn as {d.proto.placeholder or 'None'}"
            )
        cfg = d.proto.columns or ""
        bad += [f"table column {c!r}: missing cells without a help saying why" for c in cols if f'"{c}"' not in cfg]
        strs = df.select_dtypes(include="object").astype(str)
        if strs.apply(lambda s: s.str.fullmatch("None")).any().any():
            bad.append(f"table {list(df.columns)[:6]}: a cell holds the text None")
    return bad


VIEWS = [  # (page, query): each page, and each optional section drawn only when chosen
    ("overview", {}),
    ("completions", {}),
    ("extraction", {}),
    ("conformance", {}),
    *[
        ("acceptance", {"section": s})
        for s in ("", "charts", "curve", "metrics", "calibration", "patterns", "headroom")
    ],
    *[("compare", {"section": s}) for s in ("", "charts", "calibration", "lag", "config", "sweep")],
    *[("diagnostics", {"section": s}) for s in ("parity", "consistency", "sliding", "attribution", "signatures")],
]


@pytest.mark.parametrize("page,query", VIEWS, ids=[f"{p}-{q.get('section', '')}" for p, q in VIEWS])
def test_no_page_shows_a_raw_none(prepared, monkeypatch, page, query):
    q = {k: v for k, v in query.items() if v}
    if page in ("acceptance",):
        q["run"] = prepared.runs[0]
    if page == "compare":
        q |= {"a": prepared.runs[0], "b": prepared.runs[1]}
    at = app(prepared.workspace, monkeypatch, None if page == "overview" else page, **q)
    clean(at)
    bad = shown_none(at)
    assert not bad, "\n".join(bad)
