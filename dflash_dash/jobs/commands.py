"""The handlers of the operations that sit above the pipeline, registered with `pipeline.handle` when this module is
imported (the CLI and the job process import it), so they run through `pipeline.perform` as every operation does:
the demo build (`ops.Demo`), the job list and its actions (`ops.Jobs`: list, cancel, logs, rerun) and the backend
parity of two extractions (`ops.Parity`, torch: loaded in the job process only)."""

from __future__ import annotations

from .. import ops, pipeline
from ..store import Store
from . import lifecycle


def demo(store: Store, op: ops.Demo, progress: pipeline.Progress, runner: pipeline.Runner | None) -> dict:
    """Build the demo workspace in the store's workspace; what its BUILD.json records."""
    from .. import demo as demo_mod

    out = demo_mod.build(store.workspace, progress)
    return out if isinstance(out, dict) else {"value": out}


def jobs(store: Store, op: ops.Jobs, progress: pipeline.Progress, runner: pipeline.Runner | None) -> object:
    """The job list (`recent`), or one job cancelled (its status), its log's end (text) or rerun (the new job's id)."""
    if op.action == "list":
        return lifecycle.recent(store, op.limit)
    assert op.id is not None  # ops.Jobs refuses an action without one
    if op.action == "cancel":
        return lifecycle.cancel(store, op.id).status
    if op.action == "logs":
        return lifecycle.log_tail(store, op.id, op.lines)
    return lifecycle.rerun(store, op.id)


def parity(store: Store, op: ops.Parity, progress: pipeline.Progress, runner: pipeline.Runner | None) -> dict:
    """The backend parity of extractions op.a and op.b (parity.run: torch)."""
    from .. import parity as parity_mod

    return parity_mod.run(store, op, progress)


pipeline.handle(ops.Demo, demo, lambda op, out: out)
pipeline.handle(ops.Jobs, jobs)
pipeline.handle(ops.Parity, parity, lambda op, out: out)
