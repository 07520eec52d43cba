"""Model-free baselines as runs: a proposer of `baselines` replayed over a completion set and stored like a
drafter's run, so the pages that read runs show it beside the drafters.

Contract: `baseline(store, op)` resolves the set and the extraction it stands beside (`op.extraction`, or the
set's newest finished extraction, or none: then every prompt of the set and a run whose extraction_id is NULL),
replays the proposer over the prompts in set order on the CPU (no features, no model), and stores the run:
checkpoint `baseline:<method>`, the settings and the engine file followed in its config, family
`baseline:<engine>` in the summary (with `baseline`, `settings`, `set_name`), the per-prompt rows, the kept
analyses that apply to drafts without probabilities, and per prompt "sources:<prompt id>" (per round: the anchor,
the position copied from, the matched length, the store the drafts came from) for the token view. Returns {"id",
"summary"}.
"""

from __future__ import annotations

from .. import baselines, metrics, ops
from ..ops import InputError
from ..store import Extraction, Store, new_id
from .base import Progress, Runner, tick
from .kept import keep
from .runs import scored

KEPT = ("prompts", "lag", "patterns")  # the kept analyses that need no draft probabilities
SOURCES = "sources:"  # + prompt id: the kept name of a prompt's per-round draft sources


def where(store: Store, op: ops.Baseline) -> tuple[str, Extraction | None]:
    """(completion set, extraction row or None) of `op`."""
    if op.extraction:
        ex = store.extraction(op.extraction)
        if op.completions and op.completions != ex.set_name:
            raise InputError(f"extraction {ex.id} is of set {ex.set_name}, not {op.completions}: give one of them only")
        return ex.set_name, ex
    if op.completions not in {s.name for s in store.sets()}:
        raise InputError(f"completions {op.completions!r}: no such completion set; import or fetch it first")
    done = [e for e in store.extractions() if e.set_name == op.completions and e.status == "done"]
    return op.completions, (done[-1] if done else None)


def baseline(store: Store, op: ops.Baseline, progress: Progress = None, runner: Runner | None = None) -> dict:
    """Replay `op.method` over its set (see the module's contract); `runner` is not used (CPU, one process)."""
    set_name, ex = where(store, op)
    comps = {c.prompt_id: c for c in store.completions(set_name)}
    ids = [it.prompt_id for it in store.items(ex.id)] if ex else list(comps)
    ids = sorted((i for i in ids if i in comps), key=lambda i: comps[i].idx or 0)
    if not ids:
        raise InputError(f"completions {set_name}: no completions to replay on")
    prop = baselines.make(op.method, op.settings)
    seqs = [(i, list(comps[i].prompt_ids) + list(comps[i].output_ids), len(comps[i].prompt_ids)) for i in ids]
    done = baselines.replay(prop, seqs, progress)
    res = [d.prompt for d in done]
    B = prop.width + 1
    settings = baselines.settings_dict(prop)
    summary = metrics.summarize(res, B, 0) | {
        "family": prop.family,  # a baseline, not a drafter family: pages tell them apart by it
        "baseline": prop.method,
        "settings": settings,
        "source": prop.source,
        "set_name": set_name,
        "extraction": ex.id if ex else None,
        "anchors": "chain",
        "drafter_block": B,
    }
    for p in res:
        scored(p, B, 0)
    run_id = new_id("run")
    store.add_run(
        dict(
            id=run_id,
            extraction_id=ex.id if ex else None,
            checkpoint=f"baseline:{prop.method}",
            name=op.name or label(prop.method, settings),
            config={"method": prop.method, "settings": settings, "source": prop.source},
            tree_budget=0,
            summary=summary,
            device="cpu",
        ),
        res,
    )
    with store.session():  # one kept row per prompt: the token view reads its prompt's alone
        for d in done:
            store.set_analysis(run_id, SOURCES + d.prompt.id, d.sources)
    tick(progress, 0, 0, f"analysing run {run_id} (kept for the pages)")
    keep(store, run_id, KEPT, res, summary, comps)
    return {"id": run_id, "summary": summary}


def label(method: str, settings: dict) -> str:
    """A run's default name: the method and the settings that tell its runs apart."""
    keys = {
        "ngram": ("prompt_lookup_min", "prompt_lookup_max", "num_speculative_tokens"),
        "sglang-ngram": ("draft_token_num", "max_match_window_size", "branch_length"),
        "suffix": ("num_speculative_tokens", "max_tree_depth", "min_token_prob"),
    }[method]
    return f"{method} ({', '.join(f'{k}={settings[k]}' for k in keys)})"
