"""One workspace's DuckDB file: connections under a cross-process lock, sessions, transactions, migration.

Contract: every call opens a short-lived DuckDB connection under an exclusive cross-process file lock
(`dflash.duckdb.lock`, flock), so the app, background jobs and the CLI share one file without lock errors:
DuckDB itself allows one read-write process per file; inside `with store.session():` the calls share one
connection (a page run, a bulk import), the lock held until the block ends. The first connection of a Store
brings the schema up to `schema.VERSION`. Rows come back as plain dicts; JSON columns are decoded.
"""

from __future__ import annotations

import fcntl
import json
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import duckdb

from . import schema
from .errors import StoreError

DB_NAME = "dflash.duckdb"
JSON_COLS = {"meta_info", "request", "versions", "config", "summary", "args", "result", "layer_ids_json", "raw"}
REENTRY_S = 0.01  # a process re-locking sooner than this after its own release steps aside first
_last_release = -1.0  # monotonic time this process last released the store lock


def new_id(prefix: str) -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


class Database:
    """One workspace's DuckDB file, connection and lock handling only (`Store` adds the typed queries). Cheap to
    construct; holds no open connection outside `session()`."""

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
        if have > schema.VERSION:
            raise StoreError(
                f"{self.path} has schema version {have}, newer than this dflash-dash ({schema.VERSION}); "
                "upgrade dflash-dash"
            )
        for v in range(have, schema.VERSION):
            with self._transaction(con):
                step = schema.MIGRATIONS[v]
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


def _decode(row: dict) -> dict:
    for k in JSON_COLS & row.keys():
        if isinstance(row[k], str):
            row[k] = json.loads(row[k])
    return row
