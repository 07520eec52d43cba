"""Why drafts fail: target-layer attribution of a run, each target tap replaced by its mean and the tau it costs.

Contract: `attribute(store, op)` (an `ops.Attribute`) replays the run's own drafter on its own extraction, once as
it is and once per tap ablated, chain-only (whose tau equals every-anchor's), and stores the rows with the run.
The features are restored after each ablation, so the sequences read once serve every replay. The taps are the
drafter's own target layers (its columns of an extraction that may hold more).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import drafters as drafter_mod, ops
from ..ops import InputError
from ..store import Store
from .base import DTYPES, Progress, Runner, tick
from .features import columns, load_sequences, require_files

if TYPE_CHECKING:
    import torch

    from .. import replay as replay_mod


def tap_means(seqs: list[replay_mod.Sequence]) -> torch.Tensor:
    """The mean feature vector [K*H] over every token of every sequence (summed in float64)."""
    import torch

    total = sum(len(s.tokens) for s in seqs)
    if not total:
        raise InputError("the extraction holds no tokens; nothing to attribute")
    return sum(s.features.sum(0, dtype=torch.float64) for s in seqs) / total


def attribute(store: Store, op: ops.Attribute, progress: Progress = None, runner: Runner | None = None) -> dict:
    """Target-layer attribution of a run: its drafter (same checkpoint, config file and sliding semantics) is
    replayed on its extraction (chain-only anchors, whose tau equals every-anchor's; DDTree budget 0) once as it
    is and once per target tap with that tap replaced by its mean over the extraction (tap k =
    features[:, k*H:(k+1)*H], averaged over all tokens of all prompts); tau lost = base tau - ablated tau.
    Stored in `attributions` (replacing an earlier attribution of the run). `op.device`/`op.dtype` default to
    the run's own. Returns {"run", "base_tau_macro", "base_tau_pooled", "taps": [{tap, layer_id, tau_macro,
    tau_pooled, base_tau_macro, base_tau_pooled}]}."""
    r = store.run_row(op.run)
    ex = store.extraction(r.extraction_id)
    if ex.status != "done":
        raise InputError(f"extraction {ex.id} of run {r.id} is {ex.status}, not done; re-extract first")
    require_files(store, ex, f"an attribution of run {r.id}")  # a streamed run's features were never kept
    device, dtype = op.device or r.device or "cpu", op.dtype or r.dtype or "float32"

    import torch

    from .. import replay as replay_mod, target as target_mod

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {device}: no CUDA device on this machine; use --device cpu")
    H = ex.hidden_size
    tick(progress, 0, 1, f"loading drafter {r.checkpoint}")
    d = drafter_mod.load(r.checkpoint, DTYPES[dtype], device, r.sliding_block, r.config_file)
    layers = list(d.c.target_layer_ids)  # its taps: its own columns of the extraction, which may hold more layers
    K = len(layers)
    columns(store, ex, layers, f"the checkpoint at {r.checkpoint} (changed since run {r.id}?)")
    head = target_mod.load_head(ex.target_path, device, DTYPES[dtype])
    seqs = load_sequences(store, ex, layers)
    mean = tap_means(seqs)
    n = len(seqs)

    def tau_of(i: int, what: str) -> dict:
        _, summ = replay_mod.chain_only(
            d,
            head,
            seqs,
            budget=0,
            progress=lambda j, m: tick(
                progress, i * n + j, (K + 1) * n, f"replay {i + 1}/{K + 1} ({what}): {seqs[j - 1].id}"
            ),
        )
        return summ

    base = tau_of(0, "no tap ablated")
    rows = []
    for k, layer in enumerate(layers):
        cols = slice(k * H, (k + 1) * H)
        saved = [s.features[:, cols].clone() for s in seqs]
        try:
            for s in seqs:
                s.features[:, cols] = mean[cols].to(s.features.dtype)
            summ = tau_of(k + 1, f"tap {k}, target layer {layer}, replaced by its mean")
        finally:
            for s, v in zip(seqs, saved):
                s.features[:, cols] = v
        rows.append(
            {
                "tap": k,
                "layer_id": layer,
                "tau_macro": summ["tau_macro"],
                "tau_pooled": summ["tau_pooled"],
                "base_tau_macro": base["tau_macro"],
                "base_tau_pooled": base["tau_pooled"],
            }
        )
    store.set_attribution(r.id, rows)
    tick(progress, (K + 1) * n, (K + 1) * n, f"attributed {K} taps of run {r.id}")
    return {"run": r.id, "base_tau_macro": base["tau_macro"], "base_tau_pooled": base["tau_pooled"], "taps": rows}
