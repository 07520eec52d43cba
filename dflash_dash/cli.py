"""Command-line front over the pipeline: `python -m dflash_dash --workspace W <command> ...`.

Contract: a stable interface scripts rely on. Results go to stdout (ids, JSON); progress and errors go
to stderr; a user error exits with status 2 and a one-line message naming the problem and the fix,
never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import pipeline
from .errors import UserError
from .store import Store, default_workspace



_MIDLINE = [False]  # a progress bar is on stderr without its newline yet


def progress(done: int, total: int, msg: str) -> None:
    """A one-line progress bar on stderr."""
    width = 24
    fill = int(width * done / total) if total else 0
    sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} {msg[:70]:<70}")
    _MIDLINE[0] = done < total
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _print(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


# ---------------------------------------------------------------------------
# commands


def cmd_import(a, st):
    n = pipeline.import_completions(st, a.file, a.name)
    print(f"imported {n} completions into set {a.name}")


def cmd_export_completions(a, st):
    for r in pipeline.export_completions(st, a.name):
        print(json.dumps(r))


def cmd_extract(a, st):
    if a.resume:
        st.extraction(a.resume)  # must exist: a typo must not start a new extraction under that id
    layers = pipeline.layer_ids_of(a.drafter, a.layers)
    if a.orchestrate != "none":  # free the server's GPU around the extraction: the job does it, we follow it
        return follow(st, jobs_mod().start(st, "extract", {
            "target": a.target, "completions": a.completions, "layers": layers, "device": a.device,
            "dtype": a.dtype, "orchestrate": a.orchestrate, "extraction_id": a.resume}), "extraction")
    print(pipeline.extract(st, a.target, a.completions, layers, a.device, a.dtype, a.resume, progress))


def jobs_mod():
    from . import jobs
    return jobs


def follow(st, job_id: str, key: str, every: float = 0.3) -> int:
    """Wait for a job, showing its steps; print result[key] when it is done. Ctrl-C cancels the job."""
    jobs = jobs_mod()
    print(f"job {job_id} (log: python -m dflash_dash jobs logs {job_id})", file=sys.stderr)
    last = None
    try:
        while True:
            jobs.refresh(st)
            row = st.job(job_id)
            if row["step"] != last:
                progress(int(100 * (row["progress"] or 0)), 100, row["step"] or "")
                last = row["step"]
            if row["status"] not in jobs.ACTIVE:
                break
            time.sleep(every)
    except KeyboardInterrupt:
        jobs.cancel(st, job_id)
        raise
    if row["status"] != "done":
        print(f"\nerror: job {job_id} {row['status']}: {row['error']}", file=sys.stderr)
        return 2
    sys.stderr.write("\n")
    print(row["result"][key])
    return 0


def cmd_replay(a, st):
    out = pipeline.replay(st, a.drafter, a.extraction, a.tree_budget, a.device, a.dtype, a.chunk, a.name,
                          progress, a.sliding_block, a.draft_config, a.anchors)
    if a.extraction == "latest":
        print(f"extraction latest = {out['summary']['extraction']}", file=sys.stderr)
    print(out["id"])
    _print(out["summary"])


def cmd_sweep(a, st):
    for run_id in pipeline.sweep(st, a.checkpoints, a.extraction, progress, a.sliding_block, a.draft_config,
                                 a.anchors, budget=a.tree_budget, device=a.device, dtype=a.dtype):
        print(run_id)


def cmd_sliding_check(a, st):
    _print(pipeline.sliding_check(st, a.drafter, a.extraction, a.draft_config, progress, device=a.device,
                                  dtype=a.dtype))


def cmd_attribute(a, st):
    _print(pipeline.attribute(st, a.run, a.device, a.dtype, progress=progress))


def cmd_export(a, st):
    _print(pipeline.export(st, a.run))


def cmd_list(a, st):
    _print(pipeline.listing(st, a.command))


def cmd_fetch(a, st):
    from . import config
    cfg = config.load(st.workspace)
    n = pipeline.fetch(st, a.server or cfg.server_url, a.prompt_set, a.name, a.max_new_tokens, a.chat, a.tokenizer,
                       a.enable_thinking, progress, a.readiness_timeout or cfg.readiness_timeout)
    print(f"fetched {n} new completions into set {a.name} ({len(st.completion_ids(a.name))} in total)")


def cmd_jobs(a, st):
    from . import jobs
    if a.action == "list":
        return _print(jobs.recent(st, a.limit))
    if not a.id:
        raise pipeline.InputError(f"jobs {a.action} needs a job id (see `jobs list`)")
    if a.action == "cancel":
        print(jobs.cancel(st, a.id)["status"])
    elif a.action == "logs":
        sys.stdout.write(jobs.log_tail(st, a.id, a.lines))
    else:
        print(jobs.rerun(st, a.id))


def cmd_demo(a, st):
    from . import demo
    _print(demo.build(a.workspace, progress))


def cmd_serve(a, st):
    from . import server
    server.serve(a.model, a.host, a.port, a.startup_delay, health_delay=a.health_delay, api_key=a.api_key,
                 speculative_draft=a.speculative_draft, speculative_bug=a.speculative_bug)


def cmd_import_engine_stats(a, st):
    n = pipeline.import_engine_stats(st, a.file, a.completions, a.engine)
    print(f"imported {a.engine} stats of {n} prompts of set {a.completions}")


def cmd_conformance(a, st):
    out, rows, missing = pipeline.conformance(st, a.run, a.engine, a.threshold)
    if missing:
        print(f"note: {len(missing)} prompt(s) of run {out['run']} have no {out['engine']} stats: "
              f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}", file=sys.stderr)
    flagged = sum(r["flagged"] for r in rows)
    print(f"{flagged} of {len(rows)} prompt(s) flagged: engine tau = (completion_tokens - 1) / verify_steps below "
          f"the replay's committed / rounds by more than {out['threshold']:g} x replay tau", file=sys.stderr)
    _print(out)


# ---------------------------------------------------------------------------
# parser


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dflash_dash", description=__doc__.splitlines()[0])
    p.add_argument("--workspace", default=str(default_workspace()), help="workspace folder (default: cache)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("import-completions", help="import a completions JSONL file")
    s.add_argument("file")
    s.add_argument("--name", required=True, help="completion set name")
    s.set_defaults(fn=cmd_import)

    s = sub.add_parser("export-completions", help="print a completion set as JSONL")
    s.add_argument("--name", required=True)
    s.set_defaults(fn=cmd_export_completions)

    s = sub.add_parser("extract", help="extract target hidden states for a completion set")
    s.add_argument("--target", required=True, help="Hugging Face causal LM folder")
    s.add_argument("--completions", required=True, help="completion set name")
    s.add_argument("--drafter", help="DFlash checkpoint whose target_layer_ids are extracted")
    s.add_argument("--layers", help="explicit layer ids, e.g. 1,16,31 (instead of --drafter)")
    s.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    s.add_argument("--dtype", default="float32", choices=list(pipeline.DTYPES))
    s.add_argument("--resume", help="continue this extraction id instead of starting a new one")
    s.add_argument("--orchestrate", default="none", choices=["none", "release", "command"],
                   help="free the SGLang server's GPU around the extraction (config.toml): its memory-release "
                        "API, its stop/start commands, or leave it (default)")
    s.set_defaults(fn=cmd_extract)

    s = sub.add_parser("replay", help="replay a drafter checkpoint over cached features")
    s.add_argument("--drafter", required=True)
    s.add_argument("--extraction", default="latest")
    s.add_argument("--tree-budget", type=int, default=8, help="DDTree node budget (0: no tree)")
    s.add_argument("--device", default="cpu")
    s.add_argument("--dtype", default="float32", choices=list(pipeline.DTYPES))
    s.add_argument("--chunk", type=int, default=64, help="blocks per batched forward")
    s.add_argument("--name", help="display name (default: checkpoint folder name)")
    s.add_argument("--anchors", default="every", choices=list(pipeline.ANCHORS),
                   help="every completion anchor (default: accepted(p) curves, every-anchor tau) or only the "
                        "anchors the chain and DDTree walks visit (chain: several times faster, same rounds)")
    checkpoint_options(s)
    s.set_defaults(fn=cmd_replay)

    s = sub.add_parser("sweep", help="replay every checkpoint of a training output folder")
    s.add_argument("--checkpoints", required=True, help="training output folder: epoch_E_step_S/, "
                                                        "{run_id}-step{N}/ (SpecForge runtime), checkpoint-N/ ...")
    s.add_argument("--extraction", default="latest")
    s.add_argument("--anchors", default="chain", choices=list(pipeline.ANCHORS),
                   help="chain (default: only the anchors the walks visit) or every")
    s.add_argument("--tree-budget", type=int, default=8, help="DDTree node budget (0: no tree)")
    s.add_argument("--device", default="cpu")
    s.add_argument("--dtype", default="float32", choices=list(pipeline.DTYPES))
    checkpoint_options(s)
    s.set_defaults(fn=cmd_sweep)

    s = sub.add_parser("sliding-check", help="replay a sliding-layer drafter with its block causal and "
                                             "bidirectional: the train/serve mismatch detector (JSON)")
    s.add_argument("--drafter", required=True)
    s.add_argument("--extraction", default="latest")
    s.add_argument("--draft-config", help="the training's draft config JSON (SpecForge runtime checkpoints)")
    s.add_argument("--device", default="cpu")
    s.add_argument("--dtype", default="float32", choices=list(pipeline.DTYPES))
    s.set_defaults(fn=cmd_sliding_check)

    s = sub.add_parser("attribute", help="target-layer attribution of a run: tau lost with each target tap "
                                         "replaced by its mean over the extraction (JSON; stored with the run)")
    s.add_argument("--run", default="latest")
    s.add_argument("--device", help="default: the run's own device")
    s.add_argument("--dtype", choices=list(pipeline.DTYPES), help="default: the run's own dtype")
    s.set_defaults(fn=cmd_attribute)

    s = sub.add_parser("export", help="print a run as JSON")
    s.add_argument("--run", default="latest")
    s.set_defaults(fn=cmd_export)

    for what in ("runs", "extractions"):
        s = sub.add_parser(what, help=f"list {what} as JSON")
        s.set_defaults(fn=cmd_list)

    s = sub.add_parser("serve", help="local SGLang-compatible server (stand-in for tests and the demo)")
    s.add_argument("--model", required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=30000)
    s.add_argument("--startup-delay", type=float, default=0.0)
    s.add_argument("--health-delay", type=float, default=0.0,
                   help="seconds GET /health takes once ready (a real one generates a token)")
    s.add_argument("--api-key", help="require `Authorization: Bearer KEY` except on /health (as SGLang's --api-key)")
    from .server import speculative_args
    speculative_args(s)  # --speculative-draft CKPT, --speculative-bug NAME (a test aid)
    s.set_defaults(fn=cmd_serve)

    s = sub.add_parser("fetch", help="fetch greedy completions of a prompt set from an SGLang server")
    s.add_argument("--server", help="server URL (default: [server] url of W/config.toml, else "
                                    "http://127.0.0.1:30000)")
    s.add_argument("--prompt-set", required=True, help="built-in set (coding-10) or a JSONL file of {id, prompt}")
    s.add_argument("--name", required=True, help="completion set name; rerun with it to continue")
    s.add_argument("--max-new-tokens", type=int, default=256)
    s.add_argument("--chat", action="store_true", help="wrap prompts in the target's chat template (local)")
    s.add_argument("--tokenizer", help="tokenizer folder (default: the server's tokenizer_path when readable)")
    s.add_argument("--enable-thinking", action="store_true", help="leave Qwen3 thinking on (default off)")
    s.add_argument("--readiness-timeout", type=float, help="seconds to wait for /health 200 (default 600)")
    s.set_defaults(fn=cmd_fetch)

    s = sub.add_parser("jobs", help="background jobs: list | cancel ID | logs ID | rerun ID")
    s.add_argument("action", nargs="?", default="list", choices=["list", "cancel", "logs", "rerun"])
    s.add_argument("id", nargs="?")
    s.add_argument("--limit", type=int, default=50, help="list: how many recent jobs")
    s.add_argument("--lines", type=int, default=200, help="logs: how many last lines")
    s.set_defaults(fn=cmd_jobs)

    s = sub.add_parser("import-engine-stats", help="import another engine's per-prompt speculative counters "
                                                   "(JSONL) for a completion set, for `conformance`")
    s.add_argument("file", help='JSONL: {"id", "verify_steps", "accepted_tokens"} or {"id", "accept_lengths": [...]}')
    s.add_argument("--completions", required=True, help="the completion set the engine generated (same prompt ids)")
    s.add_argument("--engine", required=True, help="engine name, e.g. vllm (sglang: stats recorded at fetch)")
    s.set_defaults(fn=cmd_import_engine_stats)

    s = sub.add_parser("conformance", help="engine tau beside the replay's tau of the same drafter, per prompt; "
                                           "flags prompts where the engine falls short by more than numeric noise")
    s.add_argument("--run", default="latest", help="replay run of the drafter the engine served")
    s.add_argument("--engine", help="engine whose stats to compare (default: sglang, or the only one)")
    s.add_argument("--threshold", type=float, default=None,
                   help="flag when replay tau - engine tau > THRESHOLD x replay tau (default 0.05)")
    s.set_defaults(fn=cmd_conformance)

    s = sub.add_parser("demo", help="build the demo workspace from the committed assets (idempotent)")
    s.set_defaults(fn=cmd_demo)

    for s in sub.choices.values():  # global options are accepted after the command too
        s.add_argument("--workspace", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return p


def checkpoint_options(s: argparse.ArgumentParser) -> None:
    """How a checkpoint is read: its draft config (SpecForge runtime checkpoints) and sliding semantics."""
    from .drafter import SLIDING_BLOCKS
    s.add_argument("--draft-config", help="the training's draft config JSON, for SpecForge runtime checkpoints "
                                          "({run_id}-step{N}/training_state.pt) with no config.json beside or above")
    s.add_argument("--sliding-block", choices=list(SLIDING_BLOCKS),
                   help="sliding_attention layers: causal inside the block (SpecForge training, SGLang serving; "
                        "the default unless the config sets is_causal) or bidirectional (z-lab HF reference)")


READ_ONLY = {"runs", "extractions", "export", "export-completions", "conformance"}  # never create a workspace


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    _MIDLINE[0] = False
    try:
        if a.command in READ_ONLY and not (Path(a.workspace) / "dflash.duckdb").is_file():
            raise UserError(f"--workspace {a.workspace}: no dflash-dash workspace there (no dflash.duckdb); "
                            "point at an existing workspace, or create one with import-completions, fetch or demo")
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
