"""Compare's two token views in one element: scrolling one pane scrolls the other to the same completion position,
and buttons step both to the next or previous position whose outcome differs.

Contract: `compare_html` builds the element from `tokens.token_html` (every model token escaped) and heads
escaped with `tokens.esc`; the only script in it is the package asset compare.js, a constant that reads the DOM
(token spans are the panes' direct <span> children other than rejected drafts, index i = completion offset i in
both panes) and never holds model text. Its style is the asset compare.css (one rule per line). Both files are
read once per process.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from ..analysis.trace import Trace
from ..vocab import Vocab
from .tokens import esc, token_html

ASSETS = Path(__file__).parent  # compare.js, compare.css


@cache
def script() -> str:
    """The compare view's script (compare.js), as the page sends it."""
    return (ASSETS / "compare.js").read_text(encoding="utf-8").rstrip("\n")


@cache
def style() -> str:
    """The compare view's style element (compare.css, its rules joined on one line)."""
    rules = (ASSETS / "compare.css").read_text(encoding="utf-8").splitlines()
    return "<style>" + "".join(r.strip() for r in rules) + "</style>"


# the caption under the two token views: what "outcome" means and what the outline marks
OUTCOME_NOTE = (
    "Outlined: the positions whose outcome differs between A and B. The outcome of a completion "
    "position in the chain walk is either **accepted draft** (the drafter's token was kept) or **target "
    "token** (the target's verify/bonus token that ends a round: after a rejected draft or a fully "
    "accepted block); the first token is the target's prefill in both. Depth, block starts and which "
    "wrong token was drafted are not compared (they follow from the outcomes before them). "
    "**next difference** scrolls both views to the next outlined position (ringed in orange)."
)


# the caption of the per-prompt delta table (`analysis.compare.delta_rows`)
DELTA_NOTE = (
    "per prompt: tau = committed / rounds of the chain walk; delta = tau B − tau A; sorted by |delta|, "
    "largest first (click a column header to sort by it; select a row to open its token views)"
)


def compare_html(
    ta: Trace,
    tb: Trace,
    vocab: Vocab,
    blocks: tuple[int, int],
    diff: set[int],
    heads: tuple[str, str],
    window: tuple[int, int] | None = None,
) -> str:
    """Both token views side by side in one element, for st.html(unsafe_allow_javascript=True): scrolling one
    pane scrolls the other to the same completion position (aligned on the token at the top), and the
    next/previous difference buttons scroll both to the next outlined position. Both panes draw the completion
    offsets [lo, hi) of `window` (all without one). The tokens go through `token_html` and the heads through
    `esc`; the only script is the constant `script()`."""
    lo, hi = window or (0, len(ta.role))
    n = sum(lo <= i < hi for i in diff)
    off = " disabled" if not n else ""
    nav = (
        f'<div class="dfcmp-nav"><button type="button" class="dfcmp-prev"{off}>↑ previous difference</button>'
        f'<button type="button" class="dfcmp-next"{off}>next difference ↓</button>'
        f'<span class="dfcmp-where">{n} differing position{"" if n == 1 else "s"}</span></div>'
    )
    panes = "".join(
        f'<div class="dfcmp-pane"><div class="dfcmp-head">{esc(h, breaks=False)}</div>'
        f'{token_html(tr, vocab, B, diff=diff, window=(lo, hi))}</div>'
        for tr, B, h in zip((ta, tb), blocks, heads)
    )
    return (
        f'<div class="dfcmp" data-p0="{int(ta.prompt_len) + lo}" data-diffs="{n}">{style()}{nav}'
        f'<div class="dfcmp-panes">{panes}</div><script>{script()}</script></div>'
    )
