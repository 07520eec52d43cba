"""The drafter family registry: one `FamilySpec` per family, found by key or by config.json architecture.

Contract: torch-free. `register(spec)` adds a family (a key or architecture another family holds is refused with
ValueError naming both); `unregister(key)` takes it out; `spec_of(key)` returns it, or raises `CheckpointError`
(a UserError) naming the family, the registered ones and the fix; `specs()` lists them in registration order;
`by_architecture(arch)` finds the family a config.json `architectures` entry names. The built-in families are the
modules of `drafters/families/`, each declaring its `SPEC`: they are imported and registered on the first question
asked of the registry (a new module there is found without a list to edit), the four published families first.
The family modules import nothing of the registry, so the package has no import circle.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading

from .errors import CheckpointError
from .spec import FamilySpec

BASE = "dflash"  # the family a DFlashDraftModel config is unless its projector type or fields name another
BUILT_IN = ("dflash", "dspark", "domino", "dflash2")  # listed first, in this order (messages, choices)
RECIPE = "docs/families.md, Adding a family"  # where the fix for a missing family is written

_SPECS: dict[str, FamilySpec] = {}
_loaded = False  # the built-ins are registered (set once all are: a thread never sees part of them)
_lock = threading.Lock()  # the server's and the app's threads may ask the first question at once


def _load_built_in() -> None:
    """Import every module of `drafters/families/` once and register its `SPEC`."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        from . import families

        found = [m.name for m in pkgutil.iter_modules(families.__path__)]
        for name in [n for n in BUILT_IN if n in found] + sorted(n for n in found if n not in BUILT_IN):
            _add(importlib.import_module(f"{families.__name__}.{name}").SPEC)
        _loaded = True


def register(spec: FamilySpec) -> FamilySpec:
    """Add `spec` to the registry (again: no change); returns it."""
    _load_built_in()
    with _lock:
        return _add(spec)


def _add(spec: FamilySpec) -> FamilySpec:
    if _SPECS.get(spec.key) is spec:
        return spec
    if spec.key != spec.key.lower() or not spec.key.isidentifier():
        raise ValueError(f"family key {spec.key!r}: expected a lower-case identifier like 'dspark'")
    if spec.key in _SPECS:
        raise ValueError(f"family '{spec.key}' is registered already ({_SPECS[spec.key].name}); unregister it first")
    for other in _SPECS.values():
        clash = {a.lower() for a in spec.architectures} & {a.lower() for a in other.architectures}
        if clash or (spec.projector and spec.projector == other.projector):
            what = f"architecture {sorted(clash)[0]}" if clash else f"projector_type {spec.projector!r}"
            raise ValueError(f"family '{spec.key}': {what} already names family '{other.key}'")
    _SPECS[spec.key] = spec
    return spec


def unregister(key: str) -> FamilySpec:
    """Take family `key` out of the registry; returns its spec."""
    spec = spec_of(key)
    with _lock:
        _SPECS.pop(key, None)
    return spec


def spec_of(key: str) -> FamilySpec:
    """The spec of family `key`; CheckpointError naming it and the fix when no family of that key is registered."""
    _load_built_in()
    if key not in _SPECS:
        raise CheckpointError(
            f"drafter family '{key}' is not registered (registered: {', '.join(_SPECS)}); add its FamilySpec "
            f"module under dflash_dash/drafters/families/ or call drafters.register(spec) ({RECIPE})"
        )
    return _SPECS[key]


def specs() -> list[FamilySpec]:
    """Every registered family, built-ins first."""
    _load_built_in()
    return list(_SPECS.values())


def by_architecture(arch: str) -> FamilySpec | None:
    """The family a config.json `architectures` entry names (any case), or None."""
    low = arch.lower()
    return next((s for s in specs() if low in (a.lower() for a in s.architectures)), None)


def names() -> str:
    """The registered families' display names, comma-separated (for messages)."""
    return ", ".join(s.name for s in specs())
