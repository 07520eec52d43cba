"""Training-bug signatures: the measurements that tell a checkpoint trained with one of the three known bugs apart
from a healthy reference, and the comparison of a run against that reference.

The bugs (the seeds of this product): (1) noisy labels: diffusion noise corrupting the target logits used as labels;
(2) a shortcut: the drafter's `fc` fed, in training, the anchor's own hidden state that gives the answer away (at
inference it is absent, so the drafts come out one position behind); (3) a soft KL against the target's
distribution where hard cross-entropy on the target's tokens was meant.

Contract: numpy and the metric registry only. `SIGNATURES` is the one registry: each `Signature` turns one prompt
into a row of counts (`parts`) and the counts summed over prompts into its figure (`stat`), so the figure of a run
is stat(sum of parts) and its 95 % interval a bootstrap over prompts of the same (`metrics.bootstrap_sums`).
`measure(ps, block_size, lag)` gives a run's parts as one JSON-able dict (the pipeline keeps it per run as the
analysis "signatures"); `compare(run, reference, run_attribution, reference_attribution)` gives one row per
signature: both figures, their intervals, the difference, whether it separates and what it suggests. A run-level
signature (layer attribution) reads the run's attribution rows instead (no interval: a fixed threshold).
Left out: disagreement with the target's top-1 where the target is confident: it needs the target's own
probabilities, which an extraction never computes (it stops before the LM head) and no run stores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import metrics
from ..metrics.headroom import ranked
from . import rounded

if TYPE_CHECKING:
    from ..store import Run

VERSION = 2  # of the kept value: a kept value of another version is measured again
BINS = metrics.CAL_BINS  # reliability bins of the ECE signature
UNSURE = 0.5  # p_k below which a draft counts as one its drafter doubts (the under-confidence signature)
OVER = 0.2  # mean p_1 above P(d_1 accepted) by this much: the run is over-confident in itself (not only beside
# its reference, which may be under-confident)


@dataclass(frozen=True)
class Signature:
    key: str  # stable id (kept values, URLs, the CLI's JSON)
    label: str  # shown in the table
    formula: str  # what it measures, in plain text
    parts: Callable | None  # (Prompt, Ctx, lag triple | None) -> counts [j] of one prompt; None: from attribution
    stat: Callable  # summed counts [..., j] -> figure [...] (attribution: rows -> figure)
    up: str | None  # what a figure above the reference's suggests (None: no bug moves it up)
    down: str | None  # what a figure below the reference's suggests (None: no bug moves it down)
    floor: float  # the smallest |difference| that separates (beside intervals that do not overlap)
    needs: str = ""  # the data it reads, named when a run lacks it


def _ratio(x):
    return x[..., 0] / x[..., 1]


def _lag1(p, ctx, lag):
    if lag is None:
        return None
    n, lagged, _ = lag
    return [lagged[0], n[0]] if n else [0, 0]


def _accept(p, ctx, lag):
    """[hit at depth 1, reached at depth 1, hit at depths >= 2, reached at depths >= 2] over the chain rounds."""
    _, reach, hit = metrics.depth_counts([p], ctx)
    return [hit[0], reach[0], sum(hit[1:]), sum(reach[1:])]


def _slot1(p, ctx, lag):
    """[sum of p_1, accepted at slot 1, rounds] over the chain rounds (the calibration samples at depth 1)."""
    if not metrics.recorded(p, ctx):
        return None
    k, q, ok = metrics.cal_arrays(p, ctx)
    one = k == 1
    return [float(q[one].sum()), int(ok[one].sum()), int(one.sum())]


def _bins(p, ctx, lag):
    """Per reliability bin: samples, summed p_k, accepted (every depth); [3 * BINS]."""
    if not metrics.recorded(p, ctx):
        return None
    _, q, ok = metrics.cal_arrays(p, ctx)
    b = np.minimum((q * BINS).astype(np.int64), BINS - 1)
    return np.concatenate(
        [np.bincount(b, minlength=BINS), np.bincount(b, q, BINS), np.bincount(b[ok], minlength=BINS)]
    ).tolist()


def _ece(x):
    n, sp, hit = x[..., :BINS], x[..., BINS : 2 * BINS], x[..., 2 * BINS :]
    return np.abs(hit - sp).sum(-1) / n.sum(-1)  # sum_b n_b/N |observed_b - predicted_b|


def _doubt(p, ctx, lag):
    """[sum of (accepted - p_k) over the samples with p_k < UNSURE, samples] (every depth, the chain rounds)."""
    if not metrics.recorded(p, ctx):
        return None
    _, q, ok = metrics.cal_arrays(p, ctx)
    low = q < UNSURE
    return [float((ok[low] - q[low]).sum()), len(q)]


def _headroom(p, ctx, lag):
    """[target token in the top-K but not the draft, samples] over the recall samples (the target's path)."""
    if not ranked(p, ctx):
        return None
    D = ctx.block_size - 1
    rows, _, take = p.reached(D)
    r = p.target_rank.reshape(-1, D)[rows][take]
    return [int((r > 0).sum()), len(r)]


def _top_tap(rows: list[dict]) -> float | None:
    """Share of the tau lost (macro) that the most costly tap carries, over the taps that cost anything."""
    lost = [max(r["tau_lost_macro"] or 0.0, 0.0) for r in rows]
    return max(lost) / sum(lost) if rows and sum(lost) > 0 else None


SHORTCUT = "anchor-visible shortcut"  # fc fed the anchor's own hidden state in training
SOFT = "soft KL"  # a soft KL against the target's distribution instead of hard CE on its tokens
NOISY = "noisy labels"  # diffusion noise on the target logits used as labels
LESS = "less training"  # an under-trained healthy drafter moves the signatures that name it the same way

SIGNATURES: list[Signature] = [
    Signature(
        "lag_1",
        "draft lag at slot 1",
        "#(d_1 = t[p]) / #anchors p with t[p+1] != t[p]: the first draft equals the anchor's own token",
        _lag1,
        _ratio,
        f"drafts one position behind: {SHORTCUT} (when not less sure at slot 1: an unsure drafter that echoes "
        "the anchor is under-trained)",
        None,
        0.25,  # an under-trained drafter echoes the anchor now and then (demo early: 0.13), the shortcut mostly
        "the completions' tokens",
    ),
    Signature(
        "accept_1",
        "acceptance at slot 1",
        "P(d_1 accepted) over the chain rounds",
        lambda p, ctx, lag: _accept(p, ctx, lag)[:2],
        _ratio,
        None,
        f"a weaker first draft: any bug, or {LESS} (the rows below tell which)",
        0.03,
    ),
    Signature(
        "decay",
        "acceptance decay past slot 1",
        "P(d_1 accepted) − P(d_k accepted | d_1..d_{k-1} accepted) pooled over k = 2..B-1, over the chain rounds",
        _accept,
        lambda x: x[..., 0] / x[..., 1] - x[..., 2] / x[..., 3],
        f"far slots fall off faster than the first: {NOISY}, or {LESS} (an under-trained drafter gets its first "
        "draft right before any further one)",
        f"the first slot fails more than the far ones: {SHORTCUT}",
        0.05,
    ),
    Signature(
        "confidence_1",
        "confidence at slot 1",
        "mean over chain rounds of p_1 = exp(top-1 log-probability of d_1)",
        _slot1,
        lambda x: x[..., 0] / x[..., 2],
        f"sure of its drafts: {SHORTCUT}",
        f"a spread distribution: {SOFT} or {NOISY}, or {LESS} (over-confidence tells them apart)",
        0.05,
        "draft log-probabilities",
    ),
    Signature(
        "overconfidence_1",
        "over-confidence at slot 1",
        "mean p_1 − P(d_1 accepted), over the chain rounds",
        _slot1,
        lambda x: (x[..., 0] - x[..., 1]) / x[..., 2],
        f"over-confident: {SHORTCUT} when the draft lag separates too, else {NOISY}",
        f"under-confident: {SOFT} (p copies the target's probability, not the chance of a match)",
        0.2,  # an early healthy run stays calibrated (demo: 0.02); noisy labels 0.30, the shortcut 0.99
        "draft log-probabilities",
    ),
    Signature(
        "ece",
        "calibration error (ECE)",
        f"sum over {BINS} bins of p_k of (n_b / N)·|accepted share − mean p_k|, every depth, the chain rounds",
        _bins,
        _ece,
        f"probabilities do not predict acceptance (an under-trained drafter stays calibrated): over-confident, "
        f"{NOISY} ({SHORTCUT} when the lag separates too); under-confident, {SOFT}",
        None,
        0.05,
        "draft log-probabilities",
    ),
    Signature(
        "doubt",
        "under-confidence where unsure",
        f"sum over the drafts with p_k < {UNSURE} of (accepted − p_k), over all drafts (every depth, the chain "
        "rounds): acceptance its doubtful drafts get beyond what their probability claims",
        _doubt,
        _ratio,
        f"right where it doubts: {SOFT} (its probability copies the target's split at a near-tie, while its pick "
        "still matches the target's)",
        f"wrong where it doubts, beyond what its probability says: {NOISY}, or {LESS}",
        0.008,  # demo: soft KL 0.015, the healthy run at a tenth of its steps 0.003, the final 0.000
        "draft log-probabilities",
    ),
    Signature(
        "headroom",
        "top-K headroom",
        "share of samples (d_1..d_{k-1} accepted) whose target token is among the top-K candidates but not the "
        "draft = top-K recall − top-1 recall",
        _headroom,
        _ratio,
        f"the target's token is there but ranked below: {NOISY} or {SOFT}, or {LESS}",
        f"the target's token is missing from the candidates, not just ranked low: {SHORTCUT}, or {LESS}",
        0.03,
        "top-K ranks (every-anchor replays)",
    ),
    Signature(
        "attribution_top",
        "attribution on one tap",
        "the most costly tap's share of the tau lost (macro) over all taps (target-layer attribution)",
        None,
        _top_tap,
        f"leans on one target layer: {SHORTCUT}",
        None,
        0.2,
        "both runs attributed (Attribute)",
    ),
]
BY_KEY = {s.key: s for s in SIGNATURES}


def measure(ps: list[metrics.Prompt], block_size: int, lag: dict[str, list] | None = None) -> dict:
    """A run's per-prompt counts of every per-prompt signature (JSON-able, kept per run): {"version",
    "block_size", "prompts": ids, "parts": {key: [counts per prompt] or None where the run lacks the data}}.
    `lag`: {prompt id: metrics.lag_counts triple} (the kept analysis "lag"); None: lag not measured."""
    ctx = metrics.Ctx(block_size, 0)
    out: dict = {"version": VERSION, "block_size": block_size, "prompts": [p.id for p in ps], "parts": {}}
    for s in SIGNATURES:
        if s.parts is None:
            continue
        rows = [s.parts(p, ctx, None if lag is None else lag.get(p.id)) for p in ps]
        got = [r for r in rows if r is not None]
        out["parts"][s.key] = [[float(v) for v in r] for r in got] if got else None
    return out


def figure(kept: dict, key: str) -> tuple[float | None, list[float] | None]:
    """(figure, 95 % bootstrap interval over prompts) of signature `key` from a run's kept counts; (None, None)
    where the run lacks the data. Prompts without a sample (all counts 0) are left out."""
    parts = (kept.get("parts") or {}).get(key)
    if not parts:
        return None, None
    v = np.asarray(parts, dtype=float)
    v = v[v.any(axis=1)]
    if not len(v):
        return None, None
    s = BY_KEY[key].stat
    with np.errstate(divide="ignore", invalid="ignore"):
        val = float(s(v.sum(axis=0)))
    return (None if np.isnan(val) else val), metrics.bootstrap_sums(v, s)


def compare(
    run: dict, reference: dict, run_attribution: list[dict] | None = None, ref_attribution: list[dict] | None = None
) -> list[dict]:
    """One row per signature of `run` against `reference` (both `measure` values; attribution: each run's
    `attribution_rows`, [] or None when not attributed): key, label, formula, run and reference figures with
    their intervals, difference (run − reference), separates (True: intervals do not overlap and |difference| >=
    the signature's floor; run-level ones: |difference| >= floor; None: not measured on both), direction ("up",
    "down", None), suggests (the text of that direction when it separates) and why (not measured: which data)."""
    out = []
    for s in SIGNATURES:
        if s.parts is None:
            a, b = s.stat(run_attribution or []), s.stat(ref_attribution or [])
            ia = ib = None
        else:
            a, ia = figure(run, s.key)
            b, ib = figure(reference, s.key)
        diff = None if a is None or b is None else a - b
        sep = None if diff is None else _separates(diff, ia, ib, s.floor)
        direction = None if not diff else ("up" if diff > 0 else "down")
        text = (s.up if direction == "up" else s.down) if sep else None
        out.append(
            {
                "key": s.key,
                "label": s.label,
                "formula": s.formula,
                "run": rounded(a, 4),
                "run_ci": [rounded(x, 4) for x in ia] if ia else None,
                "reference": rounded(b, 4),
                "reference_ci": [rounded(x, 4) for x in ib] if ib else None,
                "difference": rounded(diff, 4),
                "separates": sep,
                "direction": direction,
                "suggests": text if text else ("differs, not the way a known bug moves it" if sep else None),
                "why": f"not measured on both runs: needs {s.needs}" if sep is None and s.needs else None,
            }
        )
    return out


BUGS = (SHORTCUT, SOFT, NOISY)


def points_to(rows: list[dict]) -> dict[str, int]:
    """{bug: how many separating signatures name it} over `compare` rows, most named first (bugs none names left
    out): the section's one-line verdict. A suggestion that also names less training (an under-trained healthy
    drafter moves it the same way) counts for no bug. The draft lag names the shortcut only where the run is not
    less sure at slot 1 than the reference (the shortcut is sure of its lagging drafts; an under-trained drafter
    that echoes the anchor is not). Over-confidence above the reference's counts only for a run over-confident in
    itself (its own figure at least OVER: beside an under-confident reference, a calibrated run also sits above):
    for the shortcut when that lag separates too, else for noisy labels. Miscalibration counts the same way for an
    over-confident run, and for soft KL for an under-confident one (its own over-confidence below zero)."""
    by = {r["key"]: r for r in rows}

    def moved(key: str, direction: str) -> bool:
        r = by.get(key)
        return bool(r and r["separates"] and r["direction"] == direction)

    unsure = moved("confidence_1", "down")
    lagged = moved("lag_1", "up") and not unsure
    high = SHORTCUT if lagged else NOISY
    over = (by.get("overconfidence_1") or {}).get("run")  # the run's own mean p_1 - P(d_1 accepted)
    named = []
    for r in rows:
        if not (r["separates"] and r["suggests"]) or LESS in r["suggests"]:
            continue
        if r["key"] == "lag_1" and unsure:
            continue  # an unsure drafter echoing the anchor: less training, not the shortcut
        if r["key"] == "overconfidence_1" and r["difference"] > 0:
            if over is not None and over >= OVER:
                named.append(high)
        elif r["key"] == "ece" and r["difference"] > 0:
            named.append(SOFT if over is not None and over < 0 else high)
        else:
            named.append(r["suggests"])
    got = {b: sum(1 for t in named if b in t) for b in BUGS}
    return dict(sorted(((b, n) for b, n in got.items() if n), key=lambda x: -x[1]))


def _separates(diff: float, ia: list | None, ib: list | None, floor: float) -> bool:
    """|diff| >= floor, and where both runs have intervals, the intervals do not overlap."""
    if abs(diff) < floor:
        return False
    if ia and ib:
        return ia[0] > ib[1] or ib[0] > ia[1]
    return True


def reference_for(runs: list[Run], run_id: str | None) -> str | None:
    """The default reference of run `run_id`: the healthiest run (highest tau_macro) on its extraction other than
    itself, else the healthiest run anywhere other than itself. `runs` as Store.runs lists them."""
    tau = lambda r: (r.summary or {}).get("tau_macro")  # noqa: E731
    by = {r.id: r for r in runs}
    ex = by[run_id].extraction_id if run_id in by else None
    for pool in ([r for r in runs if r.extraction_id == ex], runs):
        got = [r for r in pool if r.id != run_id and tau(r) is not None]
        if got:
            return max(got, key=tau).id
    return None


def default_pair(runs: list[Run]) -> tuple[str, str] | None:
    """(run, reference) a view opens with: on the extraction holding the most runs with a tau (ties: the newest
    such extraction), the reference is the healthiest run (highest tau_macro) and the run the least healthy other
    one. None for fewer than two runs with a tau on one extraction."""
    tau = lambda r: (r.summary or {}).get("tau_macro")  # noqa: E731
    by_ex: dict[str | None, list[Run]] = {}
    for r in runs:
        if tau(r) is not None:
            by_ex.setdefault(r.extraction_id, []).append(r)
    pools = [(len(rs), i, rs) for i, rs in enumerate(by_ex.values()) if len(rs) >= 2]
    if not pools:
        return None
    rs = max(pools, key=lambda x: (x[0], x[1]))[2]
    ref = max(rs, key=tau)
    return min((r for r in rs if r is not ref), key=tau).id, ref.id
