"""Failure patterns: on which tokens, where in the completion and at which context length the drafter fails
(for long traces, every anchor's accepted(p) and the rounds in bins of 1,000 context positions, pooled over prompts),
which drafts the target rejects most often, and the worst stretches of every completion.

Contract: pure functions over plain data, no torch, no store, no Streamlit: a run's prompt rows
(`metrics.Prompt`: prompt_len, accepted_at, rounds, drafts [A, B-1] or flat), completions
({prompt_id: {prompt_ids, output_ids}}) and
`strings(ids) -> texts` (vocab.Vocab.strings: the target tokenizer's decode of each id, `⟨id⟩` without one).
Every table is a list of dicts: a dataframe, a CSV file and the export JSON read the same rows.

Rounds are the rounds of the chain walk (anchor p, accepted a, committed c); slot 1 of a round is the
position p+1 (always inside the completion, since rounds start only while p < T-1). A token's class comes
from its decoded text alone (no parsing of the surrounding code), first match wins: `whitespace` (only
spaces, tabs, newlines: indentation), `string` (holds a quote ' " `), `keyword` (a Python keyword once
stripped), `identifier`, `number`, `punctuation` (only ASCII punctuation), `other` (mixed, non-ASCII, ⟨id⟩).
"""

from __future__ import annotations

import keyword
import math
import re
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from .. import metrics

Strings = Callable[[list[int]], list[str]]  # token ids -> their decoded texts

CLASSES = ("whitespace", "identifier", "keyword", "number", "punctuation", "string", "other")
_NUMBER = re.compile(r"(\d[\d_]*\.?[\d_]*|\.\d[\d_]*)([eE][+-]?\d+)?[jJ]?|0[xXoObB][0-9a-fA-F_]+")
_PUNCT = set(string.punctuation) - set("'\"`")


@dataclass
class Config:
    position_bin: int | None = None  # completion-position bin width in tokens (None: a round width, ~10 bins)
    context_bin: int | None = None  # context-length bin width in tokens (None: a round width, ~10 bins)
    context_position_bin: int | None = None  # positions per bin of context_position (None: context_width, 1,000
    # positions unless the traces are shorter than two such bins)
    pairs: int = 20  # most frequent (draft, target) pairs kept
    window: int = 16  # anchors per worst-span window
    spans: int = 10  # worst spans kept (non-overlapping)


@dataclass(slots=True)
class Round:
    prompt: str  # prompt id
    P: int  # prompt length
    anchor: int  # p
    accepted: int  # a = accepted(p)
    committed: int  # c = min(a + 1, tokens left)
    slots: int  # drafted slots inside the completion: min(B-1, T-1-p)
    target: list[int]  # the completion tokens at p+1..p+slots
    drafts: list[int]  # the drafts d_1..d_{B-1} of the round ([] when the row holds none)


# ---------------------------------------------------------------------------
# token classes


def token_class(text: str) -> str:
    """The class of one decoded token (see the module docstring for the order of the rules)."""
    if text == "" or text.startswith("⟨") and text.endswith("⟩"):
        return "other"
    s = text.strip()
    if not s:
        return "whitespace"
    if any(q in s for q in "'\"`"):
        return "string"
    if keyword.iskeyword(s):
        return "keyword"
    if s.isidentifier() and s.isascii():
        return "identifier"
    if _NUMBER.fullmatch(s):
        return "number"
    if all(ch in _PUNCT for ch in s):
        return "punctuation"
    return "other"


# ---------------------------------------------------------------------------
# rounds


def tokens_of(completion: dict) -> list[int]:
    return list(completion["prompt_ids"]) + list(completion["output_ids"])


def rounds(rows: list[metrics.Prompt], comps: dict[str, dict], block_size: int) -> list[Round]:
    """The chain-walk rounds of every prompt that has its completion, in row order (each prompt's anchors,
    accepted counts and drafts gathered at once, as Python ints)."""
    import numpy as np

    D, out = block_size - 1, []
    for r in rows:
        c = comps.get(r.id)
        if c is None:
            continue
        toks, P, pid = tokens_of(c), r.prompt_len, r.id
        anchors, acc, _ = r.walk()  # the chain walk's anchors and accepted(p)
        at, acc, com = anchors - P, acc.tolist(), r.rounds
        drafts = np.asarray(r.drafts, dtype=np.int64).ravel()
        whole = len(drafts) // D  # anchors whose D drafts the row holds
        rd = drafts[: whole * D].reshape(whole, D)[at[at < whole]].tolist()
        T = len(toks)
        for k, (i, a, cm) in enumerate(zip(at.tolist(), acc, com)):
            p = P + i
            n = min(D, T - 1 - p)
            out.append(Round(pid, P, p, a, cm, n, toks[p + 1 : p + 1 + n], rd[k] if i < whole else []))
    return out


def _cols(rs: list[Round]):
    """Accepted and committed counts of rounds `rs` as arrays [R] (what `_stats` reads)."""
    import numpy as np

    return (
        np.fromiter((r.accepted for r in rs), np.int64, len(rs)),
        np.fromiter((r.committed for r in rs), np.int64, len(rs)),
    )


def _stats(acc, com) -> dict:
    """rounds, P(d_1 accepted), mean accepted drafts, tau (mean committed) of a group of rounds (their accepted
    and committed counts [n]: integer sums, then one division, as a loop over the rounds would)."""
    n = len(acc)
    return {
        "rounds": n,
        "first_slot_acceptance": _r(int((acc >= 1).sum()) / n) if n else None,
        "mean_accepted": _r(int(acc.sum()) / n) if n else None,
        "tau": _r(int(com.sum()) / n) if n else None,
    }


def _r(x: float) -> float:
    return round(float(x), 4)


# ---------------------------------------------------------------------------
# tables


def by_class(rs: list[Round], strings: Strings) -> list[dict]:
    """Acceptance by the class of the target token at slot 1 (position p+1) of each round."""
    import numpy as np

    firsts = [r.target[0] for r in rs]
    ids = sorted(set(firsts))  # a class per distinct token, not per round
    cls = dict(zip(ids, map(token_class, strings(ids))))
    of = np.array([CLASSES.index(cls[t]) for t in firsts], dtype=np.int64)
    acc, com = _cols(rs)
    n = len(rs)
    return [
        {
            "class": c,
            "share_of_rounds": _r(int((of == k).sum()) / n) if n else None,
            **_stats(acc[of == k], com[of == k]),
        }
        for k, c in enumerate(CLASSES)
    ]


def nice_width(top: int, bins: int = 10) -> int:
    """A round bin width (1, 2, 2.5, 5 x 10^k tokens, whole) giving at most about `bins` bins over 0..top."""
    raw = max(1.0, top / bins)
    mag = 10 ** math.floor(math.log10(raw))
    return int(next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw and float(m * mag).is_integer()))


def _binned(rs: list[Round], value: Callable[[Round], int], width: int | None, label: str) -> list[dict]:
    import numpy as np

    if not rs:
        return []
    v = np.fromiter(map(value, rs), np.int64, len(rs))
    w = width or nice_width(int(v.max()) + 1)
    b, (acc, com) = v // w, _cols(rs)
    return [
        {label: f"{k * w}-{k * w + w - 1}", "from": k * w, "to": k * w + w - 1, **_stats(acc[b == k], com[b == k])}
        for k in np.unique(b).tolist()
    ]


def by_position(rs: list[Round], width: int | None = None) -> list[dict]:
    """Acceptance by the anchor's position in the completion (p - P, 0 = the first completion token)."""
    return _binned(rs, lambda r: r.anchor - r.P, width, "completion_position")


def by_context(rs: list[Round], width: int | None = None, rows: list[metrics.Prompt] | None = None) -> list[dict]:
    """Acceptance by context length: the anchor p (the drafter sees positions 0..p-1). With `rows` (the run's
    prompt rows), each bin also pools accepted(p) of every known completion anchor p in it over all prompts
    (`_anchor_stats`: samples, mean accepted(p) + 1), and a bin holding anchors but no round is kept."""
    if rows is None:
        return _binned(rs, lambda r: r.anchor, width, "context_length")
    import numpy as np

    pos, acc = _anchors(rows)
    if not len(pos) and not rs:
        return []
    top = max(int(pos.max()) if len(pos) else 0, max((r.anchor for r in rs), default=0))
    w = width or nice_width(top + 1)
    rb = np.fromiter((r.anchor // w for r in rs), np.int64, len(rs))
    ab, (racc, rcom) = pos // w, _cols(rs)
    return [
        {
            "context_length": f"{k * w}-{k * w + w - 1}",
            "from": k * w,
            "to": k * w + w - 1,
            "from_thousands": _r(k * w / 1000),
            **_anchor_stats(acc[ab == k]),
            **_stats(racc[rb == k], rcom[rb == k]),
            "committed": int(rcom[rb == k].sum()),
        }
        for k in np.union1d(np.unique(ab), np.unique(rb)).tolist()
    ]


def _anchors(rows: list[metrics.Prompt]):
    """(anchor p, accepted(p)) as arrays over every prompt's completion anchors P..T-2 whose accepted(p) is known
    (a chain-only run holds -1 off its walks; the last token drafts nothing)."""
    import numpy as np

    pos, acc = [], []
    for r in rows:
        a = np.asarray(r.accepted_at[:-1], dtype=np.int64)
        known = a >= 0
        pos.append(r.prompt_len + np.flatnonzero(known))
        acc.append(a[known])
    if not pos:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(pos).astype(np.int64), np.concatenate(acc)


def _anchor_stats(acc) -> dict:
    """samples and the every-anchor tau (mean accepted(p) + 1: integer sum, then one division) of anchors `acc`."""
    n = len(acc)
    return {"samples": n, "every_anchor_tau": _r((int(acc.sum()) + n) / n) if n else None}


CONTEXT_BIN = 1000  # positions per bin of acceptance against context position (long traces)


def context_width(rows: list[metrics.Prompt], width: int = CONTEXT_BIN) -> int:
    """The bin width of `by_context(..., rows=...)` over a run: `width` positions when the longest trace (prompt
    + completion) spans at least two such bins, else a round width giving about 10 bins over the longest trace (a
    short trace would otherwise be one bin)."""
    top = max((r.prompt_len + len(r.accepted_at) for r in rows), default=0)
    return width if top >= 2 * width else nice_width(max(top, 1))


def rejects(r: Round) -> bool:
    """Whether round `r` rejected a proposed draft: its slot a+1 lies inside the completion and holds a draft
    (not -1, a baseline's "nothing proposed": the round stops there without a rejection)."""
    return r.accepted < r.slots and len(r.drafts) > r.accepted and r.drafts[r.accepted] >= 0


def rejection_pairs(rs: list[Round], strings: Strings, top: int = 20) -> list[dict]:
    """The most frequent (draft, target) pairs at the first rejected slot (a+1) of the rounds that rejected a
    draft inside the completion; ties broken by draft then target id. A round whose slot a+1 holds -1 (nothing
    proposed there: a baseline without a match) rejected nothing and counts in no pair nor in the share's total."""
    pairs = Counter((r.drafts[r.accepted], r.target[r.accepted]) for r in rs if rejects(r))
    total = sum(pairs.values())
    best = sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    ids = [i for (d, t), _ in best for i in (d, t)]
    texts = strings(ids)
    return [
        {
            "draft": texts[2 * j],
            "target": texts[2 * j + 1],
            "draft_id": d,
            "target_id": t,
            "count": n,
            "share_of_rejections": _r(n / total),
        }
        for j, ((d, t), n) in enumerate(best)
    ]


def link(run_id: str, prompt: str, start: int | None = None, end: int | None = None) -> str:
    """The Acceptance page's token view of `prompt`; `pos=START-END` outlines those positions there."""
    q = {"run": run_id, "prompt": prompt} | ({"pos": f"{start}-{end}"} if start is not None else {})
    return "acceptance?" + urlencode(q)


def _shown(texts: list[str], limit: int = 120) -> str:
    s = "".join(texts).replace("\n", "↵").replace("\t", "⇥")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def end_cut(block_size: int | None) -> int:
    """Positions at the end of each completion left out of the worst spans: the last B-1 (anchors there have fewer
    than B-1 tokens after them, so accepted(p) <= T-1-p < B-1 whatever the drafter does; the last drafts nothing)."""
    return max(block_size - 1, 1) if block_size else 1


def worst_spans(
    rows: list[metrics.Prompt],
    comps: dict[str, dict],
    run_id: str,
    strings: Strings,
    window: int = 16,
    top: int = 10,
    block_size: int | None = None,
) -> list[dict]:
    """The `top` windows of `window` consecutive completion anchors with the lowest mean accepted(p) over all prompts,
    non-overlapping; ties: prompt order, then position. Only anchors with a full block of future tokens count
    (P..T-B: `end_cut`; with `block_size` None, P..T-2): the end of a text would otherwise always win, capped by the
    tokens left rather than by the drafter. A chain-only run knows accepted(p) only at the anchors its walks visited
    (-1 elsewhere): a window's mean is then over its known anchors (`anchors` counts them), and a window without one
    is skipped."""
    import numpy as np

    cut = end_cut(block_size)
    cols: list[tuple] = []  # per prompt: (mean [S], row order, start [S], w, known [S], row) of its windows
    for o, r in enumerate(rows):
        if r.id not in comps:
            continue
        acc = np.asarray(r.accepted_at[: max(len(r.accepted_at) - cut, 0)], dtype=np.int64)
        w = min(window, len(acc))
        if not w:
            continue
        tot = np.concatenate([[0], np.cumsum(np.maximum(acc, 0))])  # prefix sums of the known accepted(p)
        cnt = np.concatenate([[0], np.cumsum(acc >= 0)])  # and of how many are known
        n = cnt[w:] - cnt[:-w]
        keep = n > 0
        start = np.arange(len(acc) - w + 1)[keep]
        cols.append(((tot[w:] - tot[:-w])[keep] / n[keep], o, start, w, n[keep], r))
    picked: list[tuple] = []
    if cols:
        mean = np.concatenate([c[0] for c in cols])
        order = np.concatenate([np.full(len(c[2]), c[1]) for c in cols])
        start = np.concatenate([c[2] for c in cols])
        which = np.concatenate([np.full(len(c[2]), i) for i, c in enumerate(cols)])
        known = np.concatenate([c[4] for c in cols])
        taken: dict[str, list[tuple[int, int]]] = {}
        for j in np.lexsort((start, order, mean)).tolist():  # by mean, then prompt order, then position
            _, _, _, w, _, r = cols[which[j]]
            s = int(start[j])
            spans = taken.setdefault(r.id, [])
            if any(s < e and a < s + w for a, e in spans):
                continue
            spans.append((s, s + w))
            picked.append((float(mean[j]), s, w, int(known[j]), r))
            if len(picked) >= top:
                break
    out = []
    for mean, s, w, n, r in picked:
        pid, P = r.id, r.prompt_len
        toks = tokens_of(comps[pid])
        start, end = P + s, P + s + w - 1
        out.append(
            {
                "prompt": pid,
                "start": start,
                "end": end,
                "anchors": n,
                "mean_accepted": _r(mean),
                "every_anchor_tau": _r(mean + 1),
                "text": _shown(strings(toks[start : end + 1])),
                "link": link(run_id, pid, start, end),
            }
        )
    return out


def analyse(
    rows: list[metrics.Prompt],
    comps: dict[str, dict],
    block_size: int,
    strings: Strings,
    run_id: str,
    cfg: Config = Config(),
) -> dict[str, list[dict]]:
    """Every failure-pattern table of one run: by_class, by_position, by_context, context_position (by_context with
    every anchor's accepted(p), in bins of 1,000 positions for long traces), rejection_pairs, rejections (rounds
    that rejected a proposed draft, `rejects`: the pairs' total before the top ones are kept), worst_spans, and
    worst_spans_end_cut (`end_cut`: the positions at each completion's end that worst spans leave out)."""
    rs = rounds(rows, comps, block_size)
    return {
        "by_class": by_class(rs, strings),
        "by_position": by_position(rs, cfg.position_bin),
        "by_context": by_context(rs, cfg.context_bin),
        "context_position": by_context(rs, cfg.context_position_bin or context_width(rows), rows),
        "rejection_pairs": rejection_pairs(rs, strings, cfg.pairs),
        "rejections": sum(map(rejects, rs)),
        "worst_spans": worst_spans(rows, comps, run_id, strings, cfg.window, cfg.spans, block_size),
        "worst_spans_end_cut": end_cut(block_size),
    }
