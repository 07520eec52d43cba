"""Run storing: the parent's store step of a replayed checkpoint, the settings a run records, and reuse.

Contract: `store_run(store, extraction=..., checkpoint=..., results=..., settings=..., device=...)` stores one
checkpoint's run (summary over all prompts, per-prompt rows, kept analyses, its replayed identity `identified`)
with its settings whole: `resolved(settings, cfg, total)`, the `ops.ReplaySettings` as they acted on this drafter
and extraction (sliding semantics resolved, None for a drafter without sliding layers; max_prompts None when it
covers every prompt; the verify rule its default without a temperature), kept as JSON in the run's summary
("settings"). `recorded(run, ...)` reads them back (a run stored before they were recorded: what its row and
summary say, the rest defaults).
Two runs are the same replay when they share the `key` (checkpoint path, extraction, device kind, recorded
settings whole: a new setting takes part with no change here) AND the checkpoint's weights (`same_weights`): a
folder retrained or re-exported in place keeps its path, not its weights. `reused(store, ...)` is the one reuse
check of every path (replay, sweep): per checkpoint, the newest run of its key whose kept identity matches the
checkpoint as it is now, else None. The identity (`identified`: config + weights hash, a full read of the
weights) is computed at most once per checkpoint per operation: the operation's `idents` memo, handed from
`reused` to `store_run`.
The display name and the GPU sharding do not change a result, so they are not settings.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace

from .. import drafters as drafter_mod, metrics, ops
from ..drafters.identity import identity
from ..store import Completion, Extraction, Run, Store, new_id
from .base import Progress, tick
from .expected import labels
from .kept import ANALYSES, keep
from .served import KEPT, keep_replayed
from .trainer_cache import source_of as trainer_source


def resolved(settings: ops.ReplaySettings, cfg: drafter_mod.DrafterConfig, total: int) -> ops.ReplaySettings:
    """`settings` as they act on a drafter of config `cfg` over an extraction of `total` prompts (see the contract):
    two settings giving the same replay resolve equal."""
    sliding = "sliding_attention" in cfg.layer_types
    n = total if settings.max_prompts is None else min(total, settings.max_prompts)
    verify = settings.verify if settings.temperature is not None else _default(type(settings), "verify")
    return replace(
        settings,
        sliding_block=drafter_mod.sliding_semantics(cfg, settings.sliding_block) if sliding else None,
        max_prompts=None if n >= total else n,
        verify=verify,
    )


def _default(cls: type, name: str):
    return next(f.default for f in fields(cls) if f.name == name)


def recorded(run: Run, cls: type[ops.Settings], total: int) -> dict:
    """The settings (JSON) run `run` recorded, every field of `cls` present (one added since: its default). A run
    stored before runs recorded them: its row's tree budget, dtype and sliding semantics, its summary's anchors,
    temperature, verify rule and prompt count."""
    base = cls().to_json()
    s = run.summary or {}
    if "settings" in s:
        return base | s["settings"]
    n = s.get("prompts")
    old = {
        "tree_budget": run.tree_budget,
        "anchors": s.get("anchors", base.get("anchors")),
        "dtype": run.dtype or base.get("dtype"),
        "sliding_block": run.sliding_block,
        "temperature": s.get("temperature"),
        "verify": s.get("verify") or base.get("verify"),
        "max_prompts": None if n is None or n >= total else n,
    }
    return base | {k: v for k, v in old.items() if k in base}


def key(checkpoint: str, extraction: str | None, device: str | None, settings: dict) -> tuple:
    """The settings side of the same replay: checkpoint path, extraction, device kind (cpu, cuda) and settings
    whole. Its weights are the other side (`same_weights`)."""
    return (checkpoint, extraction, (device or "cpu").split(":")[0], json.dumps(settings, sort_keys=True))


def stored_keys(
    store: Store, extraction: Extraction, cls: type[ops.Settings], chain_from_every: bool = False
) -> dict[tuple, list[str]]:
    """{`key`: its run ids, newest first} of the runs on `extraction`. With `chain_from_every` (a sweep, which wants
    each checkpoint's chain rounds), every-anchor runs also answer the chain-only request of their other settings
    (their chain rounds are the same walk; they only hold more), after the chain-only runs of those settings; a
    replay asked for chain-only stores one."""
    total = len(store.items(extraction.id))
    out: dict[tuple, list[str]] = {}
    also: dict[tuple, list[str]] = {}
    for r in reversed(store.runs()):  # newest first
        if r.extraction_id == extraction.id:
            s = recorded(r, cls, total)
            out.setdefault(key(r.checkpoint, r.extraction_id, r.device, s), []).append(r.id)
            if chain_from_every and s.get("anchors") == "every":
                also.setdefault(key(r.checkpoint, r.extraction_id, r.device, s | {"anchors": "chain"}), []).append(r.id)
    return {k: out.get(k, []) + also.get(k, []) for k in out.keys() | also.keys()}


def wanted(
    store: Store, extraction: Extraction, checkpoint: ops.CheckpointSpec, settings: ops.ReplaySettings, device: str
) -> tuple:
    """The `key` of a replay of `checkpoint` on `extraction` with `settings` on `device`."""
    loc = drafter_mod.locate(checkpoint.path, settings.draft_config)
    done = resolved(settings, drafter_mod.config_of(loc), len(store.items(extraction.id)))
    return key(str(loc.path), extraction.id, device, done.to_json())


def identified(loc: drafter_mod.Checkpoint, draft_config: str | None, idents: dict[str, dict]) -> dict:
    """The identity kept with a run of located checkpoint `loc`: `drafters.identity` (config and weights hash, a
    full read of the weights) with "files": [name, size, mtime_ns] of each weights file. Read once per operation:
    `idents` (the operation's memo, by checkpoint path) holds it after."""
    at = str(loc.path)
    if at not in idents:
        stats = [(f.name, f.stat()) for f in loc.weights]
        idents[at] = identity(loc.path, draft_config) | {"files": [[n, st.st_size, st.st_mtime_ns] for n, st in stats]}
    return idents[at]


def same_weights(kept: dict | None, now: dict) -> bool:
    """Whether a run whose kept identity is `kept` replayed the checkpoint whose identity is `now` (`identified`):
    - `now` with a fingerprint (an HF folder: config + weights hash): the fingerprints are equal;
    - `now` without one (a SpecForge runtime checkpoint: its file holds optimizer state, so no weights hash): the
      config hashes are equal and so are the weights files' names, sizes and mtimes (a file rewritten in place
      changes its mtime; a copy made without keeping mtimes is replayed again, never mistaken);
    - no kept identity (a run stored before identities were kept), or one without what `now` is compared by:
      False, since what it replayed cannot be told; the checkpoint is replayed again."""
    if not kept:
        return False
    if now.get("fingerprint") is not None:
        return kept.get("fingerprint") == now["fingerprint"]
    return (
        kept.get("fingerprint") is None
        and kept.get("config_hash") == now.get("config_hash")
        and kept.get("files") is not None
        and kept.get("files") == now.get("files")
    )


def _kept(store: Store, run_id: str) -> dict | None:
    """The identity kept with run `run_id` at its store step (as `served.replayed` reads it), or None."""
    got = store.analysis(run_id, KEPT)
    return got if isinstance(got, dict) else None


def reused(
    store: Store,
    extraction: Extraction,
    checkpoints: list[ops.CheckpointSpec],
    settings: ops.ReplaySettings,
    device: str,
    idents: dict[str, dict],
    chain_from_every: bool = False,
) -> list[str | None]:
    """Per checkpoint (in the order given), the newest stored run that its replay on `extraction` with `settings`
    on `device` would repeat: the same `key` (`wanted`; `chain_from_every`: see `stored_keys`) and the same
    weights (`same_weights`, against its kept identity), else None. Each config is read (a bad one: refused
    now); a checkpoint's identity is computed only when a run of its key is stored, at most once per operation
    (`idents`, the operation's memo, which `store_run` reuses)."""
    have = stored_keys(store, extraction, type(settings), chain_from_every)
    out: list[str | None] = []
    for ck in checkpoints:
        runs = have.get(wanted(store, extraction, ck, settings, device), [])
        if not runs:
            out.append(None)
            continue
        now = identified(drafter_mod.locate(ck.path, settings.draft_config), settings.draft_config, idents)
        out.append(next((r for r in runs if same_weights(_kept(store, r), now)), None))
    return out


def store_run(
    store: Store,
    *,
    extraction: Extraction,
    checkpoint: ops.CheckpointSpec,
    results: list[metrics.Prompt],
    settings: ops.ReplaySettings,
    device: str,
    progress: Progress = None,
    comps: dict[str, Completion] | None = None,
    idents: dict[str, dict] | None = None,
) -> dict:
    """The parent's store step of one replayed checkpoint: its summary over all prompts (`results`, in set order),
    the run (with its `resolved` settings) and its per-prompt rows stored, then every whole-run analysis kept.
    `comps`: the set's completions by prompt id, when the caller has them; `idents`: the operation's memo of
    checkpoint identities (`identified`), when its reuse check computed them. Returns {"id", "summary"}."""
    from .. import replay as replay_mod  # torch: the store step's summary

    ex = extraction
    loc = drafter_mod.locate(checkpoint.path, settings.draft_config)
    cfg = drafter_mod.config_of(loc)
    done = resolved(settings, cfg, len(store.items(ex.id)))
    budget = done.tree_budget
    summary = replay_mod.summarize(results, cfg.width, budget) | {
        "family": cfg.family_name,  # the drafter family (block_size is its width: drafts per step + 1)
        "drafter_block": cfg.block_size,  # the config's block size (the backbone's slots)
        "backend": ex.backend,
        "extraction": ex.id,
        "sliding_block": done.sliding_block,
        "anchors": done.anchors,
        "round_topk": replay_mod.ROUND_TOPK,
        "topk": replay_mod.every.topk_of(cfg, budget),  # candidates kept per slot (headroom's K)
    }  # K of run_prompts.round_top_ids/_p, flattened [R][B-1][K]
    summary |= labels(done.temperature, done.verify)  # the expected-acceptance pass, if any
    summary["settings"] = done.to_json()  # whole: what reuse compares
    if trainer_source(ex):  # a run on a trainer's own features says so wherever its summary is read
        summary["source"] = trainer_source(ex)
    run_id = new_id("run")
    for p in results:
        scored(p, cfg.width, budget)
    store.add_run(
        dict(
            id=run_id,
            extraction_id=ex.id,
            checkpoint=str(loc.path),
            name=checkpoint.name or loc.path.name,
            config=drafter_mod.raw_config(loc),
            tree_budget=budget,
            summary=summary,
            device=device,
            dtype=done.dtype,
            sliding_block=done.sliding_block,
            config_file=str(loc.config_file),
            step=drafter_mod.step_of(loc.path.name),
        ),
        results,
    )
    ident = identified(loc, settings.draft_config, {} if idents is None else idents)
    keep_replayed(store, run_id, loc.path, settings.draft_config, ident)  # for conformance's verdict and reuse
    tick(progress, 0, 0, f"analysing run {run_id} (kept for the pages)")
    keep(store, run_id, ANALYSES, results, summary, comps)  # computed now, from the rows in hand: no page scans them
    return {"id": run_id, "summary": summary}


def scored(p: metrics.Prompt, B: int, budget: int) -> metrics.Prompt:
    """`p` with its tau values set: the registry's per-prompt tau_macro and ddtree_tau (what a run_prompts row
    keeps beside the arrays)."""
    m = metrics.per_prompt(p, B, budget)
    p.tau, p.tree_tau = m["tau_macro"], m["ddtree_tau"]
    return p
