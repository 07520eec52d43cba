"""Streaming evaluation: the target runs over each pass of sequences and every checkpoint replays on the features
while they are in memory; no feature file is written.

Contract: `stream(store, op, checkpoints, progress)` (replay --stream, sweep --stream: `op.target`,
`op.completions`) validates the target, the set and every checkpoint (config, tensors, target) before any work,
records an extraction row marked streamed (`versions["streamed"]`: target, layers, device, dtype and the kernel
backend it bound, as an extraction records them, with one item per prompt and no file), and stores one run per
checkpoint on it (`runs.store_run`), so the pages treat these runs as any other. The features are what an
extraction writes (the same forward, `target.extract`, cast to bf16), so the runs equal extract-then-replay's
exactly. The per-prompt part is `stream_work` (an `ops.StreamWork`), run here or by a runner (the one-host pool's
worker processes: `--gpus`, jobs.workers; a Ray cluster's workers: `--ray`; the extraction row records the first
worker's device and backend, and every worker must bind the same backend); this process alone writes the store. A
later replay on a streamed extraction is refused with the command that streams again (`features.require_files`). With a
temperature (`op.temperature`) the whole target runs and each sequence's top-K (ops.TARGET_TOPK) is computed with
its features (`target.extract_top`), as an extraction with --target-topk would keep it, for the expected-acceptance
pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from .. import drafters as drafter_mod, ops
from ..ops import InputError
from ..store import Extraction, Store, StoreError, new_id
from .base import DTYPES, Progress, Runner, tick
from .device_io import cut, pass_cap
from .expected import sampling_of
from .features import STREAMED, check_drafter
from .runs import store_run


def layers_for(cfgs: list) -> list[int]:
    """The target layers a stream computes for drafters `cfgs`: one drafter's (or several reading the same) in its
    order, else the sorted union (each replays on its own columns, as on an extraction of the union)."""
    needs = [list(c.target_layer_ids) for c in cfgs]
    if all(n == needs[0] for n in needs):
        return needs[0]
    return sorted({x for n in needs for x in n})


def stream(
    store: Store,
    op: ops.Replay | ops.Sweep,
    checkpoints: list[ops.CheckpointSpec],
    progress: Progress,
    runner: Runner,
) -> list[dict]:
    """Run the target over the completions of `op.completions` (the first `op.max_prompts`) on `op`'s first device
    in passes, replay every checkpoint of `checkpoints` on each pass's features while they are in memory, and store
    one run per checkpoint on a streamed extraction row; returns [{"id", "summary"}] in the order given. The
    per-prompt part (`stream_work`, given an `ops.StreamWork`) runs here or through `runner` (the pool's worker
    processes, one per device of `op.gpus`, each with its own `device`: jobs.workers; a Ray cluster's workers:
    jobs.cluster); this process alone writes the store, once every result is in."""
    from .. import metrics, target as target_mod

    device, settings = op.devices()[0], op.settings
    info = target_mod.describe(op.target)
    rows = store.completions(op.completions)
    if not rows:
        raise StoreError(f"completions: no completions in set {op.completions!r}; import or fetch them first")
    rows = rows[: settings.max_prompts] if settings.max_prompts is not None else rows
    if not (op.gpus or op.ray) and device.startswith("cuda"):  # the work runs in this process, on its device
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device cuda: no CUDA device on this machine; use --device cpu")
    locs = [drafter_mod.locate(ck.path, settings.draft_config) for ck in checkpoints]
    cfgs = [drafter_mod.config_of(loc) for loc in locs]
    layers = layers_for(cfgs)
    target_mod.check_layers(info, layers)
    ex_id = new_id("ex")
    ex = dict(  # the streamed extraction's row as it will be stored (its backend once a worker bound one)
        id=ex_id,
        set_name=op.completions,
        target_path=info.path,
        layer_ids=layers,
        hidden_size=info.hidden_size,
        device=device,
        dtype=settings.dtype,
        config_hash=info.config_hash,
        status="done",
    )
    for ck, loc, cfg in zip(checkpoints, locs, cfgs):  # every checkpoint checked before the target is loaded
        check_drafter(cfg, Extraction.of(ex | {"backend": None}), info, store, f"drafter {loc.path}")
        drafter_mod.check(ck.path, settings.sliding_block, settings.draft_config)
    for c in rows:
        if max(c.prompt_ids + c.output_ids) >= info.vocab_size:
            raise InputError(
                f"prompt {c.prompt_id!r}: a token id is outside the target's vocabulary ({info.vocab_size}); "
                "wrong target for this completion set?"
            )
    spec = ops.StreamWork(
        extraction=ex_id,
        target=info.path,
        completions=op.completions,
        layers=layers,
        checkpoints=tuple(checkpoints),
        device=device,
        settings=settings,
    )
    ids = [c.prompt_id for c in rows]
    got: list[dict[str, metrics.Prompt]] = [{} for _ in checkpoints]
    for ev in runner(spec, ids, progress):
        if "backend" in ev:  # a worker loaded the target: what the first bound is the streamed extraction's
            if "backend" in ex:
                if ev["backend"] != ex["backend"]:
                    raise InputError(
                        f"the workers bound different kernel backends ({ex['backend']} and {ev['backend']} on "
                        f"{ev['device']}); stream on devices of one kind"
                    )
                continue
            ex |= dict(
                backend=ev["backend"],
                device=ev["device"],
                versions=ev["versions"] | {"fla_bound": ev["backend"] == "fla", STREAMED: True},
            )
        else:
            got[ev["checkpoint"]][ev["result"].id] = ev["result"]
    for ck, by_id in zip(checkpoints, got):
        if len(by_id) != len(ids):
            raise RuntimeError(f"the stream of {ck.path} returned {len(by_id)} of {len(ids)} prompts")
    store.add_extraction(ex)
    with store.session():
        for c in rows:  # the prompts it holds, without files (a replay of it is refused: `require_files`)
            store.add_item(ex_id, c.prompt_id, len(c.prompt_ids) + len(c.output_ids), "")
    comps = {c.prompt_id: c for c in rows}
    stored = store.extraction(ex_id)
    return [
        store_run(
            store,
            extraction=stored,
            checkpoint=ck,
            results=[by_id[i] for i in ids],
            settings=settings,
            device=device,
            progress=progress,
            comps=comps,
        )
        for ck, by_id in zip(checkpoints, got)
    ]


def stream_work(store: Store, a: ops.StreamWork, ids: list[str], progress: Progress) -> Iterator[dict]:
    """The target over prompts `ids` of set a.completions on a.device, in passes sized to memory, every checkpoint
    of a.checkpoints replayed on each pass's features in memory: yields {"backend", "versions", "device"} once the
    target is loaded, then {"checkpoint": index, "result": metrics.Prompt} per checkpoint and prompt."""
    import torch

    from .. import cache, replay as replay_mod, sampling, target as target_mod

    s = a.settings
    device, dtype, layers = a.device, s.dtype, list(a.layers)
    info = target_mod.describe(a.target)
    want = set(ids)
    rows = [c for c in store.completions(a.completions) if c.prompt_id in want]
    if not rows:
        return
    cfgs = [drafter_mod.config_of(drafter_mod.locate(ck.path, s.draft_config)) for ck in a.checkpoints]
    tick(progress, 0, len(rows), f"loading target {info.path} (streaming: no feature file is written)")
    how = sampling_of(a)
    model, backend = target_mod.load(info.path, layers, device, DTYPES[dtype], whole=how is not None)
    yield {"backend": backend, "versions": target_mod.versions(), "device": device}
    head = target_mod.load_head(info.path, device, DTYPES[dtype])
    top = None if how is None else target_mod.top_head(info.path, ops.TARGET_TOPK, lm_head=head.lm_head)
    H, width = info.hidden_size, len(layers) * info.hidden_size
    index = [ops.layer_blocks(layers, list(c.target_layer_ids)) for c in cfgs]
    done = 0
    nbytes = width * 2  # bf16 features a token
    # passes within a share of what the loaded target leaves free (`pass_cap`)
    for part in cut(rows, lambda c: (len(c.prompt_ids) + len(c.output_ids)) * nbytes, pass_cap(device)):
        seqs = []
        for c in part:  # the extraction's forward and its bf16 cast: the features a feature file would hold
            tokens, P = torch.tensor(c.prompt_ids + c.output_ids), len(c.prompt_ids)
            if top is None:
                feats, t = target_mod.extract(model, tokens, layers).to(torch.bfloat16), None
            else:  # with the completion positions' top-K, as an extraction with --target-topk keeps it
                feats, *kept = target_mod.extract_top(model, tokens, layers, top, P)
                t = sampling.Top(*(x.cpu().numpy() for x in kept), P, info.vocab_size)
                feats = feats.to(torch.bfloat16)
            seqs.append(replay_mod.Sequence(c.prompt_id, tokens, P, feats, t))
            tick(progress, done, len(rows), f"target forward over {c.prompt_id} ({len(tokens)} tokens)")
        for j, ck in enumerate(a.checkpoints):
            tick(progress, done, len(rows), f"replaying checkpoint {j + 1}/{len(a.checkpoints)} on {len(seqs)} prompts")
            d = drafter_mod.load(ck.path, DTYPES[dtype], device, s.sliding_block, s.draft_config)
            at = None if index[j] is None else torch.tensor(index[j], dtype=torch.long, device=seqs[0].features.device)
            own = [s if at is None else _with(s, cache.blocks(s.features, at, H)) for s in seqs]

            def drafting(i: int, k: int, m: int, j=j, base=done, own=own) -> None:  # a long sequence's anchors
                tick(
                    progress,
                    base + i,
                    len(rows),
                    f"checkpoint {j + 1}/{len(a.checkpoints)}: {own[i].id}: {k:,}/{m:,} anchors",
                )

            res = (
                replay_mod.chain_only_results(d, head, own, s.tree_budget, sampling=how)
                if s.anchors == "chain"
                else replay_mod.every_anchor_results(
                    d, head, own, s.tree_budget, s.chunk, anchors=drafting, sampling=how
                )
            )
            for p in res:
                yield {"checkpoint": j, "result": p}
            del d
        done += len(part)
        tick(progress, done, len(rows), f"streamed {done}/{len(rows)} prompts")
        del seqs


def _with(seq, features):
    return replace(seq, features=features)
