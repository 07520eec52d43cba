"""Where a model-free baseline's drafts came from, for eyes: one round's source as escaped HTML.

Contract: `source_html(src, rnd, tokens, strings)` turns the kept per-round sources of one prompt (pipeline.baseline:
anchor, at, match, origin per round) and the prompt + completion ids into one line: the copied span and the matched
suffix before it (vLLM's ngram: positions in this prompt + completion), or the store and the matched length (SGLang's
n-gram cache, suffix trees); token text escaped (untrusted model output). `strings(ids)` decodes token strings.
`versus_html(v)` says how much a drafter beats the best baseline (`analysis.reference.versus`).
"""

from __future__ import annotations

from collections.abc import Callable

from .formats import fmt
from .tokens import esc

ORIGINS = {
    "n-gram cache": "SGLang's n-gram cache (tails of this and earlier outputs)",
    "prompt+output": "the suffix tree of this prompt and output so far",
    "outputs": "the suffix tree of earlier outputs (this one's included)",
}


def source_html(src: dict, rnd: int, tokens: list[int], strings: Callable[[list[int]], list[str]]) -> str:
    """The source of round `rnd` (1-based) of one prompt's baseline run."""
    i = rnd - 1
    if not src or i >= len(src.get("anchor", [])):
        return "<div>no source kept for this round</div>"
    anchor, at, n, origin = src["anchor"][i], src["at"][i], src["match"][i], src["origin"][i]

    def text(a: int, b: int) -> str:
        return "<code>" + "".join(esc(s, breaks=False) for s in strings(tokens[a:b])) + "</code>"

    if not origin:
        return f"<div>Round {rnd} (anchor {anchor}): <b>no drafts</b> (nothing matched): a plain decode.</div>"
    head = f"Round {rnd} (anchor {anchor}): the {n} tokens ending at the anchor {text(anchor - n + 1, anchor + 1)}"
    if at >= 0:
        return (
            f"<div>{head} occurred first at positions {at - n}–{at - 1}; the drafts copy what followed, from "
            f"position {at}: {text(at, min(at + 16, len(tokens)))}…</div>"
        )
    where = esc(ORIGINS.get(origin, origin))
    return f"<div>{head} matched in {where}; the drafts are its most likely continuation.</div>"


def versus_html(v: dict, who: str = "this drafter") -> str:
    """`analysis.reference.versus` in one line: the drafter's tau against the best model-free baseline's."""
    ratio = f"{v['ratio']:.2f}x" if v["ratio"] else "n/a"
    word = "beats" if v["gain"] > 0 else "does not beat"
    return (
        f"<div>Against the best model-free baseline on these completions, <b>{esc(v['base_name'], False)}</b>: "
        f"{esc(who, False)} {word} it, tau (macro) {fmt(v['tau'])} against {fmt(v['base_tau'])} ({ratio}, "
        f"{v['gain']:+.2f} tokens per step).</div>"
    )
