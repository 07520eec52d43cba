"""The measured cost table and the speedup prediction (SPEC section 3, "Predicted speedup").

Contract: numbers in, numbers out (no torch, no store). A cost table is what `profile` measured on one device and
backend: the target's forward time for q new tokens after a context of c tokens (`target` rows (c, q, seconds)),
the drafter's time for one block (`draft` rows (c, seconds)) and, optionally, for one DDTree of budget b (`tree`
rows (b, c, seconds), verified as a forward of b + 1 tokens). Times between measured context lengths are
interpolated linearly in c (clamped at the ends); q must be a measured size (a verify of q tokens is one forward
of q tokens, nothing is extrapolated in q).

Predicted speedup of a chain trace: plain decoding commits one token per target forward of q = 1; speculative
decoding spends, per round r at context c_r, one drafter block and one verify forward of `verify` tokens, and
commits `committed_r` tokens. So
    speedup = sum_r committed_r * t_target(1, c_r) / sum_r (t_draft(c_r) + t_target(verify, c_r)),
which at one context length is tau x t_target(1) / (t_draft + t_target(verify)), the formula the pages show.
The prefill token is in neither side (both decoders pay it once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import UserError

FORMULA = "speedup = tau x t_target(1) / (t_draft + t_target(verify))"


class CostError(UserError, ValueError):
    """A cost table that cannot answer: the message names the missing size or context."""


@dataclass(frozen=True)
class CostTable:
    device: str  # where it was measured, e.g. "NVIDIA H100 80GB HBM3" or "cpu" (CPU costs are labelled so)
    backend: str  # the target's kernel backend when measured: "fla 0.4.1" or "torch"
    target: tuple[tuple[int, int, float], ...]  # (context tokens, new tokens q, seconds per forward)
    draft: tuple[tuple[int, float], ...]  # (context tokens, seconds per drafter block)
    tree: tuple[tuple[int, int, float], ...] = ()  # (tree budget b, context tokens, seconds per drafted DDTree)
    meta: dict[str, Any] = field(default_factory=dict)  # model paths, dtype, block size, repeats: shown, not used

    def sizes(self) -> list[int]:
        return sorted({q for _, q, _ in self.target})

    def t_target(self, q: int, context: float) -> float:
        pts = sorted((c, s) for c, qq, s in self.target if qq == q)
        if not pts:
            raise CostError(
                f"the cost table has no target forward of {q} tokens (measured: {self.sizes()}); "
                f"run profile with that size"
            )
        return _interp(pts, context)

    def t_draft(self, context: float) -> float:
        if not self.draft:
            raise CostError("the cost table has no drafter time; run profile with --drafter")
        return _interp(sorted(self.draft), context)

    def t_tree(self, budget: int, context: float) -> float:
        pts = sorted((c, s) for b, c, s in self.tree if b == budget)
        if not pts:
            raise CostError(f"the cost table has no DDTree of budget {budget}; run profile with --tree-budget {budget}")
        return _interp(pts, context)

    def budgets(self) -> list[int]:
        return sorted({b for b, _, _ in self.tree})

    def label(self) -> str:
        """The device in words, CPU costs named as such: 'NVIDIA H100 80GB HBM3, fla 0.4.1' or 'CPU costs (...)'."""
        where = f"{self.device}, {self.backend} kernels, {self.meta.get('dtype', '?')}"
        return f"CPU costs ({where}): not a GPU's speedup" if self.device == "cpu" else where


def _interp(pts: list[tuple[int, float]], x: float) -> float:
    cs, ss = zip(*pts)
    return float(np.interp(x, cs, ss))


def speedup(table: CostTable, rounds: list[tuple[int, int]], verify: int) -> float:
    """Predicted speedup of rounds [(context length at the round, committed tokens)] with `verify` tokens per
    verify forward (module docstring). No rounds -> 1.0 (nothing to speed up)."""
    if not rounds:
        return 1.0
    plain = sum(c * table.t_target(1, ctx) for ctx, c in rounds)
    spec = sum(table.t_draft(ctx) + table.t_target(verify, ctx) for ctx, _ in rounds)
    return plain / spec


def speedup_at(table: CostTable, tau: float, context: float, verify: int) -> float:
    """The formula at one context length: tau x t_target(1) / (t_draft + t_target(verify))."""
    return tau * table.t_target(1, context) / (table.t_draft(context) + table.t_target(verify, context))


def tree_speedup(table: CostTable, rounds: list[tuple[int, int]], budget: int) -> float:
    """`speedup` of DDTree-b rounds: a tree drafted (`t_tree`) and verified as one forward of b + 1 tokens."""
    if not rounds:
        return 1.0
    plain = sum(c * table.t_target(1, ctx) for ctx, c in rounds)
    spec = sum(table.t_tree(budget, ctx) + table.t_target(budget + 1, ctx) for ctx, _ in rounds)
    return plain / spec


def to_dict(table: CostTable) -> dict[str, Any]:
    return {
        "device": table.device,
        "backend": table.backend,
        "target": [list(r) for r in table.target],
        "draft": [list(r) for r in table.draft],
        "tree": [list(r) for r in table.tree],
        "meta": dict(table.meta),
    }


def from_dict(d: dict[str, Any]) -> CostTable:
    try:
        return CostTable(
            device=str(d["device"]),
            backend=str(d["backend"]),
            target=tuple((int(c), int(q), float(s)) for c, q, s in d["target"]),
            draft=tuple((int(c), float(s)) for c, s in d.get("draft", [])),
            tree=tuple((int(b), int(c), float(s)) for b, c, s in d.get("tree", [])),
            meta=dict(d.get("meta", {})),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CostError(f"cost table: {e!r} (expected device, backend, target [[c, q, s]], draft [[c, s]])") from e
