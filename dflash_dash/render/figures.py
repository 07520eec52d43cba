"""plotly figures of runs and comparisons: acceptance along a completion, acceptance histograms, per-depth
acceptance, per-prompt tau of two runs, draft lag per slot, tau against training step, backend parity,
target-layer attribution and engine conformance.

Contract: each figure takes the rows of `analysis`, `metrics` or the store and returns a plotly Figure with its
title and axis titles set (`layout`). Names that come from users or models (run names, prompt ids) are
HTML-escaped where plotly renders them as HTML (legend names, hover templates). Per-depth figures state the rounds
behind each point and mark depths with none (n = 0), so no line stops unannounced. plotly is imported on first
use (`go`): the pages that draw no figure never load it.
"""

from __future__ import annotations

import html

import numpy as np

from .. import metrics
from ..analysis.trace import Trace


class _Plotly:
    """plotly.graph_objects, imported on first attribute use: importing `render` (every page does) costs no plotly
    until a figure is drawn."""

    def __getattr__(self, name: str):
        import plotly.graph_objects as graph_objects

        return getattr(graph_objects, name)


go = _Plotly()


def layout(fig: go.Figure, title: str, x: str, y: str, height: int = 320) -> go.Figure:
    """The layout every figure shares: title, axis titles, height, margins and the legend below the plot."""
    fig.update_layout(
        title=title,
        xaxis_title=x,
        yaxis_title=y,
        height=height,
        margin=dict(l=40, r=10, t=40, b=40),
        legend=dict(orientation="h", y=-0.25),
    )
    return fig


RUN_COLORS = [
    ("#0068c9", "#83c9ff"),  # blue
    ("#ff2b2b", "#ffabab"),  # red
    ("#29b09d", "#7defa1"),  # green
    ("#ff8700", "#ffd16a"),  # orange
    ("#6d3fc0", "#c8b4f0"),  # purple
    ("#8c564b", "#d9b8b2"),  # brown
    ("#d6338a", "#f7b6d9"),  # pink
    ("#4d5a10", "#c3cf7a"),  # olive
]
# (dark, light) per run of a figure, in its order: A blue, B red, ... on every chart of a page (the theme's colorway
# would give each trace the next color, so a run changed color from one chart to the next); eight, so Compare's
# many runs (the demo's extraction holds seven drafters) keep one color each up to eight


def run_color(i: int) -> tuple[str, str]:
    """(dark, light) colors of the i-th run of a figure: lines and markers dark, bars and second lines light."""
    return RUN_COLORS[i % len(RUN_COLORS)]


TAU_SPAN = 0.2  # the least range a tau axis spans: its ticks then fall on distinct 2-decimal values


def tau_axis(values: list[float | None], **kw) -> dict:
    """A tau axis (tokens per round) as every figure draws one: ticks printed like metrics.TAU (2 decimals), the
    range around `values` padded to at least TAU_SPAN, so a narrow range never gets ticks like 1.2081; `kw` adds
    axis settings (side, overlaying, ...)."""
    v = [float(x) for x in values if x is not None]
    lo, hi = (min(v), max(v)) if v else (1.0, 1.0 + TAU_SPAN)
    pad = max(0.05 * (hi - lo), (TAU_SPAN - (hi - lo)) / 2, 0.0)
    return dict(tickformat=".2f", range=[lo - pad, hi + pad], **kw)


def right_axis(title: str, count: bool = False, **kw) -> dict:
    """The right-hand axis of a figure drawing a second quantity over the first (`yaxis="y2"` traces): its own
    ticks (`tickmode="auto"`: synced to the left axis's grid, they read 48, 344, 640), no grid of its own,
    integers for a `count`; `kw` adds or overrides axis settings."""
    base = dict(overlaying="y", side="right", title=title, showgrid=False, tickmode="auto")
    return base | ({"tickformat": ",d"} if count else {}) | kw


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
    return layout(fig, "accepted(p) along the completion", "position p", "accepted drafts")


def hist_fig(summaries: dict[str, dict]) -> go.Figure:
    """Acceptance histogram: share of rounds by accepted count 0..B-1, one bar series per run; hover: the share
    (3 decimals) and the rounds behind it."""
    fig = go.Figure()
    for i, (name, s) in enumerate(summaries.items()):
        h = np.asarray(s.get("accept_hist") or [], dtype=float)
        fig.add_bar(
            x=list(range(len(h))),
            y=(h / h.sum()).tolist() if h.sum() else h.tolist(),
            name=name,
            marker_color=run_color(i)[0],
            customdata=h.astype(int).tolist(),
            hovertemplate=f"{html.escape(str(name))}<br>accepted %{{x}}: "
            f"%{{y:.3f}} of {int(h.sum())} rounds<br>n = %{{customdata}} rounds<extra></extra>",
        )
    fig.update_layout(barmode="group")
    return layout(
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
    for i, (name, s) in enumerate(summaries.items()):
        dark, light = run_color(i)
        cond, marg = s.get("depth_conditional") or [], s.get("depth_marginal") or []
        ks = list(range(1, len(cond) + 1))
        nc, nm = _counts(s, "depth_samples", len(cond)), _counts(s, "depth_rounds", len(marg))
        tag = html.escape(str(name))
        fig.add_scatter(
            x=ks,
            y=cond,
            mode="lines+markers",
            name=f"{name}: P(d_k | d_<k)",
            line=dict(color=dark),
            customdata=nc,
            hovertemplate=f"{tag}<br>depth %{{x}}: P(d_k | d_<k) = %{{y:.3f}}<br>n = %{{customdata}} "
            "rounds (d_1..d_{k-1} accepted)<extra></extra>",
        )
        fig.add_scatter(
            x=ks[: len(marg)],
            y=marg,
            mode="lines+markers",
            name=f"{name}: P(d_1..d_k)",
            line=dict(dash="dot", color=light),
            customdata=nm,
            hovertemplate=f"{tag}<br>depth %{{x}}: P(d_1..d_k) = %{{y:.3f}}<br>n = %{{customdata}} "
            "rounds (slot k in the completion)<extra></extra>",
        )
        if "?" not in nc:
            fig.add_bar(
                x=ks,
                y=nc,
                name=f"{name}: rounds behind P(d_k | d_<k)",
                marker_color=light,
                yaxis="y2",
                opacity=0.2,
                hovertemplate=f"{tag}<br>depth %{{x}}: n = %{{y}} rounds<extra></extra>",
            )
        empty = [k for k, v in zip(ks, cond) if v is None]
        if empty:
            # the label only where it fits: one run, no two empty depths side by side (else the legend says it)
            spaced = len(summaries) == 1 and all(b - a > 1 for a, b in zip(empty, empty[1:]))
            fig.add_scatter(
                x=empty,
                y=[0.0] * len(empty),
                mode="markers+text" if spaced else "markers",
                text=["n = 0"] * len(empty) if spaced else None,
                textposition="top center",
                marker=dict(symbol="x", size=9, color="#999"),
                name=f"{name}: no rounds reached depth (n = 0, no estimate)",
                hovertemplate=f"{tag}<br>depth %{{x}}: no round reached this depth (n = 0)<extra></extra>",
            )
    fig.update_layout(
        yaxis_range=[0, 1.02],
        barmode="group",  # the left axis only (the right one keeps its own)
        yaxis2=right_axis("rounds (n)", count=True, rangemode="tozero"),
    )
    fig.update_xaxes(dtick=1)
    title = "per-depth acceptance: conditional (solid) and marginal (dotted)"
    return layout(fig, title, "depth k", "probability", height=legend_height(len(fig.data)))


def legend_height(items: int, base: int = 320) -> int:
    """A figure's height that keeps its plot area when a legend below it lists `items` entries, one a line (a
    pair of runs lists 6-8): each entry past 3 adds its line."""
    return base + LEGEND_LINE * max(0, items - 3)


LEGEND_LINE = 20  # px a legend entry's line takes


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
    return layout(fig, "per-prompt tau: A vs B", f"A: {name_a}", f"B: {name_b}", height=380)


SWEEP_KEYS = ("tau_macro", "tau_pooled", "ddtree_tau")  # registry keys plotted against step


def sweep_fig(points: list[dict], reference: tuple[str, float] | None = None) -> go.Figure:
    """tau (macro, pooled, DDTree) against training step; `reference` (name, tau): the best model-free baseline on
    the same completions as a dashed line."""
    fig = go.Figure()
    if reference is not None:
        fig.add_hline(y=reference[1], line_dash="dash", line_color="gray", annotation_text=f"{reference[0]} (baseline)")
    xs = [p["step"] for p in points]
    for key in SWEEP_KEYS:
        fig.add_scatter(
            x=xs,
            y=[p.get(key) for p in points],
            mode="lines+markers",
            name=metrics.BY_KEY[key].label,
            text=[f"{p['name']} ({p.get('family', 'DFlash')})" for p in points],
        )
    ys = [p.get(k) for p in points for k in SWEEP_KEYS] + ([reference[1]] if reference else [])
    fig.update_layout(yaxis=tau_axis(ys))
    return layout(fig, "tau against training step", "step", "tau", height=360)


def parity_fig(rows: list[dict]) -> go.Figure:
    """Backend parity per target layer (`rows`: parity layers): relative L2 bars and 1 - cosine (right axis,
    printed as powers of ten: it is about 1e-6 between backends), one category per layer id."""
    fig = go.Figure()
    fig.add_bar(x=[str(r["layer"]) for r in rows], y=[r["rel_l2"] for r in rows], name="relative L2")
    fig.add_scatter(
        x=[str(r["layer"]) for r in rows],
        y=[1 - r["cosine"] for r in rows],
        name="1 - cosine",
        mode="markers+lines",
        yaxis="y2",
    )
    fig.update_layout(yaxis2=right_axis("1 - cosine", tickformat=".1e"))
    fig.update_xaxes(type="category")  # the layers compared, not a numeric range around them
    return layout(fig, "backend parity per target layer", "target layer id", "relative L2")


LAG_LINES = (
    ("lag", "lag: d_k = t[p+k-1]", "solid", "circle"),
    ("on target", "on target: d_k = t[p+k]", "dash", "square"),
)  # per metric of the lag chart: (row key, legend words, line dash, marker symbol)
LAG_RUNS = ({"width": 5, "size": 11, "open": ""}, {"width": 2, "size": 7, "open": "-open"})
# per run: A wide with large filled markers drawn first, B thin with small open markers on top, so a line lying on
# another (A on target at 1.0 under B's lag at 1.0) shows inside it instead of hiding it


def lag_fig(rows: list[dict], name_a: str, name_b: str) -> go.Figure:
    """Lag rate and on-target rate per slot, runs A and B (`lag_rows`): a color per run (`run_color`), a dash and
    a marker symbol per metric (lag solid circles, on target dashed squares), A wide and filled under B thin and
    open, so every line shows where two coincide; each legend entry names the run and the metric."""
    fig = go.Figure()
    ks = [r["slot k"] for r in rows]
    for i, (side, name) in enumerate((("A", name_a), ("B", name_b))):
        look, color = LAG_RUNS[i], run_color(i)[0]
        edge = dict(color=color, width=2)  # an open marker's ring, a filled one's rim
        for key, words, dash, symbol in LAG_LINES:
            fig.add_scatter(
                x=ks,
                y=[r[f"{key} {side}"] for r in rows],
                mode="lines+markers",
                line=dict(color=color, dash=dash, width=look["width"]),
                marker=dict(color=color, symbol=symbol + look["open"], size=look["size"], line=edge),
                name=f"{side} {html.escape(name)} · {words}",
                legendgroup=side,
            )
    fig.update_yaxes(range=[0, 1.04])
    fig.update_xaxes(dtick=1)
    return layout(fig, "one-position draft lag per slot", "slot k", "share of anchors", height=380)


def attribution_fig(rows: list[dict]) -> go.Figure:
    """tau lost per target-layer tap (attribution_rows), macro and pooled."""
    fig = go.Figure()
    xs = [f"tap {r['tap']} · layer {r['layer_id']}" for r in rows]
    fig.add_bar(x=xs, y=[r["tau_lost_macro"] for r in rows], name="tau lost (macro)")
    fig.add_bar(x=xs, y=[r["tau_lost_pooled"] for r in rows], name="tau lost (pooled)")
    fig.update_layout(barmode="group")
    return layout(
        fig,
        "tau lost with each target-layer tap replaced by its mean",
        "tap (target layer id)",
        "base tau − ablated tau",
        height=360,
    )


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
    return layout(
        fig,
        f"per-prompt tau: {html.escape(engine)} vs the replay",
        "replay tau (committed / rounds)",
        "engine tau ((completion_tokens − 1) / verify_steps)",
        height=420,
    )
