"""What every pipeline part shares: the progress and runner types, the torch dtype table, the feature root.

Contract: an operation reports progress through an optional `progress(done, total, message)` callback (`tick`).
Extract, replay and streaming split into a parent part (validate, then record in the store: only that process
writes it) and a per-prompt part given as a worker spec (`ops.ExtractWork`, `ops.ReplayWork`, `ops.StreamWork`); a
`Runner` runs that part, here (`worker.here`), in one worker process per GPU (jobs.workers) or on a Ray cluster's
workers (jobs.cluster), and streams its events back, so N workers give the same results as one; a handler receives
its runner (`pipeline.perform`). Torch and the
torch-backed modules (cache, replay, target) are imported inside the functions that use them, so store-only
commands and the job process never load torch at import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from .. import ops
from ..store import Store

Progress = Callable[[int, int, str], None] | None
# The per-prompt part of an operation: (worker spec, prompt ids, progress) -> events (`worker.work`): here, in this
# process (`worker.here`), or sharded over worker processes (jobs.workers) or a Ray cluster's (jobs.cluster).
Runner = Callable[[ops.Work, list, Progress], Iterator[dict]]


class _Dtypes(dict):
    """dtype name -> torch dtype; the names alone (validation: ops.check_dtype) need no torch."""

    def __getitem__(self, name: str):
        import torch

        return getattr(torch, dict.__getitem__(self, name))


DTYPES = _Dtypes({name: name for name in ops.DTYPES})


def tick(progress: Progress, done: int, total: int, msg: str) -> None:
    if progress:
        progress(done, total, msg)


def features_root(store: Store) -> Path:
    return store.workspace / "features"
