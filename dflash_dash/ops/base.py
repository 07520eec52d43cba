"""The base of every operation (`Op`: validation helpers, job records, devices) and the settings shared by
several operations. Data only, torch-free."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from typing import ClassVar

from ..fields import (  # noqa: F401  (re-exported: callers name them ops.X)
    DTYPES,
    InputError,
    check_device,
    check_dtype,
    check_name,
    check_ray,
    check_url,
    layer_blocks,
    missing_layers,
    parse_gpus,
    parse_layers,
    parse_paths,
)
from ..work import (  # noqa: F401  (re-exported: callers name them ops.X)
    ANCHORS,
    WORK,
    CheckpointSpec,
    ExtractWork,
    ReplayWork,
    StreamWork,
    Work,
    work_of,
)

ORCHESTRATE = ("none", "release", "command")  # how an extraction frees the server's GPU (jobs.free_gpu)
VERIFY = ("target-sample", "rejection")  # = sampling.RULES (tests/test_expected_pipeline.py checks), torch-free here
TARGET_TOPK = 64  # the target's top-K an extraction keeps by default (--target-topk)
SLIDING_BLOCKS = ("causal", "bidirectional")  # = drafter.SLIDING_BLOCKS (tests/test_gpus.py checks), torch-free here


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
            raise InputError(f"{cls.kind}: unknown argument {', '.join(unknown)}; expected some of {', '.join(names)}")
        for f in fields(cls):
            if f.default is MISSING and f.default_factory is MISSING and args.get(f.name) in (None, ""):
                raise InputError(
                    f"{cls.kind}: {f.name} is required; give it (--{f.name.replace('_', '-')} on the command line)"
                )
        return cls(**{k: v for k, v in args.items() if v is not None})

    # -- checks used by __post_init__
    def _need(self, name: str, what: str) -> None:
        v = getattr(self, name)
        if not isinstance(v, str) or not v.strip():
            raise InputError(f"{name} {v!r}: give {what}", name)

    def _name(self, name: str, what: str, optional: bool = False) -> None:
        setattr(self, name, check_name(getattr(self, name), name, what, optional))

    def _int(self, name: str, lo: int, fix: str) -> None:
        v = getattr(self, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise InputError(f"{name} {v!r}: {fix}")

    def _choice(self, name: str, choices: tuple, optional: bool = False) -> None:
        v = getattr(self, name)
        if not (optional and v is None) and v not in choices:
            raise InputError(f"{name} {v!r}: expected one of {', '.join(choices)}")

    def _device(self, name: str = "device", optional: bool = False) -> None:
        check_device(getattr(self, name), name, optional)

    def _gpus(self) -> None:
        """gpus: this host's devices; ray: auto or HOST:PORT, not with gpus; ray_gpus, ray_cpus (positive) need ray."""
        self.gpus = parse_gpus(self.gpus)
        for name in ("ray_gpus", "ray_cpus"):
            if getattr(self, name) is not None:
                if self.ray is None:
                    hint = "--ray auto (or --ray HOST:PORT; on the pages, the Ray cluster field)"
                    raise InputError(f"{name}: it sizes a Ray cluster's workers; add {hint}")
                self._int(name, 1, f"expected a positive number of workers, or leave {name} unset")
        if self.ray is not None:
            self.ray = check_ray(self.ray)
            if self.gpus:
                raise InputError("gpus: it names this host's devices; with --ray the cluster's GPUs are used (drop it)")

    def _replay_fields(self) -> None:
        """The fields Replay and Sweep share: extraction, tree budget, where and how the drafters run."""
        self._name("extraction", "an extraction id, or latest")
        self._int("tree_budget", 0, "expected 0 (no tree) or a positive DDTree node budget like 8")
        self._device()
        check_dtype(self.dtype)
        self._choice("anchors", ANCHORS)
        self._choice("sliding_block", SLIDING_BLOCKS, optional=True)
        if self.max_prompts is not None:
            self._int("max_prompts", 1, "expected a positive number of prompts, or leave it unset for all")
        self._gpus()
        self._stream()
        self._temperature()

    def _temperature(self) -> None:
        """temperature: None (no expected-acceptance pass) or >= 0 (0: the greedy limit); verify one of VERIFY."""
        t = self.temperature
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 100):
            raise InputError(f"temperature {t!r}: give a sampling temperature like 0.7 (0: greedy), or leave it unset")
        self.temperature = None if t is None else float(t)
        self._choice("verify", VERIFY)

    def _stream(self) -> None:
        """stream needs target and completions (here, on the gpus pool or with ray); target and completions need it."""
        if not isinstance(self.stream, bool):
            raise InputError(f"stream: expected true or false, got {self.stream!r}")
        if self.stream:
            self._need("target", "with --stream, the target model folder the features are computed with")
            self._name("completions", "with --stream, the completion set to evaluate")
        elif getattr(self, "features", None) and not self.completions:
            return  # replay --features: target names the cache's target
        elif self.target or self.completions:
            raise InputError(
                "target/completions: they name what --stream computes; add --stream, or drop them to replay an "
                "extraction (--extraction ID)"
            )

    def devices(self) -> list[str]:
        """Where the work runs: one worker per entry of `gpus`, else this process on `device` (ray: its workers')."""
        return list(getattr(self, "gpus", None) or [getattr(self, "device", None) or "cpu"])

    def local_devices(self) -> list[str]:
        """This host's devices the work uses, each once: none with `ray` (its workers' are its hosts')."""
        return [] if getattr(self, "ray", None) else list(dict.fromkeys(self.devices()))


def defaults(cls: type[Op]) -> dict:
    """{field: default} of an operation (for argparse)."""
    return {
        f.name: (f.default_factory() if f.default_factory is not MISSING else f.default)
        for f in fields(cls)
        if f.default is not MISSING or f.default_factory is not MISSING
    }
