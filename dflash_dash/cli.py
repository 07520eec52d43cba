"""Command-line front over the pipeline: `python -m dflash_dash --workspace W <command> ...`.

Contract: a stable interface scripts rely on. Results go to stdout (ids, JSON); progress and errors go
to stderr; a user error exits with status 2 and a one-line message naming the problem and the fix,
never a traceback. Each operation's options are generated from its `ops` dataclass (`add_op_options`: flag,
type, choices, default and help from each field's declaration, `ops.setting`) and turned back into one (`op_of`);
every operation's command runs it through `pipeline.perform` (`cmd_op`) and shows the answer with its printer
(`PRINTERS`), so the CLI, jobs and pages share one definition and one path; `--gpus 0,1` (extract, replay, sweep) shards
the prompts over one worker process per device (jobs.workers.pool), `--gpus cpu,cpu` over CPU workers, `--ray
auto|HOST:PORT` over one worker per GPU of a Ray cluster (jobs.cluster); `extract
--drafter A --drafter B` extracts the union of both drafters' layers (each replays on its own columns).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import MISSING, fields, replace
from pathlib import Path

from . import cli_show, ops, pipeline, prompts
from .cli_show import _print
from .errors import UserError
from .pipeline import disk
from .store import Store, default_workspace

_MIDLINE = [False]  # a progress bar is on stderr without its newline yet
_SAID = [""]  # the last progress line written off a terminal
BAR = 24  # characters of the progress bar


def fit(msg: str, width: int) -> str:
    """`msg` in at most `width` characters: cut in the middle (head … tail), so a long path keeps its end."""
    if len(msg) <= width:
        return msg
    tail = (width - 1) * 2 // 3
    return msg[: width - 1 - tail] + "…" + msg[len(msg) - tail :]


def progress(done: int, total: int, msg: str) -> None:
    """Progress on stderr. On a terminal: one bar line rewritten in place, the message fitted to the terminal's
    width (`fit`: never wrapped, never cut mid-path at a fixed column). Elsewhere (a log file, a pipe): one whole
    line per new message, without carriage returns."""
    head = f"{done}/{total}"
    if not sys.stderr.isatty():
        line = f"[{head}] {msg}"
        if line != _SAID[0]:
            sys.stderr.write(line + "\n")
            _SAID[0] = line
        sys.stderr.flush()
        return
    fill = int(BAR * done / total) if total else 0
    room = shutil.get_terminal_size((100, 24)).columns - BAR - len(head) - 5
    sys.stderr.write(f"\r[{'#' * fill}{'.' * (BAR - fill)}] {head} {fit(msg, max(room, 10)):<{max(room, 10)}}")
    _MIDLINE[0] = done < total
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------------
# commands


def cmd_import(a, store):
    n = pipeline.import_completions(store, a.file, a.name)
    print(f"imported {n} completions into set {a.name}")


def cmd_import_prompts(a, store):
    got, cats = pipeline.import_prompts(store, a.file, a.name, a.format), {}
    for r in got:
        cats[r["category"] or "(none)"] = cats.get(r["category"] or "(none)", 0) + 1
    print(f"imported {len(got)} prompts as prompt set {a.name} ({', '.join(f'{c} {n}' for c, n in cats.items())});"
          f" fetch them with: fetch --prompt-set {a.name} --name SET")  # fmt: skip


def cmd_export_completions(a, store):
    for r in pipeline.export_completions(store, a.name):
        print(json.dumps(r))


def op_of(cls: type[ops.Op], a: argparse.Namespace, **given) -> ops.Op:
    """The operation `cls` from the parsed options named like its fields (plus `given`)."""
    return cls.from_args({f.name: getattr(a, f.name) for f in fields(cls) if hasattr(a, f.name)} | given)


def runner(store, op: ops.Op):
    """(op, runner): worker processes over the op's GPUs when it names several (jobs.workers.pool), a Ray cluster's
    workers with --ray (jobs.cluster, its `device` set to theirs); None: work in this process."""
    from .jobs import workers

    return workers.placed(store, op)


def cmd_op(a, store):
    """An operation's command: its op from the options (`op_of`), placed on its GPUs or Ray cluster when it has
    them, answered by the pipeline (`pipeline.perform`) and shown by its printer (`PRINTERS`)."""
    op = op_of(a.op, a)
    run = None
    if hasattr(op, "gpus"):  # the cluster (--ray) or the GPUs checked before any work
        op, run = runner(store, op)
    return PRINTERS[type(op)](a, store, op, pipeline.perform(store, op, progress, run, answer=True))


def cmd_extract(a, store):
    from .jobs import orchestrate

    if a.extraction_id:
        store.extraction(a.extraction_id)  # must exist: a typo must not start a new extraction under that id
    op = op_of(ops.Extract, a)
    op = replace(op, layers=pipeline.layers_of(op.drafter, op.layers), drafter=[])
    run = None
    if op.orchestrate == "none":  # the cluster (--ray) or the GPUs checked before any work; else the job does it
        op, run = runner(store, op)
    for i, dev in enumerate(op.local_devices()):
        for w in orchestrate.check_extract(store, op.target, op.completions, op.layers, dev, op.dtype, a.extraction_id):
            if i == 0:  # the page asks to confirm; a script asked for it explicitly
                print(f"note: {w}", file=sys.stderr)
    space = disk.plan(store, op.completions, op.layers, op.target, a.extraction_id, op.target_topk)
    print(space.line(), file=sys.stderr)  # both figures, in full, before any work; refused when it will not fit
    disk.check(space)
    if op.orchestrate != "none":  # free the server's GPU around the extraction: the job does it, we follow it
        return follow(store, jobs_mod().start(store, op), "extraction")
    print(pipeline.perform(store, op, progress, run, answer=True))


def jobs_mod():
    from .jobs import lifecycle

    return lifecycle


def follow(store, job_id: str, key: str, every: float = 0.3) -> int:
    """Wait for a job, showing its steps; print result[key] when it is done. Ctrl-C cancels the job."""
    jobs = jobs_mod()
    print(f"job {job_id} (log: python -m dflash_dash jobs logs {job_id})", file=sys.stderr)
    last = None
    try:
        while True:
            jobs.refresh(store)
            row = store.job(job_id)
            if row["step"] != last:
                progress(int(100 * (row["progress"] or 0)), 100, row["step"] or "")
                last = row["step"]
            if row["status"] not in jobs.ACTIVE:
                break
            time.sleep(every)
    except KeyboardInterrupt:
        jobs.cancel(store, job_id)
        raise
    if row["status"] != "done":
        print(f"\nerror: job {job_id} {row['status']}: {row['error']}", file=sys.stderr)
        return 2
    sys.stderr.write("\n")
    print(row["result"][key])
    return 0


# ---------------------------------------------------------------------------
# printers: one per operation, (parsed options, store, op, the pipeline's answer) -> exit status (None: 0)


def print_replay(a, store, op: ops.Replay, out: dict):
    if op.stream:
        print(f"streamed extraction = {out['summary']['extraction']} (no feature files)", file=sys.stderr)
    elif a.extraction == "latest":
        print(f"extraction latest = {out['summary']['extraction']}", file=sys.stderr)
    if out["reused"]:
        print(
            f"note: run {out['id']} already replayed {a.drafter} on extraction {out['summary']['extraction']} with "
            "these settings; not replayed again (pass --force to store a new run)",
            file=sys.stderr,
        )
    print(f"run {out['id']}", file=sys.stderr)
    _print(out)  # {"id", "summary", "reused"}: stdout is one JSON document


def print_sweep(a, store, op: ops.Sweep, ids):
    for run_id in ids:
        print(run_id)
    if ids.skipped:  # after the bars: what under the folder is not a checkpoint, each with why
        print(f"note: not checkpoints under {op.checkpoints}: {'; '.join(ids.skipped)}", file=sys.stderr)


def print_fetch(a, store, op: ops.Fetch, n: int):
    print(f"fetched {n} new completions into set {a.name} ({len(store.completion_ids(a.name))} in total)")


def print_diagnose(a, store, op: ops.Diagnose, got: dict):
    from .analysis import steps

    print(steps.verdict(got), file=sys.stderr)  # the ranking in words: the fault named and its margin, or why none
    _print({k: v for k, v in got.items() if k != "steps"})  # the variants' rounds stay in the store (the page)


def print_audit(a, store, op: ops.Audit, out: dict):
    print(f"verdict: {out['verdict']}", file=sys.stderr)
    _print(out)
    return 0 if out["clean"] else 1


def print_profile(a, store, op: ops.Profile, out: dict):
    print(f"cost table {out['id']} ({out['table']['device']}, {out['table']['backend']} kernels)", file=sys.stderr)
    _print(out)


def print_live(a, store, op: ops.Live, out: dict):
    s = out["summary"]
    print(f"live loop on {out['device']}: accept length {s['accept_length']}, speedup {s['speedup']}", file=sys.stderr)
    _print(
        {k: v for k, v in out.items() if k != "prompts"}
        | {"prompts": {pid: {k: v for k, v in p.items() if k != "seeds"} for pid, p in out["prompts"].items()}}
    )


PRINTERS = {
    ops.Replay: print_replay,
    ops.Sweep: print_sweep,
    ops.SlidingCheck: lambda a, store, op, out: _print(out),
    ops.Attribute: lambda a, store, op, out: _print(out),
    ops.Baseline: lambda a, store, op, out: _print(out),  # {"id", "summary"}
    ops.Fetch: print_fetch,
    ops.Diagnose: print_diagnose,
    ops.Audit: print_audit,
    ops.Profile: print_profile,
    ops.Live: print_live,
}  # how each operation's answer is shown (extract prints its id; demo builds a workspace)


def cmd_jobs(a, store):
    from .jobs import lifecycle as jobs

    if a.action == "list":
        return _print(jobs.recent(store, a.limit))
    if not a.id:
        raise ops.InputError(f"jobs {a.action} needs a job id (see `jobs list`)")
    if a.action == "cancel":
        print(jobs.cancel(store, a.id).status)
    elif a.action == "logs":
        sys.stdout.write(jobs.log_tail(store, a.id, a.lines))
    else:
        print(jobs.rerun(store, a.id))


def cmd_demo(a, store):
    from . import demo

    demo.build(a.workspace, progress)
    ws = Path(a.workspace).resolve()
    # one line (`make run` ends with the dashboard's URL, not a JSON dump): what was built is in BUILD.json
    print(f"demo workspace ready: {ws} ({len(store.runs())} runs; the build's record: {ws / 'demo' / 'BUILD.json'})")


def cmd_serve(a, store):
    from .server import options as server_options

    server_options.run(a)


# ---------------------------------------------------------------------------
# parser


def parser(store_only: bool = False) -> argparse.ArgumentParser:
    """The CLI's parser; `store_only` leaves out the options whose choices live in torch-backed modules (the
    server), for the store-only commands (STORE_ONLY), which thereby never import torch."""
    p = argparse.ArgumentParser(prog="python -m dflash_dash", description=__doc__.splitlines()[0])
    p.add_argument("--workspace", default=str(default_workspace()), help="workspace folder (default: cache)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("import-completions", help="import a completions JSONL file")
    s.add_argument("file")
    s.add_argument("--name", required=True, help="completion set name")
    s.set_defaults(fn=cmd_import)

    s = sub.add_parser("import-prompts", help="keep a prompt file (MT-Bench, SPEED-Bench, GSM8K, ...) as a prompt set")
    s.add_argument("file")
    s.add_argument("--name", required=True, help="prompt set name (fetch --prompt-set NAME)")
    s.add_argument("--format", default="auto", choices=prompts.FORMATS, help="the file's format (auto: its fields)")
    s.set_defaults(fn=cmd_import_prompts)

    s = sub.add_parser("export-completions", help="print a completion set as JSONL")
    s.add_argument("--name", required=True)
    s.set_defaults(fn=cmd_export_completions)

    s = sub.add_parser("extract", help="extract target hidden states for a completion set")
    add_op_options(s, ops.Extract, flags={"extraction_id": "--resume"})
    s.set_defaults(fn=cmd_extract)

    s = sub.add_parser("replay", help="replay a drafter checkpoint over cached features")
    add_op_options(s, ops.Replay)
    s.set_defaults(fn=cmd_op, op=ops.Replay)

    s = sub.add_parser("sweep", help="replay every checkpoint of a training output folder")
    add_op_options(s, ops.Sweep)
    s.set_defaults(fn=cmd_op, op=ops.Sweep)

    s = sub.add_parser(
        "sliding-check",
        help="replay a sliding-layer drafter with its block causal and "
        "bidirectional: the train/serve mismatch detector (JSON)",
    )
    add_op_options(s, ops.SlidingCheck)
    s.set_defaults(fn=cmd_op, op=ops.SlidingCheck)

    s = sub.add_parser(
        "attribute",
        help="target-layer attribution of a run: tau lost with each target tap "
        "replaced by its mean over the extraction (JSON; stored with the run)",
    )
    add_op_options(s, ops.Attribute)
    s.set_defaults(fn=cmd_op, op=ops.Attribute)

    cli_show.add(sub)  # compare, import-engine-stats, conformance, signatures, advise, exports, listings

    s = sub.add_parser(
        "baseline",
        help="replay a model-free proposer (vLLM ngram, SGLang n-gram, suffix decoding) over a completion "
        "set as a run (JSON)",
    )
    add_op_options(s, ops.Baseline)
    s.set_defaults(fn=cmd_op, op=ops.Baseline)

    s = sub.add_parser(
        "serve", help="local stand-in for an SGLang, vLLM or llama.cpp server (--protocol; tests and the demo)"
    )
    if not store_only:  # the stand-in's options (its module imports torch)
        from .server import options as server_options

        server_options.serve_args(s)
        server_options.speculative_args(s)  # --speculative-draft CKPT, --speculative-bug NAME (a test aid)
    s.set_defaults(fn=cmd_serve)

    s = sub.add_parser("fetch", help="fetch greedy completions of a prompt set from the serving engine")
    add_op_options(s, ops.Fetch)
    s.set_defaults(fn=cmd_op, op=ops.Fetch)

    s = sub.add_parser("jobs", help="background jobs: list | cancel ID | logs ID | rerun ID")
    s.add_argument("action", nargs="?", default="list", choices=["list", "cancel", "logs", "rerun"])
    s.add_argument("id", nargs="?")
    s.add_argument("--limit", type=int, default=50, help="list: how many recent jobs")
    s.add_argument("--lines", type=int, default=200, help="logs: how many last lines")
    s.set_defaults(fn=cmd_jobs)

    s = sub.add_parser(
        "diagnose",
        help="engine or drafter? replay the run's checkpoint under each known engine fault and rank the faults by "
        "how well they reproduce the engine's per-step (or per-prompt) acceptance; kept for conformance (JSON)",
    )
    add_op_options(s, ops.Diagnose)
    s.set_defaults(fn=cmd_op, op=ops.Diagnose)

    s = sub.add_parser(
        "audit",
        help="audit a trainer's feature cache (SpecForge prepare_hidden_states.py, DeepSpec target cache) against "
        "the product's extraction: per layer rel-L2, cosine, zero/non-finite rows, best layer offset, position "
        "shift, scale; a verdict (JSON; exit 1 when a layer is faulty)",
    )
    add_op_options(s, ops.Audit)
    s.set_defaults(fn=cmd_op, op=ops.Audit)

    s = sub.add_parser(
        "profile",
        help="measure the cost table: the target's forward of q new tokens after c context tokens and the drafter's "
        "block, on this device (kept in the workspace for predicted speedups; JSON)",
    )
    add_op_options(s, ops.Profile)
    s.set_defaults(fn=cmd_op, op=ops.Profile)

    s = sub.add_parser(
        "live",
        help="the live loop: decode a set's prompts plainly and speculatively (the stand-in's decoder) at a "
        "temperature over seeds; measured accept length and tokens/s per prompt, kept beside replays of the same "
        "drafter on the set (JSON)",
    )
    add_op_options(s, ops.Live)
    s.set_defaults(fn=cmd_op, op=ops.Live)

    s = sub.add_parser("demo", help="build the demo workspace from the committed assets (idempotent)")
    s.set_defaults(fn=cmd_demo)

    for s in sub.choices.values():  # global options are accepted after the command too
        s.add_argument("--workspace", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return p


CHOICES = {
    "dtype": ops.DTYPES,
    "anchors": ops.ANCHORS,
    "orchestrate": ops.ORCHESTRATE,
    "sliding_block": ops.SLIDING_BLOCKS,
    "method": ("ngram", "sglang-ngram", "suffix"),  # = baselines.METHODS (tests/test_baselines.py checks)
}  # fields whose values are one of a few names


def add_op_options(s: argparse.ArgumentParser, cls: type[ops.Op], flags: dict[str, str] | None = None) -> None:
    """One option per field of operation `cls`: --field-name (or `flags[field]`), its type (int, float, a flag for
    bools, text for the rest: lists like "1,16,31" are parsed by the op; a field with metadata {"repeat": True} is
    given once per value, e.g. --drafter A --drafter B), its choices, its default, required when it has none, its
    help the one it was declared with (`ops.setting_help`). The parsed value lands under the field's name (`op_of`)."""
    defaults = ops.defaults(cls)
    for f in fields(cls):
        kind = str(f.type).split(" | ")[0]
        kw: dict = {"dest": f.name, "help": ops.setting_help(f).replace("%", "%%") or None}
        if kind == "bool":
            kw |= {"action": "store_true", "default": defaults[f.name]}
        elif f.metadata.get("repeat"):  # given once per value (--drafter A --drafter B); none: the op's default
            kw |= {"action": "append", "default": None}
        else:
            kw["type"] = {"int": int, "float": float}.get(kind, str)
            if f.metadata.get("choices") or f.name in CHOICES:
                kw["choices"] = f.metadata.get("choices") or CHOICES[f.name]
            if f.default is MISSING and f.default_factory is MISSING:
                kw["required"] = True
            elif f.default_factory is MISSING:  # list fields stay None: the op takes its own default
                kw["default"] = defaults[f.name]
        s.add_argument((flags or {}).get(f.name, "--" + f.name.replace("_", "-")), **kw)


# never create a workspace
READ_ONLY = {"runs", "extractions", "export", "export-completions", "conformance", "signatures", "advise"}
READ_ONLY |= {"export-specforge", "export-aiperf", "import-specforge-eval"}


STORE_ONLY = {"runs", "extractions", "jobs"}  # answered from the store alone: parsed and run without torch


def command_of(argv: list[str]) -> str | None:
    """The command word of a command line (the first word that is neither an option nor --workspace's value)."""
    after_workspace = False
    for w in argv:
        if after_workspace:
            after_workspace = False
        elif w == "--workspace":
            after_workspace = True
        elif not w.startswith("-"):
            return w
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parser(store_only=command_of(argv) in STORE_ONLY).parse_args(argv)
    _MIDLINE[0] = False
    try:
        if a.command in READ_ONLY and not (Path(a.workspace) / "dflash.duckdb").is_file():
            raise UserError(
                f"--workspace {a.workspace}: no dflash-dash workspace there (no dflash.duckdb); "
                "point at an existing workspace, or create one with import-completions, fetch or demo"
            )
        return a.fn(a, Store(a.workspace)) or 0
    except BrokenPipeError:  # `... | head`: the reader went away; end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UserError as e:
        print(f"{chr(10) if _MIDLINE[0] else ''}error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: what was finished is kept; run the same command again to continue", file=sys.stderr)
        return 130
    return 0
