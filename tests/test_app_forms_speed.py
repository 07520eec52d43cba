"""The sampling job forms through streamlit.testing AppTest: the sampling temperature and verify rule of the Replay
(Acceptance), training sweep (Compare) and streaming (Extraction) forms, the Extraction form's target top-K, and the
Profile form in Acceptance's Predicted speedup section. Each form's refusal is said in its own labels before any job;
each job start is checked by the arguments the job records and by what it kept. Jobs are real processes (tiny
models on the CPU); the tests wait on the store."""

from __future__ import annotations

from apptest import app, by_label, clean
from waiting import wait_job

from dflash_dash import cli, ops
from dflash_dash.pipeline import disk, speed
from dflash_dash.store import Store

REJECTION = "rejection: drafts sampled at T"  # the verify rule's option, as the forms show it


def _cli(ws, *args: str) -> None:
    assert cli.main(["--workspace", str(ws), *args]) == 0, args


def errors(at) -> list[str]:
    assert not at.exception, [e.value for e in at.exception]
    return [e.value for e in at.error]


def test_replay_form_runs_at_a_temperature_with_the_rule_chosen(prepared, workspace_copy, monkeypatch):
    at = app(workspace_copy, monkeypatch, "acceptance")
    by_label(at.text_input, "checkpoint folder (config.json").input(str(prepared.drafters[1]))
    at.number_input(key="replay_temperature").set_value(0.7)
    rule = at.selectbox(key="replay_verify")
    rule.select(next(o for o in rule.options if o.startswith(REJECTION)))
    by_label(at.button, "Replay").click().run()
    clean(at)
    job = wait_job(workspace_copy, "replay")
    assert job["status"] == "done", job["error"]
    want = ops.Replay(
        drafter=str(prepared.drafters[1]), extraction=prepared.extraction, device="cpu", dtype="float32", force=True,
        temperature=0.7, verify="rejection",
    )  # fmt: skip
    assert job["args"] == want.to_args()
    s = Store(workspace_copy).run_row(job["result"]["run"])["summary"]
    assert (s["temperature"], s["verify"]) == (0.7, "rejection") and s["tau_expected"] is not None


def test_a_temperature_without_the_extractions_top_k_is_refused_in_each_form(prepared, workspace_copy, monkeypatch):
    """Replay and sweep at T on an extraction made with target top-K 0: refused in the form's words (its field, the
    Extraction page's field that fixes it; no CLI flag), no job."""
    ws = workspace_copy
    _cli(ws, "extract", "--target", str(prepared.target), "--completions", prepared.set_name, "--drafter",
         str(prepared.drafters[0]), "--target-topk", "0")  # fmt: skip
    bare = Store(ws).extractions()[-1]["id"]
    at = app(ws, monkeypatch, "acceptance")
    by_label(at.text_input, "checkpoint folder (config.json").input(str(prepared.drafters[0]))
    (box,) = [b for b in at.selectbox if b.label == "extraction"]
    box.set_value(bare)
    at.number_input(key="replay_temperature").set_value(0.7)
    by_label(at.button, "Replay").click().run()
    (err,) = errors(at)
    assert err.startswith("Sampling temperature T: extraction " + bare) and "target top-K 64" in err, err
    assert "--" not in err and "Extraction page" in err
    at = app(ws, monkeypatch, "compare", sweep=str(prepared.train))
    at.selectbox(key="sweep_ex").set_value(bare)
    at.number_input(key="sweep_temperature").set_value(0.7)
    by_label(at.button, "Start sweep").click().run()
    assert [e for e in errors(at) if e.startswith("Sampling temperature T: extraction " + bare)], errors(at)
    at.number_input(key="sweep_temperature").set_value(None)  # greedy: the same extraction is fine
    by_label(at.button, "Start sweep").click().run()
    assert not [e for e in errors(at) if "top-K" in e]
    job = wait_job(ws, "sweep")
    assert job["args"]["temperature"] is None and job["args"]["extraction"] == bare
    assert [j["kind"] for j in Store(ws).jobs()] == ["sweep"]  # the refusals started nothing


def test_the_extraction_forms_target_top_k_counts_on_the_disk_and_reaches_the_job(
    prepared, workspace_copy, monkeypatch
):
    """A disk with room for the features but not for the target's top-64: refused naming the target top-K field;
    top-K 0 then fits and is the job's."""
    st = Store(workspace_copy)
    layers = st.extraction(prepared.extraction)["layer_ids"]
    need = [disk.plan(st, prepared.set_name, layers, str(prepared.target), topk=k).need for k in (0, 64)]
    assert need[0] < need[1]
    monkeypatch.setattr(disk, "free_bytes", lambda folder: (need[0] + need[1]) // 2)  # the planted nearly full disk
    at = app(workspace_copy, monkeypatch, "extraction")
    assert by_label(at.number_input, "target top-K").value == ops.TARGET_TOPK
    by_label(at.checkbox, "extract again").check()
    by_label(at.button, "Extract").click().run()
    (err,) = errors(at)
    assert "extraction needs" in err and "**target top-K** field (64) adds 516 bytes a completion token" in err, err
    assert st.jobs() == []
    by_label(at.number_input, "target top-K").set_value(0)
    by_label(at.button, "Extract").click().run()
    clean(at)
    job = wait_job(workspace_copy, "extract")
    assert job["status"] == "done", job["error"]
    assert job["args"]["target_topk"] == 0
    assert st.extraction(job["result"]["extraction"])["versions"]["target_topk"] == 0


def test_the_streaming_form_evaluates_at_a_temperature(prepared, workspace_copy, monkeypatch):
    at = app(workspace_copy, monkeypatch, "extraction")
    by_label([w for w in at.text_input if w.key and w.key.startswith("stream_")], "checkpoint folder, or a").input(
        str(prepared.drafters[0])
    )
    at.number_input(key="stream_temperature").set_value(0.7)
    by_label(at.button, "Stream").click().run()
    clean(at)
    job = wait_job(workspace_copy, "replay")
    assert job["status"] == "done", job["error"]
    assert (job["args"]["stream"], job["args"]["temperature"], job["args"]["verify"]) == (True, 0.7, "target-sample")
    s = Store(workspace_copy).run_row(job["result"]["run"])["summary"]
    assert s["temperature"] == 0.7 and s["tau_expected"] is not None  # the stream computed the top-K itself


def test_the_profile_form_refuses_in_its_words_then_keeps_a_cost_table(prepared, workspace_copy, monkeypatch):
    """In Acceptance's Predicted speedup section, open while no table is kept: a bad context list and a mistyped
    drafter folder are named by their labels (no job); then a small CPU profile keeps a table the page prices with."""
    ws = workspace_copy
    at = app(ws, monkeypatch, "acceptance", run=prepared.runs[0])
    clean(at)
    assert [e for e in at.expander if e.label == "Measure a cost table"]
    assert by_label(at.text_input, "target model folder").value == str(prepared.target)  # the run's, by default
    assert by_label(at.text_input, "drafter checkpoint folder").value == str(prepared.drafters[0])
    by_label(at.text_input, "context lengths").input("8,x")
    by_label(at.button, "Profile").click().run()
    assert errors(at) == ["Context lengths '8,x': give positive token counts like [512, 2048, 8192]"]
    by_label(at.text_input, "context lengths").input("8,32")
    by_label(at.text_input, "drafter checkpoint folder").input(str(prepared.drafters[0]) + "x")
    by_label(at.button, "Profile").click().run()
    (err,) = errors(at)
    assert err.startswith("Drafter checkpoint folder ") and "no such folder" in err, err
    assert Store(ws).jobs() == []
    by_label(at.text_input, "drafter checkpoint folder").input(str(prepared.drafters[0]))
    by_label(at.text_input, "new tokens per target forward").input("1,2")
    at.number_input(key="profile_repeats").set_value(1)
    by_label(at.button, "Profile").click().run()
    clean(at)
    job = wait_job(ws, "profile")
    assert job["status"] == "done", job["error"]
    assert (job["args"]["contexts"], job["args"]["sizes"], job["args"]["device"]) == ([8, 32], [1, 2], "cpu")
    assert [t["id"] for t in speed.tables(Store(ws))] == [job["result"]["costs"]]
    at = app(ws, monkeypatch, "acceptance", run=prepared.runs[0])
    clean(at)
    assert [m for m in at.metric if m.label == "Predicted speedup" and m.value.endswith("×")]
