"""Typed rows, resolved once: the store's queries return frozen dataclasses (`dflash_dash/store/rows.py`), and one
replay job reads each checkpoint's config.json once (`dflash_dash/drafters/checkpoint.py`'s per-process caches)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from dflash_dash.drafters import checkpoint
from dflash_dash.jobs import dispatch
from dflash_dash.store import Completion, Extraction, Item, Job, PromptSet, Run, Store, StoreError


def test_queries_return_frozen_rows(prepared):
    st = Store(prepared.workspace)
    run = st.run_row(prepared.runs[0])
    assert isinstance(run, Run) and run.id == prepared.runs[0]
    assert run.extraction_id == prepared.extraction and run.set_name == prepared.set_name
    assert run.target_path and run.backend  # the extraction's, joined as `runs()` joins them
    assert [r.id for r in st.runs() if r.id in prepared.runs] == prepared.runs
    assert st.run_row("latest").id == max(st.runs(), key=lambda r: (r.created, r.id)).id
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.summary = {}  # type: ignore[misc]
    # the two block sizes, named apart: the verify width B and D = B - 1 drafted per round; the config's own
    assert run.draft_len == run.block_size - 1 == run.summary["block_size"] - 1
    cfg = json.loads((Path(run.checkpoint) / "config.json").read_text())
    assert run.config_block == cfg["block_size"]

    ex = st.extraction(prepared.extraction)
    assert isinstance(ex, Extraction) and ex.set_name == prepared.set_name
    assert ex.prompts == len(st.items(ex.id)) > 0 and all(isinstance(i, Item) for i in st.items(ex.id))
    assert ex == next(e for e in st.extractions() if e.id == ex.id)  # one shape from either query
    comps = st.completions(prepared.set_name)
    assert comps and all(isinstance(c, Completion) and c.set_name == prepared.set_name for c in comps)
    assert st.completion(prepared.set_name, comps[0].prompt_id) == comps[0]
    assert {s.name for s in st.sets()} >= {prepared.set_name} and all(isinstance(s, PromptSet) for s in st.sets())
    with pytest.raises(StoreError, match="no run with id 'nope'"):
        st.run_row("nope")


def test_job_row_and_a_copy_with_changes(workspace_copy):
    st = Store(workspace_copy)
    st.add_job("job-t", "replay", {"drafter": "d"}, "t.log")
    st.update_job("job-t", progress=0.5, result={"run": "r"})
    job = st.job("job-t")
    assert isinstance(job, Job) and job.args == {"drafter": "d"} and job.progress == 0.5
    assert job.result == {"run": "r"} and job.status == "queued" and not job.dismissed
    done = job | {"status": "done"}  # a changed copy; the row read stays as it was
    assert done.status == "done" and job.status == "queued" and done.id == job.id
    assert job | {"note": 1} == job.as_dict() | {"note": 1}  # not a column: the plain dict (input to add_*)


def test_one_replay_job_reads_each_config_once(prepared, workspace_copy, monkeypatch):
    """The body of one replay job, in this process: validated, matched against stored runs, replayed, stored
    and analysed, every step asking for the drafter's config; the file is read once."""
    reads: Counter[Path] = Counter()
    real = checkpoint._read

    def counted(f: Path) -> bytes:
        reads[f] += 1
        return real(f)

    monkeypatch.setattr(checkpoint, "_read", counted)
    checkpoint.forget()  # this process may have read it for an earlier test
    st = Store(workspace_copy)
    ck = prepared.drafters[1]
    args = {"drafter": str(ck), "extraction": prepared.extraction, "tree_budget": 3, "force": True}
    st.add_job("job-r", "replay", args, str(workspace_copy / "r.log"))
    assert dispatch.execute(st, "job-r") == 0, st.job("job-r").error
    assert st.run_row(st.job("job-r").result["run"]).checkpoint == str(ck.resolve())
    assert reads == {(ck / "config.json").resolve(): 1}


def test_a_rewritten_config_is_read_again(prepared, tmp_path, monkeypatch):
    reads: list[Path] = []
    real = checkpoint._read
    monkeypatch.setattr(checkpoint, "_read", lambda f: reads.append(f) or real(f))
    ck = tmp_path / "ck"
    shutil.copytree(prepared.drafters[0], ck)
    f = ck / "config.json"
    assert checkpoint.raw_config(checkpoint.locate(ck)) == checkpoint.raw_config(checkpoint.locate(ck))
    assert len(reads) == 1
    raw = json.loads(f.read_text())
    f.write_text(json.dumps(raw | {"block_size": raw["block_size"] * 2}))  # a config edited in place
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a later mtime even on a coarse clock
    assert checkpoint.raw_config(checkpoint.locate(ck))["block_size"] == raw["block_size"] * 2
    assert len(reads) == 2
