"""Replay and sweep: drafter checkpoints replayed over a cached extraction, each run stored with its metrics.

Contract: `replay(store, op)`, `sweep(store, op)` and `sliding_check(store, op)` take their `ops` dataclass;
all three go through `replay_many`, which validates every checkpoint (config, target) before any replay, runs
the per-prompt part (`device_io.replay_work`, given an `ops.ReplayWork`) here or through a runner, and stores
each checkpoint's run (`store_run`: summary, per-prompt rows, kept analyses) as soon as its results are all in.
A drafter replays on any extraction holding its target layers (an extraction of several drafters' union): it reads
its own columns (`columns`, `iter_sequences`' layers), and one needing a layer the extraction lacks is refused
before any work (`LayersMissing`: the layers needed, the layers held, the extract command that adds them).
With `features` (replay --features DIR) a trainer's cache is first imported as a set and an extraction of its
own features (`trainer_cache.imported`; the run's summary "source": "trainer cache: DIR") and replayed as any
extraction. With `stream` (replay --stream, sweep --stream) the features come from the target instead of an
extraction's files (`stream.stream`: no file written), and a replay on a streamed extraction is refused
(`stream.require_files`).
Replay never touches the network; the math lives in replay/drafter/metrics, the SQL in store.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from .. import drafters as drafter_mod, metrics, ops
from ..ops import InputError
from ..store import Store, StoreError, new_id
from .base import Progress, Runner, features_root, here, tick
from .expected import labels, require_topk, same
from .kept import ANALYSES, keep
from .served import keep_replayed
from .trainer_cache import source_of as trainer_source

if TYPE_CHECKING:
    from .. import replay as replay_mod, target as target_mod


SEQ_BATCH = 64  # sequences read from the cache at a time (`iter_sequences`)


def iter_sequences(
    store: Store,
    extraction: dict,
    batch: int = SEQ_BATCH,
    only: set[str] | None = None,
    device: str = "cpu",
    layers: list[int] | None = None,
) -> Iterator[list[replay_mod.Sequence]]:
    """Batches of token ids from the store plus validated features from the cache (no network), in set order
    (`only`: just these prompt ids); each feature file is read once (`cache.read_many`: several at a time, on CUDA
    straight to `device`), its batch yielded once all of it is read. `layers`: the features of just these layers of
    the extraction, in this order (a drafter's target_layer_ids: its columns, selected as each file lands,
    `cache.read_many`'s keep); None, or the extraction's own layers: every column as stored, no copy."""
    import torch

    from .. import cache, replay as replay_mod

    comps = {r["prompt_id"]: r for r in store.completions(extraction["set_name"])}
    width = len(extraction["layer_ids"]) * extraction["hidden_size"]
    keep = None if layers is None else columns(store, extraction, layers, "the replay")
    items = sorted(
        (it for it in store.items(extraction["id"]) if only is None or it["prompt_id"] in only),
        key=lambda r: comps[r["prompt_id"]]["idx"],
    )
    todo = []  # (completion, its token ids)
    for it in items:  # every token count checked before a file is read
        c = comps[it["prompt_id"]]
        tokens = torch.tensor(c["prompt_ids"] + c["output_ids"])
        if len(tokens) != it["tokens"]:
            raise StoreError(
                f"prompt {c['prompt_id']!r}: the completion has {len(tokens)} tokens but extraction "
                f"{extraction['id']} has {it['tokens']}; re-extract"
            )
        todo.append((c, tokens))
    feats = cache.read_many(
        features_root(store),
        extraction["id"],
        [(c["prompt_id"], len(t)) for c, t in todo],
        width,
        device,
        keep,
        extraction["hidden_size"],
    )
    for b0 in range(0, len(todo), batch):
        yield [
            replay_mod.Sequence(c["prompt_id"], t, len(c["prompt_ids"]), next(feats)) for c, t in todo[b0 : b0 + batch]
        ]


def load_sequences(store: Store, extraction: dict, layers: list[int] | None = None) -> list[replay_mod.Sequence]:
    """Every sequence of an extraction, with the features of `layers` (see `iter_sequences`)."""
    return [s for batch in iter_sequences(store, extraction, layers=layers) for s in batch]


def columns(store: Store, extraction: dict, need: list[int], who: str) -> list[int] | None:
    """The blocks of `extraction`'s features that a drafter reading target layers `need` replays on
    (`ops.layer_blocks`: None when they are the extraction's layers in its order, so nothing is copied). A drafter
    needing a layer the extraction lacks is refused with `LayersMissing` (`who` names it)."""
    have = list(extraction["layer_ids"])
    lack = ops.missing_layers(have, need)
    if lack:
        raise LayersMissing(store, extraction, need, lack, who)
    return ops.layer_blocks(have, need)


class LayersMissing(InputError):
    """A drafter reads target layers an extraction does not hold: the message names the layers it needs, the ones
    the extraction has, and the extract command that makes an extraction holding both."""

    def __init__(self, store: Store, extraction: dict, need: list[int], lack: list[int], who: str):
        have = list(extraction["layer_ids"])
        both = ",".join(map(str, sorted(set(have) | set(need))))
        cmd = (
            f"python -m dflash_dash --workspace {shlex.quote(str(store.workspace))} extract --target "
            f"{shlex.quote(str(extraction['target_path']))} --completions {shlex.quote(extraction['set_name'])} "
            f"--layers {both}"
        )
        super().__init__(
            f"{who} reads target layers {list(need)} but extraction {extraction['id']} holds layers {have} "
            f"(missing {lack}); extract an extraction holding both: {cmd} (or --drafter CKPT once per drafter "
            "it must serve), then replay on it"
        )


def check_drafter(
    cfg: drafter_mod.DrafterConfig, extraction: dict, info: target_mod.TargetInfo, store: Store, who: str
) -> None:
    """Refuse a drafter that cannot replay on this extraction: layers the extraction lacks (`columns`), then
    drafter.checks, the one rule list, on the extraction as the drafter reads it (its own layers' columns)."""
    columns(store, extraction, cfg.target_layer_ids, who)
    seen = extraction | {"layer_ids": list(cfg.target_layer_ids)}
    drafter_mod.check_target(cfg, info.hidden_size, info.vocab_size, info.num_layers, seen)


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
    if ex["status"] != "done":
        raise InputError(f"extraction {ex['id']} is {ex['status']}, not done; finish it (re-extract) first")
    require_topk(store, ex, op)
    cfg = drafter_mod.read_config(op.drafter, op.draft_config)
    drafter_mod.sliding_semantics(cfg, op.sliding_block)
    check_drafter(cfg, ex, target_info.describe(ex["target_path"]), store, f"drafter {op.drafter}")


def replay(store: Store, op: ops.Replay, progress: Progress = None, runner: Runner | None = None) -> dict:
    """Replay checkpoint `op.drafter` over extraction `op.extraction` on `op`'s first device (its GPUs through
    `runner`); stores the run; returns {"id", "summary"}.

    `op.drafter` is an HF folder or a SpecForge runtime folder (`draft_config`: the training's draft config JSON
    when no config.json lies beside or above it). `sliding_block` (causal | bidirectional, default: the
    config's own, causal) is how sliding_attention layers see their block; it is stored with the run.
    `anchors` every (default) or chain (only the anchors the walks visit: faster, no every-anchor metrics);
    `max_prompts` N: only the first N prompts of the extraction (set order).
    A refused checkpoint (other family, unknown tensors, unsafe pickle) raises before anything is stored.
    A run that `same_run` finds is returned instead (with "reused": True) unless `op.force`: replaying it again
    would store a duplicate."""
    ck = ops.CheckpointSpec(op.drafter, op.sliding_block, op.draft_config, op.name)
    if op.features:  # a trainer's cache: imported as a set and an extraction of its own features, then replayed
        from .trainer_cache import imported

        op = replace(op, extraction=imported(store, op, progress)["id"])
    if op.stream:  # the target computes the features as the replay needs them: a new streamed extraction
        from .stream import stream

        return stream(store, op, [ck], progress, runner)[0] | {"reused": False}
    if not op.force and (old := same_run(store, op)):
        tick(progress, 1, 1, f"run {old['id']} already replayed this checkpoint with these settings: reused")
        return {"id": old["id"], "summary": old["summary"], "reused": True}
    return replay_many(store, [ck], op, progress, runner)[0] | {"reused": False}


def same_run(store: Store, op: ops.Replay) -> dict | None:
    """The newest stored run that `op` would repeat: the same checkpoint on the same extraction (`latest`
    resolved), with the same tree budget, anchors, sliding semantics, dtype, device kind (cpu or cuda) and
    number of prompts; None when there is none. The display name and the GPU sharding do not change a result."""
    ex = store.extraction(op.extraction)
    loc = drafter_mod.locate(op.drafter, op.draft_config)
    cfg = drafter_mod.config_of(loc)
    sem = drafter_mod.sliding_semantics(cfg, op.sliding_block) if "sliding_attention" in cfg.layer_types else None
    n = len(store.items(ex["id"]))
    n = n if op.max_prompts is None else min(n, op.max_prompts)
    kind = op.devices()[0].split(":")[0]
    for r in reversed(store.runs()):
        s = r["summary"] or {}
        if (
            r["checkpoint"] == str(loc.path)
            and r["extraction_id"] == ex["id"]
            and r["tree_budget"] == op.tree_budget
            and s.get("anchors") == op.anchors
            and r.get("sliding_block") == sem
            and r.get("dtype") == op.dtype
            and (r.get("device") or "cpu").split(":")[0] == kind
            and s.get("prompts") == n
            and same(s, op)
        ):
            return r
    return None


def replay_many(
    store: Store,
    checkpoints: list[ops.CheckpointSpec],
    op: ops.Replay | ops.Sweep,
    progress: Progress = None,
    runner: Runner | None = None,
) -> list[dict]:
    """Replay several checkpoints over ONE read of extraction `op.extraction`'s features (`device_io.replay_work`:
    passes of sequences, each replayed by every checkpoint in turn, one drafter loaded at a time), with `op`'s
    tree budget, device, dtype, anchors, chunk (Sweep: the Replay default) and max_prompts. Every checkpoint is
    validated (config, tensors, target) before any replay; each run is stored, with the metrics over all prompts,
    as soon as its checkpoint's results are all in (so a later failure keeps it). The per-prompt work runs here,
    or through `runner` (prompts sharded over worker processes, one per GPU). Returns [{"id", "summary"}] in the
    order given."""
    device, dtype, anchors, tree_budget = op.devices()[0], op.dtype, op.anchors, op.tree_budget
    ex = store.extraction(op.extraction)
    if ex["status"] != "done":
        raise InputError(f"extraction {ex['id']} is {ex['status']}, not done; finish it (re-extract) first")
    from .stream import require_files

    require_files(store, ex, "a replay on it")
    require_topk(store, ex, op)

    from .. import target as target_mod

    info = target_mod.describe(ex["target_path"])
    plan = []
    for ck in checkpoints:  # configs checked here; tensors when the work loads them, before any replay
        loc = drafter_mod.locate(ck.path, ck.draft_config)
        cfg = drafter_mod.config_of(loc)
        check_drafter(cfg, ex, info, store, f"drafter {loc.path}")
        plan.append((ck, loc, cfg, drafter_mod.sliding_semantics(cfg, ck.sliding_block)))
    comps = {c["prompt_id"]: c for c in store.completions(ex["set_name"])}  # read once: every store step needs them
    ids = sorted((it["prompt_id"] for it in store.items(ex["id"])), key=lambda i: comps[i]["idx"])
    if op.max_prompts is not None:
        ids = ids[: op.max_prompts]
    spec = ops.ReplayWork(
        checkpoints=tuple(checkpoints),
        extraction=ex["id"],
        tree_budget=tree_budget,
        device=device,
        dtype=dtype,
        chunk=getattr(op, "chunk", ops.Replay.chunk),
        anchors=anchors,
        temperature=op.temperature,
        verify=op.verify,
    )
    got: list[dict] = [{} for _ in plan]
    out: list[dict | None] = [None for _ in plan]
    tag = labels(op.temperature, op.verify)  # the expected-acceptance pass, in each run's summary
    for ev in (runner or here(store))(spec, ids, progress):
        r: metrics.Prompt = ev["result"]  # this process's, or a worker's (`jobs.wire.unpacked`): the same row
        j = ev["checkpoint"]
        got[j][r.id] = r
        if len(got[j]) == len(ids):  # complete: stored now (a worker process replays the next one meanwhile)
            by_id, got[j] = got[j], {}
            rows = [by_id[i] for i in ids]
            out[j] = store_run(
                store, ex, checkpoints[j], rows, tree_budget, device, dtype, anchors, progress, comps, tag
            )
    for (_ck, loc, _cfg, _sem), o, by_id in zip(plan, out, got):
        if o is None:
            raise RuntimeError(f"the replay of {loc.path} returned {len(by_id)} of {len(ids)} prompts")
    return out


def store_run(
    store: Store,
    ex: dict,
    ck: ops.CheckpointSpec,
    res: list[metrics.Prompt],
    tree_budget: int,
    device: str,
    dtype: str,
    anchors: str,
    progress: Progress = None,
    comps: dict[str, dict] | None = None,
    sampled: dict | None = None,
) -> dict:
    """The parent's store step of one replayed checkpoint: its summary over all prompts (`res`, in set order), the
    run and its per-prompt rows stored, then every whole-run analysis kept. `comps`: the set's completions by
    prompt id, when the caller has them; `sampled`: the expected-acceptance pass's labels. Returns {"id", "summary"}."""
    from .. import replay as replay_mod

    loc = drafter_mod.locate(ck.path, ck.draft_config)
    cfg = drafter_mod.config_of(loc)
    sem = drafter_mod.sliding_semantics(cfg, ck.sliding_block)
    semantics = sem if "sliding_attention" in cfg.layer_types else None
    summary = replay_mod.summarize(res, cfg.width, tree_budget) | {
        "family": cfg.family_name,  # the drafter family (block_size is its width: drafts per step + 1)
        "drafter_block": cfg.block_size,  # the config's block size (the backbone's slots)
        "backend": ex["backend"],
        "extraction": ex["id"],
        "sliding_block": semantics,
        "anchors": anchors,
        "round_topk": replay_mod.ROUND_TOPK,
        "topk": replay_mod.every.topk_of(cfg, tree_budget),  # candidates kept per slot (headroom's K)
    }  # K of run_prompts.round_top_ids/_p, flattened [R][B-1][K]
    summary |= sampled or {}
    if trainer_source(ex):  # a run on a trainer's own features says so wherever its summary is read
        summary["source"] = trainer_source(ex)
    run_id = new_id("run")
    for p in res:
        scored(p, cfg.width, tree_budget)
    store.add_run(
        dict(
            id=run_id,
            extraction_id=ex["id"],
            checkpoint=str(loc.path),
            name=ck.name or loc.path.name,
            config=drafter_mod.raw_config(loc),
            tree_budget=tree_budget,
            summary=summary,
            device=device,
            dtype=dtype,
            sliding_block=semantics,
            config_file=str(loc.config_file),
            step=drafter_mod.step_of(loc.path.name),
        ),
        res,
    )
    keep_replayed(store, run_id, loc.path, ck.draft_config)  # its identity, for conformance's verdict
    tick(progress, 0, 0, f"analysing run {run_id} (kept for the pages)")
    keep(store, run_id, ANALYSES, res, summary, comps)  # computed now, from the rows in hand: no page scans them
    return {"id": run_id, "summary": summary}


def scored(p: metrics.Prompt, B: int, budget: int) -> metrics.Prompt:
    """`p` with its tau values set: the registry's per-prompt tau_macro and ddtree_tau (what a run_prompts row
    keeps beside the arrays)."""
    m = metrics.per_prompt(p, B, budget)
    p.tau, p.tree_tau = m["tau_macro"], m["ddtree_tau"]
    return p


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


def sweep(store: Store, op: ops.Sweep, progress: Progress = None, runner: Runner | None = None) -> list[str]:
    """Replay every checkpoint found under `op.checkpoints` on one extraction, in one pass over its features
    (`replay_many`, chain-only anchors by default); returns run ids in step order (a `Swept`: its `skipped` lists
    what under the folder is not a checkpoint, `checkpoints_in`). A checkpoint already replayed
    on this extraction (with the same sliding semantics and over the same prompts: `op.max_prompts`) is not
    replayed again (its latest run id is returned). Every checkpoint is validated before the first replay, so a
    refused one stops the sweep with nothing stored."""
    sliding_block, draft_config = op.sliding_block, op.draft_config
    cks, notes = checkpoints_in(op.checkpoints)
    for n in notes:
        tick(progress, 0, len(cks), n)
    if op.stream:  # every checkpoint on each pass of the target's features, in memory: a new streamed extraction
        from .stream import stream

        specs = [ops.CheckpointSpec(str(ck), sliding_block, draft_config) for ck in cks]
        ids = Swept(r["id"] for r in stream(store, op, specs, progress, runner))
        ids.skipped = notes
        tick(progress, len(cks), len(cks), f"replayed {len(cks)} checkpoints on the target's streamed features")
        return ids
    ex = store.extraction(op.extraction)
    plan = []
    for ck in cks:
        cfg = drafter_mod.read_config(ck, draft_config)
        sem = drafter_mod.sliding_semantics(cfg, sliding_block) if "sliding_attention" in cfg.layer_types else None
        plan.append((ck, sem))
    n = len(store.items(ex["id"]))
    n = n if op.max_prompts is None else min(n, op.max_prompts)  # a run of other prompts is not this sweep's
    have = {
        (r["checkpoint"], r.get("sliding_block")): r["id"]
        for r in store.runs()
        if r["extraction_id"] == ex["id"] and (r["summary"] or {}).get("prompts") == n
    }
    todo = [ck for ck, sem in plan if (str(ck), sem) not in have]
    tick(progress, 0, len(cks), f"{len(cks)} checkpoints, {len(cks) - len(todo)} already replayed on {ex['id']}")
    new = (
        replay_many(
            store,
            [ops.CheckpointSpec(str(ck), sliding_block, draft_config) for ck in todo],
            replace(op, extraction=ex["id"]),
            progress,
            runner,
        )
        if todo
        else []
    )
    fresh = {str(ck): r["id"] for ck, r in zip(todo, new)}
    ids = Swept(have.get((str(ck), sem)) or fresh[str(ck)] for ck, sem in plan)
    ids.skipped = notes
    tick(progress, len(cks), len(cks), f"replayed {len(todo)} checkpoints")
    return ids


def sliding_check(store: Store, op: ops.SlidingCheck, progress: Progress = None, runner: Runner | None = None) -> dict:
    """The train/serve mismatch detector: checkpoint `op.drafter` replayed with its sliding layers causal inside
    the block (SpecForge training, SGLang serving) and bidirectional (z-lab HF reference) on one extraction
    (`op.tree_budget`, `op.device`, `op.dtype`), runs reused where they exist. Returns {"causal": run id,
    "bidirectional": run id, "tau_macro": {...}, "delta"}."""
    drafter, draft_config = op.drafter, op.draft_config
    ex = store.extraction(op.extraction)
    cfg = drafter_mod.read_config(drafter, draft_config)
    if "sliding_attention" not in cfg.layer_types:
        raise InputError(
            f"{drafter}: the drafter has no sliding_attention layers, so both semantics give the same "
            "drafts; nothing to check"
        )
    ck = str(drafter_mod.locate(drafter, draft_config).path)
    have = {r.get("sliding_block"): r for r in store.runs() if r["checkpoint"] == ck and r["extraction_id"] == ex["id"]}
    out: dict = {"checkpoint": ck, "extraction": ex["id"], "tau_macro": {}}
    for i, sem in enumerate(drafter_mod.SLIDING_BLOCKS):
        tick(progress, i, 2, f"replaying with sliding layers {sem} inside the block")
        run = have.get(sem)
        one = ops.Replay(
            drafter=drafter,
            extraction=ex["id"],
            tree_budget=op.tree_budget,
            device=op.device,
            dtype=op.dtype,
            sliding_block=sem,
            draft_config=draft_config,
        )
        rid = run["id"] if run else replay(store, one, runner=runner)["id"]
        out[sem] = rid
        out["tau_macro"][sem] = store.run_row(rid)["summary"].get("tau_macro")
    t = out["tau_macro"]
    out["delta"] = None if None in t.values() else t["causal"] - t["bidirectional"]
    tick(progress, 2, 2, f"tau macro causal {t['causal']} vs bidirectional {t['bidirectional']}")
    return out
