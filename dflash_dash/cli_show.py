"""The CLI's printers of the commands beside the main path: completions and prompts in and out, the reports on
stored runs (compare, import-engine-stats, conformance, signatures, advise, the exports), the listings, the job list,
the demo build and the stand-in server; and their commands, registered on the main parser by `add(sub, command)`.

Contract: as `cli`: results on stdout (one JSON document, or JSON lines for the JSONL exports), notes on stderr, a
user error is raised as UserError (the main loop prints its one line and exits 2). Each printer takes (parsed options,
store, op, the answer of `pipeline.perform`) and returns the exit status (None: 0); `PRINTERS` maps each op to its
printer. No torch: these read the store and kept analyses only. `cli` imports this module (its `_print`, `PRINTERS`,
and `add` for the parser); this module never imports `cli`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import ops
from .store import Row


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=lambda o: o.as_dict() if isinstance(o, Row) else str(o)))


def _lines(rows: list[dict]) -> None:
    for r in rows:
        print(json.dumps(r))


def print_import_prompts(a, store, op: ops.ImportPrompts, got: list[dict]) -> None:
    cats: dict[str, int] = {}
    for r in got:
        cats[r["category"] or "(none)"] = cats.get(r["category"] or "(none)", 0) + 1
    print(f"imported {len(got)} prompts as prompt set {op.name} ({', '.join(f'{c} {n}' for c, n in cats.items())});"
          f" fetch them with: fetch --prompt-set {op.name} --name SET")  # fmt: skip


def print_conformance(a, store, op: ops.Conformance, answer: tuple[dict, list[dict], list[str]]) -> None:
    out, rows, missing = answer
    if missing:
        print(
            f"note: {len(missing)} prompt(s) of run {out['run']} have no {out['engine']} stats: "
            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}",
            file=sys.stderr,
        )
    flagged = sum(r["flagged"] for r in rows)
    print(
        f"{flagged} of {len(rows)} prompt(s) flagged: engine tau = (completion_tokens - 1) / verify_steps below "
        f"the replay's committed / rounds by more than {out['threshold']:g} x replay tau",
        file=sys.stderr,
    )
    print(f"verdict: {out['verdict']}: {out['why']}", file=sys.stderr)
    _print(out)


def print_advise(a, store, op: ops.Advise, out: dict) -> None:
    print(f"best: {out['best']} (predicted speedup on {out['costs']})", file=sys.stderr)
    for why in out["skipped"]:
        print(f"note: {why}", file=sys.stderr)
    _print(out)


def print_jobs(a, store, op: ops.Jobs, out: Any) -> None:
    if op.action == "list":
        _print(out)
    elif op.action == "logs":
        sys.stdout.write(out)
    else:  # cancel: the job's status; rerun: the new job's id
        print(out)


def print_demo(a, store, op: ops.Demo, out: dict) -> None:
    ws = Path(store.workspace).resolve()
    # one line (`make run` ends with the dashboard's URL, not a JSON dump): what was built is in BUILD.json
    print(f"demo workspace ready: {ws} ({len(store.runs())} runs; the build's record: {ws / 'demo' / 'BUILD.json'})")


PRINTERS: dict[type[ops.Op], Callable[..., int | None]] = {
    ops.ImportCompletions: lambda a, store, op, n: print(f"imported {n} completions into set {op.name}"),
    ops.ImportPrompts: print_import_prompts,
    ops.ExportCompletions: lambda a, store, op, rows: _lines(rows),
    ops.ImportEngineStats: lambda a, store, op, n: print(
        f"imported {op.engine} stats of {n} prompts of set {op.completions}"
    ),
    ops.Compare: lambda a, store, op, out: _print(out),
    ops.Conformance: print_conformance,
    ops.Signatures: lambda a, store, op, out: _print(out),
    ops.Advise: print_advise,
    ops.Export: lambda a, store, op, out: _print(out),
    ops.ExportSpecforge: lambda a, store, op, out: _print(out),
    ops.ExportAiperf: lambda a, store, op, recs: _lines(recs),
    ops.ImportSpecforgeEval: lambda a, store, op, out: _print(out),
    ops.Runs: lambda a, store, op, out: _print(out),
    ops.Extractions: lambda a, store, op, out: _print(out),
    ops.Jobs: print_jobs,
    ops.Demo: print_demo,
    ops.Serve: lambda a, store, op, out: None,  # it serves until stopped
}


def add(sub: Any, command: Callable[..., None]) -> None:
    """The report commands on the main parser's subparsers `sub`, each added by `command(sub, op class, help)`."""
    command(sub, ops.Compare, "N runs of one extraction: tau per run and category, paired verdicts (JSON)")
    command(
        sub,
        ops.ImportEngineStats,
        "import another engine's per-prompt speculative counters (JSONL) for a completion set, for `conformance`",
    )
    command(
        sub,
        ops.Conformance,
        "engine tau beside the replay's tau of the same drafter, per prompt; flags prompts where the engine falls "
        "short by more than numeric noise",
    )
    command(
        sub,
        ops.Signatures,
        "training-bug signatures of a run against a healthy reference run: each figure with its 95%% interval, the "
        "reference's, whether it separates and what it suggests (JSON)",
    )
    command(
        sub,
        ops.Advise,
        "what to serve: tau and predicted speedup per number of drafts k = 1..B-1, per DDTree budget and per "
        "temperature replayed for the run's checkpoint, priced by a cost table of `profile`; the best marked (JSON)",
    )
    command(sub, ops.Export, "print a run as JSON")
    command(sub, ops.ExportSpecforge, "print a run's per-position numbers as SpecForge's eval report (JSON)")
    command(sub, ops.ExportAiperf, "print a run's per-request acceptance as AIPerf records (JSONL)")
    command(sub, ops.ImportSpecforgeEval, "keep SpecForge's evaluate-checkpoint JSON with the run of that checkpoint")
    command(sub, ops.Runs, "list runs as JSON")
    command(sub, ops.Extractions, "list extractions as JSON")
