"""The worker specs: the per-prompt part of an operation, as it crosses into a worker process (or a Ray worker).

Contract: frozen records (`CheckpointSpec`, `ExtractWork`, `ReplayWork`, `StreamWork`), each validated on
construction through the field checks of `fields`, with a plain-JSON round trip (`to_json()` / `work_of(kind,
data)`): the only format that crosses a process (jobs.wire). Data only, torch-free. `ops` re-exports them (callers
name them ops.X); the operations they come from live there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from .fields import InputError, check_device, check_dtype

ANCHORS = ("every", "chain")  # every completion anchor (curves of accepted(p)) | only those walks visit


@dataclass(frozen=True)
class Work:
    """Base of the worker specs: a frozen record with a plain-JSON round trip (`to_json`, `from_json`)."""

    kind: ClassVar[str] = ""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Work:
        return cls(**data)


@dataclass(frozen=True)
class CheckpointSpec(Work):
    """One checkpoint of a replay: where it is and how it is read."""

    path: str  # folder (or training_state.pt) as the user gave it
    sliding_block: str | None = None  # the run's choice, None: the config's own
    draft_config: str | None = None  # the training's draft config JSON (SpecForge runtime checkpoints)
    name: str | None = None  # display name (default: the folder name)


@dataclass(frozen=True)
class ExtractWork(Work):
    """Extract the features of some prompts of `completions` into extraction `extraction` on `device`."""

    kind: ClassVar[str] = "extract"
    target: str  # the target's folder (resolved)
    completions: str  # completion set name
    layers: tuple[int, ...]  # target layer ids
    device: str  # where this worker runs
    dtype: str  # compute dtype of the target's forward
    extraction: str  # extraction id the feature files belong to
    target_topk: int = 0  # the target's top-K kept per completion position (0: none)

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(self.layers))
        check_device(self.device)
        check_dtype(self.dtype)


@dataclass(frozen=True)
class ReplayWork(Work):
    """Replay some prompts of extraction `extraction` with every checkpoint of `checkpoints` on `device`."""

    kind: ClassVar[str] = "replay"
    checkpoints: tuple[CheckpointSpec, ...]  # replayed in this order over each pass of features
    extraction: str  # extraction id
    tree_budget: int  # DDTree node budget (0: no tree)
    device: str  # where this worker runs
    dtype: str  # compute dtype of the drafters
    chunk: int  # blocks per batched forward (every-anchor mode)
    anchors: str  # every | chain
    temperature: float | None = None  # the expected-acceptance pass's temperature (None: none)
    verify: str = "target-sample"  # its verify rule (sampling.RULES)

    def __post_init__(self):
        specs = tuple(c if isinstance(c, CheckpointSpec) else CheckpointSpec.from_json(c) for c in self.checkpoints)
        object.__setattr__(self, "checkpoints", specs)
        check_device(self.device)
        check_dtype(self.dtype)
        if self.anchors not in ANCHORS:
            raise InputError(f"anchors {self.anchors!r}: expected one of {', '.join(ANCHORS)}")


@dataclass(frozen=True)
class StreamWork(ReplayWork):
    """ReplayWork on features the target computes in memory (--stream; no file): `extraction` the streamed row's."""

    kind: ClassVar[str] = "stream"
    target: str = ""  # the target's folder (resolved)
    completions: str = ""  # completion set name
    layers: tuple[int, ...] = ()  # target layer ids computed (the checkpoints' union, or their one list)

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(self.layers))
        super().__post_init__()


WORK: dict[str, type[Work]] = {c.kind: c for c in (ExtractWork, ReplayWork, StreamWork)}


def work_of(kind: str, data: dict) -> Work:
    """The worker spec of kind `kind` from its `to_json` data."""
    cls = WORK.get(kind)
    if cls is None:
        raise InputError(f"no per-prompt work for {kind!r}; expected one of {', '.join(WORK)}")
    return cls.from_json(data)
