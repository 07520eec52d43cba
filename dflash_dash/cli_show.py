"""The CLI's report commands: store reads printed as JSON (compare, import-engine-stats, conformance, signatures,
advise, the exports and the runs/extractions listings), registered on the main parser by `add(sub)`.

Contract: as `cli`: results on stdout (one JSON document), notes on stderr, a user error is raised as UserError
(the main loop prints its one line and exits 2). No torch: these read the store and kept analyses only. `cli`
imports this module (its `_print`, and `add` for the parser); this module never imports `cli`.
"""

from __future__ import annotations

import json
import sys

from . import pipeline
from .pipeline import speed, trainers
from .store import Row


def _print(obj) -> None:
    print(json.dumps(obj, indent=2, default=lambda o: o.as_dict() if isinstance(o, Row) else str(o)))


def cmd_import_engine_stats(a, store):
    n = pipeline.import_engine_stats(store, a.file, a.completions, a.engine)
    print(f"imported {a.engine} stats of {n} prompts of set {a.completions}")


def cmd_conformance(a, store):
    out, rows, missing = pipeline.conformance(store, a.run, a.engine, a.threshold)
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


def cmd_signatures(a, store):
    _print(pipeline.signatures(store, a.run, a.reference))


def cmd_advise(a, store):
    out = speed.advise(store, store.run_row(a.run)["id"], a.costs)
    print(f"best: {out['best']} (predicted speedup on {out['costs']})", file=sys.stderr)
    for why in out["skipped"]:
        print(f"note: {why}", file=sys.stderr)
    _print(out)


def cmd_export(a, store):
    _print(pipeline.export(store, a.run))


def cmd_export_aiperf(a, store):
    for rec in trainers.aiperf_export(store, a.run):
        print(json.dumps(rec))


def cmd_list(a, store):
    _print(pipeline.listing(store, a.command))


def add(sub) -> None:
    """The report commands on the main parser's subparsers `sub`."""
    s = sub.add_parser("compare", help="N runs of one extraction: tau per run and category, paired verdicts (JSON)")
    s.add_argument("--runs", nargs="+", required=True, help="run ids (see `runs`); each is judged against the first")
    s.set_defaults(fn=lambda a, store: _print(pipeline.compare(store, a.runs)))

    s = sub.add_parser(
        "import-engine-stats",
        help="import another engine's per-prompt speculative counters (JSONL) for a completion set, for `conformance`",
    )
    s.add_argument("file", help='JSONL: {"id", "verify_steps", "accepted_tokens"} or {"id", "accept_lengths": [...]}')
    s.add_argument("--completions", required=True, help="the completion set the engine generated (same prompt ids)")
    s.add_argument("--engine", required=True, help="engine name, e.g. vllm (sglang: stats recorded at fetch)")
    s.set_defaults(fn=cmd_import_engine_stats)

    s = sub.add_parser(
        "conformance",
        help="engine tau beside the replay's tau of the same drafter, per prompt; "
        "flags prompts where the engine falls short by more than numeric noise",
    )
    s.add_argument("--run", default="latest", help="replay run of the drafter the engine served")
    s.add_argument("--engine", help="engine whose stats to compare (default: sglang, or the only one)")
    s.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="flag when replay tau - engine tau > THRESHOLD x replay tau (default 0.05)",
    )
    s.set_defaults(fn=cmd_conformance)

    s = sub.add_parser(
        "signatures",
        help="training-bug signatures of a run against a healthy reference run: each figure with its 95%% "
        "interval, the reference's, whether it separates and what it suggests (JSON)",
    )
    s.add_argument("--run", help="run to diagnose (default: the least healthy run beside the reference)")
    s.add_argument("--reference", help="healthy reference run (default: the highest tau macro on the run's extraction)")
    s.set_defaults(fn=cmd_signatures)

    s = sub.add_parser(
        "advise",
        help="what to serve: tau and predicted speedup per number of drafts k = 1..B-1, per DDTree budget and per "
        "temperature replayed for the run's checkpoint, priced by a cost table of `profile`; the best marked (JSON)",
    )
    s.add_argument("--run", default="latest", help="run id (see `runs`); its checkpoint's other runs join in")
    s.add_argument("--costs", default=None, help="cost table id (see `profile`; default: the newest)")
    s.set_defaults(fn=cmd_advise)

    s = sub.add_parser("export", help="print a run as JSON")
    s.add_argument("--run", default="latest")
    s.set_defaults(fn=cmd_export)

    s = sub.add_parser("export-specforge", help="print a run's per-position numbers as SpecForge's eval report (JSON)")
    s.add_argument("--run", default="latest")
    s.set_defaults(fn=lambda a, store: _print(trainers.specforge_export(store, a.run)))

    s = sub.add_parser("export-aiperf", help="print a run's per-request acceptance as AIPerf records (JSONL)")
    s.add_argument("--run", default="latest")
    s.set_defaults(fn=cmd_export_aiperf)

    s = sub.add_parser(
        "import-specforge-eval", help="keep SpecForge's evaluate-checkpoint JSON with the run of that checkpoint"
    )
    s.add_argument("file")
    s.add_argument("--run", default="latest", help="run id of the same checkpoint (see `runs`)")
    s.set_defaults(fn=lambda a, store: _print(trainers.import_specforge(store, a.file, a.run)))

    for what in ("runs", "extractions"):
        s = sub.add_parser(what, help=f"list {what} as JSON")
        s.set_defaults(fn=cmd_list)
