"""Disk space of an extraction, known before any work starts.

Contract: `plan(store, completions, layers, target, extraction_id)` computes the bytes an extraction will write
(tokens x K*H*2 over the prompts it still has to extract, plus `margin`) and the free space of the filesystem
holding the workspace's feature folder (`free_bytes`, `shutil.disk_usage` of the folder or its nearest existing
parent), as a `DiskPlan` whose `line` states both; `check` raises `DiskFull` (an `InputError`) naming both figures
and the ways out when it does not fit. A set without completions and a target whose weights files are cut short
are refused before any plan is made (a plan shown before an error reads as if the work would start). With the
target's top-K (`topk` K) each completion token adds `cache.top_bytes(K)` = 8K + 4 bytes (K int32 ids, K float32
log-probabilities, one float32 tail mass), stated in the line beside the features' bytes. Torch-free:
the CLI, the job's orchestration and `extract` call it before the target is loaded, a server freed or an
extraction row written.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ..ops import InputError
from ..store import Store
from ..target_info import check_safetensors, describe
from .base import features_root

MARGIN_FRACTION = 0.01  # of the payload: filesystem blocks, the header of each file
MARGIN_BYTES = 16 << 20  # fixed part of the margin (16 MiB): the store's own growth, a temp file being renamed


class DiskFull(InputError):
    """An extraction whose feature files would not fit on the workspace's disk."""


@dataclass
class DiskPlan:
    folder: Path  # the workspace's feature folder
    prompts: int  # prompts still to extract
    tokens: int  # their tokens (prompt + completion)
    width: int  # K*H values per token, 2 bytes each (bf16)
    need: int  # bytes to write: tokens * width * 2 plus the margin
    free: int  # bytes free on the folder's filesystem
    topk: int = 0  # the target's top-K kept per completion position (0: none)
    completion: int = 0  # completion tokens of the prompts to extract (the top-K's rows)

    @property
    def fits(self) -> bool:
        return self.need <= self.free

    def line(self) -> str:
        """Both figures in one line (the CLI's stderr, the job's progress line)."""
        return f"disk: writes {size(self.need)} ({self.what()}) to {self.folder}; {size(self.free)} free there"

    def what(self) -> str:
        """What the bytes are: tokens x bytes of features (+ completion tokens x bytes of the top-K), the margin."""
        top = (
            f" + {self.completion:,} completion tokens x {top_bytes(self.topk):,} bytes of the target's top-{self.topk}"
        )
        return (
            f"{self.tokens:,} tokens x {self.width * 2:,} bytes{top if self.topk else ''} over {self.prompts:,} "
            "prompts, margin included"
        )


def top_bytes(k: int) -> int:
    """Bytes a completion token takes in a top-K file (= cache.top_bytes, torch-free here): K int32 ids, K float32
    log-probabilities and one float32 tail mass."""
    return 8 * k + 4


def size(n: int) -> str:
    """Bytes for eyes: GiB from 1 GiB up, else MiB."""
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def free_bytes(folder: Path) -> int:
    """Free bytes of the filesystem holding `folder` (its nearest existing parent while it does not exist yet)."""
    p = Path(folder).resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def margin(payload: int) -> int:
    """The bytes added to a payload of feature values: MARGIN_FRACTION of it plus MARGIN_BYTES."""
    return int(payload * MARGIN_FRACTION) + MARGIN_BYTES


def plan(
    store: Store, completions: str, layers: list[int], target: str, extraction_id: str | None = None, topk: int = 0
) -> DiskPlan:
    """The bytes an extraction of set `completions` at target layers `layers` of `target` will write (the prompts
    extraction `extraction_id` already holds are not counted), with the target's top-`topk` per completion
    position, against the free space under the feature folder."""
    width = len(layers) * describe(target).hidden_size
    for f in sorted(Path(target).glob("*.safetensors")):  # headers only: a cut copy is named before any plan
        check_safetensors(f)
    every = store.completions(completions)
    if not every:  # refused before a plan is shown: a plan of 0 prompts reads as if the work would start
        sets = ", ".join(s.name for s in store.sets() if s.prompts) or "none yet"
        raise InputError(
            f"completions {completions!r}: no completions in that set (sets with completions: {sets}); give one of "
            "them, or import or fetch the set first"
        )
    held = set()
    if extraction_id and any(e.id == extraction_id for e in store.extractions()):
        held = {it.prompt_id for it in store.items(extraction_id)}
    rows = [c for c in every if c.prompt_id not in held]
    tokens = sum(len(c.prompt_ids) + len(c.output_ids) for c in rows)
    completion = sum(len(c.output_ids) for c in rows)
    payload = tokens * width * 2 + (completion * top_bytes(topk) if topk else 0)
    folder = features_root(store)
    return DiskPlan(folder, len(rows), tokens, width, payload + margin(payload), free_bytes(folder), topk, completion)


def check(p: DiskPlan) -> DiskPlan:
    """`p` when it fits; else DiskFull naming both figures and the ways out."""
    if p.fits:
        return p
    raise DiskFull(
        f"extraction needs {size(p.need)} for {p.prompts:,} prompts ({p.what()}) but {p.folder} has "
        f"{size(p.free)} free; extract fewer prompts (a smaller completion set, or no target top-K), "
        "put the workspace on another disk (--workspace DIR), or evaluate without feature files "
        "(sweep --stream --target DIR --completions SET --checkpoints DIR, or replay --stream)"
    )
