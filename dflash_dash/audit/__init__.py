"""The trainers' feature caches and the audit of them against the product's own extraction.

Contract: `audit(features, target, layers=None, drafter=None, samples=None, device="cpu", dtype="float32",
progress=None)` opens a trainer's cache (`formats.open_cache`: SpecForge's `prepare_hidden_states.py` output or a
DeepSpec target cache, read lazily, tensors only), resolves the target layer ids it holds (DeepSpec's manifest records
them; a SpecForge capture does not: `layers`, or a drafter checkpoint / draft config JSON whose
`dflash_config.target_layer_ids` it was captured for), recomputes the same positions with `target.extract` and
returns the report of `check.run` (per layer rel-L2, cosine, zero and non-finite shares, best layer offset and
position shift, scale, level, finding and meaning; a verdict in words). Errors are UserErrors naming the file or the
field and the fix. Sits under the pipeline (which keeps the report) and above the target.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..drafters import CheckpointError, parse_config, read_config
from .check import BACKEND_REL_L2, EXACT, OFFSETS, SHIFTS, Progress, run, storage_level, verdict
from .formats import DEEPSPEC, SPECFORGE, Cache, FeatureError, Sample, load_ckpt, open_cache

__all__ = [
    "BACKEND_REL_L2",
    "DEEPSPEC",
    "EXACT",
    "OFFSETS",
    "SHIFTS",
    "SPECFORGE",
    "Cache",
    "FeatureError",
    "Sample",
    "audit",
    "drafter_layers",
    "load_ckpt",
    "open_cache",
    "run",
    "storage_level",
    "verdict",
]


def drafter_layers(path: str) -> list[int]:
    """dflash_config.target_layer_ids of a draft config JSON (SpecForge's --draft-model-config) or a checkpoint."""
    p = Path(path)
    if p.is_file() and p.suffix == ".json":
        try:
            return list(parse_config(json.loads(p.read_text())).target_layer_ids)
        except (json.JSONDecodeError, CheckpointError) as e:
            raise FeatureError(f"drafter {p}: {e}") from None
    return list(read_config(p).target_layer_ids)


def audit(
    features: str,
    target: str,
    layers: list[int] | None = None,
    drafter: str | None = None,
    samples: int | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    progress: Progress = None,
) -> dict:
    """Audit a trainer's feature cache against the product's recomputation (see the module contract)."""
    cache = open_cache(features)
    given = layers or (drafter_layers(drafter) if drafter else None)
    if cache.layer_ids is not None and given and list(given) != cache.layer_ids:
        raise FeatureError(
            f"{cache.path}/manifest.json records target_layer_ids {cache.layer_ids}, the layers given are "
            f"{list(given)}; leave layers out (the manifest's are used) or audit the cache of those layers"
        )
    ids = cache.layer_ids or given
    if not ids:
        raise FeatureError(
            f"layers: {cache.path} is a SpecForge capture, which does not record its target layer ids; give layers "
            "(like 1,16,31: the draft config's dflash_config.target_layer_ids) or drafter (the draft config JSON "
            "or checkpoint it was captured for)"
        )
    return run(cache, target, list(ids), samples, device, dtype, progress)
