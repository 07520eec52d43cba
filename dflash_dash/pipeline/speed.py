"""The cost table as an operation (`profile`), kept in the store; the cost table a run's prediction uses.

Contract: `profile(store, op, progress, runner)` measures (`replay.profile.profile`, torch on first use) and keeps
the table as a kept analysis under the reserved run id `COSTS` (name = the table's id: its start time and device),
listed newest first under `INDEX`; returns {"id", "table"} (the table as `costs.to_dict`). `tables(store)` lists the
kept tables (dicts with their id), `table(store, id)` gives one as a `costs.CostTable` (None: the newest; no table
kept: None). No network.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

from .. import costs, ops
from ..store import Run, Store
from .base import Progress, Runner

COSTS = "costs"  # the reserved run id under which cost tables are kept (no run has it)
INDEX = "index"  # the kept analysis listing the table ids, newest first
KEEP = 20  # tables listed (older ones stay in the store, unlisted)


def profile(store: Store, op: ops.Profile, progress: Progress = None, runner: Runner | None = None) -> dict:
    """Measure the op's target (and drafter) and keep the table; returns {"id", "table"}."""
    from ..replay import profile as prof  # torch on first use only

    t0 = time.time()
    got = prof.profile(
        op.target,
        op.drafter,
        op.device,
        op.dtype,
        tuple(op.contexts),
        tuple(op.sizes),
        op.repeats,
        op.tree_budget,
        op.draft_config,
        progress,
    )
    return {"id": keep(store, got, t0), "table": costs.to_dict(got)}


def keep(store: Store, tab: costs.CostTable, t0: float | None = None) -> str:
    """Keep cost table `tab` (measured from time `t0`, default now) as the newest; returns its id."""
    stamp = datetime.fromtimestamp(time.time() if t0 is None else t0, timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = id_ = f"{stamp}-{re.sub(r'[^A-Za-z0-9]+', '-', tab.device).strip('-').lower()}"
    n = 1
    while store.analysis(COSTS, id_) is not None:  # two tables in one second: each its own id
        n += 1
        id_ = f"{base}-{n}"
    store.set_analysis(COSTS, id_, costs.to_dict(tab))
    ids = [id_] + [i for i in store.analysis(COSTS, INDEX) or [] if i != id_]
    store.set_analysis(COSTS, INDEX, ids[:KEEP])
    return id_


def tables(store: Store) -> list[dict]:
    """The kept cost tables, newest first: each `costs.to_dict` with its `id`."""
    got = ((i, store.analysis(COSTS, i)) for i in store.analysis(COSTS, INDEX) or [])
    return [t | {"id": i, "meta": t.get("meta", {}) | {"id": i}} for i, t in got if t]


def table(store: Store, id_: str | None = None) -> costs.CostTable | None:
    """Cost table `id_` (None: the newest kept; None when none is kept). An unknown id: CostError naming it."""
    kept = tables(store)
    if id_ is None:
        return costs.from_dict(kept[0]) if kept else None
    for t in kept:
        if t["id"] == id_:
            return costs.from_dict(t)
    have = ", ".join(t["id"] for t in kept) or "none yet: run profile --target DIR --drafter CKPT"
    raise costs.CostError(f"cost table {id_!r}: not in this workspace (kept: {have})")


def predicted(store: Store, run_id: str, tab: costs.CostTable) -> dict:
    """Run `run_id`'s predicted speedup on cost table `tab` (`analysis.speedup.predict`, verify = its block size),
    with the engine's measured tokens/s of its set where the engine reported timings (`measured`: None otherwise);
    computed once per (run, table) and kept ("speedup:<table id>")."""
    from ..analysis import speedup as sp

    name = f"speedup:{tab.meta.get('id', '')}"
    got = store.analysis(run_id, name)
    if got is not None:
        return got
    r = store.run_row(run_id)
    got = sp.predict(store.prompts(run_id), tab, r.block_size)
    got["measured"] = measured(store, r)
    store.set_analysis(run_id, name, got)
    return got


def measured(store: Store, run: Run) -> dict | None:
    """The engine's tokens/s over the run's completion set, as it reported them (`analysis.speedup.run_rate`)."""
    from ..analysis import speedup as sp

    comps = store.completions(run.set_name or "")
    return sp.run_rate([(c.meta_info, len(c.output_ids or [])) for c in comps])


def advise(store: Store, run_id: str, costs_id: str | None = None) -> dict:
    """What to serve for run `run_id`'s checkpoint (`analysis.speedup.advise`): the run, then every other run of the
    same checkpoint on the same extraction (their tree budgets and temperatures), priced by cost table `costs_id`
    (None: the newest). CostError when no table is kept."""
    from ..analysis import speedup as sp

    tab = table(store, costs_id)
    if tab is None:
        raise costs.CostError("no cost table in this workspace yet; run profile --target DIR --drafter CKPT first")
    r = store.run_row(run_id)
    same = [x for x in store.runs() if x.id != r.id and x.checkpoint == r.checkpoint]
    same = [x for x in same if x.extraction_id == r.extraction_id and x.status == "done"]
    runs = [(r, store.prompts(r.id))] + [(x, store.prompts(x.id)) for x in same]
    return sp.advise(runs, tab) | {"costs_id": tab.meta.get("id"), "device": tab.device}
