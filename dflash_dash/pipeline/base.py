"""What every pipeline part shares: the progress and runner types, the torch dtype table, the feature root, and
`work`, the per-prompt part of an operation run over a list of prompt ids.

Contract: an operation reports progress through an optional `progress(done, total, message)` callback (`tick`).
Extract, replay and streaming split into a parent part (validate, then record in the store: only that process
writes it) and a per-prompt part given as a worker spec (`ops.ExtractWork`, `ops.ReplayWork`, `ops.StreamWork`); a
`Runner` runs that part, here (`here`), in one worker process per GPU (jobs.workers) or on a Ray cluster's workers
(jobs.cluster), and streams its events back, so N workers give the same results as one. Torch and the
torch-backed modules (cache, replay, target) are imported inside the functions that use them, so store-only
commands and the job process never load torch at import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from .. import ops
from ..store import Store

Progress = Callable[[int, int, str], None] | None
# The per-prompt part of an operation: (worker spec, prompt ids, progress) -> events (`work`). None: here, in this
# process; jobs.workers shards the ids over worker processes.
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


def work(store: Store, spec: ops.Work, ids: list[str], progress: Progress = None) -> Iterator[dict]:
    """The per-prompt part of an operation over prompts `ids` (what each worker process runs on its shard):
    `ExtractWork` yields the backend bound and the items written; `ReplayWork` yields {"checkpoint": index,
    "result": metrics.Prompt} per checkpoint and prompt (packed as plain data between processes:
    `jobs.wire`); `StreamWork` yields the backend bound, then the results as `ReplayWork` does."""
    from .device_io import replay_work
    from .extract import extract_work
    from .stream import stream_work

    if isinstance(spec, ops.ExtractWork):
        return extract_work(store, spec, ids, progress)
    if isinstance(spec, ops.StreamWork):  # a ReplayWork on features computed in memory: first
        return stream_work(store, spec, ids, progress)
    if isinstance(spec, ops.ReplayWork):
        return replay_work(store, spec, ids, progress)
    raise ops.InputError(
        f"no per-prompt work for {type(spec).__name__}; expected ExtractWork, ReplayWork or StreamWork"
    )


def here(store: Store) -> Runner:
    """The runner that does the work in this process."""
    return lambda spec, ids, progress: work(store, spec, ids, progress)
