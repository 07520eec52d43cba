"""The demo's story on the Overview: what its checkpoints are, in three sentences, each linking the view that reveals
it.

Contract: `story_html(story)` takes `demo.story` (the checkpoints' names and `what` sentences from the demo's
MANIFEST.json, their run ids) and returns one HTML block of three sentences: the healthy run (its snapshots, the
early one's `what`, a link to the sweep chart of its folder on Compare), the final checkpoint (its `what`, a link to
its run on Acceptance, and its replay on the sampled completions at their temperature when the story has one:
tau_expected and the predicted speedup at T) and the bug checkpoints (each `what`, each a link to Diagnostics'
"Training-bug signatures" for that run against the final checkpoint's run on the same extraction:
`diagnostics?sig_run=ID&sig_ref=ID`). Every text is escaped and every id percent-encoded; a checkpoint without a run
yet is named without a link.
"""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from .formats import run_link


def sweep_link(folder: str) -> str:
    """Compare's sweep chart of a training output folder (relative URL)."""
    return f"compare?sweep={quote(folder, safe='')}"


def signature_link(run_id: str, ref_id: str) -> str:
    """Diagnostics' Training-bug signatures of a run against a healthy reference run (relative URL)."""
    return f"diagnostics?sig_run={quote(str(run_id), safe='')}&sig_ref={quote(str(ref_id), safe='')}"


def _a(href: str | None, text: str) -> str:
    if not href:
        return f"{escape(text)} (not replayed yet)"
    return f'<a href="{escape(href, quote=True)}" target="_self">{escape(text)}</a>'


def _name(e: dict) -> str:
    return f"<code>{escape(e['name'])}</code>"


def _what(e: dict) -> str:
    """`name`: what (the manifest's sentence as written, a full stop added when it has none)."""
    w = e["what"].strip()
    return f"{_name(e)}: {escape(w)}{'' if w.endswith(('.', '!', '?')) else '.'}"


def story_html(story: dict) -> str:
    series, fin, bugs = story["series"], story["final"], story["bugs"]
    steps = [e["step"] for e in series if e["step"] is not None]
    span = f", steps {min(steps):,} to {max(steps):,}" if steps else ""
    curve = _a(story["folder"] and sweep_link(story["folder"]), "its training curve on Compare")
    healthy = f"<b>A healthy run</b> ({len(series)} snapshots{escape(span)}; {curve}). {_what(series[0])}"
    acc = _a(fin["run"] and run_link(fin["run"]), "its acceptance on Acceptance, token by token")
    final = f"<b>Its final checkpoint</b> ({acc}). {_what(fin)}{_sampled(story.get('sampled'))}"
    each = " ".join(
        f"{_what(b)} ("
        + _a(b["run"] and b["ref"] and signature_link(b["run"], b["ref"]), "its signature against the final one")
        + ")"
        for b in bugs
    )
    one = "One checkpoint per training bug" if len(bugs) != 1 else "A checkpoint with a training bug"
    buggy = f"<b>{one}</b> (Diagnostics, Training-bug signatures). {each}" if bugs else ""
    items = "".join(f"<li>{s}</li>" for s in (healthy, final, buggy, *_more(story)) if s)
    return f'<div class="demo-story" style="font-size:15px">{LEAD}<p>What the demo holds:</p><ul>{items}</ul></div>'


LEAD = (  # the Overview's first lines in a demo workspace: what to look at, what a healthy number is
    "<p><b>What to look at.</b> tau is what one verify step commits: the drafts the target accepts plus its own "
    "bonus token (1 = no speed-up; at most the block size B). A healthy drafter of a model like this one commits "
    "about 3 to 8 tokens a step, its drafts rejected now and then, its top-1 probabilities spread rather than all "
    "near 1; a training bug costs a large share of that (the bug checkpoints below); the n-gram baseline, which "
    "needs no training, is the floor a drafter has to beat. Open the final checkpoint on Acceptance first, then "
    "Compare each bug against it, then Conformance: the same drafter served by an engine that conforms and by one "
    "that does not.</p>"
)


def _sampled(hot: dict | None) -> str:
    """The final's sentence on its replay over sampled completions (none without that run)."""
    if not hot:
        return ""
    t = f"T = {hot['temperature']:g}"
    link = _a(run_link(hot["run"]), f"its expected tau and predicted speedup at {t} on Acceptance")
    return f" Also replayed on <code>{escape(hot['set'])}</code>, completions sampled at {t} ({link})."


def _more(story: dict) -> list[str]:
    """The sentences of the other families, the two engines and the baseline (when the story has them)."""
    out = []
    fams = story.get("families") or []
    if fams:
        each = " ".join(
            f"{_what(f)} (" + _a(f["run"] and run_link(f["run"]), "its run on Acceptance") + ")" for f in fams
        )
        out.append(f"<b>One drafter of each other family</b> (their heads' sections on Acceptance). {each}")
    eng = story.get("engine")
    if eng:
        href = (
            eng["run"] and f"conformance?run={quote(str(eng['run']), safe='')}&engine={quote(eng['engine'], safe='')}"
        )
        out.append(
            "<b>Two engines serving the final checkpoint</b>: <code>sglang</code> conforms; <code>"
            f"{escape(eng['engine'])}</code> runs the planted engine fault <code>{escape(eng['fault'])}</code> and "
            f"falls below the replay ({_a(href, 'its verdict and fault ranking on Conformance')})."
        )
    base = story.get("baseline")
    if base:
        out.append(
            f"<b>The n-gram baseline</b> <code>{escape(base['name'])}</code>, model-free, on the same completions "
            f"({_a(run_link(base['run']), 'its run on Acceptance')})."
        )
    return out
