"""What the store keeps of a finished run, and what leaves it: whole-run analyses computed once, engine
statistics and conformance, exports and listings.

Contract: store only, no network, no torch: a run never changes, so each analysis (`ANALYSES`) is computed once
from its per-prompt rows (`keep`) and read back by pages as a small JSON value. Engine stats enter at fetch
(`record_engine_stats`) or by import (`import_engine_stats`); `conformance` compares them with the replay.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import metrics
from ..ops import InputError, check_name
from ..store import Completion, Extraction, Run, Store, StoreError
from .served import replayed

ANALYSES = ("prompts", "calibration", "patterns", "lag", "heads", "signatures")  # whole-run analyses kept
# keys a kept analysis must hold to be current: one written before a key existed is computed again
NEWEST = {"patterns": ("context_position", "worst_spans_end_cut", "rejections"), "signatures": ("version",)}


def analysis(store: Store, run_id: str, name: str, rows: list[metrics.Prompt] | None = None) -> dict:
    """One whole-run analysis of a finished run, computed once from its per-prompt rows and kept in the store
    (a run never changes), so pages read a small JSON value instead of every token of every prompt:
    "prompts" (metrics.prompt_rows: per-prompt numbers, no arrays), "calibration" (analysis.calibration),
    "patterns" (failure-pattern tables, tokens decoded with the target's tokenizer when it has one) or "lag"
    ({prompt_id: [anchors, lagging, on target] per slot}, metrics.lag_counts) or "heads" (analysis.heads: top-K
    headroom and a confidence head's view) or "signatures" (analysis.signatures.measure: the per-prompt counts of
    the training-bug signatures). `rows`: the run's scored prompt
    rows when the caller holds them (else read from the store)."""
    if name not in ANALYSES:
        raise InputError(f"analysis {name!r}: not one of {', '.join(ANALYSES)}")
    got = store.analysis(run_id, name)
    if got is not None and all(k in got for k in NEWEST.get(name, ())):
        return got
    return keep(store, run_id, [name], rows)[name]


def keep(
    store: Store,
    run_id: str,
    names,
    rows: list[metrics.Prompt] | None = None,
    summary: dict | None = None,
    comps: dict[str, Completion] | None = None,
) -> dict:
    """The analyses `names` of run `run_id` (`analysis`) computed from one read of the run, its extraction and its
    completions, then kept in the store (one connection); {name: value}. `summary`: the run's summary just computed
    from the same rows (the store step), which the calibration would otherwise compute again; `comps`: the set's
    completions by prompt id, when the caller has them already (a sweep's store steps); `rows`: the run's scored
    prompt rows (the store step's, which hold what the summary computed once), else read from the store."""
    from ..analysis import patterns, signatures as signatures_mod
    from ..analysis.calibration import calibration
    from ..analysis.heads import heads
    from ..vocab import load_vocab

    r = store.run_row(run_id)
    B, budget = r.block_size, r.tree_budget
    rows = sorted(rows, key=lambda p: p.id) if rows is not None else store.prompts(run_id)
    if comps is None:
        comps = (
            {c.prompt_id: c for c in store.completions(r.set_name)}
            if r.set_name and {"lag", "patterns", "signatures"} & set(names)
            else {}
        )
    out = {}
    for name in names:
        if name == "prompts":
            val = metrics.prompt_rows(rows, B, budget)
        elif name == "calibration":
            val = calibration(rows, B, budget, summary)
        elif name == "heads":
            val = heads(rows, B, budget, summary if summary is not None else metrics.complete(r.summary, rows))
        elif name == "lag":
            val = lag_of(rows, comps, B)
        elif name == "signatures":
            val = signatures_mod.measure(rows, B, out["lag"] if "lag" in out else lag_of(rows, comps, B))
        else:
            order = {pid: c.idx or 0 for pid, c in comps.items()}
            vocab = load_vocab(r.target_path)
            val = {
                "decoded_tokens": vocab.tok is not None,
                **patterns.analyse(
                    sorted(rows, key=lambda p: (order.get(p.id, 0), p.id)),
                    comps,
                    B,
                    vocab.strings,
                    run_id,
                ),
            }
        out[name] = json.loads(json.dumps(val, default=lambda x: x.item()))  # numpy scalars -> numbers, as read back
    with store.session():
        for name, val in out.items():
            store.set_analysis(run_id, name, val)
    return out


def extraction_of(store: Store, r: Run) -> Extraction | None:
    """The extraction row run `r` replayed; None for a run on a completion set alone (a baseline: extraction_id
    NULL). What a run needs of its source is on its own row (`Run.set_name`, `target_path`, `backend`: joined from
    its extraction, or the baseline's set), so no stand-in row is made up for a baseline."""
    return None if r.extraction_id is None else store.extraction(r.extraction_id)


def lag_of(rows: list[metrics.Prompt], comps: dict[str, Completion], block_size: int) -> dict[str, list]:
    """{prompt id: metrics.lag_counts triple} of the prompts whose completion is in `comps` (the analysis "lag")."""
    return {
        p.id: list(
            metrics.lag_counts(
                p.drafts.ravel(),
                list(comps[p.id].prompt_ids) + list(comps[p.id].output_ids),
                p.prompt_len,
                block_size,
            )
        )
        for p in rows
        if p.id in comps
    }


def signatures(store: Store, run: str | None = None, reference: str | None = None) -> dict:
    """The training-bug signatures of run `run` against run `reference` (analysis.signatures.compare, from both
    runs' kept "signatures" and their attributions): {"run", "reference", "rows"}. Defaults: the reference is the
    healthiest run (highest tau macro) on the run's extraction; without a run, the pair Diagnostics opens with
    (analysis.signatures.default_pair). Also "points_to": {bug: separating signatures naming it}. Store only."""
    from ..analysis import signatures as signatures_mod
    from ..analysis.attribution import attribution_rows

    runs = store.runs()
    if run is None and reference is None:
        pair = signatures_mod.default_pair(runs)
        if pair is None:
            raise InputError("signatures: no two runs with a tau on one extraction; replay two checkpoints first")
        run, reference = pair
    r = store.run_row(run or "latest")
    if not reference:
        reference = signatures_mod.reference_for(runs, r.id)
        if reference is None:
            raise InputError(f"--reference: no other run to compare run {r.id} with; replay a healthy checkpoint")
    ref = store.run_row(reference)
    if ref.id == r.id:
        raise InputError(f"--reference {ref.id}: the run itself; give another run (a healthy checkpoint's)")
    rows = signatures_mod.compare(
        analysis(store, r.id, "signatures"),
        analysis(store, ref.id, "signatures"),
        attribution_rows(store.attributions(r.id)),
        attribution_rows(store.attributions(ref.id)),
    )
    return {
        "run": {"id": r.id, "name": r.name, "tau_macro": r.summary.get("tau_macro")},
        "reference": {"id": ref.id, "name": ref.name, "tau_macro": ref.summary.get("tau_macro")},
        "same_extraction": r.extraction_id == ref.extraction_id,
        "points_to": signatures_mod.points_to(rows),
        "rows": rows,
    }


def analyses(store: Store, r: Run) -> dict:
    """What a run's export adds to its numbers: "calibration", "patterns" (`analysis`) and, once attributed,
    "attribution"."""
    from ..analysis.attribution import attribution_rows

    out = {name: analysis(store, r.id, name) for name in ("calibration", "patterns")}
    att = store.attributions(r.id)
    if att:
        out["attribution"] = attribution_rows(att)
    return out


# ---------------------------------------------------------------------------
# engine conformance: what a serving engine reported beside what the replay says it must reach


def record_engine_stats(store: Store, set_name: str, prompt_id: str, res: dict, client, server: str) -> None:
    """At fetch: the per-request speculative statistics of one answer (`res` of `client.generate`), read in the
    engine's own shape (`client.spec_stats`), as stats of engine `client.name` for the prompt; a server that
    decoded plainly reports none and nothing is recorded. (The one way engine stats of a fetch enter the store;
    `conformance` reads engine_stats only.)"""
    row = client.spec_stats(res["meta_info"], len(res["output_ids"]))
    if row is not None:
        store.add_engine_stats(set_name, client.name, [row | {"id": prompt_id}], f"{client.stats_source} of {server}")


def import_engine_stats(store: Store, file: str | Path, completions: str, engine: str) -> int:
    """Import another engine's per-prompt stats (JSONL: {"id", "verify_steps", "accepted_tokens"} or {"id",
    "accept_lengths": [...]}) for completion set `completions` as engine `engine`; all lines are validated before
    anything is stored. Returns the number of prompts."""
    from ..analysis import conformance as conformance_mod

    p = Path(file)
    if not p.is_file():
        raise InputError(f"{file}: no such file (a JSONL file of engine stats)")
    engine = check_name(engine, "engine", "the engine's name (e.g. vllm)")
    if len(engine) > 64:
        raise InputError(f"engine {engine!r}: give the engine's name (1 to 64 characters, e.g. vllm)", "engine")
    comps = store.completions(check_name(completions, "completions", "the completion set the engine generated"))
    if not comps:
        raise StoreError(f"no completion set named {completions!r}; fetch or import the completions first")
    rows = conformance_mod.parse_stats(p.read_text(), {c.prompt_id: len(c.output_ids) for c in comps}, completions)
    store.add_engine_stats(completions, engine.strip(), rows, f"import {p.resolve()}")
    return len(rows)


def engine_of(store: Store, set_name: str, engine: str | None) -> str:
    """The engine to compare: `engine` when it has stats for the set, else the only one (or sglang) there is."""
    have = store.engines(set_name)
    if not have:
        raise InputError(
            f"no engine stats for completion set {set_name!r}: fetch it from a server that decodes "
            "speculatively (`serve --speculative-draft CKPT`, or SGLang with a DFlash drafter), or "
            "`import-engine-stats FILE --completions SET --engine NAME`"
        )
    if engine is None:
        from ..analysis.conformance import SGLANG

        if len(have) > 1 and SGLANG not in have:
            raise InputError(
                f"completion set {set_name!r} has stats of engines {', '.join(have)}: choose one with --engine"
            )
        return SGLANG if SGLANG in have else have[0]
    if engine not in have:
        raise InputError(f"--engine {engine!r}: completion set {set_name!r} has stats of {', '.join(have)} only")
    return engine


def conformance(
    store: Store, run: str = "latest", engine: str | None = None, threshold: float | None = None
) -> tuple[dict, list[dict], list[str]]:
    """Engine tau beside the replay's tau of the same drafter on the same completions, per prompt (store only,
    no network): (the CLI's JSON `conformance.report`: per prompt id, engine_tau, replay_tau, flagged,
    first_divergence; the per-step summary; the kept fault ranking's faults and explained_by when `diagnose` ran;
    then the verdict and its evidence, `evidence`: served, served_source, replayed, verdict, why, ...;
    the full rows of `conformance.compare`, the run's prompt ids without engine stats)."""
    from ..analysis import conformance as conformance_mod

    thr = conformance_mod.THRESHOLD if threshold is None else threshold
    if not 0 <= thr < 1:
        raise InputError(f"--threshold {thr}: expected a fraction of the replay's tau in [0, 1), e.g. 0.05")
    r = store.run_row(run)
    set_name = r.set_name or ""
    eng = engine_of(store, set_name, engine)
    order = {c.prompt_id: c.idx or 0 for c in store.completions(set_name)}
    prompts = sorted(store.run_prompts(r.id), key=lambda p: (order.get(p["prompt_id"], 0), p["prompt_id"]))
    stats = store.engine_stats(set_name, eng)
    rows = conformance_mod.compare(prompts, stats, thr, eng)
    ranking = store.analysis(r.id, f"faults:{eng}")  # pipeline.diagnose.kept_name
    out = conformance_mod.report(r.id, eng, thr, rows, ranking)
    return out | evidence(store, r, set_name, eng, rows, thr), rows, conformance_mod.missing(prompts, stats)


def evidence(store: Store, r: Run, set_name: str, engine: str, rows: list[dict], threshold: float) -> dict:
    """The run's verdict with its evidence (`analysis.verdict`): {"served": what the engine said it served (None:
    it does not say, or nothing was recorded), "served_source", "replayed": the replayed drafter's identity,
    "verdict", "why", "identity", and the pooled numbers}."""
    from ..analysis import verdict as verdict_mod

    rec = store.served(set_name, engine)
    served = rec["served"] if rec else None
    source = rec["source"] if rec else "not recorded (stats imported from a file, or fetched before this was kept)"
    mine = replayed(store, r)
    v = verdict_mod.verdict(rows, served, mine, threshold)
    return {"served": served, "served_source": source, "replayed": mine} | v


# ---------------------------------------------------------------------------
# export


def export(store: Store, run: str = "latest") -> dict:
    """A run as JSON-able data: run row, summary and per-prompt results (store only, no network). Per prompt also
    its blocks (`analysis.rounds.blocks`): "round_anchors" [R], "drafts" [A][B-1] (-1: not drafted), "draft_p" [A][B-1]
    (exp(draft_logp), the top-1 probability; null: not recorded) and "round_top_ids"/"round_top_p" [R][B-1][K]
    (K = summary `round_topk`; empty for runs stored without them)."""
    from ..analysis.rounds import blocks

    r = store.run_row(run)
    prompts = store.run_prompts(r.id)
    order = {c.prompt_id: c.idx or 0 for c in store.completions(r.set_name or "")}
    prompts.sort(key=lambda p: order.get(p["prompt_id"], 0))
    B, budget = r.block_size, r.tree_budget
    out = {
        "run": {k: (str(v) if k == "created" else v) for k, v in r.as_dict().items() if k != "summary"},
        "summary": r.summary,
        "metrics": [{"key": m.key, "label": m.label, "formula": m.formula, "kind": m.kind} for m in metrics.REGISTRY],
        "prompts": [
            {
                "id": p["prompt_id"],
                "tau": p["tau"],
                "prompt_len": p["prompt_len"],
                "rounds": p["rounds"],
                "accepted_at": p["accepted_at"],
                "ddtree_tau": p["tree_tau"],
                "ddtree_rounds": p["tree_rounds"],
                "metrics": metrics.per_prompt(metrics.Prompt.from_row(p), B, budget),
            }
            | {k: v for k, v in blocks(p, B, r.summary.get("round_topk")).items() if k != "round_topk"}
            for p in prompts
        ],
    }
    return out | analyses(store, r)  # calibration, failure patterns, attribution (when present)


def listing(store: Store, what: str) -> list[dict]:
    """`runs` / `extractions` listings for scripts."""
    if what == "runs":
        return [
            {
                "id": r.id,
                "checkpoint": r.checkpoint,
                "name": r.name,
                "extraction": r.extraction_id,
                "completions": r.set_name,
                "backend": r.backend,
                "created": str(r.created),
                "sliding_block": r.sliding_block,
                "step": r.step,
                "summary": {m.key: r.summary.get(m.key) for m in metrics.HEADLINE},
            }
            for r in store.runs()
        ]
    return [
        {
            "id": e.id,
            "target": e.target_path,
            "completions": e.set_name,
            "backend": e.backend,
            "device": e.device,
            "dtype": e.dtype,
            "layer_ids": e.layer_ids,
            "status": e.status,
            "prompts": e.prompts,
            "created": str(e.created),
            "versions": e.versions,
        }
        for e in store.extractions()
    ]


def compare(store: Store, run_ids: list[str]) -> dict:
    """N >= 2 runs on one extraction side by side (the CLI's `compare`, Compare's table): {"extraction", "runs":
    analysis.compare.many_table, "categories": many_rows (tau per run and category with its bootstrap interval),
    "paired": verdict_rows of every run against the first}. InputError for fewer than two runs or runs on several
    extractions (their prompts' hidden states differ, so their taus do not compare)."""
    from ..analysis import compare as cmp

    if len(dict.fromkeys(run_ids)) < 2:
        raise InputError("--runs: give at least two run ids (see `runs`)")
    by = {r.id: r for r in store.runs()}
    missing = [i for i in run_ids if i not in by]
    if missing:
        raise InputError(f"--runs: no run {missing[0]!r} in this workspace (see `runs`)")
    runs = [by[i] for i in dict.fromkeys(run_ids)]
    exs = sorted({r.extraction_id or "" for r in runs})
    if len(exs) > 1:
        raise InputError(f"--runs: the runs are on {len(exs)} extractions ({', '.join(exs)}); give runs of one")
    taus = {r.id: {p["prompt_id"]: p["tau"] for p in analysis(store, r.id, "prompts")} for r in runs}
    cats = store.categories(runs[0].set_name or "")
    rows = cmp.many_rows(runs, taus, cats)
    return {
        "extraction": exs[0],
        "runs": cmp.many_table(runs, rows),
        "categories": rows,
        "paired": cmp.verdict_rows(runs[0], runs, taus, cats),
    }
