"""The DuckDB store: schema version and forward migrations, and several processes writing and reading one
workspace at once (two writer processes acting as jobs, a reader process and this process) with no lock
error and exact row counts; a writer killed while holding the lock does not wedge the workspace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import duckdb
import pytest
from serving import ENV, ROOT, until

from dflash_dash import metrics, store as store_mod
from dflash_dash.store import Store, StoreError

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
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_fresh_store_has_the_current_schema(tmp_path):
    st = Store(tmp_path)
    assert st.version() == len(store_mod.MIGRATIONS)
    tables = {r["table_name"] for r in st.rows("SELECT table_name FROM information_schema.tables")}
    assert {
        "schema_version",
        "prompt_sets",
        "completions",
        "extractions",
        "extraction_items",
        "runs",
        "run_prompts",
        "jobs",
    } <= tables


def test_forward_migration_keeps_data(tmp_path, monkeypatch):
    st = Store(tmp_path)
    st.add_job("job-1", "fetch", {"a": 1}, "l.log")
    v = st.version()
    migrations = store_mod.schema.MIGRATIONS + ["ALTER TABLE jobs ADD COLUMN note VARCHAR"]
    monkeypatch.setattr(store_mod.schema, "MIGRATIONS", migrations)
    monkeypatch.setattr(store_mod.schema, "VERSION", v + 1)
    st2 = Store(tmp_path)
    assert st2.version() == v + 1
    assert [r["version"] for r in st2.rows("SELECT version FROM schema_version ORDER BY version")] == list(
        range(1, v + 2)
    )
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
    con.execute(
        "INSERT INTO runs (id, extraction_id, checkpoint, name, config, tree_budget, summary, status) "
        "VALUES ('run-old', 'ex-1', '/ck', 'ck', '{}', 8, '{\"tau_macro\": 2.5}', 'done')"
    )
    con.close()
    st = store_mod.Store(tmp_path)
    assert st.version() == store_mod.VERSION >= 2
    row = st.run_row("run-old")
    assert row["summary"] == {"tau_macro": 2.5} and row["device"] is None
    st.add_run(
        dict(
            id="run-new",
            extraction_id="ex-1",
            checkpoint="/ck",
            name="ck",
            config={},
            tree_budget=8,
            summary={},
            device="cpu",
            dtype="float32",
        ),
        [],
    )
    assert st.run_row("run-new")["device"] == "cpu"
    assert [r["version"] for r in st.rows("SELECT version FROM schema_version ORDER BY 1")] == list(
        range(1, store_mod.VERSION + 1)
    )


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
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "holding"  # it holds the lock inside an open transaction now
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    t0 = time.monotonic()
    assert [s["name"] for s in st.sets()] == ["s"]  # the lock died with it; the half transaction is gone
    assert time.monotonic() - t0 < 10
    st.add_set("after", "x")
    until(lambda: {s["name"] for s in st.sets()} == {"s", "after"}, 5, what="the write after the kill")


def _v6_store(path) -> None:
    """A store written by schema v6: run_prompts arrays as LIST columns (one row with every array, one with
    NULLs and empty lists as older runs left them)."""
    con = duckdb.connect(str(path / store_mod.DB_NAME))
    con.execute("CREATE TABLE schema_version (version INTEGER)")
    for v in range(6):
        con.execute(store_mod.MIGRATIONS[v])
        con.execute("INSERT INTO schema_version VALUES (?)", [v + 1])
    con.execute(
        "INSERT INTO run_prompts VALUES ('run-a', 'p1', 3, 2.5, NULL, [1, 2], [0, 1, -1], [5, 6, 70000, -1], "
        "[], [], [-0.5, -1.25, 0.1], [7, 300, 2], [0.1, 0.2, 0.7])"
    )
    con.execute("INSERT INTO run_prompts VALUES ('run-a', 'p0', 4, 1.0, 1.5, [], [], [], [1], [2], NULL, NULL, NULL)")
    for i in range(70):  # a second run, more rows than one migration chunk
        con.execute(
            "INSERT INTO run_prompts VALUES ('run-b', ?, 1, 2.0, NULL, [2], [1, ?], [3, ?], [], [], NULL, NULL, NULL)",
            [f"q{i:02d}", i, i],
        )
    con.close()


def test_v6_run_prompts_migrate_to_array_files_and_read_back(tmp_path):
    """Schema v7 keeps each run prompt's arrays as one packed blob in an array file of its run: an old store opens,
    migrates its rows, and every array (ints of any width, REAL values, NULL, empty) reads back as the LIST columns
    held it."""
    _v6_store(tmp_path)
    st = Store(tmp_path)
    assert st.version() == store_mod.VERSION >= 7
    cols = {
        r["column_name"]
        for r in st.rows("SELECT column_name FROM information_schema.columns WHERE table_name = 'run_prompts'")
    }
    assert cols == {"run_id", "prompt_id", "prompt_len", "tau", "tree_tau", "arrays_file", "arrays_at", "arrays_size"}
    p1 = st.run_prompt("run-a", "p1")
    assert list(p1) == ["run_id", "prompt_id", "prompt_len", "tau", "tree_tau", *store_mod.ARRAYS]
    assert p1 | {"draft_logp": None, "round_top_p": None} == {
        "run_id": "run-a",
        "prompt_id": "p1",
        "prompt_len": 3,
        "tau": 2.5,
        "tree_tau": None,
        "rounds": [1, 2],
        "accepted_at": [0, 1, -1],
        "drafts": [5, 6, 70000, -1],
        "tree_at": [],
        "tree_rounds": [],
        "draft_logp": None,
        "round_top_ids": [7, 300, 2],
        "round_top_p": None,
        "confidence": None,  # arrays named after the migration read back as None (not stored)
        "target_rank": None,
        "expected_at": None,
    }
    import numpy as np

    assert p1["draft_logp"] == np.float32([-0.5, -1.25, 0.1]).tolist()  # REAL values, as DuckDB gave them
    assert p1["round_top_p"] == np.float32([0.1, 0.2, 0.7]).tolist()
    assert [r["prompt_id"] for r in st.run_prompts("run-a")] == ["p0", "p1"]
    assert st.run_prompts("run-a")[0] | {} == {
        "run_id": "run-a",
        "prompt_id": "p0",
        "prompt_len": 4,
        "tau": 1.0,
        "tree_tau": 1.5,
        "rounds": [],
        "accepted_at": [],
        "drafts": [],
        "tree_at": [1],
        "tree_rounds": [2],
        "draft_logp": None,
        "round_top_ids": None,
        "round_top_p": None,
        "confidence": None,
        "target_rank": None,
        "expected_at": None,
    }
    assert st.run_prompt("run-a", "nope") is None
    b = st.run_prompts("run-b")
    assert [(r["prompt_id"], r["accepted_at"], r["drafts"]) for r in b] == [
        (f"q{i:02d}", [1, i], [3, i]) for i in range(70)
    ]
    assert {p.parent.name for p in (tmp_path / store_mod.ARRAYS_DIR).rglob("*.arrays")} == {"run-a", "run-b"}
    for f in (tmp_path / store_mod.ARRAYS_DIR / "run-b").iterdir():
        f.unlink()
    with pytest.raises(StoreError, match="array file of run run-b is missing"):
        st.run_prompt("run-b", "q03")


def test_pack_arrays_round_trip_is_lossless():
    import numpy as np

    rng = np.random.default_rng(0)
    row = {
        "rounds": [1] * 5,
        "accepted_at": rng.integers(-1, 16, 300).tolist(),
        "drafts": rng.integers(-1, 40000, (300, 15)).tolist(),
        "tree_at": [],
        "tree_rounds": None,
        "draft_logp": rng.standard_normal(300 * 15).astype(np.float32).tolist(),
        "round_top_ids": np.array([[2**40, -5]]),
        "round_top_p": [],
        "confidence": rng.random((300, 15)).astype(np.float32),
        "target_rank": rng.integers(-2, 8, (300, 15)),
        "expected_at": (rng.random(300) + 1.0).astype(np.float32),  # expected committed tokens per anchor (REAL)
    }
    assert set(row) == set(store_mod.ARRAYS)
    got = store_mod.unpack_arrays(store_mod.pack_arrays(row))
    assert got == {k: (np.asarray(v).ravel().tolist() if v is not None else None) for k, v in row.items()} | {
        "drafts": [t for r in row["drafts"] for t in r]
    }
    with pytest.raises(StoreError, match="unknown format"):
        store_mod.unpack_arrays(b"XXXX" + bytes(8))


def test_put_prompts_replaces_rows_and_add_run_is_one_transaction(tmp_path):
    st = Store(tmp_path)
    row = metrics.Prompt("p", 2, [0, 1, 0], [1, 2], draft_logp=[-1.0] * 3, drafts=[4, 5, 6], tau=1.5)
    st.add_run(
        dict(id="r", extraction_id="e", checkpoint="/ck", name="ck", config={}, tree_budget=0, summary={}), [row]
    )
    assert st.run_prompt("r", "p")["round_top_ids"] == [] and st.run_prompt("r", "p")["draft_logp"] == [-1.0] * 3
    st.put_prompts("r", [dict(st.run_prompt("r", "p"), draft_logp=None)])
    assert st.run_prompt("r", "p")["draft_logp"] is None and len(st.run_prompts("r")) == 1
    with pytest.raises(duckdb.Error):  # the run's row exists: nothing of the second add is kept
        st.add_run(
            dict(id="r", extraction_id="e", checkpoint="/ck", name="ck", config={}, tree_budget=0, summary={}),
            [replace(row, id="q")],
        )
    assert st.run_prompt("r", "q") is None


def test_a_session_shares_one_connection(tmp_path, monkeypatch):
    st = Store(tmp_path)
    st.add_set("s", "x")
    opened = []
    connect = duckdb.connect
    monkeypatch.setattr(duckdb, "connect", lambda *a, **kw: opened.append(a) or connect(*a, **kw))
    with st.session():
        st.add_completions("s", [{"id": f"p{i}", "prompt_ids": [1], "output_ids": [i, i]} for i in range(3)])
        assert [c["idx"] for c in st.completions("s")] == [0, 1, 2]
        st.add_completion("s", {"id": "p9", "prompt_ids": [1], "output_ids": [9]})
        with pytest.raises(duckdb.Error):
            st.run("SELECT * FROM no_such_table")
        assert st.completion("s", "p9")["idx"] == 3 and st.stamp()  # the session survives a failed call
    assert len(opened) == 1
    assert len(Store(tmp_path).completions("s")) == 4  # committed
