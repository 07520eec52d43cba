"""The feature audit as an operation: a trainer's cache recomputed by the product's extraction, the report kept.

Contract: `audit(store, op, progress, runner)` runs `audit.audit` with the op's fields (the torch path forced on CPU,
recorded in the report) and keeps the report in the store as a kept analysis under the reserved run id `AUDITS`
(name = the audit's id: its start time and the cache folder's name); `audits(store)` lists the kept reports, newest
first, for the Diagnostics page. No network.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

from .. import ops
from ..store import Store
from .base import Progress, Runner

AUDITS = "audits"  # the reserved run id under which audit reports are kept (no run has it)
INDEX = "index"  # the kept analysis listing the audit ids, newest first
KEEP = 20  # audit reports listed (older ones stay in the store, unlisted)


def audit(store: Store, op: ops.Audit, progress: Progress = None, runner: Runner | None = None) -> dict:
    """Audit `op.features` against `op.target` and keep the report; returns it with its `id`."""
    from .. import audit as audit_mod  # torch on first use only

    t0 = time.time()
    out = audit_mod.audit(op.features, op.target, op.layers, op.drafter, op.samples, op.device, op.dtype, progress)
    stamp = datetime.fromtimestamp(t0, timezone.utc).strftime("%Y%m%d-%H%M%S")
    out["id"] = f"{stamp}-{Path(op.features).name}"
    store.set_analysis(AUDITS, out["id"], out)
    ids = [out["id"]] + [i for i in store.analysis(AUDITS, INDEX) or [] if i != out["id"]]
    store.set_analysis(AUDITS, INDEX, ids[:KEEP])
    return out


def audits(store: Store) -> list[dict]:
    """The kept audit reports, newest first."""
    got = (store.analysis(AUDITS, i) for i in store.analysis(AUDITS, INDEX) or [])
    return [a for a in got if a]
