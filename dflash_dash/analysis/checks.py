"""Drafter checks: is a checkpoint wired to this target and extraction, does the kernel backend matter for this
target, and how do a checkpoint's sliding-window layers fare with each mask semantics inside the block.

Contract: `consistency` applies the drafter's rules (`drafters.checks`) to a parsed config, an extraction row and
the target's description and returns one row per rule (problem text where it fails; an extraction holding more
layers than the drafter reads is consistent), then one row per serving engine: ⚠ where the engine cannot serve a
layer the drafter reads (`EngineClient.unservable`: llama.cpp, the target's last layer), named before a user deploys
it there; `sliding_rows` and `sliding_checkpoints` read run rows only. The
drafter and target modules import torch: they are imported on first use, so importing this module stays light.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from . import rounded

if TYPE_CHECKING:
    from ..store import Extraction, Run


def consistency(cfg, extraction: Extraction, info) -> list[dict]:
    """Drafter config (DrafterConfig) vs an extraction row and its target (TargetInfo): one row per rule of
    drafters.checks, with the problem and fix where a rule fails. The target layer ids hold when the extraction
    holds every layer the drafter reads (it may hold more: several drafters' union; the replay reads the drafter's
    own columns), so the rules see the extraction as the drafter reads it; the row shows every layer it holds."""
    from .. import drafters, ops

    have, need = list(extraction.layer_ids), list(cfg.target_layer_ids)
    lack = ops.missing_layers(have, need)
    seen = extraction if lack else replace(extraction, layer_ids=need)
    rows = []
    for k in drafters.checks(cfg, info.hidden_size, info.vocab_size, info.num_layers, seen):
        problem = k.problem
        if k.name == "target layer ids":
            problem = (
                f"the drafter reads target layers {need} but extraction {extraction.id} holds layers {have} "
                f"(missing {lack}); extract its set again with --drafter pointing at this checkpoint (repeat "
                "--drafter for every drafter one extraction should serve) or --layers naming all of them"
            )
            k = replace(k, other=have)
        rows.append(
            {
                "check": k.name,
                "drafter": str(k.drafter),
                "extraction / target": str(k.other),
                "ok": "✓" if k.ok else "✗",
                "problem": "" if k.ok else problem,
            }
        )
    from ..engines import ENGINES

    for name, client in ENGINES.items():  # where it can be deployed: each engine's layer limit (`unservable`)
        why = client.unservable(need, info.num_layers)
        rows.append(
            {
                "check": f"served by {name}",
                "drafter": str(need),
                "extraction / target": f"{info.num_layers} target layers",
                "ok": "⚠" if why else "✓",
                "problem": "; ".join(f"{name} cannot serve target layer {i}: {w}" for i, w in sorted(why.items())),
            }
        )
    return rows


def backend_matters(target_path: str) -> bool:
    """False for a target without linear-attention layers: no kernel backend to warn about."""
    from ..target_info import describe, has_linear_attention

    try:
        return has_linear_attention(describe(target_path))
    except Exception:  # noqa: BLE001  (an unreadable target is reported by the job itself)
        return True


def parity_pair(exs: list[Extraction], runs: list[Run]) -> tuple[str, str] | None:
    """Default (A, B) extraction ids of the backend parity check, `exs` finished extraction rows oldest first: A the
    newest torch-path extraction, B the newest fla extraction of the same completion set (else the newest other
    extraction of that set, else the oldest other one); at each choice one that has runs comes before a newer one
    without (the tau table under the parity reads runs: a Re-extract must not open it on empty columns). None for
    fewer than two extractions."""
    if len(exs) < 2:
        return None
    used = {r.extraction_id for r in runs}

    def newest(rows: list[Extraction]) -> Extraction | None:  # the newest with runs, else the newest
        return ([e for e in rows if e.id in used] or rows or [None])[-1]

    a = newest([e for e in exs if e.backend == "torch"]) or newest(exs)
    same = [e for e in exs if e.id != a.id and e.set_name == a.set_name]
    b = newest([e for e in same if e.backend == "fla"]) or newest(same) or next(e for e in exs if e is not a)
    return a.id, b.id


def sliding_rows(runs: list[Run], checkpoint: str, extraction: str) -> list[dict]:
    """The latest run of `checkpoint` on `extraction` per sliding semantics, for the train/serve check."""
    best = {
        r.sliding_block: r
        for r in runs
        if r.checkpoint == checkpoint and r.extraction_id == extraction and r.sliding_block
    }
    return [
        {
            "sliding layers": f"{sem} inside the block",
            "run": best[sem].id,
            "tau (macro)": rounded(best[sem].summary.get("tau_macro")),
            "tau (pooled)": rounded(best[sem].summary.get("tau_pooled")),
            "every-anchor tau": rounded(best[sem].summary.get("every_anchor_tau")),
        }
        for sem in ("causal", "bidirectional")
        if sem in best
    ]


def sliding_checkpoints(runs: list[Run]) -> list[str]:
    """Checkpoints of the runs whose drafter has sliding_attention layers (newest first, once each)."""
    out: list[str] = []
    for r in reversed(runs):
        if "sliding_attention" in ((r.config or {}).get("layer_types") or []) and r.checkpoint not in out:
            out.append(r.checkpoint)
    return out
