"""DuckDB workspace store (SPEC 7): schema, forward migrations, queries.

Contract: every call opens a short-lived DuckDB connection under an exclusive cross-process file lock
(`dflash.duckdb.lock`, flock), so the app, background jobs and the CLI share one file without lock errors:
DuckDB itself allows one read-write process per file. Rows come back as plain dicts; JSON columns are
decoded. Knows nothing of torch, HTTP or Streamlit. Large arrays live in the feature cache, not here.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import duckdb

from .errors import UserError

DB_NAME = "dflash.duckdb"
JSON_COLS = {"meta_info", "request", "versions", "config", "summary", "args", "result", "layer_ids_json"}

# Each entry upgrades the schema by one version; never edit a released entry, append a new one.
MIGRATIONS: list[str] = [
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
]
VERSION = len(MIGRATIONS)
REENTRY_S = 0.01       # a process re-locking sooner than this after its own release steps aside first
_last_release = -1.0   # monotonic time this process last released the store lock


class StoreError(UserError, RuntimeError):
    """A store problem the user must act on (e.g. an unknown id)."""


def new_id(prefix: str) -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


class Store:
    """One workspace's DuckDB file. Cheap to construct; holds no open connection."""

    def __init__(self, workspace: str | Path):
        self.workspace = Path(workspace)
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.path = self.workspace / DB_NAME
        self.lock_path = self.workspace / (DB_NAME + ".lock")
        self._migrated = False

    # -- connection -----------------------------------------------------------

    @contextmanager
    def connect(self):
        """An exclusive connection: flock on the lock file (blocks, no error), then DuckDB, then commit.

        flock is not fair: a process that releases and at once re-locks (a polling loop) can starve the
        others, so a re-entry within REENTRY_S of this process's last release first steps aside briefly.
        """
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
                    con.execute("BEGIN")
                    yield con
                    con.execute("COMMIT")
                except BaseException:
                    try:
                        con.execute("ROLLBACK")
                    except duckdb.Error:
                        pass
                    raise
                finally:
                    con.close()
            finally:
                fcntl.flock(lf.fileno(), fcntl.LOCK_UN)
                _last_release = time.monotonic()

    def _migrate(self, con) -> None:
        con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER)")
        row = con.execute("SELECT max(version) FROM schema_version").fetchone()
        have = row[0] or 0
        if have > VERSION:
            raise StoreError(f"{self.path} has schema version {have}, newer than this dflash-dash ({VERSION}); "
                             "upgrade dflash-dash")
        for v in range(have, VERSION):
            con.execute("BEGIN")
            con.execute(MIGRATIONS[v])
            con.execute("INSERT INTO schema_version VALUES (?)", [v + 1])
            con.execute("COMMIT")
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
        r = self.rows("SELECT (SELECT count(*) || max(created) FROM completions) AS c, "
                      "(SELECT count(*) || string_agg(status, '') FROM extractions) AS e, "
                      "(SELECT count(*) || max(created) FROM runs) AS r, "
                      "(SELECT count(*) FROM prompt_sets) AS s, "
                      "(SELECT count(*) FROM extraction_items) AS i, "
                      "(SELECT count(*) || max(created) FROM attributions) AS a")[0]
        return "|".join(str(v) for v in r.values())

    # -- completions ----------------------------------------------------------

    def add_set(self, name: str, source: str) -> None:
        self.run("INSERT INTO prompt_sets (name, source) VALUES (?, ?) ON CONFLICT DO NOTHING", [name, source])

    def add_completion(self, set_name: str, c: dict) -> None:
        """Insert or replace one completion; `c` has id, prompt_ids, output_ids and optional text/meta."""
        with self.connect() as con:
            idx = c.get("idx")
            if idx is None:
                idx = con.execute("SELECT count(*) FROM completions WHERE set_name = ?", [set_name]).fetchone()[0]
            con.execute(
                "INSERT OR REPLACE INTO completions (set_name, prompt_id, idx, prompt, output, prompt_ids, "
                "output_ids, finish_reason, meta_info, request, model_path) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                [set_name, c["id"], idx, c.get("prompt"), c.get("output"), list(c["prompt_ids"]),
                 list(c["output_ids"]), c.get("finish_reason"), json.dumps(c.get("meta_info") or {}),
                 json.dumps(c.get("request")) if c.get("request") is not None else None, c.get("model_path")])

    def sets(self) -> list[dict]:
        return self.rows("SELECT s.name, s.source, s.created, count(c.prompt_id) AS prompts FROM prompt_sets s "
                         "LEFT JOIN completions c ON c.set_name = s.name GROUP BY ALL ORDER BY s.created")

    def completions(self, set_name: str) -> list[dict]:
        return self.rows("SELECT * FROM completions WHERE set_name = ? ORDER BY idx, prompt_id", [set_name])

    def completion_index(self, set_name: str, preview: int = 160) -> list[dict]:
        """The set's completions without token ids and with text cut to `preview` characters (prompt, output),
        plus their token counts: what listings and selectors need."""
        return self.rows("SELECT prompt_id, idx, left(prompt, ?) AS prompt, left(output, ?) AS output, "
                         "len(prompt_ids) AS prompt_tokens, len(output_ids) AS output_tokens, finish_reason, "
                         "meta_info, model_path FROM completions WHERE set_name = ? ORDER BY idx, prompt_id",
                         [preview, preview, set_name])

    def completion(self, set_name: str, prompt_id: str) -> dict | None:
        got = self.rows("SELECT * FROM completions WHERE set_name = ? AND prompt_id = ?", [set_name, prompt_id])
        return got[0] if got else None

    def completion_ids(self, set_name: str) -> set[str]:
        return {r["prompt_id"] for r in self.rows("SELECT prompt_id FROM completions WHERE set_name = ?",
                                                  [set_name])}

    # -- extractions ----------------------------------------------------------

    def add_extraction(self, e: dict) -> None:
        self.run("INSERT INTO extractions (id, set_name, target_path, layer_ids, hidden_size, device, dtype, "
                 "backend, versions, config_hash, status) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                 [e["id"], e["set_name"], e["target_path"], e["layer_ids"], e["hidden_size"], e["device"],
                  e["dtype"], e["backend"], json.dumps(e.get("versions") or {}), e.get("config_hash"),
                  e.get("status", "running")])

    def add_item(self, extraction_id: str, prompt_id: str, tokens: int, file: str) -> None:
        self.run("INSERT OR REPLACE INTO extraction_items VALUES (?,?,?,?)", [extraction_id, prompt_id, tokens, file])

    def items(self, extraction_id: str) -> list[dict]:
        return self.rows("SELECT * FROM extraction_items WHERE extraction_id = ?", [extraction_id])

    def set_status(self, table: str, id_: str, status: str) -> None:
        assert table in ("extractions", "runs")
        self.run(f"UPDATE {table} SET status = ? WHERE id = ?", [status, id_])

    def extractions(self) -> list[dict]:
        return self.rows("SELECT e.*, (SELECT count(*) FROM extraction_items i WHERE i.extraction_id = e.id) "
                         "AS prompts FROM extractions e ORDER BY created, id")

    def extraction(self, id_: str) -> dict:
        return self._one("extractions", id_, "extraction")

    # -- runs -----------------------------------------------------------------

    def add_run(self, r: dict, prompts: list[dict]) -> None:
        """Insert a finished run and its per-prompt results in one transaction."""
        with self.connect() as con:
            con.execute("INSERT INTO runs (id, extraction_id, checkpoint, name, config, tree_budget, summary, "
                        "status, device, dtype, sliding_block, config_file, step) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        [r["id"], r["extraction_id"], r["checkpoint"], r["name"], json.dumps(r["config"]),
                         r["tree_budget"], json.dumps(r["summary"]), r.get("status", "done"), r.get("device"),
                         r.get("dtype"), r.get("sliding_block"), r.get("config_file"), r.get("step")])
            if prompts:
                con.executemany("INSERT INTO run_prompts VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", [
                    [r["id"], p["id"], p["prompt_len"], p["tau"], p["tree_tau"], p["rounds"], p["accepted_at"],
                     p["drafts"], p["tree_at"], p["tree_rounds"], p.get("draft_logp"), p.get("round_top_ids"),
                     p.get("round_top_p")] for p in prompts])

    def runs(self) -> list[dict]:
        return self.rows("SELECT r.*, e.set_name, e.backend, e.target_path FROM runs r "
                         "LEFT JOIN extractions e ON e.id = r.extraction_id ORDER BY r.created, r.id")

    def run_row(self, id_: str) -> dict:
        return self._one("runs", id_, "run")

    def run_prompts(self, run_id: str) -> list[dict]:
        return self.rows("SELECT * FROM run_prompts WHERE run_id = ? ORDER BY prompt_id", [run_id])

    def run_prompt(self, run_id: str, prompt_id: str) -> dict | None:
        """One prompt's whole row of a run (every array), None when the run has no such prompt."""
        got = self.rows("SELECT * FROM run_prompts WHERE run_id = ? AND prompt_id = ?", [run_id, prompt_id])
        return got[0] if got else None

    def analysis(self, run_id: str, name: str) -> dict | list | None:
        got = self.rows("SELECT value FROM run_analyses WHERE run_id = ? AND name = ?", [run_id, name])
        return json.loads(got[0]["value"]) if got else None

    def set_analysis(self, run_id: str, name: str, value: dict | list) -> None:
        self.run("INSERT OR REPLACE INTO run_analyses (run_id, name, value) VALUES (?, ?, ?)",
                 [run_id, name, json.dumps(value)])

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
                con.executemany("INSERT INTO attributions (run_id, tap, layer_id, tau_macro, tau_pooled, "
                                "base_tau_macro, base_tau_pooled) VALUES (?,?,?,?,?,?,?)",
                                [[run_id, r["tap"], r["layer_id"], r["tau_macro"], r["tau_pooled"],
                                  r["base_tau_macro"], r["base_tau_pooled"]] for r in rows])

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
                [[set_name, r["id"], engine, r.get("verify_steps"), r.get("accepted_tokens"),
                  r.get("completion_tokens"), r.get("accept_lengths"), r.get("histogram"), source] for r in rows])

    def engine_stats(self, set_name: str, engine: str) -> list[dict]:
        return self.rows("SELECT * FROM engine_stats WHERE set_name = ? AND engine = ? ORDER BY prompt_id",
                         [set_name, engine])

    def engines(self, set_name: str) -> list[str]:
        """Engines with stats for set `set_name`, by name."""
        return [r["engine"] for r in self.rows("SELECT DISTINCT engine FROM engine_stats WHERE set_name = ? "
                                                "ORDER BY engine", [set_name])]

    def engine_stamp(self) -> str:
        """Changes whenever engine stats are added or replaced (views key their caches on it)."""
        r = self.rows("SELECT count(*) || '|' || coalesce(max(created)::VARCHAR, '') AS s FROM engine_stats")
        return r[0]["s"]

    # -- jobs -----------------------------------------------------------------

    def add_job(self, job_id: str, kind: str, args: dict, log_path: str) -> None:
        self.run("INSERT INTO jobs (id, kind, args, status, progress, step, log_path) VALUES (?,?,?,?,?,?,?)",
                 [job_id, kind, json.dumps(args), "queued", 0.0, "queued", log_path])

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
            got = con.execute("UPDATE jobs SET status = ?, error = ?, updated = now() WHERE id = ? AND status "
                              "IN ('queued', 'running') RETURNING id", [status, error, job_id]).fetchall()
            return bool(got)

    def jobs(self, status: str | None = None, dismissed: bool = True) -> list[dict]:
        """Jobs newest first (each with `dismissed`); `dismissed=False` leaves out those a user dismissed."""
        where = (["status = ?"] if status else []) + ([] if dismissed else ["NOT coalesce(dismissed, false)"])
        return self.rows(f"SELECT * FROM jobs {'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY created DESC",
                         [status] if status else [])

    def dismiss_job(self, job_id: str) -> None:
        """Hide a failed or cancelled job from the jobs panel (`jobs` on the CLI still lists it, dismissed true);
        StoreError for an unknown job or one in another state."""
        with self.connect() as con:
            got = con.execute("UPDATE jobs SET dismissed = true WHERE id = ? AND status IN ('failed', 'cancelled') "
                              "RETURNING id", [job_id]).fetchall()
        if not got:
            status = self.job(job_id)["status"]  # raises for an unknown id
            raise StoreError(f"job {job_id} is {status}; only failed or cancelled jobs can be dismissed "
                             "(cancel a running one first)")

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
