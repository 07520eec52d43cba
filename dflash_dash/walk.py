"""The chain walk over accepted(p), numpy only: the rounds a speculative decoder makes through a completion.

Contract: `walk(acc, P, T)` gives (anchor, accepted, committed) per round from anchor P while anchor < T-1, a
round committing min(accepted + 1, T-1-anchor) tokens. Torch-free, so the pages' token views (analysis.trace,
analysis.rounds) walk without loading torch; `replay` scores with the same function.
"""

from __future__ import annotations

import numpy as np


def walk(acc: np.ndarray, prompt_len: int, T: int) -> list[tuple[int, int, int]]:
    """Chain walk: rounds (anchor, accepted, committed) from anchor P while anchor < T-1."""
    rounds, p = [], prompt_len
    while p < T - 1:
        a = int(acc[p - prompt_len])
        c = min(a + 1, T - 1 - p)
        rounds.append((p, a, c))
        p += c
    return rounds
