"""Extraction: the target's hidden states at the drafters' layers for every completion of a set, as feature files.

Contract: `layers_of` names the layers: explicit ids, one drafter's, or the union of several drafters' (one
extraction serves every drafter family whose layers it holds). `extract(store, op)` validates (target, layers,
completions), then runs the per-prompt part (`extract_work`, given an `ops.ExtractWork`) here or through a runner
(one worker process per GPU); this process alone writes the store: the record once the first worker reports the
kernel backend it bound, then each item as its feature file is written. Before any of it, the bytes the
extraction will write and the free space under the feature folder are stated and checked (`disk`: refused, with
both figures, when they do not fit). Resumable: an existing extraction keeps its items, only the missing prompts
run. With `target_topk` K (64 by default) each prompt also gets the target's top-K log-probabilities per completion
position beside its feature file (`cache.write_top`; the whole target runs, `target.extract_top`), recorded in the
extraction's versions (`target_topk`) and counted in the disk plan; 0 keeps none (the target cut after the last
layer a drafter reads).
"""

from __future__ import annotations

from collections.abc import Iterator

from .. import drafters as drafter_mod, ops
from ..ops import InputError
from ..store import Extraction, Store, StoreError, new_id
from . import disk
from .base import DTYPES, Progress, Runner, features_root, tick

TOPK = "target_topk"  # the versions key of the top-K an extraction keeps per completion position


def topk_of(extraction: Extraction) -> int:
    """The target's top-K an extraction keeps (0: none, as every extraction made before it could)."""
    return int((extraction.versions or {}).get(TOPK) or 0)


def layers_of(drafter: str | list[str] | None, layers: str | list[int] | None) -> list[int]:
    """Layer ids from an explicit '1,16,31' list (ops.parse_layers), else the drafter checkpoints': one drafter's
    target_layer_ids as it lists them (its replay then reads every column in place), several drafters' union,
    sorted and deduplicated (each replays on its own columns of it: `ops.layer_blocks`)."""
    layers = ops.parse_layers(layers)
    if layers:
        return layers
    paths = ops.parse_paths(drafter)
    if len(paths) == 1:
        return list(drafter_mod.read_config(paths[0]).target_layer_ids)
    if paths:
        return sorted({x for p in paths for x in drafter_mod.read_config(p).target_layer_ids})
    raise InputError("give --drafter CKPT (its layer ids are used; repeat it for several drafters) or --layers 1,16,31")


def extract(store: Store, op: ops.Extract, progress: Progress, runner: Runner) -> str:
    """Extract features of every completion of `op.completions` at `op.layers` (or the layers the drafters of
    `op.drafter` read: `layers_of`) on `op`'s first device (its GPUs through `runner`); resumes `op.extraction_id`
    when it exists (its items are kept, only the missing prompts are extracted), else creates the extraction under
    that id (a job records its id before starting). The per-prompt work (`extract_work`, kind "extract") runs
    through `runner` (here, or one worker process per GPU, each with its own `device`); this process alone writes
    the store: the record when the first worker reports the backend it bound, then each item as its feature file is
    written."""
    set_name, layer_ids, device, dtype = op.completions, layers_of(op.drafter, op.layers), op.devices()[0], op.dtype
    extraction_id = op.extraction_id

    import torch

    from .. import target as target_mod

    info = target_mod.describe(op.target)
    target_mod.check_layers(info, layer_ids)
    if runner is None and device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device on this machine; use --device cpu")
    rows = store.completions(set_name)
    if not rows:
        raise StoreError(f"no completions in set {set_name!r}; import or fetch them first")
    done: set[str] = set()
    exists = bool(extraction_id) and any(e.id == extraction_id for e in store.extractions())
    if exists:
        e = store.extraction(extraction_id)
        if (e.versions or {}).get("streamed"):
            raise InputError(
                f"extraction {extraction_id} was streamed (replay/sweep --stream keep no feature files), so it cannot "
                "be resumed; extract the set as a new extraction (without --resume)"
            )
        if e.layer_ids != layer_ids or e.target_path != info.path:
            raise InputError(f"extraction {extraction_id} used other layers or another target; start a new one")
        if topk_of(e) != op.target_topk:
            raise InputError(
                f"target_topk {op.target_topk}: extraction {extraction_id} keeps the target's top-{topk_of(e)}; resume "
                f"it with --target-topk {topk_of(e)}, or start a new extraction"
            )
        done = {it.prompt_id for it in store.items(extraction_id)}
    space = disk.check(
        disk.plan(store, set_name, layer_ids, info.path, extraction_id, op.target_topk)
    )  # before any work or row
    tick(progress, len(done), len(rows), space.line())
    if exists:
        store.set_status("extractions", extraction_id, "running")
    extraction_id = extraction_id or new_id("ex")
    todo = [c.prompt_id for c in rows if c.prompt_id not in done]
    spec = ops.ExtractWork(
        target=info.path,
        completions=set_name,
        layers=layer_ids,
        device=device,
        dtype=dtype,
        extraction=extraction_id,
        target_topk=op.target_topk,
    )

    def shifted(d: int, t: int, msg: str) -> None:  # the work counts this run's prompts; show the set's
        tick(progress, len(done) + d, len(done) + t, msg)

    bound = None
    try:
        for ev in runner(spec, todo, shifted):
            if "backend" in ev:  # a worker loaded the target: record the extraction with what it bound
                if bound is not None and ev["backend"] != bound:
                    raise InputError(
                        f"the workers bound different kernel backends ({bound} and {ev['backend']} "
                        f"on {ev['device']}); extract on devices of one kind"
                    )
                bound = ev["backend"]
                if not exists:
                    store.add_extraction(
                        dict(
                            id=extraction_id,
                            set_name=set_name,
                            target_path=info.path,
                            layer_ids=layer_ids,
                            hidden_size=info.hidden_size,
                            device=ev["device"],
                            dtype=dtype,
                            backend=bound,
                            versions=ev["versions"] | {"fla_bound": bound == "fla", TOPK: op.target_topk},
                            config_hash=info.config_hash,
                        )
                    )
                    exists = True
            else:
                store.add_item(extraction_id, ev["item"], ev["tokens"], ev["file"])
    except BaseException as e:  # every way out leaves the record failed or cancelled, never running
        if exists:
            store.set_status(
                "extractions", extraction_id, "cancelled" if isinstance(e, KeyboardInterrupt) else "failed"
            )
        raise
    store.set_status("extractions", extraction_id, "done")
    return extraction_id


def extract_work(store: Store, a: ops.ExtractWork, ids: list[str], progress: Progress) -> Iterator[dict]:
    """Extract prompts `ids` of set a.completions into extraction a.extraction on a.device: yields
    {"backend", "versions", "device"} once the target is loaded, then {"item", "tokens", "file"} per prompt
    whose feature file is written (the caller records it)."""
    import torch

    from .. import cache, sampling, target as target_mod

    info = target_mod.describe(a.target)
    want = set(ids)
    rows = [c for c in store.completions(a.completions) if c.prompt_id in want]
    tick(progress, 0, len(rows), f"loading target {info.path}")
    if not rows:
        return
    model, backend = target_mod.load(info.path, list(a.layers), a.device, DTYPES[a.dtype], whole=a.target_topk > 0)
    top = target_mod.top_head(info.path, a.target_topk, a.device, DTYPES[a.dtype]) if a.target_topk else None
    vers = target_mod.versions()
    yield {"backend": backend, "versions": vers, "device": a.device}
    meta = dict(
        extraction=a.extraction,
        target=info.path,
        config_hash=info.config_hash,
        layer_ids=list(a.layers),
        device=a.device,
        dtype=a.dtype,
        backend=backend,
        **vers,
    )

    def todo():  # (key, ids) of the prompts, checked one by one as the extraction reaches them
        for i, c in enumerate(rows):
            tokens = torch.tensor(c.prompt_ids + c.output_ids)
            if int(tokens.max()) >= info.vocab_size:
                raise InputError(
                    f"prompt {c.prompt_id!r}: token id {int(tokens.max())} is outside the target's "
                    f"vocabulary ({info.vocab_size}); wrong target for this completion set?"
                )
            yield (i, c.prompt_id, len(tokens), len(c.prompt_ids)), tokens

    def write(key, out):
        if top is None:
            return cache.write(features_root(store), a.extraction, key[1], out, meta)
        feats, ids, logp, tail = out  # the top-K file first: a feature file alone never reads as whole
        t = sampling.Top(ids.numpy(), logp.numpy(), tail.numpy(), key[3], info.vocab_size)
        cache.write_top(features_root(store), a.extraction, key[1], t)
        return cache.write(features_root(store), a.extraction, key[1], feats, meta)

    def forward(key, ids):  # the whole target: features and the completion positions' top-K
        return target_mod.extract_top(model, ids, list(a.layers), top, key[3])

    # device forwards overlap the previous prompts' copies and file writes (target.extract_stream)
    run = target_mod.extract_stream(model, todo(), list(a.layers), write, forward=forward if top else None)
    for (i, pid, n, _), f in run:
        yield {"item": pid, "tokens": n, "file": str(f)}
        tick(progress, i + 1, len(rows), f"extracted {pid} ({n} tokens)")
