"""Test helpers (not tests): synthetic inputs for the replay and drafter tests: a random LM head, and a token
sequence planted from a drafter's own blocks so that acceptance is a mix of long and short."""

from __future__ import annotations

import numpy as np
import torch

from dflash_dash import drafters as dr, replay as rp, target as tg


def random_head(V=512, H=64, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tg.Head(torch.randn(V, H, generator=g).to(dtype), torch.randn(V, H, generator=g).to(dtype))


def planted(m: dr.Drafter, head: tg.Head, feats: torch.Tensor, P: int, T: int, seed: int) -> torch.Tensor:
    """Tokens that follow the drafter's own blocks: at each anchor keep a random number of its drafts, then a
    different token, so acceptance is a mix of long and short (features are fixed, so drafts at anchor p
    depend only on features[:p] and token p)."""
    rng = np.random.default_rng(seed)
    toks = [int(t) for t in rng.integers(10, 500, P + 1)]
    while len(toks) < T:
        p = len(toks) - 1
        d = rp.draft_loop(m, head, feats[: p + 1], torch.tensor(toks), p).tokens[0].tolist()
        keep = int(rng.integers(0, len(d) + 1))
        toks += d[:keep]
        other = int(rng.integers(10, 500))
        toks.append(other if keep == len(d) or other != d[keep] else other + 1)
    return torch.tensor(toks[:T])
