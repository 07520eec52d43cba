"""The arguments of the operations users run, one typed dataclass per operation: the one place their defaults live.

Contract:
- One class per operation (`Fetch`, `Extract`, `Replay`, `Sweep`, `SlidingCheck`, `Attribute`, `Demo`); `kind`
  is its job kind. Each field carries its default and a comment; `__post_init__` validates (and normalises:
  "1,16,31" layers, "0,1" GPUs) and raises `ArgError`, a UserError naming the field and the fix.
- `to_args()` is the plain-JSON dict a job records; `from_args(args)` rebuilds the operation from a record:
  a missing (or None) field takes its default, so job records written before a field existed stay readable;
  an unknown field is refused by name. `of(kind, args)` does it for any kind.
- The CLI takes its argparse defaults from these fields (`defaults`), the pages build these classes for
  `jobs.start`, jobs records and rebuilds them, and pipeline's signatures take their defaults from them.
Data only, torch-free (store-only commands stay light): nothing here loads a model or touches the store; it
sits under pipeline, which imports it.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import ClassVar

from .errors import UserError

DTYPES = ("float32", "bfloat16")  # compute dtypes an operation can run in
ANCHORS = ("every", "chain")  # every completion anchor (curves of accepted(p)) | only those walks visit
ORCHESTRATE = ("none", "release", "command")  # how an extraction frees the server's GPU (jobs.free_gpu)
SLIDING_BLOCKS = ("causal", "bidirectional")  # = drafter.SLIDING_BLOCKS (tests/test_gpus.py checks), torch-free here
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


class ArgError(UserError, ValueError):
    """An operation's argument is invalid; the message names the field and the fix."""


def parse_gpus(value) -> list[str]:
    """Worker devices from "0,1" (CUDA indices), "cuda:0,cuda:1", "cpu,cpu" or a list of those; [] for none."""
    if value in (None, ""):
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for x in items:
        x = str(x).strip()
        dev = f"cuda:{x}" if x.isdigit() else x
        if not _DEVICE.fullmatch(dev):
            raise ArgError(
                f"gpus {value!r}: {x!r} is not a device; give CUDA indices like 0,1 (one worker per GPU), "
                "cuda:N entries, or cpu,cpu for CPU workers"
            )
        out.append(dev)
    return out


@dataclass
class Op:
    """Base of the operations: record round trip and the shared checks."""

    kind: ClassVar[str] = ""

    def to_args(self) -> dict:
        return asdict(self)

    @classmethod
    def from_args(cls, args: dict | None) -> Op:
        args = dict(args or {})
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(args) - set(names))
        if unknown:
            raise ArgError(f"{cls.kind}: unknown argument {', '.join(unknown)}; expected some of {', '.join(names)}")
        for f in fields(cls):
            if f.default is MISSING and f.default_factory is MISSING and args.get(f.name) in (None, ""):
                raise ArgError(
                    f"{cls.kind}: {f.name} is required; give it (--{f.name.replace('_', '-')} on the command line)"
                )
        return cls(**{k: v for k, v in args.items() if v is not None})

    # -- checks used by __post_init__
    def _need(self, name: str, what: str) -> None:
        v = getattr(self, name)
        if not isinstance(v, str) or not v.strip():
            raise ArgError(f"{name} {v!r}: give {what}")

    def _int(self, name: str, lo: int, fix: str) -> None:
        v = getattr(self, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ArgError(f"{name} {v!r}: {fix}")

    def _choice(self, name: str, choices: tuple, optional: bool = False) -> None:
        v = getattr(self, name)
        if not (optional and v is None) and v not in choices:
            raise ArgError(f"{name} {v!r}: expected one of {', '.join(choices)}")

    def _device(self, name: str = "device", optional: bool = False) -> None:
        v = getattr(self, name)
        if not (optional and v is None) and not (isinstance(v, str) and _DEVICE.fullmatch(v)):
            raise ArgError(f"{name} {v!r}: expected cpu, cuda or cuda:N")

    def _gpus(self) -> None:
        self.gpus = parse_gpus(self.gpus)

    def _replay_fields(self) -> None:
        """The fields Replay and Sweep share: extraction, tree budget, where and how the drafters run."""
        self._need("extraction", "an extraction id, or latest")
        self._int("tree_budget", 0, "expected 0 (no tree) or a positive DDTree node budget like 8")
        self._device()
        self._choice("dtype", DTYPES)
        self._choice("anchors", ANCHORS)
        self._choice("sliding_block", SLIDING_BLOCKS, optional=True)
        self._gpus()

    def devices(self) -> list[str]:
        """Where the work runs: one worker per entry of `gpus`, else this process on `device`."""
        return list(getattr(self, "gpus", None) or [getattr(self, "device", None) or "cpu"])


def defaults(cls: type[Op]) -> dict:
    """{field: default} of an operation (for argparse)."""
    return {
        f.name: (f.default_factory() if f.default_factory is not MISSING else f.default)
        for f in fields(cls)
        if f.default is not MISSING or f.default_factory is not MISSING
    }


@dataclass
class Fetch(Op):
    kind: ClassVar[str] = "fetch"
    prompt_set: str  # built-in set name (coding-10) or a JSONL file of {id, prompt}
    name: str  # completion set to fill; a rerun with it continues
    server: str | None = None  # server URL; None: [server] url of the workspace's config.toml
    max_new_tokens: int = 256  # greedy tokens per completion
    chat: bool = False  # wrap prompts in the target's chat template (applied locally)
    tokenizer: str | None = None  # tokenizer folder or hub id; None: the server's tokenizer_path
    enable_thinking: bool = False  # leave Qwen3 thinking on (off by default: it lowers acceptance)
    readiness_timeout: float | None = None  # seconds to wait for /health 200; None: the config's (600)

    def __post_init__(self):
        self._need("prompt_set", "a built-in prompt set (coding-10) or a JSONL file of {id, prompt}")
        self._need("name", "a completion set name")
        self._int("max_new_tokens", 1, "must be at least 1")
        if self.readiness_timeout is not None and not (
            isinstance(self.readiness_timeout, (int, float)) and self.readiness_timeout > 0
        ):
            raise ArgError(f"readiness_timeout {self.readiness_timeout!r}: give seconds > 0 (or leave it unset: 600)")
        self.chat, self.enable_thinking = bool(self.chat), bool(self.enable_thinking)
        self.server = self.server or None


@dataclass
class Extract(Op):
    kind: ClassVar[str] = "extract"
    target: str  # Hugging Face causal LM folder
    completions: str  # completion set name
    drafter: str | None = None  # checkpoint whose target_layer_ids are extracted (or give layers)
    layers: list[int] | None = None  # explicit target layer ids ("1,16,31" is accepted), instead of drafter
    device: str = "cpu"  # cpu or cuda[:N] (one process; see gpus)
    dtype: str = "float32"  # compute dtype of the target's forward
    orchestrate: str = "none"  # free the server's GPU around the extraction: none | release | command
    extraction_id: str | None = None  # resume this extraction (a rerun sets it) instead of starting one
    server: str | None = None  # server to free; None: the workspace's config.toml
    gpus: list[str] = field(default_factory=list)  # one worker process per device, prompts sharded; []: device

    def __post_init__(self):
        self._need("target", "the target model folder (a Hugging Face causal LM)")
        self._need("completions", "the completion set name")
        if isinstance(self.layers, str):
            try:
                self.layers = [int(x) for x in self.layers.split(",") if x.strip()] or None
            except ValueError:
                raise ArgError(f"layers {self.layers!r}: expected comma-separated integers like 1,16,31") from None
        if self.layers is not None and not all(isinstance(x, int) and not isinstance(x, bool) for x in self.layers):
            raise ArgError(f"layers {self.layers!r}: expected a list of integer layer ids like [1, 16, 31]")
        if not self.layers and not self.drafter:
            raise ArgError(
                "layers: give a drafter checkpoint (its target_layer_ids are used) or layer ids like 1,16,31"
            )
        self._device()
        self._choice("dtype", DTYPES)
        self._choice("orchestrate", ORCHESTRATE)
        self._gpus()


@dataclass
class Replay(Op):
    kind: ClassVar[str] = "replay"
    drafter: str  # checkpoint: HF folder or SpecForge runtime {run_id}-step{N}/ folder
    extraction: str = "latest"  # extraction id, or latest
    tree_budget: int = 8  # DDTree node budget (0: no tree)
    device: str = "cpu"  # cpu or cuda[:N] (one process; see gpus)
    dtype: str = "float32"  # compute dtype of the drafter
    chunk: int = 64  # blocks per batched forward (every-anchor mode)
    name: str | None = None  # display name; None: the checkpoint folder's name
    anchors: str = "every"  # every (accepted(p) curves, every-anchor tau) | chain (faster, same rounds)
    sliding_block: str | None = None  # sliding layers causal | bidirectional inside the block; None: config's
    draft_config: str | None = None  # the training's draft config JSON (runtime checkpoints without config.json)
    gpus: list[str] = field(default_factory=list)  # one worker process per device, prompts sharded; []: device

    def __post_init__(self):
        self._need("drafter", "the checkpoint folder to replay")
        self._int("chunk", 1, "expected a positive number of blocks per forward, like 64")
        self._replay_fields()


@dataclass
class Sweep(Op):
    kind: ClassVar[str] = "sweep"
    checkpoints: str  # training output folder (epoch_E_step_S/, {run_id}-step{N}/, ...)
    extraction: str = "latest"  # extraction id, or latest
    anchors: str = "chain"  # chain (only the anchors the walks visit) | every
    tree_budget: int = 8  # DDTree node budget (0: no tree)
    device: str = "cpu"  # cpu or cuda[:N] (one process; see gpus)
    dtype: str = "float32"  # compute dtype of the drafters
    sliding_block: str | None = None  # sliding layers causal | bidirectional inside the block; None: config's
    draft_config: str | None = None  # the training's draft config JSON (runtime checkpoints without config.json)
    gpus: list[str] = field(default_factory=list)  # one worker process per device, prompts sharded; []: device

    def __post_init__(self):
        self._need("checkpoints", "the training output folder")
        self._replay_fields()


@dataclass
class SlidingCheck(Op):
    kind: ClassVar[str] = "sliding-check"
    drafter: str  # checkpoint with sliding_attention layers
    extraction: str = "latest"  # extraction id, or latest
    draft_config: str | None = None  # the training's draft config JSON (runtime checkpoints without config.json)
    device: str = "cpu"  # cpu or cuda[:N]
    dtype: str = "float32"  # compute dtype of the drafter

    def __post_init__(self):
        self._need("drafter", "the checkpoint folder to check")
        self._need("extraction", "an extraction id, or latest")
        self._device()
        self._choice("dtype", DTYPES)


@dataclass
class Attribute(Op):
    kind: ClassVar[str] = "attribute"
    run: str = "latest"  # run id, or latest
    device: str | None = None  # None: the run's own device
    dtype: str | None = None  # None: the run's own dtype

    def __post_init__(self):
        self._need("run", "a run id, or latest")
        self._device(optional=True)
        self._choice("dtype", DTYPES, optional=True)


@dataclass
class Demo(Op):
    kind: ClassVar[str] = "demo"  # builds the demo workspace from the committed assets (no arguments)


KINDS: dict[str, type[Op]] = {c.kind: c for c in (Fetch, Extract, Replay, Sweep, SlidingCheck, Attribute, Demo)}


def of(kind: str, args: dict | None) -> Op:
    """The operation of a job record (kind + args)."""
    cls = KINDS.get(kind)
    if cls is None:
        raise ArgError(f"unknown job kind {kind!r}; expected one of {', '.join(KINDS)}")
    return cls.from_args(args)
