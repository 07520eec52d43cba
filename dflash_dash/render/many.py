"""Compare's many runs: the chart of tau per run and per category (the drafters as bars with their bootstrap
intervals, the model-free baselines as dashed reference lines) and the captions that state the formulas.

Contract: `many_fig` takes `analysis.compare.many_rows` and returns a plotly Figure (`figures.layout`); run names
are HTML-escaped where plotly renders them as HTML (legend, hover). Computes nothing a stored number depends on.
"""

from __future__ import annotations

import html

from ..analysis import stats
from ..metrics import BOOT_LEVEL, BOOT_N, BOOT_SEED
from .figures import go, layout, run_color, tau_axis

# the captions of Compare's many-runs section
MANY_NOTE = (
    f"tau (macro) = mean over prompts of committed / rounds (per category: over that category's prompts); interval = "
    f"{BOOT_LEVEL:.0%} percentile bootstrap over prompts ({BOOT_N:,} resamples, seed {BOOT_SEED}); tau (pooled) = all "
    "committed / all rounds. Baselines (model-free proposers replayed on the same completions) are the dashed lines."
)
PAIRED_NOTE = (
    "Each run against the reference on the same prompts: B − A = mean over shared prompts of tau_B − tau_A, its "
    f"interval the {BOOT_LEVEL:.0%} paired bootstrap of those per-prompt differences (the prompts resampled together, "
    "so the text's own difficulty cancels). A verdict is given only when the interval excludes 0. A set is too small "
    f"to separate two runs when they share fewer than {stats.MIN_PROMPTS} prompts, or when an undecided interval is "
    f"wider than ±{stats.RESOLVE:g} tau (the warning says about how many prompts would resolve it)."
)


def many_fig(rows: list[dict]) -> go.Figure:
    """tau per run and category: one bar per drafter run in each category ("all" first), error bars its bootstrap
    interval; each baseline run a dashed line across the categories."""
    fig = go.Figure()
    cats = list(dict.fromkeys(r["category"] for r in rows))
    runs = list(dict.fromkeys(r["run"] for r in rows))
    for i, rid in enumerate(runs):
        mine = {r["category"]: r for r in rows if r["run"] == rid}
        first = next(iter(mine.values()))
        name = html.escape(first["name"])
        ys = [mine[c]["tau"] if c in mine else None for c in cats]
        hover = name + "<br>%{x}: tau %{y:.2f}<extra></extra>"
        if first["baseline"]:
            fig.add_scatter(
                x=cats, y=ys, name=f"{name} (baseline)", mode="lines+markers", hovertemplate=hover,
                line=dict(dash="dash", color="#555555", width=2), marker=dict(symbol="diamond", color="#555555"),
            )  # fmt: skip
            continue
        up = [(mine[c]["hi"] - mine[c]["tau"]) if c in mine and mine[c]["hi"] is not None else 0 for c in cats]
        down = [(mine[c]["tau"] - mine[c]["lo"]) if c in mine and mine[c]["lo"] is not None else 0 for c in cats]
        fig.add_bar(
            x=cats, y=ys, name=name, marker_color=run_color(i)[0], hovertemplate=hover,
            error_y=dict(type="data", array=up, arrayminus=down, visible=True),
        )  # fmt: skip
    values = [v for r in rows for v in (r["tau"], r["lo"], r["hi"])]
    fig.update_layout(barmode="group", yaxis=tau_axis(values))
    return layout(fig, "tau per run and category", "category", "tau (macro)", height=380)
