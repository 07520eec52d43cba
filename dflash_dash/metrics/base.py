"""What every metric reads and is: a prompt's walks (`Prompt`), the run's context (`Ctx`), a registry entry (`Metric`).

Contract: plain per-round data in, no torch, no store. `Prompt.of` builds a `Prompt` from a replay result or a
run_prompts row (arrays flattened by `flat`): prompt length P, accepted(p) at every completion anchor (-1 where a
chain-only replay did not compute it), the committed tokens of each chain-walk (and DDTree) round, and the
per-slot top-1 log-probability of the drafts where the run recorded it. `Metric` is one registry entry: key,
label, formula, run-level and per-prompt functions, kind and print format (TAU or PROB).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def flat(v: Any) -> Any:
    """An array field of a result or row flat: [] for None, a numpy array raveled (numpy: a worker's chain-only
    results travel as arrays, never as Python lists), nested lists joined, a flat list as it is."""
    if v is None:
        return []
    if hasattr(v, "ravel"):
        return v.ravel()
    if len(v) and isinstance(v[0], (list, tuple)):
        return [x for row in v for x in flat(row)]
    return v


@dataclass
class Prompt:
    id: str
    prompt_len: int  # P: position of the first completion token
    accepted_at: list[int]  # accepted(p), p = P..T-1
    rounds: list[int]  # committed tokens per round of the chain walk (bonus included)
    tree_rounds: list[int] = field(default_factory=list)  # committed per round of the DDTree walk
    draft_logp: list[float] = field(default_factory=list)  # [A*(B-1)] top-1 log-prob per anchor and slot

    @property
    def T(self) -> int:  # tokens of prompt + completion
        return self.prompt_len + len(self.accepted_at)

    @property
    def anchors(self) -> list[int]:
        """Anchor of each chain-walk round: P, then + committed."""
        return self.walk()[0].tolist()

    def walk(self) -> tuple:
        """The chain-walk rounds as numpy arrays (computed once per Prompt): anchors a [R], accepted(a) [R],
        tokens left after each anchor T-1-a [R]."""
        got = self.__dict__.get("_walk")
        if got is None:
            import numpy as np

            a = (
                self.prompt_len + np.concatenate([[0], np.cumsum(self.rounds, dtype=np.int64)[:-1]]).astype(np.int64)
                if self.rounds
                else np.zeros(0, dtype=np.int64)
            )
            acc = np.asarray(self.accepted_at, dtype=np.int64)[a - self.prompt_len]
            got = self.__dict__["_walk"] = (a, acc, self.T - 1 - a)
        return got

    def draft_p(self, D: int):
        """[R, D] min(1, exp(draft_logp)) at the rounds' anchors (math.exp, value for value as the per-round loops
        computed it), computed once per Prompt and D; call only when `recorded`."""
        got = self.__dict__.get(("_p", D))
        if got is None:
            import numpy as np

            a = self.walk()[0] - self.prompt_len
            lp = np.asarray(self.draft_logp, dtype=np.float64).reshape(-1, D)[a].ravel()
            got = np.minimum(1.0, np.fromiter(map(math.exp, lp.tolist()), np.float64, len(lp))).reshape(-1, D)
            self.__dict__[("_p", D)] = got
        return got

    @classmethod
    def of(cls, r: Any) -> Prompt:
        """From a replay.PromptResult (attributes) or a run_prompts row (dict); a Prompt is itself (what it computed
        once, its walk and probabilities, is kept: a store step builds each prompt's Prompt once for every metric)."""
        if isinstance(r, Prompt):
            return r
        get = (lambda k, d=None: r.get(k, d)) if isinstance(r, dict) else (lambda k, d=None: getattr(r, k, d))
        return cls(
            get("prompt_id") or get("id"),
            int(get("prompt_len")),
            list(flat(get("accepted_at"))),
            list(flat(get("rounds"))),
            list(flat(get("tree_rounds"))),
            flat(get("draft_logp")),
        )


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
