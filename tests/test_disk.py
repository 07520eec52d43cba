"""Disk known before work starts: an extraction states the bytes it will write (tokens x K*H*2 over the prompts
still to extract, plus a margin) and the free space under the workspace's feature folder, and refuses before any
work (no target loaded, no file written, no extraction row) when they do not fit, naming both figures and the ways
out. The free space is planted by monkeypatching `disk.free_bytes`."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from dflash_dash import cli, ops, pipeline
from dflash_dash.jobs import orchestrate
from dflash_dash.pipeline import disk
from dflash_dash.store import Store


def run(ws: Path, *args: str) -> tuple[int, str, str]:
    """The CLI's (exit code, stdout, stderr), captured here."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["--workspace", str(ws), *args])
    return rc, out.getvalue(), err.getvalue()


def expected_need(store: Store, set_name: str, width: int, topk: int = ops.TARGET_TOPK) -> tuple[int, int]:
    """(tokens, bytes with the margin) of extracting every prompt of `set_name` at `width` values per token, with
    the target's top-`topk` of every completion token (K int32 ids + K float32 log-probabilities + the tail mass)."""
    rows = store.completions(set_name)
    tokens = sum(len(r["prompt_ids"]) + len(r["output_ids"]) for r in rows)
    payload = tokens * width * 2 + (sum(len(r["output_ids"]) for r in rows) * (8 * topk + 4) if topk else 0)
    return tokens, payload + int(payload * disk.MARGIN_FRACTION) + disk.MARGIN_BYTES


def feature_files(ws: Path) -> set[Path]:
    return set((ws / "features").rglob("*")) if (ws / "features").exists() else set()


class Recorder:
    """A job's reporter stand-in: the steps and notes it was given."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, done, total, msg):
        self.lines.append(msg)

    step = note = lambda self, msg: self.lines.append(msg)
    result = lambda self, r: None  # noqa: E731


def test_plan_counts_the_prompts_still_to_extract(prepared):
    st = Store(prepared.workspace)
    e = st.extraction(prepared.extraction)
    width = len(e["layer_ids"]) * e["hidden_size"]
    tokens, need = expected_need(st, prepared.set_name, width, topk=0)
    p = disk.plan(st, prepared.set_name, list(e["layer_ids"]), str(prepared.target))
    assert (p.prompts, p.tokens, p.width, p.need) == (3, tokens, width, need)
    with_top = disk.plan(st, prepared.set_name, list(e["layer_ids"]), str(prepared.target), topk=64)
    assert with_top.need == expected_need(st, prepared.set_name, width, topk=64)[1] > need
    assert p.free > 0 and p.folder == prepared.workspace / "features"
    done = disk.plan(st, prepared.set_name, list(e["layer_ids"]), str(prepared.target), prepared.extraction)
    assert (done.prompts, done.tokens, done.need) == (0, 0, disk.MARGIN_BYTES)  # a finished extraction: nothing


def test_free_bytes_reads_the_nearest_existing_parent(tmp_path):
    assert disk.free_bytes(tmp_path / "not" / "yet") == disk.free_bytes(tmp_path) > 0


def test_a_normal_extraction_states_both_figures(workspace_copy, prepared, monkeypatch):
    real = disk.free_bytes
    seen = []
    monkeypatch.setattr(disk, "free_bytes", lambda folder: seen.append(real(folder)) or seen[-1])  # as it was read
    st = Store(workspace_copy)
    layers = list(st.extraction(prepared.extraction)["layer_ids"])
    rc, out, err = run(
        workspace_copy, "extract", "--target", str(prepared.target), "--completions", prepared.set_name,
        "--layers", ",".join(map(str, layers)),
    )  # fmt: skip
    assert rc == 0, err
    width = len(layers) * st.extraction(prepared.extraction)["hidden_size"]
    tokens, need = expected_need(st, prepared.set_name, width)
    line = next(x for x in err.splitlines() if x.startswith("disk: "))
    assert f"writes {disk.size(need)} ({tokens:,} tokens x {width * 2:,} bytes + " in line and "over 3 prompts" in line
    assert f"bytes of the target's top-{ops.TARGET_TOPK}" in line
    assert seen and f"{disk.size(seen[0])} free there" in line  # the free space of the disk, as read then
    assert st.extraction(out.strip())["status"] == "done"


def test_the_pipeline_states_the_figures_as_its_first_progress(workspace_copy, prepared):
    st = Store(workspace_copy)
    layers = list(st.extraction(prepared.extraction)["layer_ids"])
    seen: list[str] = []
    op = ops.Extract(target=str(prepared.target), completions=prepared.set_name, layers=layers)
    pipeline.extract(st, op, lambda d, t, m: seen.append(m))
    assert seen[0].startswith("disk: writes ") and seen[0].endswith(" free there")


def test_an_extraction_that_will_not_fit_is_refused_before_any_work(workspace_copy, prepared, monkeypatch):
    st = Store(workspace_copy)
    before, files = [e["id"] for e in st.extractions()], feature_files(workspace_copy)
    layers = list(st.extraction(prepared.extraction)["layer_ids"])
    monkeypatch.setattr(disk, "free_bytes", lambda folder: 5 << 20)  # 5 MiB free: less than the margin alone
    loaded = []
    monkeypatch.setattr("dflash_dash.target.load", lambda *a, **k: loaded.append(a))  # must never be reached
    args = ["extract", "--target", str(prepared.target), "--completions", prepared.set_name]
    rc, out, err = run(workspace_copy, *args, "--layers", ",".join(map(str, layers)))
    assert rc == 2 and out == ""
    error = err.strip().splitlines()[-1]
    width = len(layers) * st.extraction(prepared.extraction)["hidden_size"]
    _, need = expected_need(st, prepared.set_name, width)
    assert error.startswith("error: extraction needs ") and f"needs {disk.size(need)} for 3 prompts" in error
    assert "has 5.0 MiB free" in error and str(workspace_copy / "features") in error
    assert "fewer prompts" in error and "another disk" in error and "sweep --stream" in error
    # the pipeline itself refuses too (a job, a script), and so does the job's orchestration, before the server
    op = ops.Extract(target=str(prepared.target), completions=prepared.set_name, layers=layers)
    with pytest.raises(disk.DiskFull, match=r"has 5\.0 MiB free"):
        pipeline.extract(st, op, None)
    rep = Recorder()
    with pytest.raises(disk.DiskFull, match=r"has 5\.0 MiB free"):
        orchestrate.run_extract(st, op, rep)
    assert rep.lines and rep.lines[0].startswith("disk: writes ") and "5.0 MiB free there" in rep.lines[0]
    assert not loaded and feature_files(workspace_copy) == files
    assert [e["id"] for e in st.extractions()] == before  # no row, not even a failed one


def test_a_resumed_extraction_is_checked_on_what_is_left_and_keeps_its_status(workspace_copy, prepared, monkeypatch):
    st = Store(workspace_copy)
    ex = prepared.extraction
    e = st.extraction(ex)
    items = st.items(ex)
    keep = items[0]["prompt_id"]
    st.run("DELETE FROM extraction_items WHERE extraction_id = ? AND prompt_id <> ?", [ex, keep])
    st.set_status("extractions", ex, "failed")
    p = disk.plan(st, prepared.set_name, list(e["layer_ids"]), str(prepared.target), ex, topk=ops.TARGET_TOPK)
    left = [r for r in st.completions(prepared.set_name) if r["prompt_id"] != keep]
    assert p.prompts == 2 and p.tokens == sum(len(r["prompt_ids"]) + len(r["output_ids"]) for r in left)
    monkeypatch.setattr(disk, "free_bytes", lambda folder: p.need - 1)  # one byte short
    rc, _, err = run(
        workspace_copy, "extract", "--target", str(prepared.target), "--completions", prepared.set_name,
        "--layers", ",".join(map(str, e["layer_ids"])), "--resume", ex,
    )  # fmt: skip
    assert rc == 2 and re.search(r"needs [\d.]+ MiB for 2 prompts", err)
    assert st.extraction(ex)["status"] == "failed" and len(st.items(ex)) == 1  # untouched
    monkeypatch.setattr(disk, "free_bytes", lambda folder: p.need)  # exactly enough
    rc, out, err = run(
        workspace_copy, "extract", "--target", str(prepared.target), "--completions", prepared.set_name,
        "--layers", ",".join(map(str, e["layer_ids"])), "--resume", ex,
    )  # fmt: skip
    assert rc == 0, err
    assert st.extraction(ex)["status"] == "done" and len(st.items(ex)) == 3
