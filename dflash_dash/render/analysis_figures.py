"""plotly figures of the kept analyses: calibration (reliability diagram, predicted against observed acceptance
per depth, expected against observed tau per prompt), failure patterns (acceptance by token class, by bin, against
context position) and the training-bug signatures of a run beside its reference.

Contract: each figure takes the rows of `analysis.calibration` or `analysis.patterns` (one run, or several by
name) and returns a plotly Figure laid out like every other (`figures.layout`). Left axes of probabilities span
[0, 1.02]; a right axis keeps its own range (a tau axis: `figures.tau_axis`, ticks with 2 decimals).
"""

from __future__ import annotations

from .figures import go, layout, right_axis, run_color, tau_axis


def reliability_fig(
    runs: dict[str, list[dict]],
    depth: str | int = "pooled",
    predicted: str = "predicted: drafter's probability of its draft p_k",
) -> go.Figure:
    """Reliability diagram: per bin of the predicted probability, mean predicted (x) against share accepted (y),
    one line per run (`runs`: name -> calibration()["reliability"] rows); the diagonal is perfect calibration;
    bars: samples per bin (right axis)."""
    fig = go.Figure()
    fig.add_scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfectly calibrated", line=dict(dash="dash", color="#999"))
    for i, (name, rows) in enumerate(runs.items()):
        dark, light = run_color(i)
        bins = [b for b in rows if b["depth"] == depth]
        full = [b for b in bins if b["n"]]
        fig.add_bar(
            x=[(b["lo"] + b["hi"]) / 2 for b in bins],
            y=[b["n"] for b in bins],
            name=f"{name}: samples",
            marker_color=light,
            yaxis="y2",
            opacity=0.25,
            width=0.08,
        )
        fig.add_scatter(
            x=[b["predicted"] for b in full],
            y=[b["observed"] for b in full],
            mode="lines+markers",
            name=f"{name}: observed",
            line=dict(color=dark),
            text=[f"n = {b['n']}" for b in full],
            hovertemplate="predicted %{x:.3f}<br>observed %{y:.3f}<br>%{text}",
        )
    fig.update_layout(
        barmode="group",
        yaxis2=right_axis("samples", count=True),
    )
    fig.update_xaxes(range=[0, 1])
    fig.update_layout(yaxis_range=[0, 1.02])  # the left axis only (a right axis keeps its own range)
    what = "pooled over depths" if depth == "pooled" else f"depth {depth}"
    return layout(
        fig,
        f"reliability diagram ({what})",
        predicted,
        "observed: share accepted",
        height=380,
    )


def confidence_fig(runs: dict[str, list[dict]]) -> go.Figure:
    """Per depth: mean p_k (dotted) against P(d_k accepted | d_1..d_{k-1} accepted) (solid), per run
    (`runs`: name -> calibration()["by_depth"] rows)."""
    fig = go.Figure()
    for i, (name, rows) in enumerate(runs.items()):
        dark, light = run_color(i)
        ks = [r["depth"] for r in rows]
        fig.add_scatter(
            x=ks, y=[r["observed"] for r in rows], mode="lines+markers", name=f"{name}: observed", line_color=dark
        )
        fig.add_scatter(
            x=ks,
            y=[r["mean_p"] for r in rows],
            mode="lines+markers",
            name=f"{name}: mean p_k",
            line=dict(dash="dot", color=light),
        )
    fig.update_layout(yaxis_range=[0, 1.02])  # the left axis only (a right axis keeps its own range)
    fig.update_xaxes(dtick=1)
    return layout(
        fig, "per depth: predicted (dotted) vs observed (solid) acceptance", "depth k", "probability", height=380
    )


def expected_fig(runs: dict[str, list[dict]]) -> go.Figure:
    """Per prompt: expected tau (from the draft probabilities, x) against observed tau (y), per run
    (`runs`: name -> calibration()["per_prompt"] rows)."""
    fig = go.Figure()
    vals = [1.0]
    for i, (name, rows) in enumerate(runs.items()):
        ok = [r for r in rows if r["tau"] is not None and r["expected_tau"] is not None]
        vals += [v for r in ok for v in (r["tau"], r["expected_tau"])]
        fig.add_scatter(
            x=[r["expected_tau"] for r in ok],
            y=[r["tau"] for r in ok],
            mode="markers",
            name=name,
            marker_color=run_color(i)[0],
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
    return layout(
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
    fig.update_layout(yaxis2=tau_axis([r["tau"] for r in rows], **right_axis("tau")))
    fig.update_layout(yaxis_range=[0, 1.02])  # the left axis only (a right axis keeps its own range)
    return layout(fig, "acceptance by class of the target token at slot 1", "token class", "P(d_1 accepted)")


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
    fig.update_layout(yaxis2=tau_axis([r["tau"] for r in rows], **right_axis("tau")))
    fig.update_layout(yaxis_range=[0, 1.02])  # the left axis only (a right axis keeps its own range)
    fig = layout(fig, title, x_title, "P(d_1 accepted)")
    if len(rows) > ROTATED:  # plotly turns the bins' labels: the legend goes below the longer axis
        fig.update_layout(legend_y=-0.5, height=360)
    return fig


ROTATED = 6  # bins beyond which a half-width chart's range labels ("100-124") are drawn turned


def context_position_fig(rows: list[dict], limits: list[tuple[int, str]] = ()) -> go.Figure:
    """Acceptance against context position (`rows`: patterns.by_context with every anchor, one row per bin of
    anchor positions): mean accepted(p) + 1 over every known anchor of the bin (hover: samples) and the chain walk's
    tau (committed / rounds of the rounds anchored in it; hover: rounds, committed), at each bin's start in
    thousands of positions; bars: samples per bin (right axis). `limits` (drafters.context_limits: position,
    label) inside the traces' span are dashed vertical lines: where the drafter starts to see its context
    differently."""
    x = [r["from_thousands"] for r in rows]
    fig = go.Figure()
    fig.add_bar(
        x=x, y=[r["samples"] for r in rows], name="samples (anchors)", yaxis="y2", marker_color="#ddd", opacity=0.6
    )
    fig.add_scatter(
        x=x,
        y=[r["every_anchor_tau"] for r in rows],
        mode="lines+markers",
        name="mean accepted(p)+1 (every anchor)",
        text=[f"{r['context_length']}: {r['samples']} anchors" for r in rows],
    )
    fig.add_scatter(
        x=x,
        y=[r["tau"] for r in rows],
        mode="lines+markers",
        name="tau (chain walk: committed / rounds)",
        line=dict(dash="dot"),
        text=[f"{r['context_length']}: {r['rounds']} rounds, {r['committed']} committed" for r in rows],
    )
    fig.update_layout(
        yaxis2=right_axis("samples", count=True),
        barmode="overlay",
    )
    taus = [r["every_anchor_tau"] for r in rows] + [r["tau"] for r in rows]
    fig.update_layout(yaxis=tau_axis(taus))  # tokens per round or per anchor: a tau axis, 2-decimal ticks
    end = max((r["to"] + 1 for r in rows), default=0)
    for k, (pos, label) in enumerate(p for p in limits if p[0] < end):
        fig.add_vline(  # labels stacked from the top, so that two limits close together stay readable
            x=pos / 1000, line=dict(dash="dash", color="#888", width=1), annotation_text=label,
            annotation_position="top right", annotation_y=1 - 0.09 * k, annotation_font_size=11,
        )  # fmt: skip
    return layout(
        fig, "acceptance against context position", "anchor position p (bin start, thousands)", "tokens (tau)"
    )


def headroom_fig(rows: list[dict], k: int) -> go.Figure:
    """Per depth: the draft is the target's token (top-1 recall, the conditional acceptance) against the target's
    token is among the top-K candidates (`rows`: analysis.heads()["headroom"]["by_depth"])."""
    fig = go.Figure()
    ks = [r["depth"] for r in rows]
    fig.add_scatter(x=ks, y=[r["top1"] for r in rows], mode="lines+markers", name="top-1 (the draft)")
    fig.add_scatter(
        x=ks, y=[r["topk"] for r in rows], mode="lines+markers", name=f"top-{k} candidates", line=dict(dash="dot")
    )
    fig.update_layout(yaxis_range=[0, 1.02])
    fig.update_xaxes(dtick=1)
    return layout(fig, f"per depth: target's token is the draft vs among the top-{k}", "depth k", "share", height=360)


def stop_fig(rows: list[dict], threshold: float) -> go.Figure:
    """Per stop threshold t: tau of the walk verifying only drafts with confidence >= t (left) and drafts verified
    per round (right); a vertical line at the chosen t (`rows`: analysis.heads()["confidence"]["stop"])."""
    fig = go.Figure()
    ts = [r["threshold"] for r in rows]
    fig.add_scatter(x=ts, y=[r["tau"] for r in rows], mode="lines+markers", name="tau (macro)")
    fig.add_scatter(
        x=ts,
        y=[r["verified_per_round"] for r in rows],
        mode="lines+markers",
        name="drafts verified per round",
        yaxis="y2",
        line=dict(dash="dot"),
    )
    fig.add_vline(x=threshold, line=dict(color="#999", dash="dash"))
    fig.update_layout(yaxis2=right_axis("drafts verified"))
    fig.update_xaxes(range=[0, 1])
    return layout(fig, "verify only while confidence >= t", "threshold t", "tau (macro)", height=360)


def signatures_fig(rows: list[dict], run: str, reference: str) -> go.Figure:
    """One row per measured signature: the run's figure and the reference's, each with its 95 % interval (`rows`:
    analysis.signatures.compare); a separating signature's label is starred. All figures are shares or differences
    of shares, so one x axis holds them."""
    fig = go.Figure()
    shown = [r for r in rows if r["run"] is not None and r["reference"] is not None][::-1]
    labels = [("★ " if r["separates"] else "") + r["label"] for r in shown]
    for name, key, color in ((reference, "reference", "#888"), (run, "run", "#d62728")):
        lo = [r[key] - r[f"{key}_ci"][0] if r[f"{key}_ci"] else 0 for r in shown]
        hi = [r[f"{key}_ci"][1] - r[key] if r[f"{key}_ci"] else 0 for r in shown]
        fig.add_scatter(
            x=[r[key] for r in shown],
            y=labels,
            mode="markers",
            name=name,
            marker=dict(color=color, size=9),
            error_x=dict(type="data", array=hi, arrayminus=lo, thickness=1.5),
        )
    fig.update_xaxes(tickformat=".2f", zeroline=True)
    return layout(fig, "this run against the reference (★ separates)", "figure, 95 % interval", "", height=340)
