"""The worker side of the pipeline: the per-prompt part of an operation, run on a list of prompt ids.

Contract: `work(store, spec, ids, progress)` runs a worker spec (`ops.ExtractWork`, `ops.ReplayWork`,
`ops.StreamWork`) over prompts `ids` and yields its events (what each worker process of jobs.workers or a Ray
worker of jobs.cluster runs on its shard); `here(store)` is the runner that does it in this process. It sits above
the handlers' worker halves (`extract.extract_work`, `device_io.replay_work`, `stream.stream_work`) and below
nothing of the pipeline: the handlers receive a runner (`pipeline.perform`), never import this module.
"""

from __future__ import annotations

from collections.abc import Iterator

from .. import ops
from ..store import Store
from .base import Progress, Runner
from .device_io import replay_work
from .extract import extract_work
from .stream import stream_work


def work(store: Store, spec: ops.Work, ids: list[str], progress: Progress = None) -> Iterator[dict]:
    """The per-prompt part of an operation over prompts `ids` (what each worker process runs on its shard):
    `ExtractWork` yields the backend bound and the items written; `ReplayWork` yields {"checkpoint": index,
    "result": metrics.Prompt} per checkpoint and prompt (packed as plain data between processes:
    `jobs.wire`); `StreamWork` yields the backend bound, then the results as `ReplayWork` does."""
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
