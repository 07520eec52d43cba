"""The one prompt row (`Prompt`: one prompt's replay, what every metric reads), the run's context (`Ctx`) and a
registry entry (`Metric`).

Contract: no torch, no store. A `Prompt` is one prompt of a run from replay to the store and back: its id, prompt
length P, accepted(p) at every completion anchor (-1 where a chain-only replay did not compute it), the drafts
and the top-1 log-probability of each drafted slot (-1 / NaN where not drafted), the committed tokens of each
chain-walk (and DDTree) round, the rounds' top-K candidates, the rank of the target's token among each slot's
top-K, the family's confidence where it has one, and, once scored, its tau values. The per-anchor and
per-slot values are numpy arrays (integers of any width, floats), the per-round counts lists of Python ints (the
metrics sum them exactly); the constructor makes them so. A replay builds it, the worker wire carries it
(`jobs.wire`) and the store writes it (`Store.add_run`); `from_row` builds one from a stored run_prompts row
(keyed `prompt_id`, arrays flat). `Metric` is one registry entry: key, label, formula, run-level and per-prompt
functions, kind and print format (TAU or PROB).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

_INT_ARRAYS = ("accepted_at", "drafts", "tree_at", "round_top_ids", "target_rank")
_REAL_ARRAYS = ("draft_logp", "round_top_p", "confidence", "expected_at")
_ROUNDS = ("rounds", "tree_rounds")


def _ints() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


def _reals() -> np.ndarray:
    return np.zeros(0, dtype=np.float32)


@dataclass(eq=False)
class Prompt:
    id: str
    prompt_len: int  # P: position of the first completion token
    accepted_at: np.ndarray  # [A] accepted(p), p = P..T-1 (-1: not computed)
    rounds: list[int]  # committed tokens per round of the chain walk (bonus included)
    tree_rounds: list[int] = field(default_factory=list)  # committed per round of the DDTree walk
    draft_logp: np.ndarray = field(default_factory=_reals)  # [A, B-1] top-1 log-prob per anchor and slot (NaN: none)
    drafts: np.ndarray = field(default_factory=_ints)  # [A, B-1] argmax drafts at each anchor (-1: not drafted)
    tree_at: np.ndarray = field(default_factory=_ints)  # [A] DDTree accepted(p) (-1: not computed)
    round_top_ids: np.ndarray = field(default_factory=_ints)  # [R, B-1, K] top-K drafts at each round's anchor
    round_top_p: np.ndarray = field(default_factory=_reals)  # [R, B-1, K] their probabilities
    tau: float | None = None  # committed / rounds (the registry's tau_macro of this prompt), once scored
    tree_tau: float | None = None  # the DDTree walk's, once scored
    confidence: np.ndarray = field(default_factory=_reals)  # [A, D] the family's predicted acceptance (DSpark)
    target_rank: np.ndarray = field(default_factory=_ints)  # [A, D] rank of the target's token among the slot's
    # top-K candidates (-2: not among them; -1: not computed): top-K headroom
    expected_at: np.ndarray = field(default_factory=_reals)  # [A, 2] (low, high) expected committed tokens per
    # anchor at the run's temperature (NaN: not computed; empty: no temperature); flat [2A] as stored

    def __post_init__(self) -> None:
        """The one form: lists become numpy arrays (an array is kept as it is, no copy), per-round arrays lists."""
        for k in _INT_ARRAYS + _REAL_ARRAYS:
            v = getattr(self, k)
            if not isinstance(v, np.ndarray):
                empty = v is None or len(v) == 0
                setattr(self, k, (_reals() if k in _REAL_ARRAYS else _ints()) if empty else np.asarray(v))
        for k in _ROUNDS:
            v = getattr(self, k)
            if not isinstance(v, list):
                setattr(self, k, np.asarray(v).tolist() if v is not None else [])

    def __eq__(self, other: object) -> bool:
        """The same fields (arrays: the same shape and values, NaN equal to NaN; dtypes may differ)."""
        if not isinstance(other, Prompt):
            return NotImplemented
        return all(
            np.array_equal(a, b, equal_nan=a.dtype.kind == "f") if isinstance(a, np.ndarray) else a == b
            for a, b in ((getattr(self, f.name), getattr(other, f.name)) for f in fields(self))
        )

    @classmethod
    def from_row(cls, row: dict) -> Prompt:
        """From a run_prompts row as the store reads it back (keyed `prompt_id`; arrays flat; None: not stored)."""
        return cls(
            row["prompt_id"],
            int(row["prompt_len"]),
            row.get("accepted_at"),
            row.get("rounds"),
            row.get("tree_rounds"),
            row.get("draft_logp"),
            row.get("drafts"),
            row.get("tree_at"),
            row.get("round_top_ids"),
            row.get("round_top_p"),
            row.get("tau"),
            row.get("tree_tau"),
            confidence=row.get("confidence"),
            target_rank=row.get("target_rank"),
            expected_at=row.get("expected_at"),
        )

    @property
    def T(self) -> int:  # tokens of prompt + completion
        return self.prompt_len + len(self.accepted_at)

    @property
    def round_anchors(self) -> list[int]:
        """Anchor of each chain-walk round: P, then + committed."""
        return self.walk()[0].tolist()

    def walk(self) -> tuple:
        """The chain-walk rounds as numpy arrays (computed once per Prompt): anchors a [R], accepted(a) [R],
        tokens left after each anchor T-1-a [R]."""
        got = self.__dict__.get("_walk")
        if got is None:
            a = (
                self.prompt_len + np.concatenate([[0], np.cumsum(self.rounds, dtype=np.int64)[:-1]]).astype(np.int64)
                if self.rounds
                else np.zeros(0, dtype=np.int64)
            )
            acc = np.asarray(self.accepted_at, dtype=np.int64)[a - self.prompt_len]
            got = self.__dict__["_walk"] = (a, acc, self.T - 1 - a)
        return got

    def reached(self, D: int) -> tuple:
        """The samples of the per-depth conditional curve: (rows of the rounds' anchors [R], depth k [R, D],
        mask [R, D]: slot k inside the completion and d_1..d_{k-1} accepted), row-major in round order. Calibration,
        headroom and a confidence head all read these samples."""
        a, acc, left = self.walk()
        ks = np.broadcast_to(np.arange(1, D + 1), (len(a), D))
        return a - self.prompt_len, ks, ks <= np.minimum(np.minimum(D, left), acc + 1)[:, None]

    def draft_p(self, D: int):
        """[R, D] min(1, exp(draft_logp)) at the rounds' anchors (math.exp, value for value as the per-round loops
        computed it), computed once per Prompt and D; call only when `recorded`."""
        got = self.__dict__.get(("_p", D))
        if got is None:
            a = self.walk()[0] - self.prompt_len
            lp = np.asarray(self.draft_logp, dtype=np.float64).reshape(-1, D)[a].ravel()
            got = np.minimum(1.0, np.fromiter(map(math.exp, lp.tolist()), np.float64, len(lp))).reshape(-1, D)
            self.__dict__[("_p", D)] = got
        return got


@dataclass
class Ctx:
    block_size: int  # B
    tree_budget: int  # DDTree node budget (0: no tree)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


@dataclass(frozen=True)
class Metric:
    key: str  # summary key (stored, exported)
    label: str  # shown in the UI
    formula: str  # shown next to every value
    run: Callable[[list[Prompt], Ctx], Any]  # run-level value
    prompt: Callable[[Prompt, Ctx], Any] | None = None  # per-prompt value, when the metric has one
    kind: str = "scalar"  # scalar | histogram | curve | count | interval | ids
    headline: bool = False  # one of the run's headline numbers (cards, compare, listings)
    fmt: str = "{:.2f}"  # how a scalar is printed: TAU (tau-like) unless set


TAU, PROB = "{:.2f}", "{:.3f}"  # the one format of tau-like numbers (tokens per round) and of probabilities
