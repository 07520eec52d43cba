"""Drafters: the family registry, and reading, checking and loading a drafter checkpoint of any family.

Contract: `read_config(path)` locates a checkpoint (HF folder or SpecForge runtime folder) and returns its
validated `DrafterConfig`; `check(path)` validates it as `load` would (config, sliding semantics, every tensor's
name and shape) without reading its weights; `load(path, dtype, device)` returns a `base.Drafter` of the
checkpoint's family. A family is one `FamilySpec` (`spec`) in the registry (`register`, `spec_of`, `specs`):
the built-ins declare themselves in `families/`, a plug-in calls `register`; the config's `architectures` and
`projector_type` pick it (`family_of`), and a drafter no registered family describes is refused by name. This
module and the config, checkpoint-locating, weights-table, registry and consistency modules are torch-free, so
pages read configs without torch; a family's model class (torch) is imported on first load.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import Drafter
from .checkpoint import RUNTIME_FILE, Checkpoint, check_files, config_of, locate, raw_config, read_config, step_of
from .config import (
    SLIDING_BLOCKS,
    DrafterConfig,
    context_limits,
    default_layer_ids,
    parse_config,
    sliding_semantics,
)
from .consistency import Check, check_target, checks
from .errors import CheckpointError
from .fields import family_of
from .registry import register, spec_of, specs, unregister
from .spec import FamilySpec, Fields, resolve
from .weights import Weights, checked, shapes

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

__all__ = [
    "RUNTIME_FILE",
    "SLIDING_BLOCKS",
    "Check",
    "Checkpoint",
    "check_files",
    "CheckpointError",
    "Drafter",
    "DrafterConfig",
    "FamilySpec",
    "Fields",
    "Weights",
    "check",
    "check_target",
    "checked",
    "checks",
    "config_of",
    "context_limits",
    "default_layer_ids",
    "family_of",
    "flops_per_block",
    "kernels_for",
    "load",
    "locate",
    "parse_config",
    "raw_config",
    "read_config",
    "register",
    "shapes",
    "sliding_semantics",
    "spec_of",
    "specs",
    "step_of",
    "unregister",
]


def check(path: str | Path, sliding_block: str | None = None, draft_config: str | Path | None = None) -> DrafterConfig:
    """Validate a checkpoint as `load` does (config, sliding semantics, every tensor's name and shape) without
    reading its weights; returns its config. A sweep checks every checkpoint so before loading the first."""
    ck = locate(path, draft_config)
    c = config_of(ck)
    sliding_semantics(c, sliding_block)
    checked(ck, c, None)
    return c


def load(
    path: str | Path,
    dtype: torch.dtype | None = None,
    device: str = "cpu",
    sliding_block: str | None = None,
    draft_config: str | Path | None = None,
    place: Callable[[dict], dict] | None = None,
) -> Drafter:
    """Load and validate a checkpoint (HF folder or SpecForge runtime folder, see `locate`) as its family's
    drafter, in `dtype` (float32 by default). A tensor of the wrong shape, a missing one or an unknown one (other
    than a copy of the target's embedding or LM head) raises CheckpointError naming it. `place`: moves the
    checked weights (CPU, `dtype`) to `device` all at once (a loader's staged upload); by default each tensor is
    moved as it is read."""
    ck = locate(path, draft_config)
    c = config_of(ck)
    cls = spec_of(c.family).model_class()  # imports the family's model module (torch)
    import torch

    from .dflash import load as load_checked

    return load_checked(ck, c, dtype or torch.float32, device, sliding_block, place, cls=cls)


def kernels_for(device: Any):
    """The element-wise kernels drafters on `device` use (builds the fused set on CUDA: Triton and Inductor
    imports take seconds, so a loader starts this early)."""
    from .kernels import kernels_for as build

    return build(device)


def flops_per_block(c: DrafterConfig, ctx_len: int, vocab: int) -> float:
    """Matmul FLOPs of one block of a drafter with config `c` (its family's count), for benchmarks."""
    count = spec_of(c.family).flops
    if count is None:
        from .dflash import flops_per_block as count
    return resolve(count)(c, ctx_len, vocab)
