"""Data shaped for eyes: token roles and escaped HTML, plotly figures, tables (no Streamlit here).

Contract: pure functions over rows the store returns (run rows, run_prompts rows, completions, extractions).
Every piece of model output that ends up in HTML goes through `esc`, which escapes it (html.escape) and
makes whitespace and control characters visible: a completion holding `<script>` renders as text.
`token_html` builds a whole completion's token view in one pass (fast for 4,000-token completions);
`round_detail`/`round_html` show one chain round's whole block (top-K candidates per slot beside the target's
tokens, where the chain stopped, what DDTree took there), rejected drafts and candidates with visible whitespace.
Metric labels and formulas come from the registry (`metrics`); the checks of the Diagnostics page live here.
Numbers print one way: `fmt` (2 decimals) for tau-like values, `prob` (3 decimals) for probabilities, `ci` for a
value with its interval; per-depth figures state the rounds behind each point and mark depths with none (n = 0).
`compare_html` (Compare's two token views, scroll-synced) is the one HTML that carries a script: a constant that
reads the DOM, never model text. Importing views loads no torch and no plotly: the chain walk and the drafter checks (in
modules that import torch) and plotly are imported on first use.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import metrics


class _Plotly:
    """plotly.graph_objects, imported on first attribute use: the computations here that the pipeline keeps per run
    (calibration, Vocab, attribution rows) must not need plotly (a GPU worker's image may lack it)."""

    def __getattr__(self, name: str):
        import plotly.graph_objects as graph_objects

        return getattr(graph_objects, name)


go = _Plotly()


def walk(acc: np.ndarray, prompt_len: int, T: int) -> list[tuple[int, int, int]]:
    """replay.walk, the chain walk, imported on first use: replay and drafter import torch (0.6 s), which the pages
    without token views (Overview, Completions, Extraction) never need."""
    from .replay import walk as chain_walk

    return chain_walk(acc, prompt_len, T)


def step_of(name: str) -> int | None:
    """drafter.step_of, imported on first use (see walk)."""
    from .drafter import step_of as step

    return step(name)


# ---------------------------------------------------------------------------
# legend

TOKEN_LEGEND = [  # (css class, meaning)
    ("dfv-pre", "first completion token (target prefill)"),
    ("dfv-a", "accepted draft (darker = deeper in the block; superscript = depth)"),
    ("dfv-bonus", "bonus token from the target (after the accepted drafts)"),
    ("dfv-rej", "rejected draft, struck through after the target's token; its whitespace shown as · ⏎ →"),
    ("dfv-b", "block (round) boundary"),
]


def fmt(x: float | None, digits: int = 2) -> str:
    """A tau-like number (tokens per round) as every table and card prints it: 2 decimals (metrics.TAU)."""
    return "—" if x is None else f"{x:.{digits}f}"


def prob(x: float | None) -> str:
    """A probability as every table and card prints it: 3 decimals (metrics.PROB)."""
    return fmt(x, 3)


def ci(x: float | None, interval: list[float] | None) -> str:
    """A tau-like number with its interval: '2.20 [1.95, 2.47]' ('—' parts where missing)."""
    return fmt(x) + (f" [{fmt(interval[0])}, {fmt(interval[1])}]" if interval else "")


# ---------------------------------------------------------------------------
# tokens: decoding and escaping

_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\ufeff]")


def esc(s: str, breaks: bool = True) -> str:
    """Escape one token for HTML: entities, newline -> ↵ (+ <br> when `breaks`), tab -> ⇥, other control
    chars as \\xNN."""
    s = html.escape(s, quote=True)
    s = _CTRL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}", s)
    return s.replace("\r", "␍").replace("\t", "⇥\t").replace("\n", "↵<br>" if breaks else "↵")


class Vocab:
    """Token strings of one target: its tokenizer's decode of each id (memoised), else `⟨id⟩`."""

    def __init__(self, tokenizer=None):
        self.tok = tokenizer  # a transformers tokenizer or None
        self.memo: dict[int, str] = {}

    def strings(self, ids) -> list[str]:
        out, memo = [], self.memo
        for i in ids:
            i = int(i)
            s = memo.get(i)
            if s is None:
                s = memo[i] = self._one(i)
            out.append(s)
        return out

    def _one(self, i: int) -> str:
        if self.tok is None:
            return f"⟨{i}⟩"
        try:
            return self.tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        except Exception:  # noqa: BLE001  (an id outside the tokenizer: show the id)
            return f"⟨{i}⟩"


def load_vocab(target_path: str | None) -> Vocab:
    """A Vocab from the target folder's tokenizer files; ids only when it has none or they do not load."""
    if not target_path or not any(
        (Path(target_path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    ):
        return Vocab()
    try:
        from transformers import AutoTokenizer

        return Vocab(AutoTokenizer.from_pretrained(target_path))
    except Exception:  # noqa: BLE001  (a broken tokenizer must not break the page: show ids)
        return Vocab()


# ---------------------------------------------------------------------------
# token roles of a chain-walk trace


@dataclass
class Trace:
    prompt_len: int  # P
    tokens: list[int]  # [T] prompt + completion ids
    role: list[str]  # [T-P] per completion position: pre | acc | bonus | tail
    depth: list[int]  # [T-P] depth within the block (1..B-1 for accepted drafts, else 0)
    round: list[int]  # [T-P] index of the round that committed the position (-1: prefill)
    start: list[bool]  # [T-P] first position committed by its round (block boundary)
    rejected: list[int | None]  # [T-P] the drafted token the target rejected at this position, if any
    rounds: list[tuple[int, int, int]]  # (anchor, accepted, committed) per round


def trace(row: dict, completion: dict, block_size: int) -> Trace:
    """Roles of every completion position from a run_prompts row and its completion."""
    P = row["prompt_len"]
    tokens = list(completion["prompt_ids"]) + list(completion["output_ids"])
    T = len(tokens)
    acc = np.asarray(row["accepted_at"], dtype=np.int64)
    D = block_size - 1
    drafts = row.get("drafts") or []
    n = T - P
    role, depth, rnd = ["tail"] * n, [0] * n, [-1] * n
    start, rejected = [False] * n, [None] * n
    if n:
        role[0] = "pre"
    rounds = walk(acc, P, T) if len(acc) else []
    for r, (p, a, c) in enumerate(rounds):
        for k in range(1, c + 1):
            i = p + k - P
            rnd[i] = r
            if k <= a:
                role[i], depth[i] = "acc", k
            else:
                role[i] = "bonus"
                j = (p - P) * D + a
                if a < D and j < len(drafts) and drafts[j] != tokens[p + k]:
                    rejected[i] = int(drafts[j])
        start[p + 1 - P] = True
    return Trace(P, tokens, role, depth, rnd, start, rejected, rounds)


# ---------------------------------------------------------------------------
# token view HTML


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


def token_html(
    tr: Trace,
    vocab: Vocab,
    block_size: int,
    diff: set[int] | None = None,
    superscript: bool = True,
    inline_rejects: bool = True,
) -> str:
    """The completion as escaped spans, in one pass: role colours, depth, block starts, rejections.

    `diff` holds completion offsets (position - P) to outline (positions where another run differs)."""
    P = tr.prompt_len
    strs = vocab.strings(tr.tokens[P:])
    rej_ids = [t for t in tr.rejected if t is not None]
    rej_strs = dict(zip(rej_ids, vocab.strings(rej_ids)))
    diff = diff or set()
    parts = [css(block_size), '<div class="dfv">']
    app = parts.append
    for i, s in enumerate(strs):
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


# ---------------------------------------------------------------------------
# compare (issue 14): the default pair, per-position outcomes and where they differ, both token views in one
# scroll-synced element, the per-prompt delta table, the one-position lag rate per slot

OUTCOME = {"pre": "prefill", "acc": "draft", "bonus": "target", "tail": "none"}  # Trace.role -> outcome
OUTCOME_NOTE = (
    "Outlined: the positions whose outcome differs between A and B. The outcome of a completion "
    "position in the chain walk is either **accepted draft** (the drafter's token was kept) or **target "
    "token** (the target's verify/bonus token that ends a round: after a rejected draft or a fully "
    "accepted block); the first token is the target's prefill in both. Depth, block starts and which "
    "wrong token was drafted are not compared (they follow from the outcomes before them). "
    "**next difference** scrolls both views to the next outlined position (ringed in orange)."
)


def outcomes(tr: Trace) -> list[str]:
    """Per completion offset: 'draft' (an accepted draft committed it), 'target' (the round's verify/bonus token),
    'prefill' (the first completion token) or 'none' (no round committed it)."""
    return [OUTCOME[r] for r in tr.role]


def differing(a: Trace, b: Trace) -> set[int]:
    """Completion offsets whose outcome (`outcomes`) differs between two traces of the same tokens."""
    return {i for i, (x, y) in enumerate(zip(outcomes(a), outcomes(b))) if x != y}


def default_pair(runs: list[dict]) -> tuple[str, str] | None:
    """(A, B) run ids compared by default: the newest two runs on one extraction (B the newer); without such a
    pair the two newest runs; None for fewer than two runs. `runs` oldest first, as Store.runs lists them."""
    for j in range(len(runs) - 1, 0, -1):
        for i in range(j - 1, -1, -1):
            if runs[i]["extraction_id"] == runs[j]["extraction_id"]:
                return runs[i]["id"], runs[j]["id"]
    return (runs[-2]["id"], runs[-1]["id"]) if len(runs) >= 2 else None


DELTA_NOTE = (
    "per prompt: tau = committed / rounds of the chain walk; delta = tau B − tau A; sorted by |delta|, "
    "largest first (click a column header to sort by it; select a row to open its token views)"
)


def delta_rows(ra: dict[str, dict], rb: dict[str, dict]) -> list[dict]:
    """Per prompt of both runs (run_prompts rows by prompt id): tau A, tau B, delta = B − A, and DDTree tau of
    each run when either has one; sorted by |delta| descending (prompts without both taus last), then by id."""
    tree = any(r.get("tree_tau") is not None for r in (*ra.values(), *rb.values()))
    out = []
    for p in ra:
        if p not in rb:
            continue
        ta, tb = ra[p].get("tau"), rb[p].get("tau")
        d = None if ta is None or tb is None else tb - ta
        row = {"prompt": p, "tau A": _r(ta, 4), "tau B": _r(tb, 4), "delta (B − A)": _r(d, 4)}
        if tree:
            row |= {"DDTree tau A": _r(ra[p].get("tree_tau"), 4), "DDTree tau B": _r(rb[p].get("tree_tau"), 4)}
        out.append((d is None, -abs(d or 0.0), p, row))
    return [row for *_, row in sorted(out, key=lambda x: x[:3])]


def lag_rows(ca: dict[str, list], cb: dict[str, list], block_a: int, block_b: int) -> list[dict]:
    """One-position draft lag per slot k (metrics.lag_pool) of run A and run B over the prompts both hold, from
    their per-prompt `metrics.lag_counts` (pipeline.analysis "lag")."""
    shared = [p for p in ca if p in cb]
    la, lb = metrics.lag_pool([ca[p] for p in shared], block_a), metrics.lag_pool([cb[p] for p in shared], block_b)
    out = []
    for k in range(1, max(block_a, block_b)):

        def at(x, key):
            return _r(x[key][k - 1], 4) if k <= len(x[key]) else None

        out.append(
            {
                "slot k": k,
                "lag A": at(la, "lag"),
                "lag B": at(lb, "lag"),
                "on target A": at(la, "on_target"),
                "on target B": at(lb, "on_target"),
                "anchors A": la["anchors"][k - 1] if k <= len(la["anchors"]) else 0,
                "anchors B": lb["anchors"][k - 1] if k <= len(lb["anchors"]) else 0,
            }
        )
    return out


def lag_fig(rows: list[dict], name_a: str, name_b: str) -> go.Figure:
    """Lag rate (solid) and on-target rate (dotted) per slot, runs A and B (`lag_rows`)."""
    fig = go.Figure()
    ks = [r["slot k"] for r in rows]
    for side, name in (("A", name_a), ("B", name_b)):
        fig.add_scatter(
            x=ks,
            y=[r[f"lag {side}"] for r in rows],
            mode="lines+markers",
            name=f"{side} {html.escape(name)}: d_k = t[p+k-1] (lag)",
        )
        fig.add_scatter(
            x=ks,
            y=[r[f"on target {side}"] for r in rows],
            mode="lines+markers",
            line=dict(dash="dot"),
            name=f"{side} {html.escape(name)}: d_k = t[p+k] (on target)",
        )
    fig.update_yaxes(range=[0, 1.02])
    fig.update_xaxes(dtick=1)
    return _layout(fig, "one-position draft lag per slot", "slot k", "share of anchors", height=360)


_CMP_CSS = (
    "<style>"
    ".dfcmp-nav{display:flex;gap:8px;align-items:center;margin:0 0 8px 0;font-size:13px}"
    ".dfcmp-nav button{padding:3px 10px;border:1px solid #bbb;border-radius:6px;background:#fafafa;cursor:pointer;"
    "font-size:13px;color:#111}"
    ".dfcmp-nav button:disabled{opacity:.5;cursor:default}"
    ".dfcmp-panes{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:12px}"
    ".dfcmp-head{font-weight:600;font-size:14px;margin-bottom:4px}"
    ".dfcmp .dfv .dfcmp-cur{box-shadow:0 0 0 3px #f60}"
    "</style>"
)

# The one script of the compare view: a constant (no model text in it). It reads the two panes from the DOM: token
# spans are the panes' direct <span> children other than rejected drafts, index i = completion offset i in both.
_CMP_JS = r"""(function () {
  var root = document.currentScript && document.currentScript.closest('.dfcmp');
  if (!root) return;
  var panes = Array.prototype.slice.call(root.querySelectorAll('.dfv'), 0, 2);
  if (panes.length < 2) return;
  var toks = panes.map(function (p) {
    return Array.prototype.filter.call(p.children, function (e) {
      return e.tagName === 'SPAN' && !e.classList.contains('dfv-rej'); });
  });
  var n = Math.min(toks[0].length, toks[1].length), p0 = parseInt(root.dataset.p0 || '0', 10);
  if (!n) return;
  var diffs = [];
  for (var i = 0; i < n; i++) if (toks[0][i].classList.contains('dfv-x')) diffs.push(i);
  function y(s, i) {  // top of token i in pane s, in the pane's scroll coordinates
    return toks[s][i].getBoundingClientRect().top - panes[s].getBoundingClientRect().top + panes[s].scrollTop;
  }
  function top(s) {  // the first token not entirely above the top edge of pane s
    var lo = 0, hi = n - 1, st = panes[s].scrollTop;
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (y(s, mid) + toks[s][mid].getBoundingClientRect().height <= st) lo = mid + 1; else hi = mid;
    }
    return lo;
  }
  var expect = [null, null];
  function scroll(s, v) {  // a scroll of ours: its scroll event is not echoed back
    v = Math.max(0, Math.min(v, panes[s].scrollHeight - panes[s].clientHeight));
    if (Math.abs(panes[s].scrollTop - v) < 1) return;
    expect[s] = v;
    panes[s].scrollTop = v;
  }
  function align(s, i) {  // scroll the other pane so that token i (default: the top one of pane s) sits as high
    if (i === undefined) i = top(s);
    scroll(1 - s, y(1 - s, i) - (y(s, i) - panes[s].scrollTop));
  }
  [0, 1].forEach(function (s) {
    panes[s].addEventListener('scroll', function () {
      if (expect[s] !== null && Math.abs(panes[s].scrollTop - expect[s]) < 2) { expect[s] = null; return; }
      expect[s] = null;
      align(s);
    }, {passive: true});
  });
  var cur = -1, where = root.querySelector('.dfcmp-where');
  function shown(i) {
    var t = y(0, i);
    return t >= panes[0].scrollTop && t < panes[0].scrollTop + panes[0].clientHeight;
  }
  function go(step) {
    if (!diffs.length) return;
    var k;
    if (cur >= 0 && shown(diffs[cur])) k = cur + step;
    else {
      var t = top(0);
      k = 0;
      while (k < diffs.length && diffs[k] < t) k++;
      if (step < 0) k--;
    }
    k = (k + diffs.length) % diffs.length;
    cur = k;
    var i = diffs[k];
    root.querySelectorAll('.dfcmp-cur').forEach(function (e) { e.classList.remove('dfcmp-cur'); });
    toks[0][i].classList.add('dfcmp-cur');
    toks[1][i].classList.add('dfcmp-cur');
    scroll(0, y(0, i) - panes[0].clientHeight / 3);
    align(0, i);
    root.dataset.current = String(i);
    where.textContent = 'difference ' + (k + 1) + ' of ' + diffs.length + ' · position ' + (p0 + i);
  }
  root.querySelector('.dfcmp-next').addEventListener('click', function () { go(1); });
  root.querySelector('.dfcmp-prev').addEventListener('click', function () { go(-1); });
})();"""


def compare_html(
    ta: Trace, tb: Trace, vocab: Vocab, blocks: tuple[int, int], diff: set[int], heads: tuple[str, str]
) -> str:
    """Both token views side by side in one element, for st.html(unsafe_allow_javascript=True): scrolling one
    pane scrolls the other to the same completion position (aligned on the token at the top), and the
    next/previous difference buttons scroll both to the next outlined position. The tokens go through
    `token_html` and the heads through `esc`; the only script is the constant `_CMP_JS`."""
    n = len(diff)
    off = " disabled" if not n else ""
    nav = (
        f'<div class="dfcmp-nav"><button type="button" class="dfcmp-prev"{off}>↑ previous difference</button>'
        f'<button type="button" class="dfcmp-next"{off}>next difference ↓</button>'
        f'<span class="dfcmp-where">{n} differing position{"" if n == 1 else "s"}</span></div>'
    )
    panes = "".join(
        f'<div class="dfcmp-pane"><div class="dfcmp-head">{esc(h, breaks=False)}</div>'
        f'{token_html(tr, vocab, B, diff=diff)}</div>'
        for tr, B, h in zip((ta, tb), blocks, heads)
    )
    return (
        f'<div class="dfcmp" data-p0="{int(ta.prompt_len)}" data-diffs="{n}">{_CMP_CSS}{nav}'
        f'<div class="dfcmp-panes">{panes}</div><script>{_CMP_JS}</script></div>'
    )


# ---------------------------------------------------------------------------
# figures


def _layout(fig: go.Figure, title: str, x: str, y: str, height: int = 320) -> go.Figure:
    fig.update_layout(
        title=title,
        xaxis_title=x,
        yaxis_title=y,
        height=height,
        margin=dict(l=40, r=10, t=40, b=40),
        legend=dict(orientation="h", y=-0.25),
    )
    return fig


def accept_curve(tr: Trace, row: dict, block_size: int, name: str = "accepted(p)") -> go.Figure:
    """accepted(p) at every completion anchor, with the chain walk's round anchors marked."""
    P = tr.prompt_len
    acc = row["accepted_at"]
    fig = go.Figure()
    fig.add_scatter(x=list(range(P, P + len(acc))), y=acc, mode="lines", name=name, line=dict(width=1))
    fig.add_scatter(
        x=[p for p, _, _ in tr.rounds],
        y=[a for _, a, _ in tr.rounds],
        mode="markers",
        name="round anchors (chain walk)",
        marker=dict(size=5),
    )
    fig.update_yaxes(range=[-0.3, block_size - 0.7])
    return _layout(fig, "accepted(p) along the completion", "position p", "accepted drafts")


def hist_fig(summaries: dict[str, dict]) -> go.Figure:
    """Acceptance histogram: share of rounds by accepted count 0..B-1, one bar series per run; hover: the share
    (3 decimals) and the rounds behind it."""
    fig = go.Figure()
    for name, s in summaries.items():
        h = np.asarray(s.get("accept_hist") or [], dtype=float)
        fig.add_bar(
            x=list(range(len(h))),
            y=(h / h.sum()).tolist() if h.sum() else h.tolist(),
            name=name,
            customdata=h.astype(int).tolist(),
            hovertemplate=f"{html.escape(str(name))}<br>accepted %{{x}}: "
            f"%{{y:.3f}} of {int(h.sum())} rounds<br>n = %{{customdata}} rounds<extra></extra>",
        )
    fig.update_layout(barmode="group")
    return _layout(
        fig, "acceptance histogram (rounds by accepted drafts)", "accepted drafts in the round", "share of rounds"
    )


def _counts(s: dict, key: str, n: int) -> list:
    """The rounds behind each of n depth points (summary key `key`), '?' for a summary made before they were
    stored."""
    c = s.get(key)
    return list(c) if c is not None and len(c) == n else ["?"] * n


def depth_fig(summaries: dict[str, dict]) -> go.Figure:
    """Per-depth conditional and marginal acceptance, k = 1..B-1, for each run. Hover: the rounds behind each
    point (n = depth_samples for the conditional, depth_rounds for the marginal); bars (right axis): the rounds
    behind the conditional points. A depth no round reached has no estimate: its point is a gap, marked
    'n = 0' on the x axis, so no line stops unannounced."""
    fig = go.Figure()
    for name, s in summaries.items():
        cond, marg = s.get("depth_conditional") or [], s.get("depth_marginal") or []
        ks = list(range(1, len(cond) + 1))
        nc, nm = _counts(s, "depth_samples", len(cond)), _counts(s, "depth_rounds", len(marg))
        tag = html.escape(str(name))
        fig.add_scatter(
            x=ks,
            y=cond,
            mode="lines+markers",
            name=f"{name}: P(d_k | d_<k)",
            customdata=nc,
            hovertemplate=f"{tag}<br>depth %{{x}}: P(d_k | d_<k) = %{{y:.3f}}<br>n = %{{customdata}} "
            "rounds (d_1..d_{k-1} accepted)<extra></extra>",
        )
        fig.add_scatter(
            x=ks[: len(marg)],
            y=marg,
            mode="lines+markers",
            name=f"{name}: P(d_1..d_k)",
            line=dict(dash="dot"),
            customdata=nm,
            hovertemplate=f"{tag}<br>depth %{{x}}: P(d_1..d_k) = %{{y:.3f}}<br>n = %{{customdata}} "
            "rounds (slot k in the completion)<extra></extra>",
        )
        if "?" not in nc:
            fig.add_bar(
                x=ks,
                y=nc,
                name=f"{name}: rounds behind P(d_k | d_<k)",
                yaxis="y2",
                opacity=0.2,
                hovertemplate=f"{tag}<br>depth %{{x}}: n = %{{y}} rounds<extra></extra>",
            )
        empty = [k for k, v in zip(ks, cond) if v is None]
        if empty:
            fig.add_scatter(
                x=empty,
                y=[0.0] * len(empty),
                mode="markers+text",
                text=["n = 0"] * len(empty),
                textposition="top center",
                marker=dict(symbol="x", size=9, color="#999"),
                name=f"{name}: no rounds reached depth (n = 0, no estimate)",
                hovertemplate=f"{tag}<br>depth %{{x}}: no round reached this depth (n = 0)<extra></extra>",
            )
    fig.update_layout(
        yaxis_range=[0, 1.02],
        barmode="group",  # the left axis only (the right one keeps its own)
        yaxis2=dict(overlaying="y", side="right", title="rounds (n)", showgrid=False, rangemode="tozero"),
    )
    fig.update_xaxes(dtick=1)
    return _layout(fig, "per-depth acceptance: conditional (solid) and marginal (dotted)", "depth k", "probability")


def scatter_fig(a: dict[str, float | None], b: dict[str, float | None], name_a: str, name_b: str) -> go.Figure:
    """Per-prompt tau of run A against run B (prompts present in both)."""
    ids = [p for p in a if p in b and a[p] is not None and b[p] is not None]
    xs, ys = [a[p] for p in ids], [b[p] for p in ids]
    fig = go.Figure()
    fig.add_scatter(
        x=xs, y=ys, mode="markers", text=ids, hovertemplate="%{text}<br>A %{x:.3f}<br>B %{y:.3f}", name="prompts"
    )
    lo = min(xs + ys + [1.0])
    hi = max(xs + ys + [1.0])
    fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="A = B", line=dict(dash="dash", color="#999"))
    return _layout(fig, "per-prompt tau: A vs B", f"A: {name_a}", f"B: {name_b}", height=380)


SWEEP_KEYS = ("tau_macro", "tau_pooled", "ddtree_tau")  # registry keys plotted against step


def sweep_fig(points: list[dict]) -> go.Figure:
    """tau (macro, pooled, DDTree) against training step."""
    fig = go.Figure()
    xs = [p["step"] for p in points]
    for key in SWEEP_KEYS:
        fig.add_scatter(
            x=xs,
            y=[p.get(key) for p in points],
            mode="lines+markers",
            name=metrics.BY_KEY[key].label,
            text=[p["name"] for p in points],
        )
    return _layout(fig, "tau against training step", "step", "tau", height=360)


def parity_fig(rows: list[dict]) -> go.Figure:
    fig = go.Figure()
    fig.add_bar(x=[str(r["layer"]) for r in rows], y=[r["rel_l2"] for r in rows], name="relative L2")
    fig.add_scatter(
        x=[str(r["layer"]) for r in rows],
        y=[1 - r["cosine"] for r in rows],
        name="1 - cosine",
        mode="markers+lines",
        yaxis="y2",
    )
    fig.update_layout(yaxis2=dict(overlaying="y", side="right", title="1 - cosine"))
    return _layout(fig, "backend parity per target layer", "target layer id", "relative L2")


# ---------------------------------------------------------------------------
# tables


def summary_rows(s: dict) -> list[dict]:
    """The run's metrics with formulas, for a table next to the numbers (scalars, counts, intervals, id lists;
    the DDTree ones only for a run with a tree), each printed with its metric's format (metrics.show)."""
    return [
        {"metric": metrics.label(m.key, s), "value": metrics.show(m.key, s.get(m.key)), "formula": m.formula}
        for m in metrics.REGISTRY
        if m.kind in ("scalar", "count", "interval", "ids")
        and m.key in s
        and not (metrics.tree_only(m.key) and not s.get("tree_budget"))
    ]


def outlier_links(s: dict, rows: list[dict], run_id: str) -> list[dict]:
    """The run's outlier prompts (summary `tau_outliers`): id, tau, side of the fences ("low" / "high") and a link
    to the prompt's token view; lowest tau first."""
    taus, f = {r["prompt_id"]: r.get("tau") for r in rows}, s.get("tau_fences") or [0.0, 0.0]
    out = [
        {
            "prompt": p,
            "tau": taus.get(p),
            "side": "low" if (taus.get(p) or 0) < f[0] else "high",
            "link": acceptance_link(run_id, p),
        }
        for p in s.get("tau_outliers") or []
    ]
    return sorted(out, key=lambda o: (o["tau"] is None, o["tau"] or 0, o["prompt"]))


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(float(x), digits)


TAU_COLUMNS = ("tau", "ddtree_tau", "chain_tau_at_budget", "every_anchor_tau")  # prompt_table: printed as fmt


def prompt_table(rows: list[dict], completions: dict[str, dict], tree_budget: int = 0) -> list[dict]:
    """Per-prompt results from `metrics.prompt_rows`, sorted by tau (lowest first); tau-like columns (TAU_COLUMNS)
    at 2 decimals (like `fmt`); `outlier`: "low" / "high" for a prompt outside Tukey's fences of per-prompt tau
    (metrics.TUKEY_RULE), else ""; with a tree budget N, `chain_tau_at_budget`: tau of the block-(N+1) chain beside
    `ddtree_tau`."""
    out = []
    odd = metrics.outliers_of({r["prompt_id"]: r["tau"] for r in rows})
    for r in rows:
        c = completions.get(r["prompt_id"], {})
        out.append(
            {
                "prompt": r["prompt_id"],
                "tau": _r(r["tau"], 2),
                "outlier": odd.get(r["prompt_id"], ""),
                "ddtree_tau": _r(r["tree_tau"], 2),
                **({"chain_tau_at_budget": _r(r.get("chain_tau_at_budget"), 2)} if tree_budget else {}),
                "rounds": r["rounds"],
                "completion_tokens": r["completion_tokens"],
                "prompt_tokens": r["prompt_len"],
                "every_anchor_tau": _r(r.get("every_anchor_tau"), 2),
                "finish": c.get("finish_reason"),
                "_tau": r["tau"],
            }
        )
    out.sort(key=lambda x: (x["_tau"] is None, x["_tau"] if x["_tau"] is not None else 0, x["prompt"]))
    return [{k: v for k, v in x.items() if k != "_tau"} for x in out]


SPEC_KEYS = (
    "spec_verify_ct",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_accept_token_num",
    "spec_draft_token_num",
    "spec_accepted_drafts",
    "spec_proposed_drafts",
    "spec_accept_histogram",
)
# the speculative-decoding counters SGLang reports in meta_info (names vary by version; shown when present)


def compact_histogram(h) -> str:
    """spec_accept_histogram (a list of counts, index = accepted tokens per verify step) as "0:3 1:5 2:2"
    (zero counts left out); a dict {k: count} the same way; anything else as its text."""
    if isinstance(h, dict):
        items = sorted(h.items(), key=lambda kv: str(kv[0]))
    elif isinstance(h, (list, tuple)):
        items = list(enumerate(h))
    else:
        return str(h)
    return " ".join(f"{k}:{v}" for k, v in items if v) or "—"


def completion_table(rows: list[dict]) -> list[dict]:
    """Completions (Store.completion_index rows: token counts, no ids) with finish reason, token counts and any
    server-side speculative counters; `server_tau` (tokens per verify step) = completion_tokens / spec_verify_ct,
    the engine's tau for that request."""
    out = []
    for r in rows:
        meta = r.get("meta_info") or {}
        fin = r.get("finish_reason")
        n_out = meta.get("completion_tokens")
        if isinstance(n_out, bool) or not isinstance(n_out, int):
            n_out = r["output_tokens"] or 0
        d = {
            "prompt": r["prompt_id"],
            "prompt_tokens": r["prompt_tokens"] or 0,
            "completion_tokens": n_out,
            "finish": fin,
            "latency_s": meta.get("e2e_latency"),
            "model": r.get("model_path"),
        }
        for k in SPEC_KEYS:
            if k in meta:
                d[k] = compact_histogram(meta[k]) if k == "spec_accept_histogram" else meta[k]
        verify = meta.get("spec_verify_ct")
        if isinstance(verify, (int, float)) and not isinstance(verify, bool) and verify > 0:
            d["server_tau"] = n_out / verify
        out.append(d)
    return out


def extraction_table(rows: list[dict]) -> list[dict]:
    return [
        {
            "id": e["id"],
            "backend": e["backend"],
            "completions": e["set_name"],
            "prompts": e.get("prompts"),
            "layers": ",".join(map(str, e["layer_ids"] or [])),
            "device": e["device"],
            "dtype": e["dtype"],
            "status": e["status"],
            "target": e["target_path"],
            "created": str(e["created"])[:19],
        }
        for e in rows
    ]


BACKEND_LABELS = {"fla": "fla kernels (GPU)", "torch": "torch path (CPU fallback)"}
STATUS_LABELS = {
    "queued": "waiting to start",
    "running": "running",
    "done": "finished",
    "failed": "failed",
    "cancelled": "cancelled",
}


def backend_label(backend: str | None) -> str:
    """An extraction backend for eyes: `fla` -> "fla kernels (GPU)", `torch` -> "torch path (CPU fallback)"."""
    return BACKEND_LABELS.get(backend or "", backend or "unknown")


def run_link(run_id: str) -> str:
    """The Acceptance page of a run (relative URL; id percent-encoded)."""
    from urllib.parse import quote

    return f"acceptance?run={quote(str(run_id), safe='')}"


def run_columns() -> dict[str, str]:
    """Column label -> formula of the headline metrics in `run_groups` rows (the metric registry's labels)."""
    return {metrics.label(m.key): m.formula for m in metrics.HEADLINE}


def run_groups(runs: list[dict], extractions: list[dict]) -> list[dict]:
    """Runs grouped by the extraction they replayed (newest extraction first), each group's rows ordered by
    checkpoint, step and creation, with human column labels (headline metrics by the registry's label, shown
    with its format) and the run's Acceptance link: [{"extraction", "title", "ids" (run id per row), "rows"}]."""
    exs = {e["id"]: e for e in extractions}
    order = {e["id"]: i for i, e in enumerate(extractions)}
    groups: dict[str, list[dict]] = {}
    for r in runs:
        groups.setdefault(r["extraction_id"], []).append(r)
    out = []
    for ex_id in sorted(groups, key=lambda x: -order.get(x, len(order))):
        rs = sorted(
            groups[ex_id],
            key=lambda r: (str(r["name"] or r["checkpoint"]), r.get("step") or 0, str(r["created"]), r["id"]),
        )
        e = exs.get(ex_id)
        title = (
            f"Extraction {ex_id} · {backend_label(e['backend'])} · set {e['set_name']} · {e['device']} "
            f"{e['dtype']} · {len(rs)} run{'s' if len(rs) != 1 else ''}"
            if e
            else f"Extraction {ex_id} (no longer in the store) · {len(rs)} run{'s' if len(rs) != 1 else ''}"
        )
        rows = []
        for r in rs:
            s = r.get("summary") or {}
            rows.append(
                {
                    "open": run_link(r["id"]),
                    "checkpoint": r["name"],
                    "training step": r.get("step"),
                    **{metrics.label(m.key): metrics.show(m.key, s.get(m.key)) for m in metrics.HEADLINE},
                    "sliding layers": r.get("sliding_block") or "—",
                    "checkpoint folder": r["checkpoint"],
                    "run id": r["id"],
                    "created": str(r["created"])[:19],
                }
            )
        out.append({"extraction": ex_id, "title": title, "ids": [r["id"] for r in rs], "rows": rows})
    return out


def gpu_table(gpus: list[dict]) -> list[dict]:
    """jobs.gpu_memory() rows for eyes: GiB and who holds the memory."""
    g = 1 << 30
    return [
        {
            "gpu": x.get("index"),
            "name": x.get("name"),
            "total_GiB": round((x.get("total") or 0) / g, 1),
            "free_GiB": round((x.get("free") or 0) / g, 1),
            "held by": "; ".join(
                f"pid {p.get('pid')} {p.get('name')} ({(p.get('used') or 0) / g:.1f} GiB)"
                for p in x.get("processes") or []
            )
            or "—",
        }
        for x in gpus
    ]


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(a: dict, b: dict) -> list[dict]:
    """Two checkpoint configs side by side (flattened keys); `differs` marks the keys whose values differ."""
    fa, fb = _flat(a or {}), _flat(b or {})
    keys = sorted(set(fa) | set(fb), key=lambda k: (fa.get(k, object()) == fb.get(k, object()), k))
    return [
        {"key": k, "A": _show(fa.get(k)), "B": _show(fb.get(k)), "differs": "≠" if fa.get(k) != fb.get(k) else ""}
        for k in keys
    ]


def _show(v) -> str:
    return "—" if v is None else str(v)


# ---------------------------------------------------------------------------
# checks and sweeps


def consistency(cfg, extraction: dict, info) -> list[dict]:
    """Drafter config (DrafterConfig) vs an extraction row and its target (TargetInfo): one row per rule of
    drafter.checks, with the problem and fix where a rule fails."""
    from . import drafter  # on first use (see walk)

    return [
        {
            "check": k.name,
            "drafter": str(k.drafter),
            "extraction / target": str(k.other),
            "ok": "✓" if k.ok else "✗",
            "problem": "" if k.ok else k.problem,
        }
        for k in drafter.checks(cfg, info.hidden_size, info.vocab_size, info.num_layers, extraction)
    ]


def backend_matters(target_path: str) -> bool:
    """False for a target without linear-attention layers: no kernel backend to warn about."""
    from .target import describe, has_linear_attention

    try:
        return has_linear_attention(describe(target_path))
    except Exception:  # noqa: BLE001  (an unreadable target is reported by the job itself)
        return True


def sliding_note(semantics: str | None) -> str:
    """' · sliding layers: causal inside the block' for a run with sliding layers, '' without."""
    return f" · sliding layers: {semantics} inside the block" if semantics else ""


def sliding_rows(runs: list[dict], checkpoint: str, extraction: str) -> list[dict]:
    """The latest run of `checkpoint` on `extraction` per sliding semantics, for the train/serve check."""
    best = {
        r["sliding_block"]: r
        for r in runs
        if r["checkpoint"] == checkpoint and r["extraction_id"] == extraction and r.get("sliding_block")
    }
    return [
        {
            "sliding layers": f"{sem} inside the block",
            "run": best[sem]["id"],
            "tau (macro)": _r(best[sem]["summary"].get("tau_macro")),
            "tau (pooled)": _r(best[sem]["summary"].get("tau_pooled")),
            "every-anchor tau": _r(best[sem]["summary"].get("every_anchor_tau")),
        }
        for sem in ("causal", "bidirectional")
        if sem in best
    ]


def sliding_checkpoints(runs: list[dict]) -> list[str]:
    """Checkpoints of the runs whose drafter has sliding_attention layers (newest first, once each)."""
    out: list[str] = []
    for r in reversed(runs):
        if "sliding_attention" in ((r.get("config") or {}).get("layer_types") or []) and r["checkpoint"] not in out:
            out.append(r["checkpoint"])
    return out


def sweep_points(runs: list[dict], folder: str, extraction: str | None = None) -> list[dict]:
    """Runs whose checkpoint lies inside `folder` (latest run per checkpoint), ordered by step."""
    root = str(Path(folder).resolve())
    best: dict[str, dict] = {}
    for r in runs:
        ck = r["checkpoint"] or ""
        if not (ck == root or ck.startswith(root + "/")):
            continue
        if extraction and r["extraction_id"] != extraction:
            continue
        best[ck] = r  # runs come oldest first: the latest wins
    pts = []
    for ck, r in best.items():
        step = r.get("step") if r.get("step") is not None else step_of(ck)
        s = r.get("summary") or {}
        pts.append(
            {
                "step": step,
                "name": r["name"],
                "run": r["id"],
                "checkpoint": ck,
                "sliding_block": r.get("sliding_block"),
                "tau_macro": s.get("tau_macro"),
                "tau_pooled": s.get("tau_pooled"),
                "ddtree_tau": s.get("ddtree_tau"),
            }
        )
    pts.sort(key=lambda p: (p["step"] is None, p["step"] or 0, p["checkpoint"]))
    return pts


# ---------------------------------------------------------------------------
# calibration, failure patterns, target-layer attribution (issue 11): tables (also the CSV downloads and the
# export JSON) and figures; the numbers come from the registry (metrics) and dflash_dash.patterns


def csv_text(rows: list[dict]) -> str:
    """Rows as CSV text (header = the union of keys, in first-seen order), for st.download_button."""
    import csv
    import io

    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


CAL_KEYS = ("calibration_ece", "expected_tau", "expected_tau_pooled", "tau_macro", "tau_pooled")


def calibration(rows: list, block_size: int, tree_budget: int = 0, summary: dict | None = None) -> dict:
    """A run's calibration from its run_prompts rows (or their `metrics.Prompt`s; the registry applied to them, so
    a run summarised before these metrics existed gets them too; `summary`: metrics.summarize of these rows when
    the caller has just computed it): {"recorded", headline values, "formula", "by_depth" rows, "reliability"
    rows (depth "pooled" and 1..B-1), "per_prompt" expected vs observed tau rows}."""
    ps = [metrics.Prompt.of(r) for r in rows]
    s = summary if summary is not None else metrics.summarize(ps, block_size, tree_budget)
    rel = metrics.reliability(ps, metrics.Ctx(block_size, tree_budget))
    out = {
        "recorded": rel is not None,
        **{k: s.get(k) for k in CAL_KEYS},
        "formula": {k: metrics.BY_KEY[k].formula for k in ("calibration_ece", "expected_tau")}
        | {"reliability": metrics.RELIABILITY_FORMULA},
    }
    if rel is None:
        return out | {"by_depth": [], "reliability": [], "per_prompt": []}
    cond, conf = s["depth_conditional"], s["confidence_depth"]
    out["by_depth"] = [
        {
            "depth": k,
            "rounds": s["depth_samples"][k - 1],
            "mean_p": _r(conf[k - 1], 4),
            "observed": _r(cond[k - 1], 4),
            "ece": _r(s["calibration_ece_depth"][k - 1], 4),
        }
        for k in range(1, block_size)
    ]
    out["reliability"] = [
        {
            "depth": d,
            "lo": round(b["lo"], 3),
            "hi": round(b["hi"], 3),
            "n": b["n"],
            "predicted": _r(b["predicted"], 4),
            "observed": _r(b["observed"], 4),
        }
        for d, bins in [("pooled", rel["pooled"])] + list(enumerate(rel["by_depth"], 1))
        for b in bins
    ]
    ctx = metrics.Ctx(block_size, tree_budget)
    out["per_prompt"] = []
    for p in ps:
        obs, exp = metrics.tau(p, ctx), metrics.expected_tau(p, ctx)
        out["per_prompt"].append(
            {
                "prompt": p.id,
                "rounds": len(p.rounds),
                "tau": _r(obs, 4),
                "expected_tau": _r(exp, 4),
                "expected_minus_observed": _r(exp - obs, 4) if None not in (exp, obs) else None,
            }
        )
    return out


def reliability_fig(runs: dict[str, list[dict]], depth: str | int = "pooled") -> go.Figure:
    """Reliability diagram: per bin of the predicted probability, mean predicted (x) against share accepted (y),
    one line per run (`runs`: name -> calibration()["reliability"] rows); the diagonal is perfect calibration;
    bars: samples per bin (right axis)."""
    fig = go.Figure()
    fig.add_scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfectly calibrated", line=dict(dash="dash", color="#999"))
    for name, rows in runs.items():
        bins = [b for b in rows if b["depth"] == depth]
        full = [b for b in bins if b["n"]]
        fig.add_bar(
            x=[(b["lo"] + b["hi"]) / 2 for b in bins],
            y=[b["n"] for b in bins],
            name=f"{name}: samples",
            yaxis="y2",
            opacity=0.25,
            width=0.08,
        )
        fig.add_scatter(
            x=[b["predicted"] for b in full],
            y=[b["observed"] for b in full],
            mode="lines+markers",
            name=f"{name}: observed",
            text=[f"n = {b['n']}" for b in full],
            hovertemplate="predicted %{x:.3f}<br>observed %{y:.3f}<br>%{text}",
        )
    fig.update_layout(barmode="group", yaxis2=dict(overlaying="y", side="right", title="samples", showgrid=False))
    fig.update_xaxes(range=[0, 1])
    fig.update_layout(yaxis_range=[0, 1.02])  # the left axis only (a right axis keeps its own range)
    what = "pooled over depths" if depth == "pooled" else f"depth {depth}"
    return _layout(
        fig,
        f"reliability diagram ({what})",
        "predicted: drafter's probability of its draft p_k",
        "observed: share accepted",
        height=380,
    )


def confidence_fig(runs: dict[str, list[dict]]) -> go.Figure:
    """Per depth: mean p_k (dotted) against P(d_k accepted | d_1..d_{k-1} accepted) (solid), per run
    (`runs`: name -> calibration()["by_depth"] rows)."""
    fig = go.Figure()
    for name, rows in runs.items():
        ks = [r["depth"] for r in rows]
        fig.add_scatter(x=ks, y=[r["observed"] for r in rows], mode="lines+markers", name=f"{name}: observed")
        fig.add_scatter(
            x=ks, y=[r["mean_p"] for r in rows], mode="lines+markers", name=f"{name}: mean p_k", line=dict(dash="dot")
        )
    fig.update_layout(yaxis_range=[0, 1.02])  # the left axis only (a right axis keeps its own range)
    fig.update_xaxes(dtick=1)
    return _layout(
        fig, "per depth: predicted (dotted) vs observed (solid) acceptance", "depth k", "probability", height=380
    )


def expected_fig(runs: dict[str, list[dict]]) -> go.Figure:
    """Per prompt: expected tau (from the draft probabilities, x) against observed tau (y), per run
    (`runs`: name -> calibration()["per_prompt"] rows)."""
    fig = go.Figure()
    vals = [1.0]
    for name, rows in runs.items():
        ok = [r for r in rows if r["tau"] is not None and r["expected_tau"] is not None]
        vals += [v for r in ok for v in (r["tau"], r["expected_tau"])]
        fig.add_scatter(
            x=[r["expected_tau"] for r in ok],
            y=[r["tau"] for r in ok],
            mode="markers",
            name=name,
            text=[r["prompt"] for r in ok],
            hovertemplate="%{text}<br>expected %{x:.3f}<br>observed %{y:.3f}",
        )
    fig.add_scatter(
        x=[min(vals), max(vals)],
        y=[min(vals), max(vals)],
        mode="lines",
        name="expected = observed",
        line=dict(dash="dash", color="#999"),
    )
    return _layout(
        fig,
        "expected vs observed tau per prompt",
        "expected tau (mean over rounds)",
        "observed tau (committed / rounds)",
        height=380,
    )


def class_fig(rows: list[dict]) -> go.Figure:
    """Failure patterns: slot-1 acceptance and tau by the class of the target token at slot 1."""
    rows = [r for r in rows if r["rounds"]]
    fig = go.Figure()
    fig.add_bar(
        x=[r["class"] for r in rows],
        y=[r["first_slot_acceptance"] for r in rows],
        name="P(d_1 accepted)",
        hovertext=[f"{r['rounds']} rounds" for r in rows],
    )
    fig.add_scatter(
        x=[r["class"] for r in rows],
        y=[r["tau"] for r in rows],
        name="tau (committed / round)",
        mode="markers",
        marker=dict(size=10),
        yaxis="y2",
    )
    fig.update_layout(yaxis2=dict(overlaying="y", side="right", title="tau", showgrid=False))
    fig.update_layout(yaxis_range=[0, 1.02])  # the left axis only (a right axis keeps its own range)
    return _layout(fig, "acceptance by class of the target token at slot 1", "token class", "P(d_1 accepted)")


def binned_fig(rows: list[dict], label: str, title: str, x_title: str) -> go.Figure:
    """Failure patterns: slot-1 acceptance and tau per bin (`label`: the bin column of the rows)."""
    fig = go.Figure()
    fig.add_scatter(
        x=[r[label] for r in rows],
        y=[r["first_slot_acceptance"] for r in rows],
        mode="lines+markers",
        name="P(d_1 accepted)",
        text=[f"{r['rounds']} rounds" for r in rows],
    )
    fig.add_scatter(
        x=[r[label] for r in rows],
        y=[r["tau"] for r in rows],
        mode="lines+markers",
        name="tau (committed / round)",
        yaxis="y2",
        line=dict(dash="dot"),
    )
    fig.update_layout(yaxis2=dict(overlaying="y", side="right", title="tau", showgrid=False))
    fig.update_layout(yaxis_range=[0, 1.02])  # the left axis only (a right axis keeps its own range)
    return _layout(fig, title, x_title, "P(d_1 accepted)")


def attribution_rows(rows: list[dict]) -> list[dict]:
    """Store `attributions` rows as a table: per tap, tau with the tap ablated and the tau lost (base - ablated)."""
    out = []
    for r in sorted(rows, key=lambda r: r["tap"]):
        lost = {
            k: (None if r[f"base_{k}"] is None or r[k] is None else _r(r[f"base_{k}"] - r[k], 4))
            for k in ("tau_macro", "tau_pooled")
        }
        out.append(
            {
                "tap": r["tap"],
                "layer_id": r["layer_id"],
                "tau_lost_macro": lost["tau_macro"],
                "tau_lost_pooled": lost["tau_pooled"],
                "tau_macro_ablated": _r(r["tau_macro"], 4),
                "tau_pooled_ablated": _r(r["tau_pooled"], 4),
                "base_tau_macro": _r(r["base_tau_macro"], 4),
                "base_tau_pooled": _r(r["base_tau_pooled"], 4),
            }
        )
    return out


def attribution_fig(rows: list[dict]) -> go.Figure:
    """tau lost per target-layer tap (attribution_rows), macro and pooled."""
    fig = go.Figure()
    xs = [f"tap {r['tap']} · layer {r['layer_id']}" for r in rows]
    fig.add_bar(x=xs, y=[r["tau_lost_macro"] for r in rows], name="tau lost (macro)")
    fig.add_bar(x=xs, y=[r["tau_lost_pooled"] for r in rows], name="tau lost (pooled)")
    fig.update_layout(barmode="group")
    return _layout(
        fig,
        "tau lost with each target-layer tap replaced by its mean",
        "tap (target layer id)",
        "base tau − ablated tau",
        height=360,
    )


# ---------------------------------------------------------------------------
# engine conformance (issue 11): engine tau beside replay tau, per prompt (rows of `conformance.compare`)

CONFORMANCE_NOTE = (
    "engine tau = (completion_tokens − 1) / verify_steps: committed tokens per verify step with the "
    "prefill's first token left out, like the replay's committed / rounds. SGLang's own "
    "spec_accept_length = completion_tokens / spec_verify_ct counts the prefill token too (last "
    "column, for reference only)."
)


def acceptance_link(run_id: str, prompt_id: str) -> str:
    """The Acceptance page of one prompt of a run (relative URL; ids percent-encoded)."""
    from urllib.parse import quote

    return f"acceptance?run={quote(str(run_id), safe='')}&prompt={quote(str(prompt_id), safe='')}"


def conformance_table(rows: list[dict], run_id: str) -> list[dict]:
    """Per prompt: flagged, engine tau, replay tau, gap (engine − replay) and its share of the replay tau, the
    counts behind them and a link to the prompt's token view; sorted by gap, most negative first."""
    out = []
    for r in rows:
        out.append(
            {
                "prompt": r["id"],
                "flagged": bool(r["flagged"]),
                "engine_tau": _r(r["engine_tau"], 4),
                "replay_tau": _r(r["replay_tau"], 4),
                "gap": _r(r["gap"], 4),
                "gap_pct": _r(None if r["gap_rel"] is None else 100 * r["gap_rel"], 2),
                "verify_steps": r["verify_steps"],
                "rounds": r["rounds"],
                "completion_tokens": r["completion_tokens"],
                "accepted_drafts": r["accepted_tokens"],
                "sglang_accept_length": _r(r["sglang_accept_length"], 4),
                "token_view": acceptance_link(run_id, r["id"]),
            }
        )
    out.sort(key=lambda x: (x["gap"] is None, x["gap"] if x["gap"] is not None else 0, x["prompt"]))
    return out


CONFORMANCE_COLUMNS = {  # column -> formula (help text of the table, and the CSV's meaning)
    "flagged": "replay tau − engine tau > threshold × replay tau",
    "engine_tau": "(completion_tokens − 1) / verify_steps",
    "replay_tau": "committed / rounds of the replay's chain walk (bonus included, prefill token excluded)",
    "gap": "engine tau − replay tau",
    "gap_pct": "100 × (engine tau − replay tau) / replay tau",
    "verify_steps": "verify steps the engine ran for the request",
    "rounds": "rounds of the replay's chain walk",
    "completion_tokens": "tokens of the completion (the prefill's first one included)",
    "accepted_drafts": "draft tokens the engine accepted over its verify steps (bonus tokens not counted)",
    "sglang_accept_length": "completion_tokens / verify_steps, as SGLang reports it (prefill token included)",
    "token_view": "the prompt on the Acceptance page",
}


def _cell(v):
    """A CSV cell that a spreadsheet will not run as a formula (untrusted ids may start with = + - @)."""
    return "'" + v if isinstance(v, str) and v[:1] in ("=", "+", "-", "@", "\t", "\r") else v


def conformance_csv(table: list[dict]) -> str:
    """The conformance table as CSV text (st.download_button)."""
    return csv_text([{k: _cell(v) for k, v in r.items()} for r in table])


def conformance_fig(rows: list[dict], threshold: float, engine: str = "engine") -> go.Figure:
    """Per prompt: replay tau (x) against engine tau (y); flagged prompts in red; the diagonal (conformant) and
    the flag line y = (1 − threshold) x (below it: more than numeric noise)."""
    pts = [r for r in rows if r["engine_tau"] is not None and r["replay_tau"] is not None]
    fig = go.Figure()
    for flagged, name, color in ((False, "within the threshold", "#1f77b4"), (True, "flagged", "#d62728")):
        sel = [r for r in pts if bool(r["flagged"]) == flagged]
        fig.add_scatter(
            x=[r["replay_tau"] for r in sel],
            y=[r["engine_tau"] for r in sel],
            mode="markers",
            name=f"{name} ({len(sel)})",
            marker=dict(size=9, color=color),
            text=[html.escape(str(r["id"]), quote=True) for r in sel],
            hovertemplate="%{text}<br>replay %{x:.3f}<br>engine %{y:.3f}<extra></extra>",
        )
    hi = max([r["replay_tau"] for r in pts] + [r["engine_tau"] for r in pts] + [2.0]) * 1.05
    fig.add_scatter(x=[1, hi], y=[1, hi], mode="lines", name="engine = replay", line=dict(dash="dash", color="#999"))
    fig.add_scatter(
        x=[1, hi],
        y=[1 - threshold, (1 - threshold) * hi],
        mode="lines",
        name=f"flag line: engine = (1 − {threshold:g}) × replay",
        line=dict(dash="dot", color="#d62728"),
    )
    return _layout(
        fig,
        f"per-prompt tau: {html.escape(engine)} vs the replay",
        "replay tau (committed / rounds)",
        "engine tau ((completion_tokens − 1) / verify_steps)",
        height=420,
    )


def replay_histogram(run_prompts: list[dict], ids: set[str], block_size: int) -> list[int]:
    """The replay's rounds by accepted drafts 0..B-1 over the prompts `ids` (the compared ones)."""
    ps = [metrics.Prompt.of(r) for r in run_prompts if r.get("prompt_id", r.get("id")) in ids]
    return metrics.accept_hist(ps, metrics.Ctx(block_size, 0))


# ---------------------------------------------------------------------------
# the whole proposed block of one chain round (issue 14): the drafter's B-1 slots with their top-K candidates
# beside the target's tokens, where the chain stopped, and what DDTree took at that anchor


def visible(s: str) -> str:
    """One token as escaped HTML on one line with its whitespace made visible: space ·, newline ⏎, tab →
    (`esc` for markup and the other control characters)."""
    return esc(s.replace(" ", "·").replace("\t", "→").replace("\n", "⏎"), breaks=False)


def _nest(flat: list, *shape: int) -> list:
    """A flat list as nested lists of `shape` (the last axis innermost)."""
    if len(shape) == 1:
        return list(flat)
    n = int(np.prod(shape[1:]))
    return [_nest(flat[i * n : (i + 1) * n], *shape[1:]) for i in range(shape[0])]


def blocks(row: dict, block_size: int, k: int | None = None) -> dict:
    """A run_prompts row's blocks, nested: "drafts" [A][B-1] argmax drafts per anchor (-1: not drafted, a
    chain-only run), "draft_p" [A][B-1] their probabilities exp(draft_logp) (None: not recorded), "round_anchors"
    [R], "round_top_ids"/"round_top_p" [R][B-1][K] top-K candidates at each round's anchor and "round_topk" K
    (0 and empty lists for runs replayed before they were kept). `k` is the run summary's `round_topk` (None: read
    from the row's lengths)."""
    D = block_size - 1
    P, rounds = row["prompt_len"], list(row.get("rounds") or [])
    drafts = list(row.get("drafts") or [])
    A = len(drafts) // D if D else 0
    lp = row.get("draft_logp")
    draft_p = (
        [None if x != x else x for x in np.exp(np.asarray(lp, dtype=np.float64)).tolist()] if lp else [None] * (A * D)
    )  # NaN: not drafted (chain-only run)
    anchors = (P + np.concatenate([[0], np.cumsum(rounds)[:-1]])).tolist() if rounds else []
    ids, ps = row.get("round_top_ids") or [], row.get("round_top_p") or []
    R = len(rounds)
    K = k if k else (len(ids) // (R * D) if R and D else 0)
    if not (K and len(ids) == len(ps) == R * D * K):
        K, ids, ps = 0, [], []
    return {
        "drafts": _nest(drafts, A, D),
        "draft_p": _nest(draft_p, A, D),
        "round_anchors": [int(a) for a in anchors],
        "round_topk": K,
        "round_top_ids": _nest(ids, R, D, K) if K else [],
        "round_top_p": _nest([float(x) for x in ps], R, D, K) if K else [],
    }


def round_options(row: dict, completion: dict, block_size: int) -> list[dict]:
    """The rounds of the chain walk of one prompt: {"round" (1-based), "anchor", "accepted", "inside" (drafts
    inside the completion, min(B-1, T-1-anchor)), "committed", "label"}."""
    P = row["prompt_len"]
    T = P + len(completion["output_ids"])
    acc = np.asarray(row["accepted_at"], dtype=np.int64)
    out = []
    for i, (p, a, c) in enumerate(walk(acc, P, T) if len(acc) else []):
        n = min(block_size - 1, T - 1 - p)
        out.append(
            {
                "round": i + 1,
                "anchor": p,
                "accepted": a,
                "inside": n,
                "committed": c,
                "label": f"round {i + 1} · anchor {p} · accepted {a}/{n}",
            }
        )
    return out


SLOT_STATUS = {
    "acc": "accepted",
    "rej": "rejected: the chain stops here",
    "after": "not verified (after the stop)",
    "past": "past the end of the completion",
}


def round_detail(
    row: dict, completion: dict, block_size: int, rnd: int, vocab: Vocab, k: int | None = None, tree_budget: int = 0
) -> dict:
    """Round `rnd` (1-based) of a prompt's chain walk, slot by slot: {"round", "anchor", "anchor_token",
    "accepted", "inside", "committed", "stop" (first rejected slot, None: none rejected), "tree" (DDTree's
    accepted tokens at this anchor, None: no tree budget or not computed there), "tree_budget", "topk" (K; 0: only
    the argmax draft recorded), "slots": per slot 1..B-1 {"slot", "position", "target_id", "target" (None past the
    completion), "status" (key of SLOT_STATUS), "candidates" [{"id", "text", "p"}] best first, "target_rank"
    (1-based rank of the target's token among them, None: not among them), "ddtree" (slot inside DDTree's
    accepted path, None: unknown)}}. Texts are raw model output: escape them (`visible`) before HTML."""
    opts = round_options(row, completion, block_size)
    if not 1 <= rnd <= len(opts):
        raise ValueError(f"round {rnd}: the chain walk of prompt {row.get('prompt_id')!r} has rounds 1..{len(opts)}")
    o = opts[rnd - 1]
    P, p, a, n, D = row["prompt_len"], o["anchor"], o["accepted"], o["inside"], block_size - 1
    tokens = list(completion["prompt_ids"]) + list(completion["output_ids"])
    b = blocks(row, block_size, k)
    if b["round_topk"]:
        ids, ps = b["round_top_ids"][rnd - 1], b["round_top_p"][rnd - 1]  # [B-1][K]
    else:
        ids, ps = [[d] for d in b["drafts"][p - P]], [[x] for x in b["draft_p"][p - P]]  # [B-1][1]
    tree_at = row.get("tree_at") or []
    tree = int(tree_at[p - P]) if tree_budget and p - P < len(tree_at) and tree_at[p - P] >= 0 else None
    targets = [tokens[p + i] if i <= n else None for i in range(1, D + 1)]
    strs = vocab.strings(
        [tokens[p]] + [t for t in targets if t is not None] + [c for slot in ids for c in slot if c >= 0]
    )
    anchor_str, strs = strs[0], iter(strs[1:])
    target_strs = [next(strs) if t is not None else None for t in targets]
    slots = []
    for i in range(1, D + 1):
        t = targets[i - 1]
        cands = [
            {"id": int(c), "text": next(strs), "p": None if x is None else float(x)}
            for c, x in zip(ids[i - 1], ps[i - 1])
            if c >= 0
        ]  # -1: not computed (chain-only, DDTree off)
        status = "acc" if i <= a else "rej" if i == a + 1 and i <= n else "after" if i <= n else "past"
        rank = next((r for r, c in enumerate(cands, 1) if t is not None and c["id"] == t), None)
        slots.append(
            {
                "slot": i,
                "position": p + i,
                "target_id": t,
                "target": target_strs[i - 1],
                "status": status,
                "candidates": cands,
                "target_rank": rank,
                "ddtree": None if tree is None else i <= tree,
            }
        )
    return {
        "round": rnd,
        "anchor": p,
        "anchor_token": anchor_str,
        "accepted": a,
        "inside": n,
        "committed": o["committed"],
        "stop": a + 1 if a < n else None,
        "tree": tree,
        "tree_budget": tree_budget,
        "topk": b["round_topk"],
        "slots": slots,
    }


ROUND_CSS = (
    "<style>.dfr{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:13px;border-collapse:"
    "collapse;color:#111;background:#fff}.dfr td,.dfr th{border:1px solid #ddd;padding:2px 6px;"
    "text-align:left;white-space:nowrap}.dfr th{background:#f4f4f4;font-weight:600}"
    ".dfr .dfr-acc td.dfr-slot{background:#cdebd3}.dfr .dfr-rej td{background:#fde8e8}"
    ".dfr .dfr-after td,.dfr .dfr-past td{color:#888}.dfr .dfr-hit{background:#b9e4c1;font-weight:600}"
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
    head += (
        f"the chain stops at slot {d['stop']} (first rejected draft)"
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
