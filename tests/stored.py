"""Test helpers (not tests): what a workspace's store and feature files hold, read back for comparisons."""

from __future__ import annotations

import torch

from dflash_dash import cache, pipeline
from dflash_dash.store import Store


def features(st: Store, ex: str) -> dict[str, torch.Tensor]:
    """Every prompt's features of extraction `ex`, read and validated from its files: {prompt id: [T, K*H]}."""
    e = st.extraction(ex)
    width = len(e["layer_ids"]) * e["hidden_size"]
    return {
        it["prompt_id"]: cache.read(pipeline.features_root(st), ex, it["prompt_id"], it["tokens"], width)
        for it in st.items(ex)
    }
