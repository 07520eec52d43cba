"""Replay on a trainer's feature cache: its samples become a completion set and an extraction whose features are
the cache's own, so a checkpoint replays teacher-forced on the very features it was trained on.

Contract: `imported(store, op, progress)` (replay --features DIR --target T [--features-layers 1,16,31]) opens the
cache (`audit.open_cache`: SpecForge's prepare_hidden_states.py output or a DeepSpec target cache, lazily, tensors
only) and resolves the target layer ids it holds: the DeepSpec manifest's, else `op.features_layers`. It refuses,
naming the flag, when they are unknown, when they disagree with the manifest, when the cache's width is not
len(layers) x the target's hidden size, or when the drafter reads a layer the cache lacks. Each sample is split at
its loss mask: the tokens before the first loss-masked token are the prompt, those from it through the last
loss-masked token the completion (unmasked tokens inside, e.g. a later user turn, stay in it; the unmasked tail is
left out); a sample without a loss-masked token is skipped with a note. Its rows are written as a completion of
set `trainer-cache-<folder>-<key>` (source "trainer cache: DIR") and, through `cache.write`, as the feature file of
extraction `tc-<key>` (backend: the format's capture; versions["trainer_cache"]: the folder, with format, strategy
and the writer's source), so what follows is the ordinary replay of an extraction (`replay.replay_many`: the
drafter's columns in its own layer order, `ops.layer_blocks`). The key hashes the folder, its files' sizes and times,
the layers, the target's config hash and the sample count: the same cache imported again is reused, a changed one
imported anew. No network, no target forward.
"""

from __future__ import annotations

import hashlib
import json

from .. import drafters as drafter_mod, ops
from ..store import Extraction, Store
from .base import Progress, features_root, tick

CACHE_KEY = "trainer_cache"  # the versions key of an extraction imported from a trainer's cache: its folder
FLAG = "--features-layers"


def source_of(extraction: Extraction | None) -> str | None:
    """'trainer cache: DIR' for an extraction imported from a trainer's cache, else None."""
    d = (extraction.versions if extraction is not None else None) or {}
    return f"trainer cache: {d[CACHE_KEY]}" if d.get(CACHE_KEY) else None


def _key(cache, layers: list[int], config_hash: str, n: int) -> str:
    h = hashlib.sha1(json.dumps([str(cache.path.resolve()), layers, config_hash, n]).encode())
    for f in cache.files + ([cache.path / "samples.idx"] if cache.format == "deepspec" else []):
        st = f.stat()
        h.update(f"{f}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:10]


def layers_held(cache, given: list[int] | None, need: list[int]) -> list[int]:
    """The layer ids the cache holds, in its order; FeatureError naming the flag when unknown or short of `need`."""
    from ..audit import FeatureError

    if cache.layer_ids is not None and given and list(given) != cache.layer_ids:
        raise FeatureError(
            f"{FLAG}: {cache.path}/manifest.json records target_layer_ids {cache.layer_ids}, {FLAG} says "
            f"{list(given)}; leave {FLAG} out (the manifest's are used)"
        )
    have = cache.layer_ids or given
    if not have:
        raise FeatureError(
            f"{FLAG}: {cache.path} is a SpecForge capture, which does not record its target layer ids; give {FLAG} "
            f"with the layers it was captured for, in order (the draft config's dflash_config.target_layer_ids, "
            f"like {','.join(map(str, need))})"
        )
    lack = ops.missing_layers(list(have), need)
    if lack:
        raise FeatureError(
            f"{FLAG}: the drafter reads target layers {need} but the cache at {cache.path} holds {list(have)} "
            f"(missing {lack}); replay a checkpoint of those layers, or give {FLAG} if the cache holds others"
        )
    return list(have)


def split(ids: list[int], mask: list) -> tuple[int, int] | None:
    """(first, end): the completion is ids[first:end], from the first through the last loss-masked token (the
    prompt keeps at least one token); None when nothing is loss-masked."""
    on = [i for i, m in enumerate(mask) if m]
    if not on or on[-1] < 1:
        return None
    return max(on[0], 1), on[-1] + 1


def imported(store: Store, op: ops.Replay, progress: Progress = None) -> Extraction:
    """The extraction holding `op.features`' samples (imported now, or the earlier import of the same cache)."""
    import torch

    from .. import cache as cache_mod, target as target_mod
    from ..audit import FeatureError, open_cache

    info = target_mod.describe(op.target)
    tc = open_cache(op.features)
    need = list(drafter_mod.read_config(op.drafter, op.draft_config).target_layer_ids)
    layers = layers_held(tc, op.features_layers, need)
    target_mod.check_layers(info, layers)
    n = tc.count if op.max_prompts is None else min(tc.count, op.max_prompts)
    key = _key(tc, layers, info.config_hash, n)
    ex_id, set_name = f"tc-{key}", f"trainer-cache-{tc.path.name[:40]}-{key[:6]}"
    old = {e.id: e for e in store.extractions()}.get(ex_id)
    if old and old.status == "done":
        tick(progress, n, n, f"trainer cache {tc.path}: imported before as extraction {ex_id}")
        return old
    width, source = len(layers) * info.hidden_size, f"trainer cache: {tc.path}"
    store.add_set(ops.check_name(set_name, "features", "a set name"), source)
    if not old:
        store.add_extraction(
            dict(
                id=ex_id,
                set_name=set_name,
                target_path=info.path,
                layer_ids=layers,
                hidden_size=info.hidden_size,
                device="trainer",
                dtype=tc.hidden_dtype or "bfloat16",
                backend=f"{tc.format} capture",
                versions={CACHE_KEY: str(tc.path), "format": tc.format, "strategy": tc.strategy, "source": tc.source},
                config_hash=info.config_hash,
            )
        )
    kept, skipped = 0, []
    try:
        for i, s in enumerate(tc.samples(n)):
            where = f"{tc.path}: {s.name}"
            ids = s.input_ids.tolist()
            cut = split(ids, s.loss_mask.tolist())
            if cut is None:
                skipped.append(s.name)
                continue
            if s.hidden.shape[1] != width:
                raise FeatureError(
                    f"{FLAG}: {where} holds {s.hidden.shape[1]} feature values a token, {len(layers)} layers x "
                    f"hidden {info.hidden_size} = {width}; give {FLAG} the layers the cache was captured with"
                )
            if max(ids) >= info.vocab_size:
                raise FeatureError(
                    f"{where}: token id {max(ids)} is outside {info.path}'s vocabulary ({info.vocab_size}); give "
                    "--target the model the cache was captured from"
                )
            first, end = cut
            feats = s.hidden[:end]
            if not bool(torch.isfinite(feats.float()).all()):
                raise FeatureError(f"{where}: holds NaN or inf features; audit the cache (audit --features ...)")
            comp = {"id": s.name, "prompt_ids": ids[:first], "output_ids": ids[first:end], "idx": i}
            store.add_completions(set_name, [comp | {"finish_reason": "trainer cache"}])
            f = cache_mod.write(features_root(store), ex_id, s.name, feats, {"extraction": ex_id, "source": source})
            store.add_item(ex_id, s.name, end, str(f))
            kept += 1
            tick(progress, i + 1, n, f"imported {s.name} ({first} prompt + {end - first} completion tokens)")
        if not kept:
            raise FeatureError(f"{tc.path}: none of its first {n} samples has a loss-masked token (nothing to replay)")
    except BaseException:
        store.set_status("extractions", ex_id, "failed")
        raise
    if skipped:
        tick(progress, n, n, f"skipped {len(skipped)} samples without a loss-masked token: {', '.join(skipped[:5])}")
    store.set_status("extractions", ex_id, "done")
    return store.extraction(ex_id)
