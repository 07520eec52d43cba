"""The why-drafts-fail sections through AppTest on the prepared workspace: calibration and failure patterns on
Acceptance (CSV downloads, worst-span links that outline their positions), calibration overlaid on Compare, and
target-layer attribution on Diagnostics (the button starts the job, the chart follows)."""

from __future__ import annotations

import csv
import io

from apptest import app, by_label, clean, htmls
from waiting import wait_job

from dflash_dash import drafters as dr, ops, pipeline
from dflash_dash.analysis import patterns
from dflash_dash.analysis.calibration import calibration
from dflash_dash.render.formats import csv_text, fmt, prob
from dflash_dash.store import Store


def charts(at) -> list[str]:
    """The titles of the page's plotly charts."""
    import json

    out = []
    for c in at.get("plotly_chart"):
        spec = json.loads(c.proto.spec)
        out.append(((spec.get("layout") or {}).get("title") or {}).get("text", ""))
    return out


def downloads(at) -> list[str]:
    return [d.proto.label for d in at.get("download_button")]


def test_sections_are_drawn_only_when_chosen(prepared, monkeypatch):
    """Acceptance opens without its calibration and failure-pattern sections (so the page draws fast); the
    section picker draws the chosen one and keeps it in the URL (&section=...), and a link with it opens it."""
    rid = prepared.runs[0]
    at = app(prepared.workspace, monkeypatch, "acceptance", run=rid)
    clean(at)
    assert "Calibration" not in [s.value for s in at.subheader] and "reliability bins (CSV)" not in downloads(at)
    assert not any("reliability diagram" in t or "acceptance by class" in t for t in charts(at))
    assert "section" not in at.query_params
    at.get("segmented_control")[0].set_value("patterns").run()
    clean(at)
    assert "Failure patterns" in [s.value for s in at.subheader] and "Calibration" not in [
        s.value for s in at.subheader
    ]
    assert "acceptance by class of the target token at slot 1" in charts(at)
    assert at.query_params["section"] == "patterns"
    at.get("segmented_control")[0].set_value(None).run()
    clean(at)
    assert "section" not in at.query_params and "worst spans (CSV)" not in downloads(at)
    at = app(prepared.workspace, monkeypatch, "compare", a=prepared.runs[0], b=prepared.runs[1])
    clean(at)
    assert "Calibration, A and B" not in [s.value for s in at.subheader]
    # the runs side by side (one chart of tau per run and category) and the pair; no section's chart yet
    assert len(at.get("plotly_chart")) == 1 and "section" not in at.query_params
    at.get("segmented_control")[0].set_value("lag").run()
    clean(at)
    assert at.query_params["section"] == "lag"
    assert "one-position draft lag per slot" in " ".join(c.proto.spec for c in at.get("plotly_chart"))


def test_acceptance_shows_calibration_with_formulas(prepared, monkeypatch):
    rid = prepared.runs[0]
    at = app(prepared.workspace, monkeypatch, "acceptance", run=rid, section="calibration")
    clean(at)
    st_ = Store(prepared.workspace)
    cal = calibration(st_.prompts(rid), 4, st_.run_row(rid)["tree_budget"])
    m = {x.label: x.value for x in at.metric}
    assert m["calibration ECE (pooled over depths)"] == prob(cal["calibration_ece"])
    assert m["expected tau (macro)"] == fmt(cal["expected_tau"])
    assert m["expected tau (pooled)"] == fmt(cal["expected_tau_pooled"])
    captions = " ".join(c.value for c in at.caption)
    assert "(n_b / N) * |observed_b - predicted_b|" in captions and "prod_{j<=k} p_j" in captions
    titles = charts(at)
    assert "reliability diagram (pooled over depths)" in titles and "expected vs observed tau per prompt" in titles
    by_label(at.selectbox, "reliability diagram: depth").set_value("depth 2").run()
    clean(at)
    assert "reliability diagram (depth 2)" in charts(at)
    for label in ("reliability bins (CSV)", "per-depth calibration (CSV)", "expected vs observed tau per prompt (CSV)"):
        assert label in downloads(at)


def test_acceptance_shows_failure_patterns_with_downloads_and_links(prepared, monkeypatch):
    rid = prepared.runs[0]
    at = app(prepared.workspace, monkeypatch, "acceptance", run=rid, section="patterns")
    clean(at)
    st_ = Store(prepared.workspace)
    exp = pipeline.export(st_, rid)["patterns"]
    frames = [d.value for d in at.dataframe]
    by_class = next(f for f in frames if "class" in f.columns)
    assert list(by_class["class"]) == list(patterns.CLASSES)
    assert list(by_class["rounds"]) == [r["rounds"] for r in exp["by_class"]]
    assert by_class["rounds"].sum() == st_.run_row(rid)["summary"]["rounds"]
    spans = next(f for f in frames if "link" in f.columns)
    assert list(spans["link"]) == [s["link"] for s in exp["worst_spans"]]
    for title in (
        "by token class",
        "by position in the completion",
        "by context length",
        "against context position",
        "most frequent rejections",
        "worst spans",
    ):
        assert f"{title} (CSV)" in downloads(at)
    assert "acceptance by class of the target token at slot 1" in charts(at)
    assert "acceptance against context position" in charts(at)
    ctx = next(f for f in frames if "from_thousands" in f.columns)
    assert list(ctx["samples"]) == [r["samples"] for r in exp["context_position"]]
    assert ctx["samples"].sum() == sum(int((p.accepted_at[:-1] >= 0).sum()) for p in st_.prompts(rid))
    assert ctx["rounds"].sum() == st_.run_row(rid)["summary"]["rounds"]
    limits = dr.context_limits(st_.run_row(rid)["config"])  # named under the chart
    assert limits and any("; ".join(label for _, label in limits) in c.value for c in at.caption)
    links = [m.value for m in at.markdown if "open in the token view" in m.value]
    assert len(links) == len(exp["worst_spans"]) and exp["worst_spans"][0]["link"] in links[0]
    # the CSV a button offers is the table
    btn = next(d for d in at.get("download_button") if d.proto.label == "worst spans (CSV)")
    assert btn.proto.label  # the data itself is served by the media file manager; the table is checked above
    rows = list(csv.DictReader(io.StringIO(csv_text(exp["worst_spans"]))))
    assert [r["link"] for r in rows] == list(spans["link"])


def test_worst_span_link_opens_the_prompt_with_the_span_outlined(prepared, monkeypatch):
    rid = prepared.runs[0]
    span = pipeline.export(Store(prepared.workspace), rid)["patterns"]["worst_spans"][0]
    at = app(
        prepared.workspace,
        monkeypatch,
        "acceptance",
        run=rid,
        prompt=span["prompt"],
        pos=f"{span['start']}-{span['end']}",
    )
    clean(at)
    assert by_label(at.selectbox, "prompt").value == span["prompt"]
    view = next(h for h in htmls(at) if 'class="dfv"' in h and "pos " in h)
    assert view.split("</style>", 1)[1].count("dfv-x") == span["end"] - span["start"] + 1
    assert any(f"positions {span['start']}–{span['end']} from the link" in c.value for c in at.caption)
    # another prompt: the span belonged to the first one, so nothing is outlined and pos leaves the URL
    other = next(p for p in ("html-script", "code-add", "drafted") if p != span["prompt"])
    by_label(at.selectbox, "prompt").set_value(other).run()
    clean(at)
    view = next(h for h in htmls(at) if 'class="dfv"' in h and "pos " in h)
    assert "dfv-x" not in view.split("</style>", 1)[1] and "pos" not in at.query_params


def test_run_without_draft_probabilities_says_replay_again(prepared, workspace_copy, monkeypatch):
    rid = prepared.runs[1]
    st_ = Store(workspace_copy)  # a run stored before draft log-probabilities and kept analyses existed
    st_.put_prompts(rid, [dict(r, draft_logp=None) for r in st_.run_prompts(rid)])
    st_.run("DELETE FROM run_analyses WHERE run_id = ?", [rid])
    at = app(workspace_copy, monkeypatch, "acceptance", run=rid, section="calibration")
    clean(at)
    assert any("not recorded, replay again" in i.value for i in at.info)
    assert "calibration ECE (pooled over depths)" not in {m.label for m in at.metric}
    at = app(workspace_copy, monkeypatch, "acceptance", run=rid, section="patterns")
    clean(at)
    assert "acceptance by class of the target token at slot 1" in charts(at)  # patterns need no probabilities
    at = app(workspace_copy, monkeypatch, "compare", a=prepared.runs[0], b=rid, section="calibration")
    clean(at)
    assert any("not recorded, replay again" in i.value for i in at.info)


def test_compare_overlays_both_runs_calibration(prepared, monkeypatch):
    a, b = prepared.runs
    at = app(prepared.workspace, monkeypatch, "compare", a=a, b=b, section="calibration")
    clean(at)
    st_ = Store(prepared.workspace)
    table = next(
        d.value
        for d in at.dataframe
        if "metric" in d.value.columns and "calibration ECE (pooled over depths)" in list(d.value["metric"])
    )
    names = [f"A {st_.run_row(a)['name']}", f"B {st_.run_row(b)['name']}"]
    assert list(table.columns) == ["metric", *names, "formula"]
    for rid, name in zip((a, b), names):
        cal = calibration(st_.prompts(rid), 4, 8)
        assert table.set_index("metric").loc["calibration ECE (pooled over depths)", name] == fmt(
            cal["calibration_ece"]
        )
    import json

    rel = next(
        json.loads(c.proto.spec)
        for c in at.get("plotly_chart")
        if "reliability diagram" in json.dumps(json.loads(c.proto.spec).get("layout", {}).get("title"))
    )
    traced = {t.get("name") for t in rel["data"]}
    assert {f"{n}: observed" for n in names} <= traced
    assert "reliability bins, both runs (CSV)" in downloads(at)


def test_attribute_button_starts_the_job_and_the_chart_follows(prepared, workspace_copy, monkeypatch):
    rid = prepared.runs[0]
    at = app(workspace_copy, monkeypatch, "diagnostics", run=rid)
    clean(at)
    assert any("not attributed yet" in i.value for i in at.info)
    by_label(at.button, "Attribute").click().run()
    clean(at)
    job = wait_job(workspace_copy, "attribute")
    assert job["status"] == "done", job
    assert job["args"] == ops.Attribute(run=rid).to_args() and job["result"] == {"run": rid, "taps": 2}
    at.run()
    clean(at)
    assert "tau lost with each target-layer tap replaced by its mean" in charts(at)
    frame = next(d.value for d in at.dataframe if "tau_lost_macro" in d.value.columns)
    assert list(frame["layer_id"]) == Store(workspace_copy).extraction(prepared.extraction)["layer_ids"]
    assert "attribution (CSV)" in downloads(at)
    assert any(b.label == "Attribute again" for b in at.button)


def rounded(x, digits: int = 12):
    """`x` (nested JSON values) with floats to `digits` significant digits: sums taken in another order agree."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [rounded(v, digits) for v in x]
    return x


def test_kept_analyses_equal_a_fresh_computation(prepared, workspace_copy):
    """The store step keeps the four analyses computed from its rows in hand (one read of the run, the calibration
    from the summary it has just computed): each equals the analysis computed again from the rows read back (the
    calibration's sums to 12 digits: the summary summed the replay's arrays, in another order)."""
    st_, copy = Store(prepared.workspace), Store(workspace_copy)
    for rid in prepared.runs[:2]:
        kept = {name: st_.analysis(rid, name) for name in pipeline.ANALYSES}
        fresh = pipeline.keep(copy, rid, pipeline.ANALYSES)  # rows from the store, the summary recomputed
        assert all(kept.values()) and kept.keys() == fresh.keys()
        for name in pipeline.ANALYSES:
            same = rounded if name == "calibration" else (lambda x: x)
            assert same(kept[name]) == same(fresh[name]), name


def test_a_patterns_analysis_kept_before_the_context_view_is_computed_again(prepared, workspace_copy):
    st_ = Store(workspace_copy)
    rid = prepared.runs[0]
    kept = pipeline.analysis(st_, rid, "patterns")
    old = {k: v for k, v in kept.items() if k != "context_position"}
    st_.set_analysis(rid, "patterns", old)
    again = pipeline.analysis(st_, rid, "patterns")
    assert again["context_position"] == kept["context_position"] and again["context_position"]
    assert "context_position" in st_.analysis(rid, "patterns")  # kept again, with the new table
