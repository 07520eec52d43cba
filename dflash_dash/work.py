"""The settings of a kind of work and the worker specs: what a replay is run with, and the per-prompt part of an
operation as it crosses into a worker process (or a Ray worker).

Contract: `ReplaySettings` is the one declaration of how a replay runs (tree budget, anchors, dtype, chunk, sliding
semantics, draft config, prompts, temperature and verify rule): a frozen record, validated on construction, each field
declared with `setting(default, help)` (its help is the CLI's, `setting_help`). `ops.Replay` and `ops.Sweep` embed it
(`ops.embeds`: its fields are theirs, `op.settings` the record); the worker's `ReplayWork` carries it whole; a stored
run records it whole (`pipeline.runs`) and reuse compares it whole. A new replay option is one field here and its use.
`Placement` is the one declaration of where an operation's per-prompt work runs (device, gpus, a Ray cluster and its
size): Extract, Replay and Sweep embed it (`op.placement`), and jobs.workers / jobs.cluster read it from there.
Worker specs (`CheckpointSpec`, `ExtractWork`, `ReplayWork`, `StreamWork`) are frozen records validated on
construction through the field checks of `fields`, with a plain-JSON round trip (`to_json()` / `work_of(kind,
data)`): the only format that crosses a process (jobs.wire); a spec's settings are rebuilt through `SETTINGS` (its
class by kind). Data only, torch-free. `ops` re-exports them (callers name them ops.X).
"""

from __future__ import annotations

from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from .fields import DTYPES, InputError, check_device, check_dtype, check_ray, parse_gpus

ANCHORS = ("every", "chain")  # every completion anchor (curves of accepted(p)) | only those walks visit
VERIFY = ("target-sample", "rejection")  # = sampling.RULES (tests/test_expected_pipeline.py checks), torch-free here
SLIDING_BLOCKS = ("causal", "bidirectional")  # = drafter.SLIDING_BLOCKS (tests/test_gpus.py checks), torch-free here


def setting(default: Any = MISSING, help: str = "", **meta: Any) -> Any:
    """A dataclass field with its default and its help text (the CLI's help, `setting_help`); `meta`: more metadata
    (choices: the values it takes; repeat: a list given once per value on the command line). A list default is
    copied per instance."""
    md = {"help": help} | meta
    if isinstance(default, list):
        given: list[Any] = default

        def copy() -> list[Any]:
            return list(given)

        return field(default_factory=copy, metadata=md)
    return field(default=default, metadata=md)


def setting_help(f: Field[Any]) -> str:
    """The help text a field was declared with (`setting`), "" without one."""
    return str(f.metadata.get("help", ""))


S = TypeVar("S", bound="Settings")
W = TypeVar("W", bound="Work")


@dataclass(frozen=True)
class Settings:
    """Base of the settings records: frozen, plain-JSON round trip; an unknown field is refused by name."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls: type[S], data: dict[str, Any] | None) -> S:
        data = dict(data or {})
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise InputError(f"settings: unknown field {', '.join(unknown)}; expected some of {', '.join(names)}")
        return cls(**data)


@dataclass(frozen=True)
class ReplaySettings(Settings):
    """How a replay runs: everything its results depend on besides the checkpoint, the features and the device."""

    tree_budget: int = setting(8, "DDTree node budget (0: no tree)")
    anchors: str = setting(
        "every", "every (accepted(p) curves, every-anchor tau) | chain (faster, same rounds)", choices=ANCHORS
    )
    dtype: str = setting("float32", "compute dtype of the drafters", choices=DTYPES)
    chunk: int = setting(64, "blocks per batched forward (every-anchor mode)")
    sliding_block: str | None = setting(
        None,
        "sliding layers causal | bidirectional inside the block; None: config's",
        choices=SLIDING_BLOCKS,
    )
    draft_config: str | None = setting(
        None, "the training's draft config JSON (runtime checkpoints without config.json)"
    )
    max_prompts: int | None = setting(None, "replay only the first N prompts of the extraction (set order); None: all")
    temperature: float | None = setting(
        None,
        "also the expected acceptance at this sampling temperature (teacher-forced; needs an extraction with the "
        "target's top-K, or stream); None: none",
    )
    verify: str = setting(
        "target-sample",
        "with temperature: target-sample (greedy drafts, accepted while the target's sample equals them: SGLang's "
        "DFlash) | rejection (sampled drafts, min(1, p/q): Leviathan et al.)",
        choices=VERIFY,
    )

    def __post_init__(self) -> None:
        b = self.tree_budget
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise InputError(f"tree_budget {b!r}: expected 0 (no tree) or a positive DDTree node budget like 8")
        c = self.chunk
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise InputError(f"chunk {c!r}: expected a positive number of blocks per forward, like 64")
        check_dtype(self.dtype)
        for name, choices, optional in (
            ("anchors", ANCHORS, False),
            ("sliding_block", SLIDING_BLOCKS, True),
            ("verify", VERIFY, False),
        ):
            v = getattr(self, name)
            if not (optional and v is None) and v not in choices:
                raise InputError(f"{name} {v!r}: expected one of {', '.join(choices)}")
        m = self.max_prompts
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise InputError(f"max_prompts {m!r}: expected a positive number of prompts, or leave it unset for all")
        t = self.temperature
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 100):
            raise InputError(f"temperature {t!r}: give a sampling temperature like 0.7 (0: greedy), or leave it unset")
        object.__setattr__(self, "temperature", None if t is None else float(t))


@dataclass(frozen=True)
class Placement(Settings):
    """Where an operation's per-prompt work runs: this process on `device`, one worker process per entry of `gpus`,
    or one worker per GPU (or `ray_cpus` CPU slots) of a Ray cluster (`ray`)."""

    device: str = setting("cpu", "cpu or cuda[:N] (one process; see gpus)")
    gpus: list[str] = setting(
        [],
        "one worker process per device, the prompts sharded over them: GPU indices like 0,1 (or "
        "cuda:N,...; cpu,cpu for CPU workers); none: one process on device",
    )
    ray: str | None = setting(
        None, "run on a Ray cluster (auto: this host's or RAY_ADDRESS; or HOST:PORT), a worker per GPU"
    )
    ray_gpus: int | None = setting(
        None, "with ray: the GPUs the cluster must have (checked before any work); None: all it has"
    )
    ray_cpus: int | None = setting(
        None, "with ray on a cluster without GPUs: the CPU workers to run (one CPU slot each)"
    )

    def __post_init__(self) -> None:
        """device: cpu or cuda[:N]; gpus: this host's devices; ray: auto or HOST:PORT, not with gpus; ray_gpus and
        ray_cpus (positive) need ray."""
        check_device(self.device)
        object.__setattr__(self, "gpus", parse_gpus(self.gpus))
        for name in ("ray_gpus", "ray_cpus"):
            v = getattr(self, name)
            if v is None:
                continue
            if self.ray is None:
                hint = "--ray auto (or --ray HOST:PORT; on the pages, the Ray cluster field)"
                raise InputError(f"{name}: it sizes a Ray cluster's workers; add {hint}")
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"{name} {v!r}: expected a positive number of workers, or leave {name} unset")
        if self.ray is not None:
            object.__setattr__(self, "ray", check_ray(self.ray))
            if self.gpus:
                raise InputError("gpus: it names this host's devices; with --ray the cluster's GPUs are used (drop it)")

    def devices(self) -> list[str]:
        """Where the work runs: one worker per entry of `gpus`, else this process on `device` (ray: its workers')."""
        return list(self.gpus or [self.device])

    def local_devices(self) -> list[str]:
        """This host's devices the work uses, each once: none with `ray` (its workers' are its hosts')."""
        return [] if self.ray else list(dict.fromkeys(self.devices()))


SETTINGS: dict[str, type[Settings]] = {"replay": ReplaySettings}  # the settings record of each kind of work


@dataclass(frozen=True)
class Work:
    """Base of the worker specs: a frozen record with a plain-JSON round trip (`to_json`, `from_json`)."""

    kind: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls: type[W], data: dict[str, Any]) -> W:
        return cls(**data)


@dataclass(frozen=True)
class CheckpointSpec(Work):
    """One checkpoint of a replay: where it is (how it is read: the replay's settings)."""

    path: str  # folder (or training_state.pt) as the user gave it
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        check_device(self.device)
        check_dtype(self.dtype)


@dataclass(frozen=True)
class ReplayWork(Work):
    """Replay some prompts of extraction `extraction` with every checkpoint of `checkpoints` on `device`, as
    `settings` say (the operation's `ReplaySettings`, whole)."""

    kind: ClassVar[str] = "replay"
    checkpoints: tuple[CheckpointSpec, ...]  # replayed in this order over each pass of features
    extraction: str  # extraction id
    device: str  # where this worker runs
    settings: ReplaySettings = field(default_factory=ReplaySettings)  # how the replay runs

    def __post_init__(self) -> None:
        specs = tuple(c if isinstance(c, CheckpointSpec) else CheckpointSpec.from_json(c) for c in self.checkpoints)
        object.__setattr__(self, "checkpoints", specs)
        if not isinstance(self.settings, Settings):  # from JSON: rebuilt as the kind's registered record
            object.__setattr__(self, "settings", SETTINGS["replay"].from_json(self.settings))
        check_device(self.device)


@dataclass(frozen=True)
class StreamWork(ReplayWork):
    """ReplayWork on features the target computes in memory (--stream; no file): `extraction` the streamed row's."""

    kind: ClassVar[str] = "stream"
    target: str = ""  # the target's folder (resolved)
    completions: str = ""  # completion set name
    layers: tuple[int, ...] = ()  # target layer ids computed (the checkpoints' union, or their one list)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        super().__post_init__()


WORK: dict[str, type[Work]] = {c.kind: c for c in (ExtractWork, ReplayWork, StreamWork)}


def work_of(kind: str, data: dict[str, Any]) -> Work:
    """The worker spec of kind `kind` from its `to_json` data."""
    cls = WORK.get(kind)
    if cls is None:
        raise InputError(f"no per-prompt work for {kind!r}; expected one of {', '.join(WORK)}")
    return cls.from_json(data)
