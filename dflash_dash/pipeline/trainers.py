"""A run in the trainers' and benchmarkers' shapes, and SpecForge's own evaluation set beside it.

Contract: `specforge_export(store, run)` -> the run's per-position numbers as SpecForge's teacher-forced checkpoint
report (`analysis.trainers.specforge_report`, over the run's stored rows and the completion tokens), with the run,
checkpoint and source named; `aiperf_export(store, run)` -> one AIPerf profile_export.jsonl record per prompt
(`analysis.trainers.aiperf_records`); `import_specforge(store, file, run)` reads SpecForge's evaluation output
(`specforge evaluate-checkpoint`'s JSON, checked as its own report reader checks it) and keeps it with the run as
the kept analysis `SPECFORGE` (refused, one line naming the file, when unreadable, another strategy's, or of a
block wider than the run's drafter); `beside(store, run)` -> the rows the page shows (this product's numbers, the
imported ones, the difference, the noise and why) or None before an import. Store only, no torch, no network.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ..analysis import trainers
from ..ops import InputError
from ..store import Extraction, Run, Store
from .kept import extraction_of
from .trainer_cache import source_of as trainer_source

SPECFORGE = "specforge_eval"  # the kept analysis of a run holding SpecForge's imported evaluation


def _rows(store: Store, run: str) -> tuple[Run, Extraction | None, list, dict]:
    """(run row, its extraction row (None: a baseline's), its prompts as metrics.Prompt, {prompt id: full token
    ids})."""
    r = store.run_row(run)
    ex = extraction_of(store, r)
    comps = {c.prompt_id: c for c in store.completions(r.set_name or "")}
    prompts = sorted(store.prompts(r.id), key=lambda p: (comps[p.id].idx or 0) if p.id in comps else 0)
    tokens = {p.id: np.asarray(comps[p.id].prompt_ids + comps[p.id].output_ids) for p in prompts}
    return r, ex, prompts, tokens


def specforge_export(store: Store, run: str = "latest") -> dict:
    """The run as SpecForge's checkpoint evaluation report (plus the run, checkpoint and source that made it)."""
    r, ex, prompts, tokens = _rows(store, run)
    out = trainers.specforge_report(prompts, tokens, r.block_size)
    return out | {
        "checkpoint": r.checkpoint,
        "producer": f"dflash-dash run {r.id}",
        "features": trainer_source(ex) or f"extraction {r.extraction_id} of completion set {r.set_name} ({r.backend})",
    }


def aiperf_export(store: Store, run: str = "latest") -> list[dict]:
    """One AIPerf profile_export.jsonl record per prompt of the run (its chain-walk rounds, engine named)."""
    r, ex, prompts, _ = _rows(store, run)
    engine = f"dflash-dash replay ({trainer_source(ex) or r.backend})"
    return trainers.aiperf_records(prompts, r.block_size, engine)


def import_specforge(store: Store, file: str | Path, run: str = "latest") -> dict:
    """Keep SpecForge's evaluation of the run's checkpoint (`file`: its JSON report) with run `run`."""
    p = Path(file)
    if not p.is_file():
        raise InputError(f"{file}: no such file (give SpecForge's evaluate-checkpoint output JSON)")
    try:
        raw = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(
            f"{p}: not readable JSON ({type(e).__name__}); give SpecForge's evaluate-checkpoint output"
        ) from None
    try:
        got = trainers.read_specforge(raw)
    except trainers.ReportError as e:
        raise InputError(f"{p}: {e}") from None
    r = store.run_row(run)
    D = r.draft_len
    if got["positions"] and max(got["positions"]) > D:
        raise InputError(
            f"{p}: the report scores draft positions up to {max(got['positions'])} but run {r.id}'s drafter drafts "
            f"{D} (block {D + 1}); import the evaluation of this run's checkpoint"
        )
    theirs = str(raw.get("checkpoint") or "")
    kept = got | {
        "file": str(p.resolve()),
        "checkpoint": theirs or None,
        "same_checkpoint": bool(theirs) and Path(theirs).name == Path(r.checkpoint).name,
        "metric_scope": raw.get("metric_scope"),
        "feature_index": raw.get("feature_index"),
        "imported": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    kept["positions"] = {str(j): v for j, v in got["positions"].items()}  # JSON keys
    store.set_analysis(r.id, SPECFORGE, kept)
    return kept | {"run": r.id}


def beside(store: Store, run: str) -> dict | None:
    """{"rows", "imported", "ours", "context"} for the page: this product's numbers beside SpecForge's; None before
    an import."""
    r = store.run_row(run)
    kept = store.analysis(r.id, SPECFORGE)
    if not kept:
        return None
    theirs = kept | {"positions": {int(j): v for j, v in kept["positions"].items()}}
    _, ex, prompts, tokens = _rows(store, r.id)
    ours = trainers.read_specforge(trainers.specforge_report(prompts, tokens, r.block_size))
    ctx = {
        "source": trainer_source(ex),
        "set_name": r.set_name,
        "backend": r.backend,
        "anchors": (r.summary or {}).get("anchors", "every"),
        "same_cache": bool(trainer_source(ex)),  # this run replayed a trainer's cache (the one SpecForge read?)
        "feature_index": kept.get("feature_index"),
    }
    return {"rows": trainers.beside(ours, theirs, ctx), "imported": kept, "ours": ours, "context": ctx}
