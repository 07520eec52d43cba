"""Navigation and job hygiene: dismissing failed jobs, checking a (re-)extraction before a job
starts (page and CLI say the same), Overview's runs grouped per extraction with human labels and links, and the
store-only CLI listings running without torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from apptest import app, clean
from serving import ENV

from dflash_dash import cli, metrics, pipeline
from dflash_dash.jobs import gpu, orchestrate
from dflash_dash.store import Store, StoreError

NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # hides every GPU from CUDA, so this machine's devices are ["cpu"]


# ---------------------------------------------------------------------------
# dismissed jobs


def test_only_failed_or_cancelled_jobs_can_be_dismissed_and_the_cli_still_lists_them(tmp_path, capsys):
    st = Store(tmp_path)
    for jid, status in [("job-a", "failed"), ("job-b", "done"), ("job-c", "cancelled"), ("job-d", "running")]:
        st.add_job(jid, "replay", {}, str(tmp_path / f"{jid}.log"))
        st.update_job(jid, status=status, pid=None)
    st.dismiss_job("job-a")
    st.dismiss_job("job-c")
    for jid in ("job-b", "job-d"):
        with pytest.raises(StoreError, match=f"job {jid} is .*only failed or cancelled jobs can be dismissed"):
            st.dismiss_job(jid)
    with pytest.raises(StoreError, match="no job with id 'job-x'"):
        st.dismiss_job("job-x")
    assert {j["id"] for j in st.jobs(dismissed=False)} == {"job-b", "job-d"}
    assert {j["id"]: j["dismissed"] for j in st.jobs()} == {
        "job-a": True,
        "job-b": False,
        "job-c": True,
        "job-d": False,
    }
    assert [j["id"] for j in st.jobs("failed", dismissed=False)] == []
    capsys.readouterr()
    assert cli.main(["--workspace", str(tmp_path), "jobs"]) == 0
    listed = {j["id"]: j["dismissed"] for j in json.loads(capsys.readouterr().out)}
    assert listed["job-a"] is True and listed["job-c"] is True and listed["job-b"] is False


# ---------------------------------------------------------------------------
# checking an extraction before it starts


def test_a_device_the_machine_lacks_is_refused_in_the_same_words_by_check_and_cli(
    prepared, workspace_copy, monkeypatch, capsys
):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    st = Store(workspace_copy)
    ex = st.extraction(prepared.extraction)
    assert gpu.devices() == ["cpu"]
    with pytest.raises(pipeline.InputError) as err:
        orchestrate.check_extract(st, ex["target_path"], ex["set_name"], ex["layer_ids"], "cuda", "float32")
    msg = str(err.value)
    assert msg.startswith("device 'cuda': this machine has no CUDA GPU") and "set device to cpu" in msg
    with pytest.raises(pipeline.InputError, match="device 'gpu0': expected cpu, cuda or cuda:N"):
        orchestrate.check_extract(st, ex["target_path"], ex["set_name"], ex["layer_ids"], "gpu0", "float32")
    n_ex, n_jobs = len(st.extractions()), len(st.jobs())
    capsys.readouterr()
    for mode in ("none", "release"):
        rc = cli.main(
            [
                "--workspace",
                str(workspace_copy),
                "extract",
                "--target",
                ex["target_path"],
                "--completions",
                ex["set_name"],
                "--layers",
                ",".join(map(str, ex["layer_ids"])),
                "--device",
                "cuda",
                "--orchestrate",
                mode,
            ]
        )
        assert rc == 2 and capsys.readouterr().err.strip() == f"error: {msg}"
    assert len(st.extractions()) == n_ex and len(st.jobs()) == n_jobs


def test_a_gpu_index_beyond_the_machines_is_refused(prepared):
    st = Store(prepared.workspace)
    ex = st.extraction(prepared.extraction)
    n = len(gpu.devices()) - 1  # GPUs visible here: cuda:n is one too many on any machine
    with pytest.raises(pipeline.InputError, match=f"device 'cuda:{n}': this machine has no"):
        orchestrate.check_extract(st, ex["target_path"], ex["set_name"], ex["layer_ids"], f"cuda:{n}", "float32")


def test_duplicates_are_named(prepared):
    st = Store(prepared.workspace)
    ex = st.extraction(prepared.extraction)
    args = (st, ex["target_path"], ex["set_name"], ex["layer_ids"])
    warns = orchestrate.check_extract(*args, ex["device"], ex["dtype"])
    assert len(warns) == 1 and warns[0].startswith(f"extraction {ex['id']} (done, backend {ex['backend']})")
    other = "bfloat16" if ex["dtype"] == "float32" else "float32"
    assert orchestrate.check_extract(*args, ex["device"], other) == []
    sub = orchestrate.check_extract(
        st, ex["target_path"], ex["set_name"], ex["layer_ids"][:-1], ex["device"], ex["dtype"]
    )
    assert len(sub) == 1 and "would duplicate it (each drafter replays on its own layers of it)" in sub[0]
    absent = [max(ex["layer_ids"]) + 1]  # a layer it does not hold
    assert orchestrate.check_extract(st, ex["target_path"], ex["set_name"], absent, ex["device"], ex["dtype"]) == []
    assert (
        orchestrate.check_extract(*args, ex["device"], ex["dtype"], resume=ex["id"]) == []
    )  # resuming it is no duplicate


def reextract(at, ex_id: str):
    next(b for b in at.button if b.label == "Re-extract").click().run()
    return at


def test_reextract_with_a_device_the_machine_lacks_starts_no_job(prepared, workspace_copy, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    st = Store(workspace_copy)
    ex = st.extraction(prepared.extraction)
    at = reextract(app(workspace_copy, monkeypatch, "extraction"), ex["id"])
    clean(at)
    assert at.text_input(key=f"rx_{ex['id']}_device").value == "cpu"  # this machine's default
    at.text_input(key=f"rx_{ex['id']}_device").set_value("cuda").run()
    with pytest.raises(pipeline.InputError) as err:
        orchestrate.check_extract(st, ex["target_path"], ex["set_name"], ex["layer_ids"], "cuda", "float32")
    assert [e.value for e in at.error] == [str(err.value)]
    assert at.button(key=f"rx_{ex['id']}_go").disabled  # refused: nothing to press
    assert st.jobs() == [] and [e["id"] for e in st.extractions()] == [ex["id"]]


def test_reextract_warns_of_a_duplicate_and_needs_a_tick(prepared, workspace_copy, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    st = Store(workspace_copy)
    ex = st.extraction(prepared.extraction)
    assert (ex["device"], ex["dtype"]) == ("cpu", "float32")  # the defaults on a machine without CUDA
    at = reextract(app(workspace_copy, monkeypatch, "extraction"), ex["id"])
    clean(at)
    assert [w.value for w in at.warning if ex["id"] in w.value and "duplicate" in w.value]
    assert at.checkbox(key=f"rx_{ex['id']}_again").value is False
    assert at.button(key=f"rx_{ex['id']}_go").disabled
    at.checkbox(key=f"rx_{ex['id']}_again").check().run()
    assert not at.button(key=f"rx_{ex['id']}_go").disabled
    at.selectbox(key=f"rx_{ex['id']}_dtype").set_value("bfloat16").run()  # another dtype: no duplicate
    assert not [w for w in at.warning if "duplicate" in w.value]
    assert not at.button(key=f"rx_{ex['id']}_go").disabled
    assert st.jobs() == []


# ---------------------------------------------------------------------------
# Overview: runs grouped per extraction, human labels, links


def test_overview_groups_runs_per_extraction_with_labels_and_links(prepared, monkeypatch):
    st = Store(prepared.workspace)
    at = app(prepared.workspace, monkeypatch)
    clean(at)
    exs = {e["id"]: e for e in st.extractions()}
    assert [x.label for x in at.expander] == [
        f"Extraction {e} · {'fla kernels (GPU)' if exs[e]['backend'] == 'fla' else 'torch path (CPU fallback)'} · "
        f"set {exs[e]['set_name']} · {exs[e]['device']} {exs[e]['dtype']} · {len(prepared.runs)} runs"
        " · imported: sampling not recorded"  # how the set was sampled (an imported set does not say)
        for e in [prepared.extraction]
    ]
    df = at.dataframe[0].value
    headline = [metrics.BY_KEY[k].label for k in ("tau_macro", "tau_pooled", "every_anchor_tau")]
    assert set(headline) <= set(df.columns)
    assert not {"tau_macro", "tau_pooled", "sliding_block", "id", "extraction_id"} & set(df.columns)
    runs = {r["id"]: r for r in st.runs()}
    want = sorted(prepared.runs, key=lambda r: runs[r]["name"])  # by checkpoint within the extraction
    assert list(df["run id"]) == want
    assert list(df["open"]) == [f"acceptance?run={r}" for r in want]
    assert list(df["checkpoint"]) == [runs[r]["name"] for r in want]
    assert list(df["tau (macro)"]) == [f"{runs[r]['summary']['tau_macro']:.2f}" for r in want]


# ---------------------------------------------------------------------------
# store-only listings without torch


def test_listings_never_import_torch(prepared, workspace_copy):
    code = (
        "import sys, json, io, contextlib\n"
        "from dflash_dash import cli\n"
        "out = {}\n"
        "for c in ('runs', 'extractions', 'jobs'):\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf):\n"
        f"        assert cli.main(['--workspace', {str(workspace_copy)!r}, c]) == 0\n"
        "    out[c] = json.loads(buf.getvalue())\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'out': out}))\n"
    )
    got = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    res = json.loads(got.stdout)
    assert res["torch"] is False
    assert [r["id"] for r in res["out"]["runs"]] == prepared.runs
    assert [e["id"] for e in res["out"]["extractions"]] == [prepared.extraction]
    assert res["out"]["jobs"] == []
