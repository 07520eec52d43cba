"""Numbers, labels and links printed one way on every page.

Contract: `fmt` prints a tau-like value with 2 decimals (metrics.TAU), `prob` a probability with 3 (metrics.PROB),
`ci` a value with its interval; `None` prints as '—'. Links are relative page URLs with their ids
percent-encoded, so an id holding `&` or `#` opens the right run. `csv_text` writes rows as CSV for downloads.
"""

from __future__ import annotations

import csv
import io
from urllib.parse import quote


def fmt(x: float | None, digits: int = 2, signed: bool = False) -> str:
    """A tau-like number (tokens per round) as every table and card prints it: 2 decimals (metrics.TAU); `signed`
    prints its sign (a difference: +0.012)."""
    if x is None:
        return "—"
    x = round(x, digits) + 0.0  # + 0.0: no "-0.000" for a tiny negative
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def prob(x: float | None) -> str:
    """A probability as every table and card prints it: 3 decimals (metrics.PROB)."""
    return fmt(x, 3)


def ci(x: float | None, interval: list[float] | None, digits: int = 2) -> str:
    """A tau-like number with its interval: '2.20 [1.95, 2.47]' ('—' parts where missing); `digits` 3 for a
    probability (`prob`)."""
    return fmt(x, digits) + (f" [{fmt(interval[0], digits)}, {fmt(interval[1], digits)}]" if interval else "")


BACKEND_LABELS = {"fla": "fla kernels (GPU)", "torch": "torch path (CPU fallback)"}


def count(n: int, noun: str) -> str:
    """'1 run', '7 runs': a count with its noun, plural by an s."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def backend_label(backend: str | None) -> str:
    """An extraction backend for eyes: `fla` -> "fla kernels (GPU)", `torch` -> "torch path (CPU fallback)"."""
    return BACKEND_LABELS.get(backend or "", backend or "unknown")


def sliding_note(semantics: str | None) -> str:
    """' · sliding layers: causal inside the block' for a run with sliding layers, '' without."""
    return f" · sliding layers: {semantics} inside the block" if semantics else ""


def run_link(run_id: str) -> str:
    """The Acceptance page of a run (relative URL; id percent-encoded)."""
    return f"acceptance?run={quote(str(run_id), safe='')}"


DEFAULT_RUN_NOTES = {  # why Acceptance opened on the run it shows (analysis.compare.healthiest_run's basis)
    "serving": "Opened on the healthiest run (highest tau macro) on an extraction that matches serving: backend fla, "
    "the kernels SGLang and vLLM run on a GPU (or any backend for a target without linear attention). Choose "
    "another run above.",
    "any": "Opened on the healthiest run (highest tau macro): no run is on an extraction that matches serving "
    "(backend fla, the kernels a GPU serving engine runs), so its acceptance can differ from serving. Choose "
    "another run above.",
    "newest": "Opened on the newest run (no run has a tau yet). Choose another run above.",
}
RUN_RESULTS = ("run", "runs", "causal", "bidirectional")  # the job result keys whose values are run ids


def job_result(result: dict) -> str:
    """A finished job's result as one markdown line: every run id a link to its Acceptance page (`run_link`),
    other values as code: 'result: run [`run-1`](acceptance?run=run-1)'. Backticks in a value are dropped."""

    def one(key: str, v) -> str:
        text = f"`{str(v).replace('`', '')}`"
        return f"[{text}]({run_link(v)})" if key in RUN_RESULTS else text

    parts = [f"{k} " + ", ".join(one(k, v) for v in (vs if isinstance(vs, list) else [vs])) for k, vs in result.items()]
    return "result: " + ", ".join(parts)


def acceptance_link(run_id: str, prompt_id: str) -> str:
    """The Acceptance page of one prompt of a run (relative URL; ids percent-encoded)."""
    return f"acceptance?run={quote(str(run_id), safe='')}&prompt={quote(str(prompt_id), safe='')}"


def divergence_link(run_id: str, prompt_id: str, prompt_len: int, first: int, length: int, round_no: int) -> str:
    """The Acceptance token view of one prompt with the first divergent step outlined: the completion token index
    `first` (the first token the step commits) for `length` tokens, as absolute positions (`pos=START-END`), and
    that round of the replay's chain walk (`round`, 1-based) shown in full."""
    a = prompt_len + first
    return f"{acceptance_link(run_id, prompt_id)}&pos={a}-{a + max(1, length) - 1}&round={round_no}"


def csv_text(rows: list[dict]) -> str:
    """Rows as CSV text (header = the union of keys, in first-seen order), for st.download_button."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


MD_SPECIAL = set("\\`*_{}[]()#+-.!|<>~$:")  # characters Markdown (and Streamlit's extensions) would interpret


def plain(text: str) -> str:
    """`text` (untrusted: a server's draft path, a file name) escaped to show literally in Streamlit Markdown."""
    return "".join("\\" + c if c in MD_SPECIAL else c for c in str(text))
