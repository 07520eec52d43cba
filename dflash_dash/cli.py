"""Command-line front over the pipeline: `python -m dflash_dash --workspace W <command> ...`.

Contract: a stable interface scripts rely on. Results go to stdout (ids, JSON); progress and errors go
to stderr; a user error exits with status 2 and a one-line message naming the problem and the fix,
never a traceback. Every command is an operation: its options are generated from its `ops` dataclass
(`add_op_options`: flag or positional, type, choices, default and help from each field's declaration,
`ops.setting`) and turned back into one (`op_of`); the command runs it through `pipeline.perform` (`cmd_op`; extract
checks its disk space first, `cmd_extract`) and shows the answer with its printer (`PRINTERS`; the report commands'
in cli_show), so the CLI, jobs and pages share one definition and one path; `--gpus 0,1` (extract, replay, sweep) shards
the prompts over one worker process per device (jobs.workers.pool), `--gpus cpu,cpu` over CPU workers, `--ray
auto|HOST:PORT` over one worker per GPU of a Ray cluster (jobs.cluster); `extract
--drafter A --drafter B` extracts the union of both drafters' layers (each replays on its own columns).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any

from . import cli_show, ops, pipeline
from .cli_show import _print
from .errors import UserError
from .jobs import commands as _registered  # noqa: F401  (the demo and jobs handlers, registered with perform)
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


def op_of(cls: type[ops.Op], a: argparse.Namespace, **given: Any) -> ops.Op:
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
    if op.placement is not None:  # the cluster (--ray) or the GPUs checked before any work
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
    if op.orchestrate != "none":  # free the server's GPU around the extraction: the job does it (performing it
        return follow(store, jobs_mod().start(store, op), "extraction")  # inside), we follow it
    return PRINTERS[ops.Extract](a, store, op, pipeline.perform(store, op, progress, run, answer=True))


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


PRINTERS: dict[type[ops.Op], Callable[..., int | None]] = {
    ops.Extract: lambda a, store, op, ex_id: print(ex_id),
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
} | cli_show.PRINTERS  # how each operation's answer is shown (the other commands': cli_show)


# ---------------------------------------------------------------------------
# parser


def command(sub: Any, cls: type[ops.Op], help: str, fn: Callable[..., Any] | None = None, **flags: str) -> None:
    """The command `cls.kind` on the subparsers `sub`: its options from the op's fields (`add_op_options`; `flags`:
    another flag for a field), run by `fn` (default `cmd_op`: perform, then the op's printer)."""
    s = sub.add_parser(cls.kind, help=help)
    add_op_options(s, cls, flags)
    s.set_defaults(fn=fn or cmd_op, op=cls)


def parser() -> argparse.ArgumentParser:
    """The CLI's parser: one command per operation (`command`), every option generated from its fields."""
    p = argparse.ArgumentParser(prog="python -m dflash_dash", description=__doc__.splitlines()[0])
    p.add_argument("--workspace", default=str(default_workspace()), help="workspace folder (default: cache)")
    sub = p.add_subparsers(dest="command", required=True)
    command(sub, ops.ImportCompletions, "import a completions JSONL file")
    command(sub, ops.ImportPrompts, "keep a prompt file (MT-Bench, SPEED-Bench, GSM8K, ...) as a prompt set")
    command(sub, ops.ExportCompletions, "print a completion set as JSONL")
    command(
        sub, ops.Extract, "extract target hidden states for a completion set", cmd_extract, extraction_id="--resume"
    )
    command(sub, ops.Replay, "replay a drafter checkpoint over cached features")
    command(sub, ops.Sweep, "replay every checkpoint of a training output folder")
    command(
        sub,
        ops.SlidingCheck,
        "replay a sliding-layer drafter with its block causal and bidirectional: the train/serve mismatch detector "
        "(JSON)",
    )
    command(
        sub,
        ops.Attribute,
        "target-layer attribution of a run: tau lost with each target tap replaced by its mean over the extraction "
        "(JSON; stored with the run)",
    )
    cli_show.add(sub, command)  # compare, import-engine-stats, conformance, signatures, advise, exports, listings
    command(
        sub,
        ops.Baseline,
        "replay a model-free proposer (vLLM ngram, SGLang n-gram, suffix decoding) over a completion set as a run "
        "(JSON)",
    )
    command(sub, ops.Serve, "local stand-in for an SGLang, vLLM or llama.cpp server (--protocol; tests and the demo)")
    command(sub, ops.Fetch, "fetch greedy completions of a prompt set from the serving engine")
    command(sub, ops.Jobs, "background jobs: list | cancel ID | logs ID | rerun ID")
    command(
        sub,
        ops.Diagnose,
        "engine or drafter? replay the run's checkpoint under each known engine fault and rank the faults by how "
        "well they reproduce the engine's per-step (or per-prompt) acceptance; kept for conformance (JSON)",
    )
    command(
        sub,
        ops.Audit,
        "audit a trainer's feature cache (SpecForge prepare_hidden_states.py, DeepSpec target cache) against the "
        "product's extraction: per layer rel-L2, cosine, zero/non-finite rows, best layer offset, position shift, "
        "scale; a verdict (JSON; exit 1 when a layer is faulty)",
    )
    command(
        sub,
        ops.Profile,
        "measure the cost table: the target's forward of q new tokens after c context tokens and the drafter's "
        "block, on this device (kept in the workspace for predicted speedups; JSON)",
    )
    command(
        sub,
        ops.Live,
        "the live loop: decode a set's prompts plainly and speculatively (the stand-in's decoder) at a temperature "
        "over seeds; measured accept length and tokens/s per prompt, kept beside replays of the same drafter on the "
        "set (JSON)",
    )
    command(sub, ops.Demo, "build the demo workspace from the committed assets (idempotent)")
    for s in sub.choices.values():  # global options are accepted after the command too
        s.add_argument("--workspace", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return p


def add_op_options(s: argparse.ArgumentParser, cls: type[ops.Op], flags: dict[str, str] | None = None) -> None:
    """One option per field of operation `cls`: --field-name (or `flags[field]`; a positional argument with metadata
    {"positional": True}), its type (int, float, a flag for bools, text for the rest: lists like "1,16,31" are
    parsed by the op; a field with metadata {"repeat": True} is given once per value, e.g. --drafter A --drafter B;
    {"nargs": "+"} takes its values after one flag), its choices (metadata), its default, required when it has
    none, its help the one it was declared with (`ops.setting_help`). The parsed value lands under the field's name
    (`op_of`)."""
    defaults = ops.defaults(cls)
    for f in fields(cls):
        kind = str(f.type).split(" | ")[0]
        required = f.default is MISSING and f.default_factory is MISSING
        kw: dict[str, Any] = {"help": ops.setting_help(f).replace("%", "%%") or None}
        if kind == "bool":
            kw |= {"action": "store_true", "default": defaults[f.name]}
        elif f.metadata.get("repeat"):  # given once per value (--drafter A --drafter B); none: the op's default
            kw |= {"action": "append", "default": None}
        else:
            kw["type"] = {"int": int, "float": float}.get(kind, str)
            kw["choices"] = ops.choices(f)
            if f.metadata.get("nargs"):
                kw["nargs"] = f.metadata["nargs"]
            if required and not f.metadata.get("positional"):
                kw["required"] = True
            elif f.default_factory is MISSING and not required:  # list fields stay None: the op takes its default
                kw["default"] = defaults[f.name]
        if f.metadata.get("positional"):
            s.add_argument(f.name, **kw, **({} if required else {"nargs": "?"}))
        else:
            s.add_argument((flags or {}).get(f.name, "--" + f.name.replace("_", "-")), dest=f.name, **kw)


# never create a workspace
READ_ONLY = {"runs", "extractions", "export", "export-completions", "conformance", "signatures", "advise"}
READ_ONLY |= {"export-specforge", "export-aiperf", "import-specforge-eval"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parser().parse_args(argv)
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
