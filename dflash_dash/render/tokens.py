"""Token views as escaped HTML: a whole completion coloured by how each token was committed, a prompt or a log as
text, and one chain round's block slot by slot.

Contract: every piece of model output that ends up in HTML goes through `esc` (the one escaping function): it
escapes entities and quotes (html.escape) and makes whitespace and control characters visible, so a completion
holding `<script>` renders as text. `token_html` builds a whole completion's view in one pass (fast for
4,000-token completions): role colours (prefill, accepted draft shaded by depth, the target's bonus token), block
starts, rejected drafts struck through with their whitespace shown, and a tooltip per token. `round_html` shows
`analysis.rounds.round_detail`: the top-K candidates per slot beside the target's tokens, where the chain stopped
and what DDTree took there.
"""

from __future__ import annotations

import html
import re

from ..analysis.rounds import SLOT_STATUS
from ..analysis.trace import Trace
from ..vocab import Vocab

_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\ufeff]")


def esc(s: str, breaks: bool = True) -> str:
    """Escape one token for HTML: entities, newline -> ↵ (+ <br> when `breaks`), tab -> ⇥, other control
    chars as \\xNN."""
    s = html.escape(s, quote=True)
    s = _CTRL.sub(_hex, s)
    return s.replace("\r", "␍").replace("\t", "⇥\t").replace("\n", "↵<br>" if breaks else "↵")


def visible(s: str) -> str:
    """One token as escaped HTML on one line with its whitespace made visible: space ·, newline ⏎, tab →
    (`esc` for markup and the other control characters)."""
    return esc(_marked(s), breaks=False)


def _marked(s: str) -> str:
    return s.replace(" ", "·").replace("\t", "→").replace("\n", "⏎")


def shown(s: str | None) -> str | None:
    """One token as `visible` shows it, for a table cell that draws plain text (st.dataframe never renders HTML, so
    entities would show as typed): whitespace marked (space ·, newline ⏎, tab →), control characters as \\xNN; a
    whitespace-only token is never a blank cell."""
    return None if s is None else _CTRL.sub(_hex, _marked(s))


def _hex(m: re.Match) -> str:
    return f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}"


def _shade(k: int, D: int) -> str:
    """Green of an accepted draft at depth k of D: deeper = darker."""
    f = (k - 1) / max(1, D - 1)
    light = 85 - 40 * f
    return f"hsl(130, 55%, {light:.0f}%)"


def css(block_size: int) -> str:
    D = block_size - 1
    depth = "".join(
        f".dfv .dfv-a{k}{{background:{_shade(k, D)};{'color:#fff;' if k > D * 0.6 else ''}}}" for k in range(1, D + 1)
    )
    return (
        "<style>"
        ".dfv{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:13px;line-height:1.9;"
        "white-space:pre-wrap;word-break:break-all;padding:8px;border:1px solid #ddd;border-radius:6px;"
        "max-height:640px;overflow-y:auto;background:#fff;color:#111}"
        ".dfv span{border-radius:2px}"
        ".dfv .dfv-pre{background:#cfe3ff}"
        ".dfv .dfv-bonus{background:#ffe08a}"
        ".dfv .dfv-tail{background:#eee}"
        ".dfv .dfv-b{border-left:2px solid #333;margin-left:1px}"
        ".dfv .dfv-rej{color:#a00;background:#fde8e8;text-decoration:line-through;text-decoration-color:"
        "rgba(170,0,0,.5);margin:0 1px;padding:0 2px;border:1px dashed #e99}"
        ".dfv sup{font-size:8px;color:#555;margin-left:1px}"
        ".dfv .dfv-x{outline:2px solid #d0f;outline-offset:-1px}"
        ".dfv-legend span{padding:1px 6px;margin-right:8px;border-radius:2px;font-size:12px}" + depth + "</style>"
    )


def legend_html(block_size: int, compare: bool = False) -> str:
    D = block_size - 1
    items = [
        '<span class="dfv-pre" style="background:#cfe3ff">prefill</span>',
        f'<span style="background:{_shade(1, D)}">accepted d1</span>',
        f'<span style="background:{_shade(D, D)};color:#fff">accepted d{D}</span>',
        '<span style="background:#ffe08a">bonus (target)</span>',
        '<span style="color:#a00;background:#fde8e8;text-decoration:line-through;border:1px dashed #e99">'
        'rejected draft</span><span>its whitespace: space ·, newline ⏎, tab →</span>',
        '<span style="border-left:2px solid #333">block start</span>',
    ] + (
        [
            '<span style="outline:2px solid #d0f">outcome differs from the other run (accepted draft vs target '
            'token)</span>'
        ]
        if compare
        else []
    )
    return '<div class="dfv-legend">' + "".join(items) + "</div>"


WINDOW = 4096  # completion positions one token view draws: a long trace (a reasoning trace of 128K tokens would be
# tens of MB of spans) is drawn a window at a time


def windows(n: int, size: int | None = None) -> list[tuple[int, int]]:
    """The windows [lo, hi) of completion offsets a token view of n positions is drawn in (one when n <= WINDOW)."""
    size = size or WINDOW
    return [(lo, min(lo + size, n)) for lo in range(0, n, size)] or [(0, 0)]


def token_html(
    tr: Trace,
    vocab: Vocab,
    block_size: int,
    diff: set[int] | None = None,
    superscript: bool = True,
    inline_rejects: bool = True,
    window: tuple[int, int] | None = None,
) -> str:
    """The completion (or its completion offsets [lo, hi) of `window`) as escaped spans, in one pass: role
    colours, depth, block starts, rejections.

    `diff` holds completion offsets (position - P) to outline (positions where another run differs)."""
    P = tr.prompt_len
    lo, hi = window or (0, len(tr.role))
    strs = vocab.strings(tr.tokens[P + lo : P + hi])
    rej_ids = [t for t in tr.rejected if t is not None]
    rej_strs = dict(zip(rej_ids, vocab.strings(rej_ids)))
    diff = diff or set()
    parts = [css(block_size), '<div class="dfv">']
    app = parts.append
    for i, s in enumerate(strs, start=lo):
        role, k = tr.role[i], tr.depth[i]
        cls = "dfv-a" + str(k) if role == "acc" else "dfv-" + role
        if tr.start[i]:
            cls += " dfv-b"
        if i in diff:
            cls += " dfv-x"
        pos = P + i
        tip = f"pos {pos} · token {tr.tokens[pos]}"
        if role == "acc":
            tip += f" · round {tr.round[i] + 1} · accepted draft, depth {k}"
        elif role == "bonus":
            tip += f" · round {tr.round[i] + 1} · bonus token from the target"
        elif role == "pre":
            tip += " · from the target's prefill"
        if tr.start[i] and tr.round[i] >= 0:  # a block starts: its round, as the round picker lists it
            p, a, _ = tr.rounds[tr.round[i]]
            tip += (
                f" · round {tr.round[i] + 1} starts: anchor {p}, accepted "
                f"{a}/{min(block_size - 1, len(tr.tokens) - 1 - p)}"
            )
        rej = tr.rejected[i]
        if rej is not None:
            tip += f" · drafted {rej_strs[rej]!r} ({rej}), target {s!r}"
        app(f'<span class="{cls}" title="{html.escape(tip, quote=True)}">{esc(s)}')
        if superscript and role == "acc":
            app(f"<sup>{k}</sup>")
        app("</span>")
        if rej is not None and inline_rejects:
            app(f'<span class="dfv-rej" title="rejected draft {rej}">{visible(rej_strs[rej])}</span>')
    app("</div>")
    return "".join(parts)


def text_html(text: str) -> str:
    """Untrusted plain text (a prompt) as an escaped block."""
    return (
        '<div class="dfv" style="font-family:ui-monospace,monospace;font-size:13px;white-space:pre-wrap;'
        f'word-break:break-all">{esc(text or "")}</div>'
    )


def pre_html(text: str) -> str:
    """Plain text (a job's log) as an escaped monospace block: the pages' light stand-in for st.code, whose syntax
    highlighter costs the browser ~0.2 s on every page load it appears on."""
    return (
        '<pre style="font-size:12px;white-space:pre-wrap;word-break:break-all;max-height:24rem;overflow:auto;'
        f'margin:0">{html.escape(text or "", quote=True)}</pre>'
    )


ROUND_CSS = (
    "<style>.dfr{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:13px;border-collapse:"
    "collapse;color:#111;background:#fff}.dfr td,.dfr th{border:1px solid #ddd;padding:2px 6px;"
    "text-align:left;white-space:nowrap}.dfr th{background:#f4f4f4;font-weight:600}"
    ".dfr .dfr-acc td.dfr-slot{background:#cdebd3}.dfr .dfr-rej td{background:#fde8e8}"
    ".dfr .dfr-after td,.dfr .dfr-past td,.dfr .dfr-none td{color:#888}"
    ".dfr .dfr-hit{background:#b9e4c1;font-weight:600}"
    ".dfr .dfr-p{color:#555;font-size:11px;margin-left:4px}.dfr-note{font-size:13px;margin:4px 0}</style>"
)


def round_html(d: dict) -> str:
    """`round_detail` as an escaped HTML table: per slot the target's token, the slot's status, the drafter's
    top-K candidates with probabilities (the target's token among them highlighted) and DDTree's path."""
    K = max(1, d["topk"])
    tb = d["tree_budget"]
    head = (
        f"round {d['round']} · anchor {d['anchor']} ({visible(d['anchor_token'])}) · accepted "
        f"{d['accepted']} of {d['inside']} drafts inside the completion · committed {d['committed']} · "
    )
    proposed = not d["stop"] or d["slots"][d["stop"] - 1]["status"] != "none"
    head += (
        f"the chain stops at slot {d['stop']} ("
        + ("first rejected draft" if proposed else "nothing proposed there, nothing rejected")
        + ")"
        if d["stop"]
        else "no draft rejected" + (" (the completion ends inside the block)" if d["inside"] < len(d["slots"]) else "")
    )
    if tb:
        span = (
            f"position {d['anchor'] + 1}"
            if d["tree"] == 1
            else f"positions {d['anchor'] + 1}–{d['anchor'] + (d['tree'] or 0)}"
        )
        head += (
            f" · DDTree-{tb} would accept {d['tree']} here (the target's tokens at {span}), committing {d['tree'] + 1}"
            if d["tree"]
            else f" · DDTree-{tb} would accept none here"
            if d["tree"] == 0
            else f" · DDTree-{tb}: not computed at this anchor"
        )
    parts = [ROUND_CSS, f'<div class="dfr-note">{head}</div>']
    if d["topk"] and any(not s["candidates"] for s in d["slots"] if s["status"] == "after"):
        parts.append(
            '<div class="dfr-note">Slots after the stop were not computed: this run was replayed chain-only '
            "without DDTree (a sweep), which runs the LM head only for the slots the chain walk reads.</div>"
        )
    if not d["topk"]:
        parts.append(
            '<div class="dfr-note"><b>Top-k candidates not recorded</b>: this run was replayed before '
            "dflash-dash kept each round's whole block, so only the argmax draft of each slot is shown; "
            "replay the checkpoint again to see the top-k.</div>"
        )
    cols = "".join(f"<th>candidate {j}</th>" for j in range(1, K + 1))
    parts.append(
        f'<table class="dfr"><tr><th>slot</th><th>position</th><th>target token</th><th>status</th>{cols}'
        + (f"<th>DDTree-{tb}</th>" if tb else "")
        + "</tr>"
    )
    for s in d["slots"]:
        tgt = "—" if s["target"] is None else f'{visible(s["target"])}<span class="dfr-p">{s["target_id"]}</span>'
        cells = []
        for c in s["candidates"] + [None] * (K - len(s["candidates"])):
            if c is None:
                cells.append("<td></td>")
                continue
            hit = ' class="dfr-hit"' if c["id"] == s["target_id"] else ""
            p = "" if c["p"] is None else f'<span class="dfr-p">{c["p"]:.3f}</span>'
            cells.append(f'<td{hit} title="token {c["id"]}">{visible(c["text"])}{p}</td>')
        tree = "" if not tb else f"<td>{'—' if s['ddtree'] is None else 'taken' if s['ddtree'] else ''}</td>"
        parts.append(
            f'<tr class="dfr-{s["status"]}"><td class="dfr-slot">{s["slot"]}</td><td>{s["position"]}</td>'
            f'<td>{tgt}</td><td>{SLOT_STATUS[s["status"]]}</td>{"".join(cells)}{tree}</tr>'
        )
    parts.append("</table>")
    return "".join(parts)
