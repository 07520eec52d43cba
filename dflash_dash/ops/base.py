"""The base of every operation (`Op`: validation helpers, job records, devices) and the settings records several
operations embed (`embeds`). Data only, torch-free."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

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
    Placement,
    ReplaySettings,
    ReplayWork,
    Settings,
    StreamWork,
    Work,
    setting,
    setting_help,
    work_of,
)

__all__ = [
    "ANCHORS",
    "DTYPES",
    "ORCHESTRATE",
    "SETTINGS",
    "SLIDING_BLOCKS",
    "TARGET_TOPK",
    "VERIFY",
    "WORK",
    "CheckpointSpec",
    "ExtractWork",
    "InputError",
    "Op",
    "Placement",
    "ReplaySettings",
    "ReplayWork",
    "Settings",
    "StreamWork",
    "Work",
    "check_device",
    "check_dtype",
    "check_name",
    "check_ray",
    "check_url",
    "choices",
    "defaults",
    "embeds",
    "layer_blocks",
    "missing_layers",
    "parse_gpus",
    "parse_layers",
    "parse_paths",
    "setting",
    "setting_help",
    "work_of",
]

ORCHESTRATE = ("none", "release", "command")  # how an extraction frees the server's GPU (jobs.free_gpu)
TARGET_TOPK = 64  # the target's top-K an extraction keeps by default (--target-topk)


O = TypeVar("O", bound="Op")


def embeds(settings: type[Settings], name: str = "settings", **defaults: Any) -> Callable[[type[O]], type[O]]:
    """Class decorator (under @dataclass): operation `cls` embeds the settings record `settings` as `op.<name>`:
    each of the record's fields becomes a field of the operation (declared there once, its help and choices with
    it; `defaults` overrides a default, as Sweep's chain anchors), and `op.<name>` is the record built (and
    validated) from them. An operation may embed several records (Replay: `settings` and `placement`)."""

    def wrap(cls: type[O]) -> type[O]:
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
        cls.EMBEDS = {**cls.EMBEDS, name: settings}
        if not isinstance(getattr(cls, name, None), property):  # `placement` is Op's own (typed) property
            setattr(cls, name, property(lambda op: op.embedded(name), doc=f"The embedded {settings.__name__}."))
        return cls

    return wrap


@dataclass
class Op:
    """Base of the operations: record round trip and the shared checks."""

    kind: ClassVar[str] = ""
    # the settings records it embeds (`embeds`), by the property that returns each: {"settings": ReplaySettings}
    EMBEDS: ClassVar[dict[str, type[Settings]]] = {}

    def embedded(self, name: str) -> Settings:
        """The settings record embedded as `name`, built (and validated) from the op's fields."""
        cls = self.EMBEDS[name]
        return cls(**{f.name: getattr(self, f.name) for f in fields(cls)})

    @property
    def placement(self) -> Placement | None:
        """Where the work runs (the embedded `Placement`: device, gpus, Ray cluster); None for an op without one."""
        if "placement" not in self.EMBEDS:
            return None
        p = self.embedded("placement")
        assert isinstance(p, Placement)
        return p

    def _settle(self) -> None:
        """Validate the embedded records; their normalised values (temperature as a float, gpus as devices) become
        the op's."""
        for name in self.EMBEDS:
            s = self.embedded(name)
            for f in fields(s):
                setattr(self, f.name, getattr(s, f.name))

    def to_args(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_args(cls: type[O], args: dict[str, Any] | None) -> O:
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

    def _choice(self, name: str, choices: tuple[str, ...], optional: bool = False) -> None:
        v = getattr(self, name)
        if not (optional and v is None) and v not in choices:
            raise InputError(f"{name} {v!r}: expected one of {', '.join(choices)}")

    def _device(self, name: str = "device", optional: bool = False) -> None:
        check_device(getattr(self, name), name, optional)

    def devices(self) -> list[str]:
        """Where the work runs: its placement's devices (`Placement.devices`), else this process on `device`."""
        p = self.placement
        return p.devices() if p else [getattr(self, "device", None) or "cpu"]

    def local_devices(self) -> list[str]:
        """This host's devices the work uses, each once: none with `ray` (its workers' are its hosts')."""
        p = self.placement
        return p.local_devices() if p else list(dict.fromkeys(self.devices()))


def choices(f: Field[Any]) -> tuple[str, ...] | None:
    """The values field `f` takes (its metadata's `choices`), None for a free value."""
    c = f.metadata.get("choices")
    return tuple(c) if c else None


def defaults(cls: type[Op]) -> dict[str, Any]:
    """{field: default} of an operation (for argparse)."""
    return {
        f.name: (f.default_factory() if f.default_factory is not MISSING else f.default)
        for f in fields(cls)
        if f.default is not MISSING or f.default_factory is not MISSING
    }
