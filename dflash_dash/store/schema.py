"""The store's schema as append-only forward migrations; the current version is their count.

Contract: MIGRATIONS[v] upgrades a store from version v to v + 1, as SQL or as a function of (connection, store)
for a data rewrite; a released entry is never edited, a new one is appended. The database layer applies the
missing ones in order, each in its own transaction, and refuses a store newer than VERSION.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .arrays import V7_ARRAYS

if TYPE_CHECKING:
    from .queries import Store


def _v7_arrays_to_files(con, store: Store) -> None:
    """v7: run_prompts' LIST columns move to array files (`Store.put_prompts`), in one pass over the old table: the
    files are written as its rows stream in, the rows pointing into them inserted after."""
    con.execute("ALTER TABLE run_prompts RENAME TO run_prompts_v6")
    con.execute(RUN_PROMPTS_V7)
    cols = ["run_id", "prompt_id", "prompt_len", "tau", "tree_tau", *V7_ARRAYS]
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
    # v8: several serving engines: the engine each completion came from (sglang, vllm, llamacpp), and engine stats
    # kept in the engine's own terms: draft tokens proposed, the fields the engine did not report (never guessed),
    # and the engine's speculative payload as it came (JSON)
    """
    ALTER TABLE completions ADD COLUMN engine VARCHAR;
    ALTER TABLE engine_stats ADD COLUMN drafted_tokens INTEGER;
    ALTER TABLE engine_stats ADD COLUMN missing VARCHAR[];
    ALTER TABLE engine_stats ADD COLUMN raw VARCHAR;
    """,
    # v9: each prompt's category where its set has them (MT-Bench, SPEED-Bench, any JSONL with a category field), for
    # per-category tau; NULL where the set has none
    "ALTER TABLE completions ADD COLUMN category VARCHAR;",
    # v10: what the engine said it served when a set was fetched (its drafter, algorithm, block size: the JSON of
    # `engines.base.served_row` plus the local identity of the draft path when it is readable here; NULL: the
    # engine does not say), beside the set's engine stats, so conformance can tell another drafter from a fault
    """
    CREATE TABLE engine_served (set_name VARCHAR, engine VARCHAR, served VARCHAR, source VARCHAR,
        created TIMESTAMP DEFAULT now(), PRIMARY KEY (set_name, engine));
    """,
]
VERSION = len(MIGRATIONS)
