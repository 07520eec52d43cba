"""The one interface every model-free proposer stands behind, and its settings' parsing.

Contract: a `Proposer` sees the requests of a completion set one after another, as a serving engine would: `start`
(the prompt and the prefill's first token), then rounds of `propose` (the drafts at an anchor: the context is the
sequence up to and including the anchor's token) and `advance` (the tokens the target committed), then `finish`.
`propose` returns a `Proposal`: the chain of draft ids and where it came from (a position of the context it copies
from, the matched length, the structure it came from). An engine that verifies a tree (SGLang's n-gram) answers
`accept` itself: the longest root path equal to the target's next tokens. Settings are frozen dataclasses, one
field per engine flag with its default; `settings_of` builds one from "key=value,key=value" text. Numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..errors import UserError


class SettingsError(UserError, ValueError):
    """A baseline setting that is unknown or out of range; the message names it and the fix."""


@dataclass(frozen=True)
class Proposal:
    ids: np.ndarray  # [n] draft token ids, n <= the proposer's width (empty: no draft this round)
    at: int = -1  # position in the context the drafts copy from (-1: not one position, e.g. a tree's counts)
    match: int = 0  # length of the matched suffix the drafts continue
    origin: str = ""  # which store the drafts came from: "context", "prompt+output tree", "earlier outputs", ...


class Proposer:
    """Base of the proposers: a stateless chain by default (start/advance/finish do nothing)."""

    method = ""  # the CLI's --method name
    family = ""  # the run's family label, "baseline:<method>"
    source = ""  # the engine file (and commit) this proposer follows

    def __init__(self, settings):
        self.settings = settings

    @property
    def width(self) -> int:
        """The most drafts one round proposes (a run's block size is this + 1)."""
        raise NotImplementedError

    def start(self, prompt: np.ndarray, first: int) -> None:
        """A new request: its prompt ids and the token the prefill produced."""

    def propose(self, context: np.ndarray) -> Proposal:
        raise NotImplementedError

    def accept(self, context: np.ndarray, truth: np.ndarray) -> tuple[int, Proposal]:
        """(accepted, the proposal as a chain): leading drafts equal to `truth` (the target's next tokens)."""
        prop = self.propose(context)
        n = min(len(prop.ids), len(truth))
        return int(np.cumprod(prop.ids[:n] == truth[:n]).sum()), prop

    def advance(self, context: np.ndarray, committed: np.ndarray) -> None:
        """The target committed `committed`; `context` is the sequence up to the new anchor, those tokens included."""

    def finish(self, tokens: np.ndarray) -> None:
        """The request ended with `tokens` (prompt + completion)."""


def settings_of(cls: type, text: str | dict | None):
    """Settings dataclass `cls` from "key=value,key=value" (or a dict; None: the defaults): each value cast to its
    field's type; an unknown key or a bad value raises SettingsError naming it."""
    given = dict(text or {}) if not isinstance(text, str) else {}
    if isinstance(text, str):
        for part in filter(None, (s.strip() for s in text.split(","))):
            key, eq, value = part.partition("=")
            if not eq:
                raise SettingsError(f"settings {part!r}: expected key=value, e.g. prompt_lookup_min=2")
            given[key.strip().replace("-", "_")] = value.strip()
    kinds = {f.name: str(f.type) for f in fields(cls)}
    unknown = sorted(set(given) - set(kinds))
    if unknown:
        known = ", ".join(kinds)
        raise SettingsError(f"settings {', '.join(unknown)}: not a setting of this method; expected some of {known}")
    out = {}
    for k, v in given.items():
        try:
            out[k] = {"int": int, "float": float}.get(kinds[k], str)(v) if isinstance(v, str) else v
        except ValueError:
            raise SettingsError(f"settings {k}={v!r}: expected a {kinds[k]}") from None
    return cls(**out)


def positive(name: str, value, lo: float = 1) -> None:
    """Refuse a setting below `lo`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < lo:
        raise SettingsError(f"settings {name}={value!r}: expected a number >= {lo}")
