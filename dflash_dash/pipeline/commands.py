"""The handlers of the CLI's other commands (`ops.COMMANDS`): completions and prompts in and out, the reports on
stored runs, the listings and the stand-in server, each `handler(store, op, progress, runner)` as every handler of
`perform` (`TABLE`, merged into the package's). They only unpack the op for the functions that do the work; the
answer is what the CLI's printer for the op shows. The job list's handler lives above, in jobs.commands."""

from __future__ import annotations

from collections.abc import Callable

from .. import ops
from ..store import Store
from .base import Progress, Runner
from .ingest import export_completions, import_completions, import_prompts
from .kept import compare, conformance, export, import_engine_stats, listing, signatures
from .speed import advise
from .trainers import aiperf_export, import_specforge, specforge_export


def serve(store: Store, op: ops.Serve, progress: Progress, runner: Runner | None) -> None:
    """Run the stand-in server with the op's options (blocking; its module imports torch, so it is loaded here)."""
    from ..server import options

    options.run(op)


def _advise(store: Store, op: ops.Advise, progress: Progress, runner: Runner | None) -> dict:
    return advise(store, store.run_row(op.run).id, op.costs)


TABLE: dict[type[ops.Op], Callable] = {
    ops.ImportCompletions: lambda store, op, progress, runner: import_completions(store, op.file, op.name),
    ops.ImportPrompts: lambda store, op, progress, runner: import_prompts(store, op.file, op.name, op.format),
    ops.ExportCompletions: lambda store, op, progress, runner: export_completions(store, op.name),
    ops.ImportEngineStats: lambda store, op, progress, runner: import_engine_stats(
        store, op.file, op.completions, op.engine
    ),
    ops.Compare: lambda store, op, progress, runner: compare(store, op.runs),
    ops.Conformance: lambda store, op, progress, runner: conformance(store, op.run, op.engine, op.threshold),
    ops.Signatures: lambda store, op, progress, runner: signatures(store, op.run, op.reference),
    ops.Advise: _advise,
    ops.Export: lambda store, op, progress, runner: export(store, op.run),
    ops.ExportSpecforge: lambda store, op, progress, runner: specforge_export(store, op.run),
    ops.ExportAiperf: lambda store, op, progress, runner: aiperf_export(store, op.run),
    ops.ImportSpecforgeEval: lambda store, op, progress, runner: import_specforge(store, op.file, op.run),
    ops.Runs: lambda store, op, progress, runner: listing(store, "runs"),
    ops.Extractions: lambda store, op, progress, runner: listing(store, "extractions"),
    ops.Serve: serve,
}
