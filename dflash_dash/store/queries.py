"""The workspace store's typed queries: completions, extractions, runs and their packed arrays, kept analyses,
attributions, engine stats, jobs.

Contract: `Store` is a `Database` (connection, lock, migration) with one method per question the product asks;
rows come back as the frozen dataclasses of `rows` (`Run`, `Extraction`, `Completion`, `Job`, ...), JSON columns
decoded; a run prompt's row (still a dict) has its arrays unpacked from its array file;
a run's prompt rows go in, and come back from `prompts`, as `metrics.Prompt`s (the column `prompt_id` is their
`id`). Knows nothing of torch, HTTP or Streamlit.
"""

from __future__ import annotations

import json
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..metrics import Prompt
from . import arrays
from .arrays import ARRAYS_DIR, pack_arrays, unpack_arrays
from .database import Database
from .errors import StoreError
from .rows import Attribution, Completion, CompletionEntry, Extraction, Item, Job, PromptSet, Run


class Store(Database):
    """One workspace's DuckDB file and its queries. Cheap to construct; holds no open connection outside
    `session()`."""

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
                    "engine": pa.array([c.get("engine") for c in cs], pa.string()),
                    "category": pa.array([c.get("category") for c in cs], pa.string()),
                }
            )
            con.register("_add_completions", t)
            try:
                con.execute(
                    "INSERT OR REPLACE INTO completions (set_name, prompt_id, idx, prompt, output, prompt_ids, "
                    "output_ids, finish_reason, meta_info, request, model_path, engine, category) "
                    "SELECT * FROM _add_completions"
                )
            finally:
                con.unregister("_add_completions")

    def sets(self) -> list[PromptSet]:
        return self._of(
            PromptSet,
            "SELECT s.name, s.source, s.created, count(c.prompt_id) AS prompts FROM prompt_sets s "
            "LEFT JOIN completions c ON c.set_name = s.name GROUP BY ALL ORDER BY s.created",
        )

    def completions(self, set_name: str) -> list[Completion]:
        return self._of(Completion, "SELECT * FROM completions WHERE set_name = ? ORDER BY idx, prompt_id", [set_name])

    def completion_requests(self, set_name: str) -> list[dict]:
        """{prompt_id, engine, request} of the set's completions: what each request asked for, without the outputs."""
        return self.rows(
            "SELECT prompt_id, engine, request FROM completions WHERE set_name = ? ORDER BY idx, prompt_id", [set_name]
        )

    def completion_index(self, set_name: str, preview: int = 160) -> list[CompletionEntry]:
        """The set's completions without token ids and with text cut to `preview` characters (prompt, output),
        plus their token counts: what listings and selectors need."""
        return self._of(
            CompletionEntry,
            "SELECT prompt_id, idx, left(prompt, ?) AS prompt, left(output, ?) AS output, "
            "len(prompt_ids) AS prompt_tokens, len(output_ids) AS output_tokens, finish_reason, "
            "meta_info, model_path, category FROM completions WHERE set_name = ? ORDER BY idx, prompt_id",
            [preview, preview, set_name],
        )

    def completion(self, set_name: str, prompt_id: str) -> Completion | None:
        got = self._of(
            Completion, "SELECT * FROM completions WHERE set_name = ? AND prompt_id = ?", [set_name, prompt_id]
        )
        return got[0] if got else None

    def categories(self, set_name: str) -> dict[str, str | None]:
        """{prompt id: its category} of the set's completions (None where the set has none)."""
        rows = self.rows("SELECT prompt_id, category FROM completions WHERE set_name = ?", [set_name])
        return {r["prompt_id"]: r["category"] for r in rows}

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

    def items(self, extraction_id: str) -> list[Item]:
        return self._of(Item, "SELECT * FROM extraction_items WHERE extraction_id = ?", [extraction_id])

    def set_status(self, table: str, id_: str, status: str) -> None:
        assert table in ("extractions", "runs")
        self.run(f"UPDATE {table} SET status = ? WHERE id = ?", [status, id_])

    def extractions(self) -> list[Extraction]:
        return self._of(Extraction, EXTRACTIONS + " ORDER BY created, id")

    def extraction(self, id_: str) -> Extraction:
        """The extraction `id_` (or "latest": the newest finished one); StoreError naming the id otherwise."""
        return Extraction.of(self._one("extractions", id_, "extraction"))

    # -- runs -----------------------------------------------------------------

    def add_run(self, r: dict, prompts: list[Prompt]) -> None:
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

    def put_prompts(self, run_id: str, prompts: list[Prompt | dict]) -> None:
        """Insert or replace run `run_id`'s per-prompt rows in one transaction: scored `Prompt`s, or run_prompts
        rows as `run_prompts` reads them (keyed `prompt_id`; an array None is stored as None: a row rewritten as
        an older run held it). The arrays are packed into one new array file (written whole, then renamed into
        place), the rows pointing into it."""
        if not prompts:
            return
        t, f = self._write_arrays(run_id, prompts)
        try:
            with self.connect() as con:
                self._insert_prompts(con, t)
        except BaseException:
            f.unlink(missing_ok=True)
            raise

    def _write_arrays(self, run_id: str, prompts: list[Prompt | dict]):
        """The prompts' arrays packed into one new array file (written whole, then renamed into place): (the
        run_prompts rows pointing into it as an arrow table, the file)."""
        import pyarrow as pa

        rel = Path(ARRAYS_DIR) / run_id / f"{uuid.uuid4().hex}.arrays"
        f = self.workspace / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        rows = [p if isinstance(p, dict) else vars(p) | {"prompt_id": p.id} for p in prompts]
        with ThreadPoolExecutor(arrays.PACKERS) as pool:  # zlib and numpy release the GIL: rows pack side by side
            blobs = list(pool.map(pack_arrays, rows))
        tmp = f.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            out.writelines(blobs)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, f)
        sizes = np.fromiter(map(len, blobs), np.int64, len(blobs))
        return pa.table(
            {
                "run_id": [run_id] * len(rows),
                "prompt_id": [p["prompt_id"] for p in rows],
                "prompt_len": pa.array([p["prompt_len"] for p in rows], pa.int32()),
                "tau": pa.array([p["tau"] for p in rows], pa.float64()),
                "tree_tau": pa.array([p["tree_tau"] for p in rows], pa.float64()),
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

    def runs(self) -> list[Run]:
        return self._of(Run, RUNS + " ORDER BY r.created, r.id")

    def run_row(self, id_: str) -> Run:
        """The run `id_` (or "latest": the newest finished drafter run) with its extraction's set, backend and
        target; StoreError naming the id otherwise."""
        return Run.of(self._one("runs", id_, "run"))

    def run_prompts(self, run_id: str) -> list[dict]:
        """Every prompt's whole row of a run (every array, decoded), by prompt id."""
        return self._with_arrays(self.rows("SELECT * FROM run_prompts WHERE run_id = ? ORDER BY prompt_id", [run_id]))

    def prompts(self, run_id: str) -> list[Prompt]:
        """Every prompt's row of a run as a `Prompt` (the arrays flat, as stored), by prompt id."""
        return [Prompt.from_row(r) for r in self.run_prompts(run_id)]

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

    def _of(self, cls, sql: str, params: list | None = None) -> list:
        return [cls.of(r) for r in self.rows(sql, params)]

    def _one(self, table: str, id_: str, what: str) -> dict:
        """One row of `table` (runs or extractions, with the columns `runs()` / `extractions()` add) by id, or
        "latest": the newest finished one."""
        select, t = (RUNS, "r") if table == "runs" else (EXTRACTIONS, "e")
        if id_ == "latest":  # a run: the newest drafter's (a model-free baseline is never "the latest replay")
            drafter = f" AND {t}.checkpoint NOT LIKE 'baseline:%'" if table == "runs" else ""
            got = self.rows(
                f"{select} WHERE {t}.status = 'done'{drafter} ORDER BY {t}.created DESC, {t}.id DESC LIMIT 1"
            )
            if not got:
                raise StoreError(f"no finished {what} in {self.workspace} yet")
            return got[0]
        got = self.rows(f"{select} WHERE {t}.id = ?", [id_])
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

    def attributions(self, run_id: str) -> list[Attribution]:
        return self._of(Attribution, "SELECT * FROM attributions WHERE run_id = ? ORDER BY tap", [run_id])

    # -- engine stats (conformance: acceptance a serving engine reported per request) ------------------

    def add_engine_stats(self, set_name: str, engine: str, rows: list[dict], source: str) -> None:
        """Insert or replace engine `engine`'s stats of prompts of set `set_name` in one transaction; rows hold
        id, verify_steps, accepted_tokens, completion_tokens, accept_lengths, histogram, drafted_tokens, missing
        (the fields the engine did not report) and raw (its payload as it came), None where unknown."""
        with self.connect() as con:
            con.executemany(
                "INSERT OR REPLACE INTO engine_stats (set_name, prompt_id, engine, verify_steps, accepted_tokens, "
                "completion_tokens, accept_lengths, histogram, source, drafted_tokens, missing, raw) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
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
                        r.get("drafted_tokens"),
                        r.get("missing") or None,
                        json.dumps(r["raw"]) if r.get("raw") is not None else None,
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

    def set_served(self, set_name: str, engine: str, served: dict | None, source: str) -> None:
        """Keep what engine `engine` said it served for set `set_name` (None: it does not say; `source`: where that
        was asked)."""
        self.run(
            "INSERT OR REPLACE INTO engine_served (set_name, engine, served, source) VALUES (?, ?, ?, ?)",
            [set_name, engine, None if served is None else json.dumps(served), source],
        )

    def served(self, set_name: str, engine: str) -> dict | None:
        """{"served": the JSON kept by `set_served` (None: the engine did not say), "source"}; None when nothing was
        recorded (stats imported from a file, or fetched before this was kept)."""
        got = self.rows(
            "SELECT served, source FROM engine_served WHERE set_name = ? AND engine = ?", [set_name, engine]
        )
        if not got:
            return None
        return {"served": json.loads(got[0]["served"]) if got[0]["served"] else None, "source": got[0]["source"]}

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

    def jobs(self, status: str | None = None, dismissed: bool = True) -> list[Job]:
        """Jobs newest first (each with `dismissed`); `dismissed=False` leaves out those a user dismissed."""
        where = (["status = ?"] if status else []) + ([] if dismissed else ["NOT coalesce(dismissed, false)"])
        return self._of(
            Job,
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
            status = self.job(job_id).status  # raises for an unknown id
            raise StoreError(
                f"job {job_id} is {status}; only failed or cancelled jobs can be dismissed (cancel a running one first)"
            )

    def job(self, job_id: str) -> Job:
        got = self._of(Job, "SELECT * FROM jobs WHERE id = ?", [job_id])
        if not got:
            raise StoreError(f"no job with id {job_id!r} (list them with `jobs list`)")
        return got[0]


# a run's columns and its extraction's set, backend and target (a baseline's set from its summary)
RUNS = (
    "SELECT r.*, coalesce(e.set_name, json_extract_string(r.summary, '$.set_name')) AS set_name, e.backend, "
    "e.target_path FROM runs r LEFT JOIN extractions e ON e.id = r.extraction_id"
)
# an extraction's columns and its count of feature files
EXTRACTIONS = (
    "SELECT e.*, (SELECT count(*) FROM extraction_items i WHERE i.extraction_id = e.id) AS prompts FROM extractions e"
)


def default_workspace() -> Path:
    return Path(os.environ.get("DFLASH_WORKSPACE", "cache"))
