"""The base of every operation (`Op`: validation helpers, job records, devices) and the settings shared by
several operations. Data only, torch-free."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
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
    SETTINGS,
    SLIDING_BLOCKS,
    VERIFY,
    WORK,
    CheckpointSpec,
    ExtractWork,
    ReplaySettings,
    ReplayWork,
    Settings,
    StreamWork,
    Work,
    setting,
    setting_help,
    work_of,
)

ORCHESTRATE = ("none", "release", "command")  # how an extraction frees the server's GPU (jobs.free_gpu)
TARGET_TOPK = 64  # the target's top-K an extraction keeps by default (--target-topk)


def embeds(settings: type[Settings], **defaults):
    """Class decorator (under @dataclass): operation `cls` embeds the settings record `settings`: each of its fields
    becomes a field of the operation (declared there once, its help and choices with it; `defaults` overrides a
    default, as Sweep's chain anchors), and `op.settings` is the record built from them."""

    def wrap(cls):
        ann = dict(cls.__dict__.get("__annotations__", {}))
        for f in fields(settings):
            if f.name in ann:
                raise TypeError(f"{cls.__name__}.{f.name}: declared by {settings.__name__}; do not repeat it")
            ann[f.name] = f.type
            default = defaults.get(f.name, f.default)
            if default is MISSING and f.default_factory is not MISSING:
                setattr(cls, f.name, field(default_factory=f.default_factory, metadata=f.metadata))
            else:
                setattr(cls, f.name, field(default=default, metadata=f.metadata))
        cls.__annotations__ = ann
        cls.SETTINGS = settings
        cls.settings = property(_settings, doc="The embedded settings record, built (and validated) from the fields.")
        return cls

    return wrap


def _settings(op) -> Settings:
    """The settings record `op` embeds, from its fields."""
    return op.SETTINGS(**{f.name: getattr(op, f.name) for f in fields(op.SETTINGS)})


@dataclass
class Op:
    """Base of the operations: record round trip and the shared checks."""

    kind: ClassVar[str] = ""
    SETTINGS: ClassVar[type[Settings] | None] = None  # the settings record it embeds (`embeds`), if any

    def _settle(self) -> None:
        """Validate the embedded settings; their normalised values (temperature as a float) become the op's."""
        s = _settings(self)
        for f in fields(s):
            setattr(self, f.name, getattr(s, f.name))

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
        """The fields Replay and Sweep share beside their settings: extraction, where the drafters run, the stream."""
        self._settle()
        self._name("extraction", "an extraction id, or latest")
        self._device()
        self._gpus()
        self._stream()

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
