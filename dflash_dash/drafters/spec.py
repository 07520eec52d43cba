"""What a drafter family declares about itself: `FamilySpec`, and `Fields`, the reader its config fields go through.

Contract: torch-free. A family is one `FamilySpec` (names, `architectures`, `projector_type`, its own config fields
and their validation, the tensors it adds to DFlash's backbone, legacy tensor names, SpecForge training strategies,
target-layer default, draft alignment, and where its `Drafter` class and FLOP count live), registered in
`registry`. Everything the rest of the product asks about a family (`fields.family_of`, `config.parse_config`,
`weights.shapes`, `checkpoint.tensors`, `drafters.load`) reads the spec; nothing else names a family. The
model class is named as "module:attribute" so that declaring a family imports no torch (`resolve` imports it on
first load); a plug-in outside the package may give the class itself. `Fields` reads a field wherever configs
write it (`dflash_config`, SpecForge's `dspark_config`, the top level) and validates it with errors naming it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import CheckpointError

if TYPE_CHECKING:
    from .config import DrafterConfig


@dataclass(frozen=True)
class Fields:
    """A config.json's family fields, read wherever they are written, with the sizes validation needs."""

    raw: dict[str, Any]  # the config.json object
    dcfg: dict[str, Any]  # its dflash_config object ({} when absent)
    hidden_size: int = 0  # H
    vocab_size: int = 0  # V
    block_size: int = 0  # B
    heads: int = 0  # query heads
    kv_heads: int = 0  # key/value heads

    def _places(self) -> list[tuple[str, dict[str, Any]]]:
        """Where a family field may be written: dflash_config, SpecForge's newer dspark_config, the top level
        (engines and exporters write any of them)."""
        got = self.raw.get("dspark_config")
        dsp: dict[str, Any] = got if isinstance(got, dict) else {}
        return [("dflash_config.", self.dcfg), ("dspark_config.", dsp), ("", self.raw)]

    def get(self, key: str, default: Any = None) -> Any:
        """A field read wherever it is written; two places with different values is an error naming both."""
        found = [(where + key, d[key]) for where, d in self._places() if d.get(key) is not None]
        for name, v in found[1:]:
            if v != found[0][1]:
                raise CheckpointError(
                    f"config.json: {found[0][0]} = {found[0][1]!r} but {name} = {v!r}; they must agree"
                )
        return found[0][1] if found else default

    def present(self, key: str) -> bool:
        return any(d.get(key) is not None for _, d in self._places())

    def integer(self, key: str, lo: int, hi: int | None = None, default: Any = None) -> int:
        """Field `key` (or `default`), an integer in lo..hi; else an error naming it and the range."""
        v = self.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
            raise CheckpointError(f"config.json: dflash_config.{key} = {v!r}, expected an integer {rng}")
        return v

    def flag(self, key: str, default: Any = None) -> bool:
        """Field `key` (or `default`), true or false; else an error naming it."""
        v = self.get(key, default)
        if not isinstance(v, bool):
            raise CheckpointError(f"config.json: dflash_config.{key} = {v!r}, expected true or false")
        return v

    def positive(self, key: str, default: Any = None) -> float:
        """Field `key` (or `default`), a positive number; else an error naming it."""
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise CheckpointError(f"config.json: dflash_config.{key} = {v!r}, expected a positive number")
        return float(v)


def _none(_: dict[str, Any]) -> int:
    return 0


def _after_anchor(_: dict[str, Any]) -> int:
    return 1


def _block_minus_one(_: dict[str, Any], block_size: int) -> int:
    return block_size - 1


@dataclass(frozen=True)
class FamilySpec:
    """Everything the product knows about one drafter family. Only `key`, `name`, `architectures` and `model` are
    required: the defaults describe a plain DFlash (no own fields, no extra tensors, slot 1 drafts anchor + 1)."""

    key: str  # registry key, lower case: what configs, runs and the store record ("dspark")
    name: str  # shown to users ("DSpark")
    architectures: tuple[str, ...]  # config.json `architectures` values naming it (compared lower-cased)
    model: str | type  # its `Drafter` class, "module:Class" (imported on first load) or the class; built by
    # `dflash.load` as cls(config, Weights, path, sliding_block)
    flops: str | Callable[..., float] | None = None  # "module:function" (config, ctx_len, vocab) -> matmul FLOPs
    # of a block; None: DFlash's count (`drafters.flops_per_block`)
    projector: str | None = None  # dflash_config.projector_type naming it (wins over a DFlashDraftModel)
    own_fields: tuple[str, ...] = ()  # fields only it has: set on another family's config, an error naming both
    implied_by: tuple[str, ...] = ()  # fields that make a DFlashDraftModel config this family (SGLang's DFlash2)
    head: Callable[[Fields], dict[str, Any]] | None = None  # its fields validated into `DrafterConfig.head`; None: {}
    refuse: Callable[[Fields], None] | None = None  # raises CheckpointError for configs of it this tool refuses
    extra_shapes: Callable[[DrafterConfig], dict[str, tuple[int, ...]]] | None = None  # tensors it adds to
    # DFlash's backbone, state-dict name -> shape (no prefix)
    rename: Callable[[str], str] | None = None  # a state-dict key's current name (its legacy names); None: as is
    strategies: tuple[str, ...] = ()  # SpecForge training `strategy` values that train it (runtime checkpoints)
    target_layers: Callable[[int, int], list[int]] | None = None  # (target layers N, draft layers n) -> target
    # layer ids when the config names none; None: evenly spaced (`config.default_layer_ids`)
    first_slot: Callable[[dict[str, Any]], int] = _after_anchor  # head fields -> the block slot that drafts anchor + 1
    drafts: Callable[[dict[str, Any], int], int] = _block_minus_one  # (head fields, B) -> D, tokens drafted per block
    candidates: Callable[[dict[str, Any]], int] = _none  # head fields -> top-k a replay keeps per slot at least
    # (a selector's candidate count)

    def model_class(self) -> type:
        """The `Drafter` class (importing its module: torch)."""
        cls: type = resolve(self.model)
        return cls


def resolve(ref: Any) -> Any:
    """ "module:attribute" -> that attribute (the module imported now); anything else as it is."""
    if not isinstance(ref, str):
        return ref
    mod, _, attr = ref.partition(":")
    return getattr(importlib.import_module(mod), attr)


def renamer(prefixes: Mapping[str, str]) -> Callable[[str], str]:
    """A `FamilySpec.rename` mapping old state-dict prefixes to current ones."""

    def rename(key: str) -> str:
        for old, new in prefixes.items():
            if key.startswith(old):
                return new + key[len(old) :]
        return key

    return rename
