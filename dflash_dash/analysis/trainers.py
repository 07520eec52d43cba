"""The trainers' and benchmarkers' report shapes: a run's per-position numbers as SpecForge's teacher-forced
checkpoint evaluation reports them, a per-request acceptance record as AIPerf reads it, and SpecForge's own report
read back and set beside the run's numbers with the reason for each difference.

Contract: numpy only. `specforge_report(prompts, tokens, B)` -> the report dict; `read_specforge(report)` -> its
per-position numbers (a `ReportError`, one line, when it is not a successful SpecForge checkpoint report);
`aiperf_records(prompts, B)` -> one record per prompt; `beside(ours, theirs, context)` -> rows (metric, position,
this product, SpecForge, difference, noise, why); `sources(runs, extractions)` -> one row per run of every checkpoint
that also ran on a trainer's cache (its tau on the training features, fresh extractions and generations side by side).

Sources:
- SpecForge (sgl-project/SpecForge): `specforge/eval/checkpoint.py` @ 06cb5feb438e, `evaluate_cached_features`: the
  report {"schema_version": 1, "success", "examples", "seconds", "optimizer_updates", "metric_scope", "mean",
  "ratio_totals", "sum_totals", "rows"}, read by `specforge/eval/report.py` @ 9ec462f92dca, `checkpoint_metrics` (a
  "mean" whose name is in "ratio_totals" must equal numerator / denominator; `position_<j>/...` names per draft
  position j = 1..B-1), with the DFlash-family names SpecForge's docs list for the unary greedy path:
  `position_<j>/hard_label/unary_top1_accuracy` (marginal: slot j's argmax equals the label, over supervised slots),
  `position_<j>/hard_label/unary_greedy_prefix_acceptance` (conditional: accepted / reached prefixes),
  `position_<j>/hard_label/unary_greedy_prefix_survival` (accepted / all evaluated blocks),
  `dflash/hard_label/unary_greedy_accepted_length` (= 1 + sum_j survival_j), counts
  `position_<j>/hard_label/unary_greedy_{reached,accepted}_count` and `dflash/hard_label/block_count`.
  The product's per-depth "marginal" (P(d_1..d_k all accepted), SPEC section 3) is SpecForge's survival; SpecForge's
  marginal accuracy is slot k alone.
- AIPerf (ai-dynamo/aiperf): `profile_export.jsonl` lines are `MetricRecordInfo` (aiperf/common/models/
  record_models.py: metadata, metrics {tag: {value, unit}}, error) carrying the engine-neutral per-request
  `SpecDecodeAcceptanceRecord` under `spec_decode_acceptance` (engine, mean_acceptance_length = 1 + accepted /
  steps, draft_acceptance_rate, acceptance_histogram {j: steps}, num_accepted_draft_tokens, num_draft_tokens,
  num_spec_steps, num_spec_tokens, completion_tokens, per_step_accepted, per_step_drafted; the record's own
  invariants hold: histogram counts sum to the steps, its j-weighted sum to the accepted drafts).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..errors import UserError

if TYPE_CHECKING:
    from ..store import Extraction, Run

SCHEMA = 1  # SpecForge's checkpoint report schema_version
LENGTH = "dflash/hard_label/unary_greedy_accepted_length"
BLOCKS = "dflash/hard_label/block_count"
TOP1 = "hard_label/unary_top1_accuracy"
COND = "hard_label/unary_greedy_prefix_acceptance"
SURV = "hard_label/unary_greedy_prefix_survival"
REACHED = "hard_label/unary_greedy_reached_count"
ACCEPTED = "hard_label/unary_greedy_accepted_count"
SCOPE = (
    "teacher-forced diagnostics (dflash-dash replay: every completion anchor a block, the stored completion's "
    "tokens the labels); not serving acceptance, speed, or answer accuracy"
)
LABELS = {TOP1: "marginal accuracy (slot j alone)", COND: "conditional acceptance", SURV: "prefix survival"}


class ReportError(UserError, ValueError):
    """A file that is not a successful SpecForge checkpoint evaluation report; the message names the field."""


def counts(p, tokens: np.ndarray, B: int) -> dict[str, np.ndarray | int]:
    """One prompt's block counts: every completion anchor whose accepted(p) was computed and whose block has a slot
    inside the completion is a block; slot j is supervised when anchor + j is inside it."""
    D = B - 1
    acc = np.asarray(p.accepted_at, dtype=np.int64)
    pos = p.prompt_len + np.arange(len(acc))
    left = p.T - 1 - pos  # completion tokens after the anchor
    valid = (acc >= 0) & (left >= 1)
    j = np.arange(1, D + 1)
    inside = valid[:, None] & (left[:, None] >= j)
    out = {
        "blocks": int(valid.sum()),
        "accepted_sum": int(acc[valid].sum()),
        "reached": (inside & (acc[:, None] >= j - 1)).sum(0),
        "accepted": (valid[:, None] & (acc[:, None] >= j)).sum(0),
        "top1_num": np.zeros(D, dtype=np.int64),
        "top1_den": np.zeros(D, dtype=np.int64),
    }
    drafts = np.asarray(p.drafts, dtype=np.int64).reshape(len(acc), -1) if len(p.drafts) else None
    if drafts is not None and drafts.shape[1] >= D:
        label_at = np.minimum(pos[:, None] + j, p.T - 1)  # clipped where not inside (masked out below)
        seen = inside & (drafts[:, :D] >= 0)
        out["top1_den"] = seen.sum(0)
        out["top1_num"] = (seen & (drafts[:, :D] == np.asarray(tokens)[label_at])).sum(0)
    return out


def _ratios(c: dict, D: int) -> tuple[dict, dict]:
    ratio = {LENGTH: [float(c["blocks"] + c["accepted_sum"]), float(c["blocks"])]}
    sums = {BLOCKS: float(c["blocks"])}
    for j in range(1, D + 1):
        k = j - 1
        ratio[f"position_{j}/{TOP1}"] = [float(c["top1_num"][k]), float(c["top1_den"][k])]
        ratio[f"position_{j}/{COND}"] = [float(c["accepted"][k]), float(c["reached"][k])]
        ratio[f"position_{j}/{SURV}"] = [float(c["accepted"][k]), float(c["blocks"])]
        sums[f"position_{j}/{REACHED}"] = float(c["reached"][k])
        sums[f"position_{j}/{ACCEPTED}"] = float(c["accepted"][k])
    return ratio, sums


def specforge_report(prompts: list, tokens: dict[str, np.ndarray], B: int) -> dict:
    """The run's per-position numbers as `evaluate_cached_features` reports them (ratios pooled over all blocks)."""
    D, rows, total = B - 1, [], None
    for p in prompts:
        c = counts(p, tokens[p.id], B)
        ratio, sums = _ratios(c, D)
        rows.append({"id": p.id, "metrics": {}, "ratio_metrics": ratio, "sum_metrics": sums})
        total = c if total is None else {k: total[k] + c[k] for k in c}
    if total is None:
        raise ReportError("the run holds no prompts; nothing to report")
    ratio, sums = _ratios(total, D)
    return {
        "schema_version": SCHEMA,
        "success": True,
        "examples": len(rows),
        "optimizer_updates": 0,
        "metric_scope": SCOPE,
        "mean": {k: (n / d if d else 0.0) for k, (n, d) in ratio.items()},
        "ratio_totals": ratio,
        "sum_totals": sums,
        "rows": rows,
    }


def read_specforge(report) -> dict:
    """{"examples", "accepted_length", "blocks", "positions": {j: {TOP1, COND, SURV: value or None, "n": {...}}}} of a
    SpecForge checkpoint report, checked as `checkpoint_metrics` checks it; ReportError naming the field."""
    if not isinstance(report, dict) or not report.get("success") or not isinstance(report.get("examples"), int):
        raise ReportError("expected a successful SpecForge checkpoint evaluation report (success: true, examples)")
    if report["examples"] <= 0:
        raise ReportError("examples is 0: the report evaluated nothing")
    mean, ratios = report.get("mean"), report.get("ratio_totals") or {}
    if not isinstance(mean, dict) or not isinstance(ratios, dict):
        raise ReportError("expected 'mean' and 'ratio_totals' objects (specforge/eval/checkpoint.py's report)")
    for name, v in mean.items():
        if not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ReportError(f"mean.{name} is {v!r}, expected a finite number")
        pair = ratios.get(name)
        if pair is not None:
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, (int, float)) for x in pair)):
                raise ReportError(f"ratio_totals.{name} is {pair!r}, expected [numerator, denominator]")
            n, d = map(float, pair)
            if d < 0 or (d == 0 and n != 0) or (d and not math.isclose(v, n / d, rel_tol=1e-6, abs_tol=1e-9)):
                raise ReportError(f"mean.{name} disagrees with its pooled counts ratio_totals.{name} {pair}")
    pos: dict[int, dict] = {}
    for name in mean:
        head, _, metric = name.partition("/")
        if head.startswith("position_") and head[9:].isdigit() and metric in LABELS:
            d = (ratios.get(name) or [None, None])[1]
            got = pos.setdefault(int(head[9:]), {"n": {}})
            got[metric], got["n"][metric] = (None if d == 0 else float(mean[name])), d
    if LENGTH not in mean and not pos:
        raise ReportError(
            f"no DFlash-family metric in 'mean' (expected {LENGTH} and position_<j>/{SURV}): another strategy's report?"
        )
    blocks = (report.get("sum_totals") or {}).get(BLOCKS)
    return {"examples": report["examples"], "accepted_length": mean.get(LENGTH), "blocks": blocks, "positions": pos}


def aiperf_records(prompts: list, B: int, engine: str) -> list[dict]:
    """One AIPerf `MetricRecordInfo` per prompt, its chain-walk rounds as the `spec_decode_acceptance` record (a
    round's accepted drafts = its committed tokens - 1, so mean_acceptance_length equals the prompt's tau)."""
    out = []
    for i, p in enumerate(prompts):
        acc = [int(c) - 1 for c in p.rounds]
        steps, drafted = len(acc), (B - 1) * len(acc)
        hist: dict[int, int] = {}
        for a in acc:
            hist[a] = hist.get(a, 0) + 1
        n_out = len(p.accepted_at)
        rec = {
            "engine": engine,
            "mean_acceptance_length": 1 + sum(acc) / steps if steps else 1.0,
            "draft_acceptance_rate": sum(acc) / drafted if drafted else 0.0,
            "acceptance_histogram": {str(k): v for k, v in sorted(hist.items())},
            "num_accepted_draft_tokens": sum(acc),
            "num_draft_tokens": drafted,
            "num_spec_steps": steps,
            "num_spec_tokens": B - 1,
            "completion_tokens": n_out,
            "per_step_accepted": acc,
            "per_step_drafted": [B - 1] * steps,
        }
        out.append(
            {
                "metadata": {  # a replay sends no request: no wall-clock times (0), one "session" per prompt
                    "session_num": i,
                    "conversation_id": p.id,
                    "turn_index": 0,
                    "request_start_ns": 0,
                    "request_end_ns": 0,
                    "worker_id": "dflash-dash-replay",
                    "record_processor_id": "dflash-dash",
                    "benchmark_phase": "profiling",
                },
                "metrics": {
                    "input_sequence_length": {"value": p.prompt_len, "unit": "tokens"},
                    "output_sequence_length": {"value": n_out, "unit": "tokens"},
                },
                "spec_decode_acceptance": rec,
            }
        )
    return out


def _noise(a: float | None, na, b: float | None, nb) -> float | None:
    """Two binomial standard errors of the difference of two rates (None where a count is missing)."""
    if a is None or b is None or not na or not nb:
        return None
    var = a * (1 - a) / na + b * (1 - b) / nb
    return 2 * math.sqrt(max(var, 0.0))


def _why(metric: str, diff: float | None, noise: float | None, ctx: dict) -> str:
    """Why this product's number differs from SpecForge's for the same checkpoint."""
    if diff is None:
        return "not measured on one side (no block reached this position)"
    within = noise is not None and abs(diff) <= noise
    same_cache = bool(ctx.get("same_cache"))
    parts = []
    if within:
        parts.append("within sampling noise (2 standard errors)")
    parts.append(
        "population: SpecForge scores seeded sampled anchor blocks inside the loss mask; the replay scores a block at "
        f"every completion anchor ({ctx.get('anchors', 'every')} anchors)"
    )
    if same_cache:
        parts.append(
            f"same features and labels when SpecForge's feature index ({ctx.get('feature_index')}) lists this run's "
            f"cache ({ctx.get('source')}): a gap beyond noise is then numerics (SpecForge's attention backend and "
            "dtype against the replay's) or the anchors drawn"
        )
    else:
        src = ctx.get("source") or f"completion set {ctx.get('set_name')}"
        parts.append(
            f"labels and features differ: SpecForge teacher-forces the recorded training labels on the trainer's "
            f"capture; this run is {src}, the target's own generations with this product's extraction "
            f"({ctx.get('backend')}). On its own greedy output the target is easier to draft for (acceptance usually "
            "higher); a capture unlike the served features lowers it (audit the cache)"
        )
    if metric == LENGTH:
        parts.append(
            "SpecForge's length is 1 + Σ survival over its blocks, the replay's every-anchor tau (mean accepted(p)+1); "
            "the chain-walk tau a decoder commits is a third number"
        )
    return "; ".join(parts)


def beside(ours: dict, theirs: dict, ctx: dict) -> list[dict]:
    """Rows of this product's numbers (`read_specforge` of `specforge_report`) beside SpecForge's, each with the
    difference, the sampling noise and why they differ. `ctx`: the run's source, set, backend, anchors, same_cache."""
    rows = []
    a, b = ours.get("accepted_length"), theirs.get("accepted_length")
    d = None if a is None or b is None else a - b
    rows.append(
        {
            "metric": "accepted length",
            "position": None,
            "this product": a,
            "SpecForge": b,
            "difference": d,
            "noise": None,
            "why": _why(LENGTH, d, None, ctx),
        }
    )
    for j in sorted(set(ours["positions"]) | set(theirs["positions"])):
        o, t = ours["positions"].get(j, {"n": {}}), theirs["positions"].get(j, {"n": {}})
        for m, label in LABELS.items():
            x, y = o.get(m), t.get(m)
            d = None if x is None or y is None else x - y
            noise = _noise(x, o["n"].get(m), y, t["n"].get(m))
            rows.append(
                {
                    "metric": label,
                    "position": j,
                    "this product": x,
                    "SpecForge": y,
                    "difference": d,
                    "noise": noise,
                    "why": _why(m, d, noise, ctx),
                }
            )
    return rows


def sources(runs: list[Run], extractions: list[Extraction]) -> list[dict]:
    """Every run of each checkpoint that also ran on a trainer's cache, one row each: its source (the trainer's
    cache, or an extraction of a completion set: the target's generations), backend, tau and every-anchor tau."""
    exs = {e.id: e for e in extractions}
    on_cache = {r.checkpoint for r in runs if (r.summary or {}).get("source")}
    out = []
    for r in runs:
        if r.checkpoint not in on_cache:
            continue
        s, e = r.summary or {}, exs.get(r.extraction_id or "")
        out.append(
            {
                "checkpoint": r.name,
                "run": r.id,
                "source": s.get("source") or f"completion set {e and e.set_name} (extraction {e and e.id})",
                "features": "the trainer's capture" if s.get("source") else f"this product's ({e and e.backend})",
                "tau": s.get("tau_macro"),
                "every-anchor tau": s.get("every_anchor_tau"),
                "prompts": s.get("prompts"),
            }
        )
    return out
