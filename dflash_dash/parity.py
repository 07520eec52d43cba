"""Backend parity: how far two extractions of the same completions differ, per target layer.

Contract: reads both extractions' feature files through `cache.read` (validated) and compares them on the
prompts and the target layers they share (an extraction of several drafters' union against one of a single
drafter's layers compares those), layer by layer (features are K layers of H values concatenated per token):
- relative L2 = ||A - B|| / ||B|| over all shared tokens (B is the reference, normally the fla extraction);
- cosine = mean over tokens of cos(A_t, B_t).
No network, no model; raises StoreError/CacheError/ValueError with a message naming the fix.
`run(store, op, progress)` is the backend-parity job (ops.Parity, started by the Diagnostics page, run by
jobs.dispatch): its result, the per-layer numbers and the counts, is the job's result the page draws, so torch runs
in the job process, never in the Streamlit one.
"""

from __future__ import annotations

import torch

from . import cache, ops
from .pipeline import features_root
from .pipeline.features import require_files
from .store import Store, StoreError


def compare(store: Store, a_id: str, b_id: str, max_prompts: int | None = None, progress=None) -> dict:
    """Per-layer relative L2 and cosine of extraction A against reference B, over the layers both hold. Returns
    {"layers": [{"layer", "rel_l2", "cosine", "max_abs"}], "prompts": n, "tokens": n, "a": row, "b": row};
    `progress(done, total, message)` after each prompt."""
    a, b = store.extraction(a_id), store.extraction(b_id)
    for e in (a, b):  # a streamed extraction kept no feature file to compare
        require_files(store, e, "backend parity")
    layer_ids = [x for x in a.layer_ids if x in set(b.layer_ids)]  # the layers both hold, in A's order
    if not layer_ids or a.hidden_size != b.hidden_size:
        raise ValueError(
            f"extractions {a.id} (layers {a.layer_ids}) and {b.id} (layers {b.layer_ids}) "
            "hold different layers, none in common; extract both with the same drafter or --layers"
        )
    if a.set_name != b.set_name:
        raise ValueError(
            f"extractions {a.id} and {b.id} are of different completion sets "
            f"({a.set_name!r} vs {b.set_name!r}); extract the same set with both backends"
        )
    ia = {it.prompt_id: it.tokens for it in store.items(a.id)}
    ib = {it.prompt_id: it.tokens for it in store.items(b.id)}
    shared = sorted(p for p in ia if p in ib and ia[p] == ib[p])
    if not shared:
        raise StoreError(f"extractions {a.id} and {b.id} share no extracted prompt")
    if max_prompts:
        shared = shared[:max_prompts]
    K, H = len(layer_ids), a.hidden_size
    ka, kb = (ops.layer_blocks(e.layer_ids, layer_ids) for e in (a, b))  # None: every block, as stored
    ka, kb = (None if k is None else torch.tensor(k) for k in (ka, kb))
    diff2 = torch.zeros(K, dtype=torch.float64)
    ref2 = torch.zeros(K, dtype=torch.float64)
    cos_sum = torch.zeros(K, dtype=torch.float64)
    max_abs = torch.zeros(K, dtype=torch.float64)
    n_tok = 0
    root = features_root(store)
    for i, pid in enumerate(shared):
        fa = cache.read(root, a.id, pid, ia[pid], len(a.layer_ids) * H)
        fb = cache.read(root, b.id, pid, ib[pid], len(b.layer_ids) * H)
        fa = cache.blocks(fa, ka, H).double().view(-1, K, H)  # [T, K, H] of the shared layers
        fb = cache.blocks(fb, kb, H).double().view(-1, K, H)
        d = fa - fb
        diff2 += d.pow(2).sum((0, 2))
        ref2 += fb.pow(2).sum((0, 2))
        cos_sum += torch.nn.functional.cosine_similarity(fa, fb, dim=-1, eps=1e-12).sum(0)
        max_abs = torch.maximum(max_abs, d.abs().amax((0, 2)))
        n_tok += fa.shape[0]
        if progress:
            progress(i + 1, len(shared), f"compared prompt {pid} ({i + 1}/{len(shared)})")
    rel = (diff2.sqrt() / ref2.sqrt().clamp_min(1e-30)).tolist()
    cos = (cos_sum / n_tok).tolist()
    layers = [
        {"layer": l, "rel_l2": rel[k], "cosine": cos[k], "max_abs": float(max_abs[k])} for k, l in enumerate(layer_ids)
    ]
    return {"layers": layers, "prompts": len(shared), "tokens": n_tok, "a": a, "b": b}


def run(store: Store, op: ops.Parity, progress=None) -> dict:
    """The backend-parity job: `compare` of op.a against op.b; the job's result is {"a", "b", "layers", "prompts",
    "tokens"} (plain JSON, what the Diagnostics page draws)."""
    out = compare(store, op.a, op.b, op.max_prompts, progress)
    return {"a": op.a, "b": op.b, "layers": out["layers"], "prompts": out["prompts"], "tokens": out["tokens"]}
