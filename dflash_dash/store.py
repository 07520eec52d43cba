"""DuckDB workspace store (SPEC 7): schema, forward migrations, queries.

Contract: every call opens a short-lived DuckDB connection under an exclusive cross-process file lock
(`dflash.duckdb.lock`, flock), so the app, background jobs and the CLI share one file without lock errors:
DuckDB itself allows one read-write process per file; inside `with store.session():` the calls share one
connection (a page run, a bulk import), the lock held until the block ends. Rows come back as plain dicts;
JSON columns are decoded. Knows nothing of torch, HTTP or Streamlit. Large arrays live outside DuckDB: features
in the feature cache, each run prompt's result arrays as one packed blob (`pack_arrays`) in an array file of
its run (ARRAYS_DIR) that its run_prompts row points into, so reading one prompt of one run is a keyed read of
scalars plus one file read, while the scalars stay SQL columns.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import duckdb
import numpy as np

from .errors import UserError

DB_NAME = "dflash.duckdb"
JSON_COLS = {"meta_info", "request", "versions", "config", "summary", "args", "result", "layer_ids_json"}

# The per-prompt result arrays of a run_prompts row, in the order rows list them. Integers, except REALS
# (float32, as the REAL[] columns of schema v4-v6 held them).
ARRAYS = ("rounds", "accepted_at", "drafts", "tree_at", "tree_rounds", "draft_logp", "round_top_ids", "round_top_p")
REALS = frozenset({"draft_logp", "round_top_p"})
PACK_MAGIC, PACK_LEVEL = b"DFA1", 1  # blob format tag; zlib level (1: fast, most of the gain)
PACKERS = min(8, os.cpu_count() or 1)  # threads packing a run's rows (`_write_arrays`)
ARRAYS_DIR = "run_arrays"  # under the workspace: {run_id}/{uuid}.arrays, the packed rows of one put_prompts
_INTS = [np.dtype(t) for t in ("<i1", "<i2", "<i4", "<i8")]


def pack_arrays(p: dict) -> bytes:
    """A run_prompts row's arrays (ARRAYS; lists or numpy, flat or nested; None kept as None) as one blob:
    MAGIC, u32 header length, JSON header {name: [dtype, count] | null, "z": bytes of the zlib part}, then
    zlib(the integer arrays' values) and the REALS' raw float32 values (random mantissas: zlib would spend its
    time for a few percent), little-endian, in ARRAYS order. Integers take the narrowest signed type their
    values fit (lossless)."""
    head, ints, reals = {}, [], []
    for k in ARRAYS:
        v = p.get(k)
        if v is None:
            head[k] = None
            continue
        a = np.asarray(v, dtype=np.float32 if k in REALS else np.int64).ravel()
        if k not in REALS:
            lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
            a = a.astype(next(t for t in _INTS if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max))
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        head[k] = [a.dtype.str, int(a.size)]
        (reals if k in REALS else ints).append(a.tobytes())
    z = zlib.compress(b"".join(ints), PACK_LEVEL)
    h = json.dumps(head | {"z": len(z)}).encode()
    return b"".join([PACK_MAGIC, struct.pack("<I", len(h)), h, z, *reals])


def unpack_arrays(blob: bytes) -> dict:
    """`pack_arrays` reversed: {name: list (flat) | None} for every name of ARRAYS."""
    if blob[:4] != PACK_MAGIC:
        raise StoreError("a run_prompts row holds arrays in an unknown format; upgrade dflash-dash")
    n = struct.unpack("<I", blob[4:8])[0]
    head = json.loads(blob[8 : 8 + n])
    ints, reals = zlib.decompress(blob[8 + n : 8 + n + head["z"]]), memoryview(blob)[8 + n + head["z"] :]
    at, out = {False: 0, True: 0}, {}
    for k in ARRAYS:
        spec = head.get(k)
        if spec is None:
            out[k] = None
            continue
        dt, real = np.dtype(spec[0]), k in REALS
        out[k] = np.frombuffer(reals if real else ints, dt, spec[1], at[real]).tolist()
        at[real] += dt.itemsize * spec[1]
    return out


def _v7_arrays_to_files(con, store: Store) -> None:
    """v7: run_prompts' LIST columns move to array files (`Store.put_prompts`), in one pass over the old table: the
    files are written as its rows stream in, the rows pointing into them inserted after."""
    con.execute("ALTER TABLE run_prompts RENAME TO run_prompts_v6")
    con.execute(RUN_PROMPTS_V7)
    cols = ["run_id", "prompt_id", "prompt_len", "tau", "tree_tau", *ARRAYS]
    cur, rows = con.execute(f"SELECT {', '.join(cols)} FROM run_prompts_v6 ORDER BY run_id, prompt_id"), []
    while got := cur.fetchmany(64):
        by_run: dict[str, list[dict]] = {}
        for r in got:
            by_run.setdefault(r[0], []).append(dict(zip(cols, r)))
        rows += [store._write_arrays(run_id, ps)[0] for run_id, ps in by_run.items()]
    for t in rows:
        store._insert_prompts(con, t)
    con.execute("DROP TABLE run_prompts_v6")


RUN_PROMPTS_V7 = """
    CREATE TABLE run_prompts (
        run_id VARCHAR, prompt_id VARCHAR, prompt_len INTEGER, tau DOUBLE, tree_tau DOUBLE,
        arrays_file VARCHAR, arrays_at BIGINT, arrays_size BIGINT, PRIMARY KEY (run_id, prompt_id));
"""

# Each entry upgrades the schema by one version (SQL, or a function of the connection for a data rewrite);
# never edit a released entry, append a new one.
MIGRATIONS: list[str | Callable] = [
    # v1: initial schema
    """
    CREATE TABLE prompt_sets (name VARCHAR PRIMARY KEY, source VARCHAR, created TIMESTAMP DEFAULT now());
    CREATE TABLE completions (
        set_name VARCHAR, prompt_id VARCHAR, idx INTEGER, prompt VARCHAR, output VARCHAR,
        prompt_ids INTEGER[], output_ids INTEGER[], finish_reason VARCHAR, meta_info VARCHAR,
        request VARCHAR, model_path VARCHAR, created TIMESTAMP DEFAULT now(),
        PRIMARY KEY (set_name, prompt_id));
    CREATE TABLE extractions (
        id VARCHAR PRIMARY KEY, set_name VARCHAR, target_path VARCHAR, layer_ids INTEGER[],
        hidden_size INTEGER, device VARCHAR, dtype VARCHAR, backend VARCHAR, versions VARCHAR,
        config_hash VARCHAR, status VARCHAR, created TIMESTAMP DEFAULT now());
    CREATE TABLE extraction_items (
        extraction_id VARCHAR, prompt_id VARCHAR, tokens INTEGER, file VARCHAR,
        PRIMARY KEY (extraction_id, prompt_id));
    CREATE TABLE runs (
        id VARCHAR PRIMARY KEY, extraction_id VARCHAR, checkpoint VARCHAR, name VARCHAR, config VARCHAR,
        tree_budget INTEGER, summary VARCHAR, status VARCHAR, created TIMESTAMP DEFAULT now());
    CREATE TABLE run_prompts (
        run_id VARCHAR, prompt_id VARCHAR, prompt_len INTEGER, tau DOUBLE, tree_tau DOUBLE,
        rounds INTEGER[], accepted_at INTEGER[], drafts INTEGER[], tree_at INTEGER[], tree_rounds INTEGER[],
        PRIMARY KEY (run_id, prompt_id));
    CREATE TABLE jobs (
        id VARCHAR PRIMARY KEY, kind VARCHAR, args VARCHAR, status VARCHAR, progress DOUBLE, step VARCHAR,
        pid INTEGER, log_path VARCHAR, error VARCHAR, result VARCHAR,
        created TIMESTAMP DEFAULT now(), updated TIMESTAMP DEFAULT now());
    """,
    # v2: where a replay ran (device, dtype), next to the extraction's provenance
    """
    ALTER TABLE runs ADD COLUMN device VARCHAR;
    ALTER TABLE runs ADD COLUMN dtype VARCHAR;
    """,
    # v3: how a run read its checkpoint: sliding-layer block semantics, the config file used, the step
    """
    ALTER TABLE runs ADD COLUMN sliding_block VARCHAR;
    ALTER TABLE runs ADD COLUMN config_file VARCHAR;
    ALTER TABLE runs ADD COLUMN step BIGINT;
    """,
    # v4: why drafts fail: draft log-probabilities (calibration), engine-reported acceptance (conformance),
    # target-layer attribution
    """
    ALTER TABLE run_prompts ADD COLUMN draft_logp REAL[];
    CREATE TABLE engine_stats (
        set_name VARCHAR, prompt_id VARCHAR, engine VARCHAR, verify_steps INTEGER, accepted_tokens INTEGER,
        completion_tokens INTEGER, accept_lengths INTEGER[], histogram INTEGER[], source VARCHAR,
        created TIMESTAMP DEFAULT now(), PRIMARY KEY (set_name, prompt_id, engine));
    CREATE TABLE attributions (
        run_id VARCHAR, tap INTEGER, layer_id INTEGER, tau_macro DOUBLE, tau_pooled DOUBLE, base_tau_macro DOUBLE,
        base_tau_pooled DOUBLE, created TIMESTAMP DEFAULT now(), PRIMARY KEY (run_id, tap));
    """,
    # v5: the whole proposed block of each chain round (top-k candidates per slot, flattened [R][B-1][K] with
    # K = the run summary's `round_topk`), and failed jobs a user has dismissed from the jobs panel
    """
    ALTER TABLE run_prompts ADD COLUMN round_top_ids INTEGER[];
    ALTER TABLE run_prompts ADD COLUMN round_top_p REAL[];
    ALTER TABLE jobs ADD COLUMN dismissed BOOLEAN DEFAULT false;
    """,
    # v6: whole-run analyses (calibration, failure patterns, draft lag), computed once per finished run and
    # kept, so a page never scans every token of every prompt to draw
    """
    CREATE TABLE run_analyses (run_id VARCHAR, name VARCHAR, value VARCHAR, created TIMESTAMP DEFAULT now(),
        PRIMARY KEY (run_id, name));
    """,
    # v7: each run prompt's arrays as one packed blob (pack_arrays) in an array file of its run (ARRAYS_DIR), the
    # row keeping (arrays_file, arrays_at, arrays_size): one prompt of one run is a keyed read of scalars and one
    # file read (a LIST-column row, or a BLOB column, cost about a second at 1,000 prompts x 2,560 tokens: DuckDB
    # scans the whole column)
    _v7_arrays_to_files,
]
VERSION = len(MIGRATIONS)
REENTRY_S = 0.01  # a process re-locking sooner than this after its own release steps aside first
_last_release = -1.0  # monotonic time this process last released the store lock


class StoreError(UserError, RuntimeError):
    """A store problem the user must act on (e.g. an unknown id)."""


def new_id(prefix: str) -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


class Store:
    """One workspace's DuckDB file. Cheap to construct; holds no open connection outside `session()`."""

    def __init__(self, workspace: str | Path):
        self.workspace = Path(workspace)
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.path = self.workspace / DB_NAME
        self.lock_path = self.workspace / (DB_NAME + ".lock")
        self._migrated = False
        self._local = threading.local()  # .con: this thread's session connection

    # -- connection -----------------------------------------------------------

    @contextmanager
    def connect(self):
        """An exclusive connection: flock on the lock file (blocks, no error), then DuckDB, then commit. Inside
        `session()` (this thread), the session's connection, in a transaction of its own.

        flock is not fair: a process that releases and at once re-locks (a polling loop) can starve the
        others, so a re-entry within REENTRY_S of this process's last release first steps aside briefly.
        """
        held = getattr(self._local, "con", None)
        if held is None:
            with self._opened() as con, self._transaction(con):
                yield con
        elif self._local.depth:  # a call inside another's transaction (add_run -> put_prompts) joins it
            yield held
        else:
            with self._transaction(held) as con:
                self._local.depth = 1
                try:
                    yield con
                finally:
                    self._local.depth = 0

    @contextmanager
    def session(self):
        """Every store call of this thread inside the block shares one connection (one DuckDB open instead of
        one per call: a page run, a bulk import). The lock is held until the block ends, so keep it short: other
        processes (jobs) wait for it. Nested sessions reuse the outer one; a call made inside another call's
        `connect()` block joins its transaction."""
        if getattr(self._local, "con", None) is not None:
            yield self
            return
        with self._opened() as con:
            self._local.con, self._local.depth = con, 0
            try:
                yield self
            finally:
                self._local.con = None

    @contextmanager
    def _opened(self):
        global _last_release
        with open(self.lock_path, "a+") as lf:
            if time.monotonic() - _last_release < REENTRY_S:
                time.sleep(REENTRY_S)
            fcntl.flock(lf.fileno(), fcntl.LOCK_EX)
            try:
                con = duckdb.connect(str(self.path))
                try:
                    if not self._migrated:
                        self._migrate(con)
                    yield con
                finally:
                    con.close()
            finally:
                fcntl.flock(lf.fileno(), fcntl.LOCK_UN)
                _last_release = time.monotonic()

    @staticmethod
    @contextmanager
    def _transaction(con):
        con.execute("BEGIN")
        try:
            yield con
            con.execute("COMMIT")
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:
                pass
            raise

    def _migrate(self, con) -> None:
        con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER)")
        row = con.execute("SELECT max(version) FROM schema_version").fetchone()
        have = row[0] or 0
        if have > VERSION:
            raise StoreError(
                f"{self.path} has schema version {have}, newer than this dflash-dash ({VERSION}); upgrade dflash-dash"
            )
        for v in range(have, VERSION):
            with self._transaction(con):
                step = MIGRATIONS[v]
                step(con, self) if callable(step) else con.execute(step)
                con.execute("INSERT INTO schema_version VALUES (?)", [v + 1])
        self._migrated = True

    def rows(self, sql: str, params: list | None = None) -> list[dict]:
        with self.connect() as con:
            cur = con.execute(sql, params or [])
            cols = [d[0] for d in cur.description] if cur.description else []
            return [_decode(dict(zip(cols, r))) for r in cur.fetchall()]

    def run(self, sql: str, params: list | None = None) -> None:
        with self.connect() as con:
            con.execute(sql, params or [])

    def version(self) -> int:
        return self.rows("SELECT max(version) AS v FROM schema_version")[0]["v"]

    def stamp(self) -> str:
        """A cheap token that changes whenever a set, completion, extraction or run is added or finishes
        (views key their caches on it so new data shows up)."""
        r = self.rows(
            "SELECT (SELECT count(*) || max(created) FROM completions) AS c, "
            "(SELECT count(*) || string_agg(status, '') FROM extractions) AS e, "
            "(SELECT count(*) || max(created) FROM runs) AS r, "
            "(SELECT count(*) FROM prompt_sets) AS s, "
            "(SELECT count(*) FROM extraction_items) AS i, "
            "(SELECT count(*) || max(created) FROM attributions) AS a"
        )[0]
        return "|".join(str(v) for v in r.values())

    # -- completions ----------------------------------------------------------

    def add_set(self, name: str, source: str) -> None:
        self.run("INSERT INTO prompt_sets (name, source) VALUES (?, ?) ON CONFLICT DO NOTHING", [name, source])

    def add_completion(self, set_name: str, c: dict) -> None:
        """Insert or replace one completion; `c` has id, prompt_ids, output_ids and optional text/meta."""
        self.add_completions(set_name, [c])

    def add_completions(self, set_name: str, cs: list[dict]) -> None:
        """Insert or replace completions (`add_completion`'s dicts) in one transaction, one batch; one without
        `idx` gets the next index of the set."""
        if not cs:
            return
        import pyarrow as pa

        with self.connect() as con:
            idx = [c.get("idx") for c in cs]
            if None in idx:
                n = con.execute("SELECT count(*) FROM completions WHERE set_name = ?", [set_name]).fetchall()[0][0]
                for i, c in enumerate(cs):
                    idx[i] = c.get("idx") if c.get("idx") is not None else n + i
            ids = pa.list_(pa.int32())
            t = pa.table(
                {
                    "set_name": [set_name] * len(cs),
                    "prompt_id": [c["id"] for c in cs],
                    "idx": pa.array(idx, pa.int32()),
                    "prompt": pa.array([c.get("prompt") for c in cs], pa.string()),
                    "output": pa.array([c.get("output") for c in cs], pa.string()),
                    "prompt_ids": pa.array([list(c["prompt_ids"]) for c in cs], ids),
                    "output_ids": pa.array([list(c["output_ids"]) for c in cs], ids),
                    "finish_reason": pa.array([c.get("finish_reason") for c in cs], pa.string()),
                    "meta_info": [json.dumps(c.get("meta_info") or {}) for c in cs],
                    "request": pa.array(
                        [json.dumps(c.get("request")) if c.get("request") is not None else None for c in cs],
                        pa.string(),
                    ),
                    "model_path": pa.array([c.get("model_path") for c in cs], pa.string()),
                }
            )
            con.register("_add_completions", t)
            try:
                con.execute(
                    "INSERT OR REPLACE INTO completions (set_name, prompt_id, idx, prompt, output, prompt_ids, "
                    "output_ids, finish_reason, meta_info, request, model_path) SELECT * FROM _add_completions"
                )
            finally:
                con.unregister("_add_completions")

    def sets(self) -> list[dict]:
        return self.rows(
            "SELECT s.name, s.source, s.created, count(c.prompt_id) AS prompts FROM prompt_sets s "
            "LEFT JOIN completions c ON c.set_name = s.name GROUP BY ALL ORDER BY s.created"
        )

    def completions(self, set_name: str) -> list[dict]:
        return self.rows("SELECT * FROM completions WHERE set_name = ? ORDER BY idx, prompt_id", [set_name])

    def completion_index(self, set_name: str, preview: int = 160) -> list[dict]:
        """The set's completions without token ids and with text cut to `preview` characters (prompt, output),
        plus their token counts: what listings and selectors need."""
        return self.rows(
            "SELECT prompt_id, idx, left(prompt, ?) AS prompt, left(output, ?) AS output, "
            "len(prompt_ids) AS prompt_tokens, len(output_ids) AS output_tokens, finish_reason, "
            "meta_info, model_path FROM completions WHERE set_name = ? ORDER BY idx, prompt_id",
            [preview, preview, set_name],
        )

    def completion(self, set_name: str, prompt_id: str) -> dict | None:
        got = self.rows("SELECT * FROM completions WHERE set_name = ? AND prompt_id = ?", [set_name, prompt_id])
        return got[0] if got else None

    def completion_ids(self, set_name: str) -> set[str]:
        return {r["prompt_id"] for r in self.rows("SELECT prompt_id FROM completions WHERE set_name = ?", [set_name])}

    # -- extractions ----------------------------------------------------------

    def add_extraction(self, e: dict) -> None:
        self.run(
            "INSERT INTO extractions (id, set_name, target_path, layer_ids, hidden_size, device, dtype, "
            "backend, versions, config_hash, status) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            [
                e["id"],
                e["set_name"],
                e["target_path"],
                e["layer_ids"],
                e["hidden_size"],
                e["device"],
                e["dtype"],
                e["backend"],
                json.dumps(e.get("versions") or {}),
                e.get("config_hash"),
                e.get("status", "running"),
            ],
        )

    def add_item(self, extraction_id: str, prompt_id: str, tokens: int, file: str) -> None:
        self.run("INSERT OR REPLACE INTO extraction_items VALUES (?,?,?,?)", [extraction_id, prompt_id, tokens, file])

    def items(self, extraction_id: str) -> list[dict]:
        return self.rows("SELECT * FROM extraction_items WHERE extraction_id = ?", [extraction_id])

    def set_status(self, table: str, id_: str, status: str) -> None:
        assert table in ("extractions", "runs")
        self.run(f"UPDATE {table} SET status = ? WHERE id = ?", [status, id_])

    def extractions(self) -> list[dict]:
        return self.rows(
            "SELECT e.*, (SELECT count(*) FROM extraction_items i WHERE i.extraction_id = e.id) "
            "AS prompts FROM extractions e ORDER BY created, id"
        )

    def extraction(self, id_: str) -> dict:
        return self._one("extractions", id_, "extraction")

    # -- runs -----------------------------------------------------------------

    def add_run(self, r: dict, prompts: list[dict]) -> None:
        """Insert a finished run and its per-prompt results in one transaction."""
        with self.session(), self.connect() as con:
            con.execute(
                "INSERT INTO runs (id, extraction_id, checkpoint, name, config, tree_budget, summary, "
                "status, device, dtype, sliding_block, config_file, step) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    r["id"],
                    r["extraction_id"],
                    r["checkpoint"],
                    r["name"],
                    json.dumps(r["config"]),
                    r["tree_budget"],
                    json.dumps(r["summary"]),
                    r.get("status", "done"),
                    r.get("device"),
                    r.get("dtype"),
                    r.get("sliding_block"),
                    r.get("config_file"),
                    r.get("step"),
                ],
            )
            self.put_prompts(r["id"], prompts)

    def put_prompts(self, run_id: str, prompts: list[dict]) -> None:
        """Insert or replace run `run_id`'s per-prompt rows ({id or prompt_id, prompt_len, tau, tree_tau} and the
        ARRAYS, lists or numpy; a missing array is stored as None) in one transaction: the arrays packed into one
        new array file (written whole, then renamed into place), the rows pointing into it."""
        if not prompts:
            return
        t, f = self._write_arrays(run_id, prompts)
        try:
            with self.connect() as con:
                self._insert_prompts(con, t)
        except BaseException:
            f.unlink(missing_ok=True)
            raise

    def _write_arrays(self, run_id: str, prompts: list[dict]):
        """The prompts' arrays packed into one new array file (written whole, then renamed into place): (the
        run_prompts rows pointing into it as an arrow table, the file)."""
        import pyarrow as pa

        rel = Path(ARRAYS_DIR) / run_id / f"{uuid.uuid4().hex}.arrays"
        f = self.workspace / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(PACKERS) as pool:  # zlib and numpy release the GIL: rows pack side by side
            blobs = list(pool.map(pack_arrays, prompts))
        tmp = f.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            out.writelines(blobs)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, f)
        sizes = np.fromiter(map(len, blobs), np.int64, len(blobs))
        return pa.table(
            {
                "run_id": [run_id] * len(prompts),
                "prompt_id": [p.get("prompt_id", p.get("id")) for p in prompts],
                "prompt_len": pa.array([p["prompt_len"] for p in prompts], pa.int32()),
                "tau": pa.array([p["tau"] for p in prompts], pa.float64()),
                "tree_tau": pa.array([p["tree_tau"] for p in prompts], pa.float64()),
                "arrays_file": [str(rel)] * len(prompts),
                "arrays_at": np.cumsum(sizes) - sizes,
                "arrays_size": sizes,
            }
        ), f

    @staticmethod
    def _insert_prompts(con, t) -> None:
        con.register("_put_prompts", t)
        try:
            con.execute("INSERT OR REPLACE INTO run_prompts SELECT * FROM _put_prompts")
        finally:
            con.unregister("_put_prompts")

    def runs(self) -> list[dict]:
        return self.rows(
            "SELECT r.*, e.set_name, e.backend, e.target_path FROM runs r "
            "LEFT JOIN extractions e ON e.id = r.extraction_id ORDER BY r.created, r.id"
        )

    def run_row(self, id_: str) -> dict:
        return self._one("runs", id_, "run")

    def run_prompts(self, run_id: str) -> list[dict]:
        """Every prompt's whole row of a run (every array, decoded), by prompt id."""
        return self._with_arrays(self.rows("SELECT * FROM run_prompts WHERE run_id = ? ORDER BY prompt_id", [run_id]))

    def run_prompt(self, run_id: str, prompt_id: str) -> dict | None:
        """One prompt's whole row of a run (every array), None when the run has no such prompt: a keyed read of
        the row's scalars and one read of its packed arrays."""
        got = self.rows("SELECT * FROM run_prompts WHERE run_id = ? AND prompt_id = ?", [run_id, prompt_id])
        return self._with_arrays(got)[0] if got else None

    def _with_arrays(self, rows: list[dict]) -> list[dict]:
        """run_prompts rows as the store returns them: the scalars, then the ARRAYS read from their files."""
        out, files = [], {}
        try:
            for r in rows:
                name, at, size = r.pop("arrays_file"), r.pop("arrays_at"), r.pop("arrays_size")
                if name not in files:
                    files[name] = open(self.workspace / name, "rb")
                files[name].seek(at)
                out.append(r | unpack_arrays(files[name].read(size)))
        except FileNotFoundError as e:
            raise StoreError(
                f"{e.filename}: the array file of run {rows[0]['run_id']} is missing from the workspace "
                f"(copy the whole folder {self.workspace}, {ARRAYS_DIR}/ included)"
            ) from None
        finally:
            for f in files.values():
                f.close()
        return out

    def analysis(self, run_id: str, name: str) -> dict | list | None:
        got = self.rows("SELECT value FROM run_analyses WHERE run_id = ? AND name = ?", [run_id, name])
        return json.loads(got[0]["value"]) if got else None

    def set_analysis(self, run_id: str, name: str, value: dict | list) -> None:
        self.run(
            "INSERT OR REPLACE INTO run_analyses (run_id, name, value) VALUES (?, ?, ?)",
            [run_id, name, json.dumps(value)],
        )

    def _one(self, table: str, id_: str, what: str) -> dict:
        if id_ == "latest":
            got = self.rows(f"SELECT * FROM {table} WHERE status = 'done' ORDER BY created DESC, id DESC LIMIT 1")
            if not got:
                raise StoreError(f"no finished {what} in {self.workspace} yet")
            return got[0]
        got = self.rows(f"SELECT * FROM {table} WHERE id = ?", [id_])
        if not got:
            raise StoreError(f"no {what} with id {id_!r} in {self.workspace} (list them with `{what}s`)")
        return got[0]

    # -- attributions (target-layer attribution of a run) --------------------

    def set_attribution(self, run_id: str, rows: list[dict]) -> None:
        """Replace run `run_id`'s attribution with `rows` ({tap, layer_id, tau_macro, tau_pooled, base_tau_macro,
        base_tau_pooled}: tau with that tap ablated, and without ablation) in one transaction."""
        with self.connect() as con:
            con.execute("DELETE FROM attributions WHERE run_id = ?", [run_id])
            if rows:
                con.executemany(
                    "INSERT INTO attributions (run_id, tap, layer_id, tau_macro, tau_pooled, "
                    "base_tau_macro, base_tau_pooled) VALUES (?,?,?,?,?,?,?)",
                    [
                        [
                            run_id,
                            r["tap"],
                            r["layer_id"],
                            r["tau_macro"],
                            r["tau_pooled"],
                            r["base_tau_macro"],
                            r["base_tau_pooled"],
                        ]
                        for r in rows
                    ],
                )

    def attributions(self, run_id: str) -> list[dict]:
        return self.rows("SELECT * FROM attributions WHERE run_id = ? ORDER BY tap", [run_id])

    # -- engine stats (conformance: acceptance a serving engine reported per request) ------------------

    def add_engine_stats(self, set_name: str, engine: str, rows: list[dict], source: str) -> None:
        """Insert or replace engine `engine`'s stats of prompts of set `set_name` in one transaction; rows hold
        id, verify_steps, accepted_tokens, completion_tokens, accept_lengths, histogram (None where unknown)."""
        with self.connect() as con:
            con.executemany(
                "INSERT OR REPLACE INTO engine_stats (set_name, prompt_id, engine, verify_steps, accepted_tokens, "
                "completion_tokens, accept_lengths, histogram, source) VALUES (?,?,?,?,?,?,?,?,?)",
                [
                    [
                        set_name,
                        r["id"],
                        engine,
                        r.get("verify_steps"),
                        r.get("accepted_tokens"),
                        r.get("completion_tokens"),
                        r.get("accept_lengths"),
                        r.get("histogram"),
                        source,
                    ]
                    for r in rows
                ],
            )

    def engine_stats(self, set_name: str, engine: str) -> list[dict]:
        return self.rows(
            "SELECT * FROM engine_stats WHERE set_name = ? AND engine = ? ORDER BY prompt_id", [set_name, engine]
        )

    def engines(self, set_name: str) -> list[str]:
        """Engines with stats for set `set_name`, by name."""
        return [
            r["engine"]
            for r in self.rows(
                "SELECT DISTINCT engine FROM engine_stats WHERE set_name = ? ORDER BY engine", [set_name]
            )
        ]

    def engine_stamp(self) -> str:
        """Changes whenever engine stats are added or replaced (views key their caches on it)."""
        r = self.rows("SELECT count(*) || '|' || coalesce(max(created)::VARCHAR, '') AS s FROM engine_stats")
        return r[0]["s"]

    # -- jobs -----------------------------------------------------------------

    def add_job(self, job_id: str, kind: str, args: dict, log_path: str) -> None:
        self.run(
            "INSERT INTO jobs (id, kind, args, status, progress, step, log_path) VALUES (?,?,?,?,?,?,?)",
            [job_id, kind, json.dumps(args), "queued", 0.0, "queued", log_path],
        )

    def update_job(self, job_id: str, **fields) -> None:
        allowed = {"status", "progress", "step", "pid", "error", "result"}
        sets, vals = [], []
        for k, v in fields.items():
            assert k in allowed, k
            sets.append(f"{k} = ?")
            vals.append(json.dumps(v) if k == "result" else v)
        self.run(f"UPDATE jobs SET {', '.join(sets)}, updated = now() WHERE id = ?", vals + [job_id])

    def settle_job(self, job_id: str, status: str, error: str | None) -> bool:
        """Set a final `status` only while the job is still queued/running (a job that already finished keeps
        its own final state); True when this call changed it."""
        with self.connect() as con:
            got = con.execute(
                "UPDATE jobs SET status = ?, error = ?, updated = now() WHERE id = ? AND status "
                "IN ('queued', 'running') RETURNING id",
                [status, error, job_id],
            ).fetchall()
            return bool(got)

    def jobs(self, status: str | None = None, dismissed: bool = True) -> list[dict]:
        """Jobs newest first (each with `dismissed`); `dismissed=False` leaves out those a user dismissed."""
        where = (["status = ?"] if status else []) + ([] if dismissed else ["NOT coalesce(dismissed, false)"])
        return self.rows(
            f"SELECT * FROM jobs {'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY created DESC",
            [status] if status else [],
        )

    def dismiss_job(self, job_id: str) -> None:
        """Hide a failed or cancelled job from the jobs panel (`jobs` on the CLI still lists it, dismissed true);
        StoreError for an unknown job or one in another state."""
        with self.connect() as con:
            got = con.execute(
                "UPDATE jobs SET dismissed = true WHERE id = ? AND status IN ('failed', 'cancelled') RETURNING id",
                [job_id],
            ).fetchall()
        if not got:
            status = self.job(job_id)["status"]  # raises for an unknown id
            raise StoreError(
                f"job {job_id} is {status}; only failed or cancelled jobs can be dismissed (cancel a running one first)"
            )

    def job(self, job_id: str) -> dict:
        got = self.rows("SELECT * FROM jobs WHERE id = ?", [job_id])
        if not got:
            raise StoreError(f"no job with id {job_id!r} (list them with `jobs list`)")
        return got[0]


def _decode(row: dict) -> dict:
    for k in JSON_COLS & row.keys():
        if isinstance(row[k], str):
            row[k] = json.loads(row[k])
    return row


def default_workspace() -> Path:
    return Path(os.environ.get("DFLASH_WORKSPACE", "cache"))
