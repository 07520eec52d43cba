"""The operations users run: import, fetch, extract, replay, sweep, attribute, export. Glue between the layers
below (target, drafter, replay, metrics, analysis) and the store; no HTML, no SQL, no math of its own.

Contract: one handler per `ops` dataclass, each called as `handler(store, op, progress, runner)`; `perform` looks
the handler up by the op's type (`TABLE`), hands it its runner (`worker.here` unless given one: jobs.workers' pool,
a Ray cluster) and returns the job's result (plain JSON, `RESULT`). The handlers exported here default the runner
the same way for callers outside `perform`. Every operation is resumable: work already recorded in the store is
not redone. Replay and export never touch the network.
The parts, no import circle among them: `base` (progress, runner type, dtypes), `features` (reading an extraction's
features), `runs` (storing a run with its settings, reuse), `worker` (the per-prompt `work` and `here`, above the
worker halves), `ingest` (completions in and out, fetch, tokenizers), `extract` (its `disk` check first), `replay`
(replay, sweep, sliding check; `stream` for --stream), `device_io` (passes, loader thread, pinned uploads: the
replay worker's loop), `attribute`, `baseline` (model-free proposers stored as runs), `kept` (kept analyses,
conformance, export, listings), `sampled` (what a set's requests asked for: length, greedy or sampled),
`commands` (the handlers of the CLI's other commands: import, export, reports, listings, the stand-in server).
Operations above the pipeline (the demo build, the job list, the backend parity) register their handlers with
`handle` from their own layer (jobs.commands), so every operation, and every CLI command, runs through `perform`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from .. import ops
from ..ops import InputError
from ..store import Store
from .attribute import attribute
from .audit import audit, audits
from .base import DTYPES, Progress, Runner, features_root
from .baseline import baseline
from .commands import TABLE as COMMANDS
from .diagnose import rank_faults
from .extract import extract as _extract, layers_of
from .features import LayersMissing
from .ingest import (
    export_completions,
    fetch,
    hub_snapshot,
    import_completions,
    import_features,
    import_prompts,
    parse_jsonl,
    prompt_folder,
)
from .kept import ANALYSES, analysis, compare, conformance, export, import_engine_stats, keep, listing, signatures
from .live import live, live_for
from .replay import check_replay, checkpoints_in, replay as _replay, sliding_check as _sliding_check, sweep as _sweep
from .runs import store_run
from .sampled import set_sampling
from .speed import profile
from .worker import here, work


def _runs_here(handler: Callable) -> Callable:
    """`handler` with its runner defaulting to `here` (this process), for callers outside `perform`."""

    @wraps(handler)
    def call(store: Store, op: ops.Op, progress: Progress = None, runner: Runner | None = None):
        return handler(store, op, progress, runner or here(store))

    return call


extract, replay, sweep, sliding_check = (_runs_here(h) for h in (_extract, _replay, _sweep, _sliding_check))

__all__ = [
    "ANALYSES",
    "DTYPES",
    "InputError",
    "LayersMissing",
    "Progress",
    "RESULT",
    "Runner",
    "TABLE",
    "analysis",
    "compare",
    "attribute",
    "audit",
    "audits",
    "baseline",
    "check_replay",
    "checkpoints_in",
    "conformance",
    "export",
    "export_completions",
    "extract",
    "features_root",
    "handle",
    "fetch",
    "here",
    "hub_snapshot",
    "import_completions",
    "import_prompts",
    "prompt_folder",
    "import_engine_stats",
    "import_features",
    "keep",
    "layers_of",
    "listing",
    "live",
    "live_for",
    "parse_jsonl",
    "perform",
    "profile",
    "replay",
    "set_sampling",
    "sliding_check",
    "signatures",
    "store_run",
    "sweep",
    "work",
]


Handler = Callable[[Store, ops.Op, Progress, Runner | None], object]

TABLE: dict[type[ops.Op], Handler] = {
    ops.Fetch: fetch,
    ops.Extract: extract,
    ops.Replay: replay,
    ops.Sweep: sweep,
    ops.SlidingCheck: sliding_check,
    ops.Attribute: attribute,
    ops.Baseline: baseline,
    ops.Audit: audit,
    ops.Profile: profile,
    ops.Live: live,
    ops.Diagnose: lambda store, op, progress, runner: rank_faults(store, op.run, op.engine, progress),
} | COMMANDS

# what a job records of each handler's answer (plain JSON, small)
RESULT: dict[type[ops.Op], Callable[[ops.Op, object], dict]] = {
    ops.Fetch: lambda op, n: {"set": op.name, "fetched": n},
    ops.Extract: lambda op, ex_id: {"extraction": ex_id},
    ops.Replay: lambda op, out: {"run": out["id"]},
    ops.Sweep: lambda op, ids: {"runs": list(ids), "skipped": ids.skipped},
    ops.SlidingCheck: lambda op, out: {"causal": out["causal"], "bidirectional": out["bidirectional"]},
    ops.Attribute: lambda op, out: {"run": out["run"], "taps": len(out["taps"])},
    ops.Baseline: lambda op, out: {"run": out["id"]},
    ops.Audit: lambda op, out: {"audit": out["id"], "clean": out["clean"], "faults": out.get("faults", [])},
    ops.Profile: lambda op, out: {"costs": out["id"], "device": out["table"]["device"]},
    ops.Live: lambda op, out: {"live": out["key"], "speedup": out["summary"]["speedup"]},
    ops.Diagnose: lambda op, out: {"run": out["run"], "engine": out["engine"], "explained_by": out["explained_by"]},
}


def handle(cls: type[ops.Op], handler: Handler, result: Callable[[ops.Op, object], dict] | None = None) -> None:
    """Register the handler of operation `cls` (and what a job records of its answer): how an operation above the
    pipeline (jobs.commands: the demo build, the job list, the backend parity) joins `perform`."""
    TABLE[cls] = handler
    if result is not None:
        RESULT[cls] = result


def perform(store: Store, op: ops.Op, progress: Progress = None, runner: Runner | None = None, answer: bool = False):
    """Run one operation given as its `ops` dataclass (what a job and every CLI command run): TABLE[type(op)](store,
    op, progress, runner), shaped as the job's result dict (`RESULT`), or with `answer` the handler's own answer
    (what the CLI's printer for the op shows). `runner` shards the per-prompt work of extract, replay and sweep over
    worker processes (jobs.workers); without it the work runs here, on the op's device (its one GPU when `gpus`
    names one). The operations above the pipeline are registered by their layer (`handle`); an extraction's GPU
    orchestration is the job's (it calls this inside it)."""
    handler = TABLE.get(type(op))
    if handler is None:
        raise InputError(f"{op.kind}: no handler registered (import dflash_dash.jobs.commands)")
    out = handler(store, op, progress, runner or here(store))
    return out if answer else RESULT[type(op)](op, out)
