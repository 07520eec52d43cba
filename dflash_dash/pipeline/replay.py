"""Replay and sweep: drafter checkpoints replayed over a cached extraction, each run stored with its metrics.

Contract: `replay(store, op, progress, runner)`, `sweep(...)` and `sliding_check(...)` take their `ops` dataclass
and the runner of their per-prompt work (`worker.here`, jobs.workers' pool, a Ray cluster: `pipeline.perform`
hands it over); all three go through `replay_many`, which validates every checkpoint (config, target) before any
replay, runs the per-prompt part (`device_io.replay_work`, given an `ops.ReplayWork` carrying `op.settings` whole)
through the runner, and stores each checkpoint's run (`runs.store_run`: summary, settings, per-prompt rows, kept
analyses) as soon as its results are all in. A stored run is reused unless `force` when it is the same replay
(`runs.reused`, the one reuse check: the same checkpoint path, extraction, device kind and settings whole, AND the
checkpoint's weights as they are now: its identity fingerprint, computed at most once per checkpoint per
operation and handed on to the store step); a checkpoint retrained or re-exported in place is replayed again.
A drafter replays on any extraction holding its target layers (an extraction of several drafters' union): it reads
its own columns (`features.columns`), and one needing a layer the extraction lacks is refused before any work
(`features.LayersMissing`).
With `features` (replay --features DIR) a trainer's cache is first imported as a set and an extraction of its
own features (`trainer_cache.imported`; the run's summary "source": "trainer cache: DIR") and replayed as any
extraction. With `stream` (replay --stream, sweep --stream) the features come from the target instead of an
extraction's files (`stream.stream`: no file written), and a replay on a streamed extraction is refused
(`features.require_files`).
Replay never touches the network; the math lives in replay/drafter/metrics, the SQL in store.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .. import drafters as drafter_mod, metrics, ops
from ..ops import InputError
from ..store import Extraction, Run, Store
from .base import Progress, Runner, tick
from .expected import require_topk
from .features import check_drafter, require_files
from .runs import reused, store_run
from .stream import stream
from .trainer_cache import imported


def check_replay(store: Store, op: ops.Replay) -> None:
    """What `replay` would refuse before any work, checked without torch, so a page can refuse a form at once
    rather than start a job that fails seconds later: the extraction exists and is done, the checkpoint is a
    readable drafter config of a known family (`drafters.read_config`: a mistyped folder is named), its sliding
    semantics, its weights files whole (`check_files`: headers only), and its wiring to the extraction's target
    (`check_drafter`). Raises the UserError naming the fix."""
    from .. import target_info

    drafter_mod.check_files(drafter_mod.locate(op.drafter, op.draft_config))  # weights cut short: named now
    if op.stream or op.features:  # the target will compute the drafter's own layers: checked against the target alone
        cfg = drafter_mod.read_config(op.drafter, op.draft_config)
        drafter_mod.sliding_semantics(cfg, op.sliding_block)
        info = target_info.describe(op.target)
        drafter_mod.check_target(cfg, info.hidden_size, info.vocab_size, info.num_layers)
        return
    ex = store.extraction(op.extraction)
    if ex.status != "done":
        raise InputError(f"extraction {ex.id} is {ex.status}, not done; finish it (re-extract) first")
    require_topk(store, ex, op)
    cfg = drafter_mod.read_config(op.drafter, op.draft_config)
    drafter_mod.sliding_semantics(cfg, op.sliding_block)
    check_drafter(cfg, ex, target_info.describe(ex.target_path), store, f"drafter {op.drafter}")


def replay(store: Store, op: ops.Replay, progress: Progress, runner: Runner) -> dict:
    """Replay checkpoint `op.drafter` over extraction `op.extraction` on `op`'s first device (its GPUs through
    `runner`); stores the run; returns {"id", "summary"}.

    `op.drafter` is an HF folder or a SpecForge runtime folder (`draft_config`: the training's draft config JSON
    when no config.json lies beside or above it). `sliding_block` (causal | bidirectional, default: the
    config's own, causal) is how sliding_attention layers see their block; it is stored with the run.
    `anchors` every (default) or chain (only the anchors the walks visit: faster, no every-anchor metrics);
    `max_prompts` N: only the first N prompts of the extraction (set order).
    A refused checkpoint (other family, unknown tensors, unsafe pickle) raises before anything is stored.
    A run that `same_run` finds is returned instead (with "reused": True) unless `op.force`: replaying it again
    would store a duplicate. A checkpoint whose weights changed since (overwritten in place) is replayed again."""
    ck = ops.CheckpointSpec(op.drafter, op.name)
    if op.stream:  # the target computes the features as the replay needs them: a new streamed extraction
        return stream(store, op, [ck], progress, runner)[0] | {"reused": False}
    # the extraction (an id, `latest`, or a trainer's cache imported as one) resolved once, at the door
    ex = imported(store, op, progress) if op.features else store.extraction(op.extraction)
    op = replace(op, extraction=ex.id)
    idents: dict[str, dict] = {}  # the checkpoint's identity, read once for the reuse check and the store step
    if not op.force and (old := same_run(store, op, ex, idents)):
        tick(progress, 1, 1, f"run {old.id} already replayed this checkpoint with these settings: reused")
        return {"id": old.id, "summary": old.summary, "reused": True}
    return replay_many(store, [ck], op, ex, progress, runner, idents)[0] | {"reused": False}


def same_run(store: Store, op: ops.Replay, ex: Extraction, idents: dict[str, dict] | None = None) -> Run | None:
    """The newest stored run that `op` would repeat (`runs.reused`): the same checkpoint on extraction `ex` (the
    op's, resolved by the caller) and device kind (cpu or cuda), with the same settings whole (`runs.resolved`) and
    the same weights (its kept identity's fingerprint); None when there is none. `idents`: the operation's memo of
    checkpoint identities (filled here, reused by its store step)."""
    spec = ops.CheckpointSpec(op.drafter)
    (got,) = reused(store, ex, [spec], op.settings, op.devices()[0], {} if idents is None else idents)
    return store.run_row(got) if got else None


def replay_many(
    store: Store,
    checkpoints: list[ops.CheckpointSpec],
    op: ops.Replay | ops.Sweep,
    ex: Extraction,
    progress: Progress,
    runner: Runner,
    idents: dict[str, dict] | None = None,
) -> list[dict]:
    """Replay several checkpoints over ONE read of extraction `ex`'s features (`op.extraction`, resolved by the caller;
    `device_io.replay_work`: passes of sequences, each replayed by every checkpoint in turn, one drafter loaded at a
    time), on `op`'s first device with its settings (`op.settings`, whole, in the worker's `ops.ReplayWork`). Every
    checkpoint is validated (config, tensors, target) before any replay; each run is stored, with the metrics over all
    prompts, as soon as its checkpoint's results are all in (so a later failure keeps it). The per-prompt work runs
    here, or through `runner` (prompts sharded over worker processes, one per GPU). `idents`: the operation's memo of
    checkpoint identities (`runs.identified`), computed by its reuse check. Returns [{"id", "summary"}] in the
    order given."""
    device, settings = op.devices()[0], op.settings
    if ex.status != "done":
        raise InputError(f"extraction {ex.id} is {ex.status}, not done; finish it (re-extract) first")
    require_files(store, ex, "a replay on it")
    require_topk(store, ex, op)

    from .. import target as target_mod

    info = target_mod.describe(ex.target_path)
    plan = []
    for ck in checkpoints:  # configs checked here; tensors when the work loads them, before any replay
        loc = drafter_mod.locate(ck.path, settings.draft_config)
        cfg = drafter_mod.config_of(loc)
        check_drafter(cfg, ex, info, store, f"drafter {loc.path}")
        drafter_mod.sliding_semantics(cfg, settings.sliding_block)
        plan.append(loc)
    comps = {c.prompt_id: c for c in store.completions(ex.set_name)}  # read once: every store step needs them
    ids = sorted((it.prompt_id for it in store.items(ex.id)), key=lambda i: comps[i].idx or 0)
    if settings.max_prompts is not None:
        ids = ids[: settings.max_prompts]
    spec = ops.ReplayWork(checkpoints=tuple(checkpoints), extraction=ex.id, device=device, settings=settings)
    got: list[dict] = [{} for _ in plan]
    out: list[dict | None] = [None for _ in plan]
    for ev in runner(spec, ids, progress):
        r: metrics.Prompt = ev["result"]  # this process's, or a worker's (`jobs.wire.unpacked`): the same row
        j = ev["checkpoint"]
        got[j][r.id] = r
        if len(got[j]) == len(ids):  # complete: stored now (a worker process replays the next one meanwhile)
            by_id, got[j] = got[j], {}
            rows = [by_id[i] for i in ids]
            out[j] = store_run(
                store,
                extraction=ex,
                checkpoint=checkpoints[j],
                results=rows,
                settings=settings,
                device=device,
                progress=progress,
                comps=comps,
                idents=idents,
            )
    for loc, o, by_id in zip(plan, out, got):
        if o is None:
            raise RuntimeError(f"the replay of {loc.path} returned {len(by_id)} of {len(ids)} prompts")
    return out


def checkpoints_in(folder: str | Path) -> tuple[list[Path], list[str]]:
    """(checkpoints, notes) under `folder` (itself included), in step order: HF folders (config.json +
    *.safetensors; SpecForge `epoch_E_step_S/`, `checkpoint-N/`, ...) and SpecForge runtime folders
    (`{run_id}-step{N}/training_state.pt`). Links such as `{run_id}-latest`/`-best` count once (their target).
    What is not a block drafter is skipped with a note each ("NAME: skipped (why)"): a folder of weights without a
    config.json, a target model, EAGLE, ..., and every other entry of `folder` (logs, files) holding no checkpoint.
    A checkpoint that is damaged (its config.json not JSON, a weights file cut short) is refused naming the file:
    skipping it would hide a step of the training."""
    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"checkpoints {str(folder)!r}: no such folder (give a training output folder)", "checkpoints")
    top = root.resolve()
    dirs = {f.parent.resolve() for pat in ("*.safetensors", drafter_mod.RUNTIME_FILE) for f in root.rglob(pat)}
    found, notes = [], []
    for d in sorted(dirs):
        why = foreign(d)
        if why:
            notes.append(f"{d.relative_to(top) if d.is_relative_to(top) else d}: skipped ({why})")
        else:
            found.append(d)
    if top not in dirs:  # the folder's other entries (logs, notes, files): listed, never read
        for e in sorted(root.iterdir()):
            if e.name.startswith(".") or e.name == "config.json":  # hidden, or the config of runtime checkpoints
                continue
            if not any(d == e.resolve() or e.resolve() in d.parents for d in dirs):
                notes.append(f"{e.name}: skipped (not a checkpoint{' folder' if e.is_dir() else ''})")
    if not found:
        raise InputError(
            f"{folder}: no checkpoint inside (expected epoch_E_step_S/ or {{run_id}}-step{{N}}/ "
            "folders)" + (f"; {'; '.join(notes)}" if notes else "")
        )
    big = 1 << 62
    return sorted(
        found, key=lambda p: (drafter_mod.step_of(p.name) is None, drafter_mod.step_of(p.name) or big, str(p))
    ), notes


def foreign(d: Path) -> str | None:
    """Why folder `d` (holding weights) is not a block-drafter checkpoint, or None when it is one. A damaged one
    raises CheckpointError naming the file (its config.json not JSON, a weights file cut short)."""
    if not (d / "config.json").is_file():  # a runtime folder's config may sit above or come with --draft-config
        return None if (d / drafter_mod.RUNTIME_FILE).is_file() else "weights without a config.json: not a checkpoint"
    ck = drafter_mod.locate(d)
    try:
        drafter_mod.family_of(drafter_mod.raw_config(ck))
    except drafter_mod.CheckpointError as e:
        if str(e).startswith(str(ck.config_file)):  # the file itself is damaged: named, never skipped
            raise
        return str(e).removeprefix("config.json: ")
    drafter_mod.check_files(ck)
    return None


class Swept(list):
    """A sweep's run ids in step order (a list); `skipped`: the notes of what under the folder is not a checkpoint."""

    skipped: list[str] = []


def sweep(store: Store, op: ops.Sweep, progress: Progress, runner: Runner) -> list[str]:
    """Replay every checkpoint found under `op.checkpoints` on one extraction, in one pass over its features
    (`replay_many`, chain-only anchors by default); returns run ids in step order (a `Swept`: its `skipped` lists
    what under the folder is not a checkpoint, `checkpoints_in`). A checkpoint already replayed
    on this extraction with the same settings (an every-anchor run also serves a chain-only sweep: `stored_keys`)
    and the same weights (`runs.reused`) is not replayed again (that run's id is returned); one overwritten in
    place since is. Every checkpoint is validated before the first replay, so a
    refused one stops the sweep with nothing stored."""
    cks, notes = checkpoints_in(op.checkpoints)
    for n in notes:
        tick(progress, 0, len(cks), n)
    specs = [ops.CheckpointSpec(str(ck)) for ck in cks]
    if op.stream:  # every checkpoint on each pass of the target's features, in memory: a new streamed extraction
        ids = Swept(r["id"] for r in stream(store, op, specs, progress, runner))
        ids.skipped = notes
        tick(progress, len(cks), len(cks), f"replayed {len(cks)} checkpoints on the target's streamed features")
        return ids
    ex = store.extraction(op.extraction)
    settings, device = op.settings, op.devices()[0]
    idents: dict[str, dict] = {}  # each checkpoint's identity, read once for the reuse check and its store step
    have = reused(store, ex, specs, settings, device, idents, chain_from_every=True)  # each config read: refused now
    todo = [ck for ck, h in zip(specs, have) if h is None]
    tick(progress, 0, len(cks), f"{len(cks)} checkpoints, {len(cks) - len(todo)} already replayed on {ex.id}")
    new = replay_many(store, todo, replace(op, extraction=ex.id), ex, progress, runner, idents) if todo else []
    fresh = {ck.path: r["id"] for ck, r in zip(todo, new)}
    ids = Swept(h or fresh[ck.path] for ck, h in zip(specs, have))
    ids.skipped = notes
    tick(progress, len(cks), len(cks), f"replayed {len(todo)} checkpoints")
    return ids


def sliding_check(store: Store, op: ops.SlidingCheck, progress: Progress, runner: Runner) -> dict:
    """The train/serve mismatch detector: checkpoint `op.drafter` replayed with its sliding layers causal inside
    the block (SpecForge training, SGLang serving) and bidirectional (z-lab HF reference) on one extraction
    (`op.tree_budget`, `op.device`, `op.dtype`), runs with the same settings reused (`same_run`). Returns
    {"causal": run id, "bidirectional": run id, "tau_macro": {...}, "delta"}."""
    drafter, draft_config = op.drafter, op.draft_config
    ex = store.extraction(op.extraction)
    cfg = drafter_mod.read_config(drafter, draft_config)
    if "sliding_attention" not in cfg.layer_types:
        raise InputError(
            f"{drafter}: the drafter has no sliding_attention layers, so both semantics give the same "
            "drafts; nothing to check"
        )
    ck = str(drafter_mod.locate(drafter, draft_config).path)
    out: dict = {"checkpoint": ck, "extraction": ex.id, "tau_macro": {}}
    for i, sem in enumerate(drafter_mod.SLIDING_BLOCKS):
        tick(progress, i, 2, f"replaying with sliding layers {sem} inside the block")
        one = ops.Replay(
            drafter=drafter,
            extraction=ex.id,
            tree_budget=op.tree_budget,
            device=op.device,
            dtype=op.dtype,
            sliding_block=sem,
            draft_config=draft_config,
        )
        rid = replay(store, one, None, runner)["id"]
        out[sem] = rid
        out["tau_macro"][sem] = store.run_row(rid).summary.get("tau_macro")
    t = out["tau_macro"]
    out["delta"] = None if None in t.values() else t["causal"] - t["bidirectional"]
    tick(progress, 2, 2, f"tau macro causal {t['causal']} vs bidirectional {t['bidirectional']}")
    return out
