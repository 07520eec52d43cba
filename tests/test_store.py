"""The DuckDB store: schema version and forward migrations, and several processes writing and reading one
workspace at once (two writer processes acting as jobs, a reader process and this process) with no lock
error and exact row counts; a writer killed while holding the lock does not wedge the workspace."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import duckdb
import pytest

from dflash_dash import store as store_mod
from dflash_dash.store import Store, StoreError
from serving import ENV, ROOT, until

N = 60  # completions each writer commits (each store call is a short connection, ~20 ms)

WRITER = """
import sys
from dflash_dash.store import Store
ws, name, job, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
st = Store(ws)
st.add_set(name, "hammer")
for i in range(n):
    st.add_completion(name, {"id": f"p{i}", "idx": i, "prompt_ids": [1, 2, i], "output_ids": [i] * 5,
                             "meta_info": {"i": i}})
    st.update_job(job, progress=(i + 1) / n, step=f"wrote {i + 1}/{n}", status="running")
st.update_job(job, status="done")
"""

READER = """
import sys, time
from dflash_dash.store import Store
st, reads, last = Store(sys.argv[1]), 0, {}
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    for r in st.rows("SELECT set_name, count(*) AS n FROM completions GROUP BY set_name"):
        assert r["n"] >= last.get(r["set_name"], 0), (r, last)  # counts never go back
        last[r["set_name"]] = r["n"]
    st.jobs()
    reads += 1
print(reads)
"""


def spawn(code: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_fresh_store_has_the_current_schema(tmp_path):
    st = Store(tmp_path)
    assert st.version() == len(store_mod.MIGRATIONS)
    tables = {r["table_name"] for r in st.rows("SELECT table_name FROM information_schema.tables")}
    assert {"schema_version", "prompt_sets", "completions", "extractions", "extraction_items", "runs",
            "run_prompts", "jobs"} <= tables


def test_forward_migration_keeps_data(tmp_path, monkeypatch):
    st = Store(tmp_path)
    st.add_job("job-1", "fetch", {"a": 1}, "l.log")
    v = st.version()
    monkeypatch.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS + ["ALTER TABLE jobs ADD COLUMN note VARCHAR"])
    monkeypatch.setattr(store_mod, "VERSION", v + 1)
    st2 = Store(tmp_path)
    assert st2.version() == v + 1
    assert [r["version"] for r in st2.rows("SELECT version FROM schema_version ORDER BY version")] == \
        list(range(1, v + 2))
    (job,) = st2.jobs()
    assert job["id"] == "job-1" and job["args"] == {"a": 1} and job["note"] is None


def test_old_schema_opens_and_migrates(tmp_path):
    """A store written by schema v1 (before runs recorded device/dtype) opens, migrates, keeps its rows."""
    import duckdb

    from dflash_dash import store as store_mod

    db = tmp_path / store_mod.DB_NAME
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE schema_version (version INTEGER)")
    con.execute(store_mod.MIGRATIONS[0])
    con.execute("INSERT INTO schema_version VALUES (1)")
    con.execute("INSERT INTO runs (id, extraction_id, checkpoint, name, config, tree_budget, summary, status) "
                "VALUES ('run-old', 'ex-1', '/ck', 'ck', '{}', 8, '{\"tau_macro\": 2.5}', 'done')")
    con.close()
    st = store_mod.Store(tmp_path)
    assert st.version() == store_mod.VERSION >= 2
    row = st.run_row("run-old")
    assert row["summary"] == {"tau_macro": 2.5} and row["device"] is None
    st.add_run(dict(id="run-new", extraction_id="ex-1", checkpoint="/ck", name="ck", config={}, tree_budget=8,
                    summary={}, device="cpu", dtype="float32"), [])
    assert st.run_row("run-new")["device"] == "cpu"
    assert [r["version"] for r in st.rows("SELECT version FROM schema_version ORDER BY 1")] == list(
        range(1, store_mod.VERSION + 1))


def test_newer_schema_is_refused(tmp_path):
    Store(tmp_path).version()
    con = duckdb.connect(str(tmp_path / store_mod.DB_NAME))
    con.execute("INSERT INTO schema_version VALUES (999)")
    con.close()
    with pytest.raises(StoreError, match="schema version 999, newer than this dflash-dash"):
        Store(tmp_path).jobs()


def test_settle_job_keeps_a_final_state(tmp_path):
    st = Store(tmp_path)
    st.add_job("j", "fetch", {}, "l")
    assert st.settle_job("j", "failed", "process died") is True
    assert st.settle_job("j", "done", None) is False
    assert st.job("j")["status"] == "failed" and st.job("j")["error"] == "process died"


def test_processes_hammering_one_workspace(tmp_path):
    st = Store(tmp_path)
    st.add_job("job-a", "fetch", {}, "a.log")
    st.add_job("job-b", "fetch", {}, "b.log")
    writers = [spawn(WRITER, tmp_path, "A", "job-a", N), spawn(WRITER, tmp_path, "B", "job-b", N)]
    reader = spawn(READER, tmp_path, 3.0)
    seen: dict[str, int] = {}
    reads = 0
    while any(w.poll() is None for w in writers) or reader.poll() is None:
        for r in st.rows("SELECT set_name, count(*) AS n FROM completions GROUP BY set_name"):
            assert r["n"] >= seen.get(r["set_name"], 0)
            seen[r["set_name"]] = r["n"]
        assert {j["id"] for j in st.jobs()} == {"job-a", "job-b"}
        reads += 1
    for p in writers + [reader]:
        out, err = p.communicate()
        assert p.returncode == 0, err
        assert "lock" not in err.lower()
    assert int(out) > 0 and reads > 0
    counts = {r["set_name"]: r["n"] for r in st.rows("SELECT set_name, count(*) AS n FROM completions GROUP BY 1")}
    assert counts == {"A": N, "B": N}
    for name in ("A", "B"):
        rows = st.completions(name)
        assert [r["prompt_id"] for r in rows] == [f"p{i}" for i in range(N)]
        assert all(r["output_ids"] == [i] * 5 and r["meta_info"] == {"i": i} for i, r in enumerate(rows))
    for j in st.jobs():
        assert j["status"] == "done" and j["progress"] == 1.0 and j["step"] == f"wrote {N}/{N}"


def test_writer_killed_inside_a_transaction_does_not_wedge_the_store(tmp_path):
    st = Store(tmp_path)
    st.add_set("s", "x")
    code = """
import sys, time
from dflash_dash.store import Store
st = Store(sys.argv[1])
with st.connect() as con:
    con.execute("INSERT INTO prompt_sets (name, source) VALUES ('half', 'x')")
    print("holding", flush=True)
    time.sleep(600)
"""
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "holding"  # it holds the lock inside an open transaction now
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    t0 = time.monotonic()
    assert [s["name"] for s in st.sets()] == ["s"]  # the lock died with it; the half transaction is gone
    assert time.monotonic() - t0 < 10
    st.add_set("after", "x")
    until(lambda: {s["name"] for s in st.sets()} == {"s", "after"}, 5, what="the write after the kill")
