"""Missing values as users see them: a dash, never a raw `None`, with a reason.

Contract: pure (no Streamlit). `DASH` is what a table cell or caption shows for a value that is not known; `why(col)`
says why for a column (the help of a table column holding a dash); `helps(rows)` gives that help for every column of
`rows` (a list of dicts) with a missing value; `shown(v, spec)` formats a value for a caption (the dash for None).
"""

from __future__ import annotations

import math

DASH = "—"
GENERIC = "— : not known for this row"
SPEC = "— : the server reported no such counter for this request"
WHY = {  # column -> why it can be missing (the help of its dashes)
    "tau": "— : no round of the chain walk (a completion of one token drafts nothing)",
    "engine_tau": "— : the engine reported no verify steps for this prompt",
    "replay_tau": "— : the replay has no rounds for this prompt",
    "gap": "— : engine or replay tau not known for this prompt",
    "gap_pct": "— : engine or replay tau not known for this prompt",
    "score": "— : this fault was not scored (its detail says why)",
    "first_divergence": "— : engine and replay agree token for token",
    "ddtree_tau": "— : no DDTree budget for this run",
    "expected_tau": "— : no drafter probabilities for this prompt",
    "finish": "— : no finish reason recorded (completions imported from a file, or an engine that gives none)",
    "latency_s": "— : the server reported no latency for this request (or the completion was imported from a file)",
    "model": "— : no model path recorded (completions imported from a file)",
    "predicted speedup": "— : a model-free baseline (no drafter block to price), or no cost table in the workspace",
    "drafts k": "— : a DDTree verifies a tree of nodes, not a number of drafts",
}


def why(column: str) -> str:
    """The help of a table column whose missing cells show the dash."""
    return WHY.get(column) or (SPEC if column.startswith("spec_") else GENERIC)


def gone(v) -> bool:
    """Whether a cell's value is missing: None or a float NaN."""
    return v is None or (isinstance(v, float) and math.isnan(v))


def helps(rows: list[dict]) -> dict[str, str]:
    """{column: why} for every column of `rows` with a missing value (None, NaN, or a key some rows lack)."""
    cols = dict.fromkeys(k for r in rows for k in r)
    return {k: why(k) for k in cols if any(k not in r or gone(r[k]) for r in rows)}


def shown(v, spec: str = "{}") -> str:
    """`spec.format(v)`, or the dash when `v` is missing."""
    return DASH if gone(v) else spec.format(v)
