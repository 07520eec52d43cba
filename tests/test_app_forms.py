"""The pages' job forms through streamlit.testing AppTest: where a job runs (device, this host's GPUs or a Ray
cluster, `jobs_view.where_inputs`, on every form), the Extraction page's streaming form (a checkpoint folder is a
`replay --stream` job, a training folder a `sweep --stream` job) and its disk check before any job. Jobs are real
processes; the tests poll the store with a deadline. The Ray cluster itself: tests/test_ray.py."""

from __future__ import annotations

from apptest import app, by_label, clean
from waiting import wait_job

from dflash_dash import ops
from dflash_dash.pipeline import disk
from dflash_dash.store import Store


def inputs(at, prefix: str):
    """The text inputs of one form (their keys start with `prefix`)."""
    return [w for w in at.text_input if w.key and w.key.startswith(prefix)]


def test_a_checkpoint_folder_streams_as_a_replay_of_every_anchor(prepared, workspace_copy, monkeypatch):
    at = app(workspace_copy, monkeypatch, "extraction")
    clean(at)
    form = inputs(at, "stream_")
    assert by_label(form, "target model folder").value  # the newest extraction's target, by default
    by_label(form, "checkpoint folder, or a training").input(str(prepared.drafters[1]))
    by_label(at.button, "Stream").click().run()
    clean(at)
    job = wait_job(workspace_copy, "replay")
    assert job["status"] == "done", job["error"]
    st = Store(workspace_copy)
    want = ops.Replay(
        drafter=str(prepared.drafters[1]), stream=True, target=str(prepared.target), completions=prepared.set_name,
        force=True, device="cpu", dtype="float32",
    )  # fmt: skip
    assert job["args"] == want.to_args()
    run = st.run_row(job["result"]["run"])
    assert st.extraction(run["extraction_id"])["versions"]["streamed"]
    assert run["summary"].get("every_anchor_tau") is not None  # every anchor, as the Replay form's runs
    assert not list((workspace_copy / "features").glob(f"{run['extraction_id']}*"))  # no feature file


def test_a_training_folder_streams_as_a_sweep(prepared, workspace_copy, monkeypatch):
    at = app(workspace_copy, monkeypatch, "extraction")
    by_label(inputs(at, "stream_"), "checkpoint folder, or a training").input(str(prepared.train))
    by_label(at.button, "Stream").click().run()
    clean(at)
    job = wait_job(workspace_copy, "sweep")
    assert job["status"] == "done", job["error"]
    assert (job["args"]["checkpoints"], job["args"]["stream"]) == (str(prepared.train), True)
    assert len(job["result"]["runs"]) == 2


def test_the_streaming_form_refuses_a_mistyped_folder_before_any_job(prepared, workspace_copy, monkeypatch):
    at = app(workspace_copy, monkeypatch, "extraction")
    by_label(inputs(at, "stream_"), "checkpoint folder, or a training").input(str(prepared.train) + "x")
    by_label(at.button, "Stream").click().run()
    assert not at.exception
    assert [e.value for e in at.error if "no such folder" in e.value], [e.value for e in at.error]
    assert Store(workspace_copy).jobs() == []


def test_an_extraction_that_would_not_fit_is_refused_in_the_page(prepared, workspace_copy, monkeypatch):
    """The page checks the disk before the job (as the CLI does): both figures, the ways out, and the streaming
    form on the same page; no job starts."""
    monkeypatch.setattr(disk, "free_bytes", lambda folder: 1 << 20)  # 1 MiB free: the planted full disk
    at = app(workspace_copy, monkeypatch, "extraction")
    by_label(at.text_input, "…or explicit layer ids").input("1,4")
    by_label(at.checkbox, "extract again").check()
    by_label(at.button, "Extract").click().run()
    assert not at.exception
    errs = [e.value for e in at.error]
    assert len(errs) == 1 and "extraction needs" in errs[0] and "1.0 MiB free" in errs[0], errs
    assert "**Evaluate without feature files** below" in errs[0]
    assert Store(workspace_copy).jobs() == []


def test_every_job_form_takes_where_it_runs_and_refuses_a_bad_ray_address(prepared, workspace_copy, monkeypatch):
    """Extraction, streaming, replay and sweep forms share the device / GPUs / Ray cluster inputs; a Ray address
    that is not HOST:PORT is named in the page (the op's own check) and no job starts."""
    at = app(workspace_copy, monkeypatch, "extraction")
    for prefix in ("extract_", "stream_"):
        assert {"device", "GPUs", "Ray cluster"} <= {w.label for w in inputs(at, prefix)}
    by_label(inputs(at, "stream_"), "checkpoint folder, or a training").input(str(prepared.train))
    by_label(inputs(at, "stream_"), "Ray cluster").input("ray://head:10001")
    by_label(at.button, "Stream").click().run()
    assert not at.exception
    assert any("a ray:// address is a Ray Client's" in e.value for e in at.error), [e.value for e in at.error]
    at = app(workspace_copy, monkeypatch, "acceptance")
    assert {"device", "GPUs", "Ray cluster"} <= {w.label for w in inputs(at, "replay_")}
    at = app(workspace_copy, monkeypatch, "compare", sweep=str(prepared.train))
    assert {"device", "GPUs", "Ray cluster"} <= {w.label for w in inputs(at, "sweep_")}
    by_label(inputs(at, "sweep_"), "GPUs").input("0,x")
    by_label(at.button, "Start sweep").click().run()
    assert not at.exception
    assert any("'x' is not a device" in e.value for e in at.error), [e.value for e in at.error]
    assert Store(workspace_copy).jobs() == []


def test_a_new_extraction_like_an_existing_one_needs_a_tick_then_runs(prepared, workspace_copy, monkeypatch):
    at = app(workspace_copy, monkeypatch, "extraction")
    layers = by_label(at.text_input, "…or explicit layer ids").value  # the newest extraction's, by default
    by_label(at.button, "Extract").click().run()
    dup = [w.value for w in at.warning if "would duplicate it" in w.value]
    assert dup and "Tick **extract again" in dup[0]
    assert Store(workspace_copy).jobs() == []
    by_label(at.checkbox, "extract again").check()
    by_label(at.button, "Extract").click().run()
    clean(at)
    job = wait_job(workspace_copy, "extract")
    assert job["status"] == "done", job["error"]
    want = ops.Extract(
        target=str(prepared.target), completions=prepared.set_name, layers=layers, device="cpu", dtype="float32"
    )
    assert job["args"] == want.to_args()
    assert Store(workspace_copy).extraction(job["result"]["extraction"])["status"] == "done"
