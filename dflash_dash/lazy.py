"""Modules imported on first use, so the store-only commands (`runs`, `extractions`, `jobs`) never load torch.

Contract: `module(name)` returns a stand-in whose attribute reads, writes and deletes go to the real module,
imported by the first of them (so monkeypatching through it patches the real module). Nothing is imported,
nor put in sys.modules, before that. Importers keep the real imports under `if TYPE_CHECKING:` so readers,
type checkers and tests/test_arrows.py still see them.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class Lazy:
    __slots__ = ("_name",)

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str):
        return getattr(_real(self), attr)

    def __setattr__(self, attr: str, value) -> None:
        setattr(_real(self), attr, value)

    def __delattr__(self, attr: str) -> None:
        delattr(_real(self), attr)

    def __repr__(self) -> str:
        return f"<lazy module {object.__getattribute__(self, '_name')!r}>"


def _real(lazy: Lazy) -> ModuleType:
    """The module behind a stand-in (imported now if it was not yet); no method, so no module attribute is hidden."""
    return importlib.import_module(object.__getattribute__(lazy, "_name"))


def module(name: str) -> Lazy:
    """A stand-in for module `name` (absolute, e.g. "dflash_dash.target"), imported on first attribute use."""
    return Lazy(name)
