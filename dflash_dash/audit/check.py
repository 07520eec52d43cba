"""The audit: a trainer's captured features against the product's own recomputation of the same positions.

Contract: `run(cache, target, layer_ids, samples, device, dtype, progress)` loads the target cut after the deepest
layer it needs (`target.load`: fla kernels on CUDA where they import, the torch path FORCED on CPU; the backend is
recorded), recomputes every sample's token ids (`target.extract`: the OUTPUT of layer l, Hugging Face
`hidden_states[l+1]`; layer -1 is the embedding, `hidden_states[0]`) and compares, per cached target layer l:
- rel_l2 = ||C - R|| / ||R|| and cosine (mean over positions) against layer l's recomputation R, over the rows
  that are finite and not all zero; the shares of all-zero and of non-finite rows;
- the fit against layers l-2..l+2 and one-token position shifts (cache row t against recomputed row t+s,
  s in -1..1): the pair with the lowest rel_l2 is the best fit, so an off-by-one names itself;
- scale (the least-squares factor a with C ~ a R) and the rel_l2 left after it; the cache's dtype and its RMS;
- the level of the error at (l, 0): exact, the cache dtype's storage rounding, a kernel-backend level
  (`BACKEND_REL_L2`, well below the distance to the adjacent layers) or a mismatch.
Each layer gets a finding and what it means for a drafter trained on those features; `verdict` joins them.
Numbers in, numbers out: no store, no files other than the target folder and the cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .. import target as target_mod
from ..target_info import TargetError, describe
from .formats import Cache, FeatureError

OFFSETS = (-2, -1, 0, 1, 2)  # layer offsets tried: cached layer l against recomputed layer l+o
SHIFTS = (-1, 0, 1)  # position shifts tried: cached row t against recomputed row t+s
EXACT = 1e-5  # rel_l2 at or below: the same numbers (float32 reductions in another order)
# fla against the torch path: the known level, measured by benchmarks/RESULTS.md at the 27B reference shapes in bf16
# (relative L2 from 1.6e-2 at layer 1 to 9.7e-2 at layer 61, fla's causal conv against transformers' kernels) and by
# the Diagnostics page's backend parity on the tiny demo target (1.0e-3..1.6e-3). dflash_dash/parity.py measures it
# per extraction pair but records no level of its own, so this is the documented bound: a layer whose error is at
# or below it AND below half the distance to its adjacent layers is the same layer with other kernels or precision
BACKEND_REL_L2 = 0.1
LAST_KEPT = ("dspark", "deepspec")  # strategies whose captures keep the target's post-norm last hidden state
SCALE_OFF = 0.02  # |a - 1| above this, with the rescaled error at a backend level: a scale change
Progress = Callable[[int, int, str], None] | None


@dataclass
class _Acc:
    """Sums over positions for one cached layer."""

    d2: dict = field(default_factory=dict)  # (offset, shift) -> sum ||C - R||^2
    r2: dict = field(default_factory=dict)  # (offset, shift) -> sum ||R||^2
    cos: dict = field(default_factory=dict)  # (offset, shift) -> sum of row cosines
    n: dict = field(default_factory=dict)  # (offset, shift) -> rows compared
    rows: int = 0  # rows seen
    zero: int = 0  # all-zero rows
    bad: int = 0  # rows holding NaN or inf
    cr: float = 0.0  # sum <C, R> at (0, 0)
    cc: float = 0.0  # sum ||C||^2 over the valid rows
    nb2: dict = field(default_factory=dict)  # adjacent offset -> sum ||R_l - R_{l+o}||^2 (the layers' own distance)

    def add(self, key, d2, r2, cos, n):
        for m, v in ((self.d2, d2), (self.r2, r2), (self.cos, cos), (self.n, n)):
            m[key] = m.get(key, 0.0) + v


def storage_level(dtype: torch.dtype) -> float:
    """The rel_l2 that rounding to `dtype` alone leaves (half its machine epsilon); EXACT for float32 and wider."""
    return EXACT if torch.finfo(dtype).bits >= 32 else torch.finfo(dtype).eps / 2


def _compare(acc: _Acc, key, c: torch.Tensor, r: torch.Tensor, ok: torch.Tensor) -> None:
    """Add cached rows c against recomputed rows r (same length), over the rows `ok`."""
    c, r = c[ok], r[ok]
    if not len(c):
        return
    d = c - r
    cos = torch.nn.functional.cosine_similarity(c, r, dim=-1, eps=1e-12)
    acc.add(key, float(d.pow(2).sum()), float(r.pow(2).sum()), float(cos.sum()), len(c))


def _accumulate(acc: _Acc, c: torch.Tensor, rec: dict[int, torch.Tensor], l: int) -> None:
    """One sample's cached block c [T, H] of layer l against the recomputed layers `rec` {layer: [T, H]}."""
    T = c.shape[0]
    finite = torch.isfinite(c).all(-1)
    zero = finite & (c == 0).all(-1)
    ok = finite & ~zero
    acc.rows += T
    acc.zero += int(zero.sum())
    acc.bad += int((~finite).sum())
    c = torch.where(ok[:, None], c, torch.zeros((), dtype=c.dtype, device=c.device))
    for o in OFFSETS:
        r = rec.get(l + o)
        if r is None:
            continue
        for s in SHIFTS:
            lo, hi = max(0, -s), min(T, T - s)  # cached rows t whose row t+s exists
            if hi > lo:
                _compare(acc, (o, s), c[lo:hi], r[lo + s : hi + s], ok[lo:hi])
    r0 = rec[l]
    acc.cr += float((c[ok] * r0[ok]).sum())
    acc.cc += float(c[ok].pow(2).sum())
    for o in (-1, 1):
        if l + o in rec:
            acc.nb2[o] = acc.nb2.get(o, 0.0) + float((r0[ok] - rec[l + o][ok]).pow(2).sum())


def _stats(acc: _Acc, key) -> dict | None:
    if not acc.n.get(key):
        return None
    rel = (acc.d2[key] ** 0.5) / max(acc.r2[key] ** 0.5, 1e-30)
    return {"rel_l2": rel, "cosine": acc.cos[key] / acc.n[key]}


def _name(l: int) -> str:
    return "the embedding (hidden_states[0])" if l < 0 else f"layer {l}'s output (hidden_states[{l + 1}])"


def judge(l: int, acc: _Acc, dtype: torch.dtype) -> dict:
    """One cached layer's numbers, finding, level and meaning for a drafter trained on it."""
    fits = {f"{o},{s}": st for o in OFFSETS for s in SHIFTS if (st := _stats(acc, (o, s))) is not None}
    own = fits.get("0,0")
    row = {
        "layer": l,
        "rows": acc.rows,
        "zero_share": acc.zero / max(acc.rows, 1),
        "nonfinite_share": acc.bad / max(acc.rows, 1),
        "rel_l2": own and own["rel_l2"],
        "cosine": own and own["cosine"],
        "fits": fits,
    }
    r2 = acc.r2.get((0, 0), 0.0)
    row["scale"] = acc.cr / r2 if r2 else None  # least squares a: C ~ a R
    row["rms_ratio"] = (acc.cc / r2) ** 0.5 if r2 else None
    nb = [(acc.nb2[o] / r2) ** 0.5 for o in acc.nb2 if r2]
    row["neighbour_rel_l2"] = min(nb) if nb else None  # how far layer l is from its adjacent layers
    best = min(fits, key=lambda k: fits[k]["rel_l2"]) if fits else None
    row["best_offset"], row["best_shift"] = (int(x) for x in best.split(",")) if best else (None, None)
    row["best_rel_l2"] = fits[best]["rel_l2"] if best else None
    row |= _finding(l, row, acc, dtype)
    return row


def _finding(l: int, row: dict, acc: _Acc, dtype: torch.dtype) -> dict:
    """kind, fault, finding (with its evidence), meaning."""
    pct = lambda x: f"{100 * x:.1f} %"  # noqa: E731
    store = storage_level(dtype)
    if row["rel_l2"] is None:  # no valid row at all
        if row["zero_share"] >= 1:
            return _f(
                "zeros",
                True,
                f"layer {l}'s features are all zeros ({acc.rows} rows): the capture never wrote "
                "this layer (seen with hybrid targets whose linear-attention layers the capture hook skips)",
                "the drafter's fc learned to ignore this tap; an engine feeds it real values there, inputs it "
                "never saw: acceptance drops with no error. Capture again with the layer written.",
            )
        return _f(
            "nonfinite",
            True,
            f"layer {l}: every row is NaN or inf ({acc.rows} rows)",
            "training on it turns every loss NaN; the checkpoint trained on it is not usable.",
        )
    found = []
    if row["nonfinite_share"] > 0:
        found.append(
            _f(
                "nonfinite",
                True,
                f"layer {l}: {pct(row['nonfinite_share'])} of rows hold NaN or inf",
                "each batch holding one trains on a NaN loss (SpecForge's writer skips records with a NaN, "
                "so these were written otherwise or damaged after)",
            )
        )
    if row["zero_share"] > 0:
        found.append(
            _f(
                "zeros",
                True,
                f"layer {l}: {pct(row['zero_share'])} of rows are all zeros",
                "the drafter learned those positions from an empty tap; served, they are real values",
            )
        )
    o, s, best, own = row["best_offset"], row["best_shift"], row["best_rel_l2"], row["rel_l2"]
    ev = f"rel-L2 {best:.3g} against it, {own:.3g} against layer {l}'s own output"
    if (o, s) != (0, 0) and best <= BACKEND_REL_L2 and best < own / 2:
        if o:
            how = {
                -1: ": the capture reads hidden_states[l] for layer l (the layer's input)",
                1: ": the capture reads hidden_states[l+2] for layer l (one layer too deep)",
            }.get(o, "")
            what = f"layer {l}'s features are {_name(l + o)}{how}"
        else:
            what = f"layer {l}'s features are layer {l}'s output"
        if s:
            what += (
                f", positions shifted by one token: row t holds token t{s:+d}'s state "
                f"({'one token early: each position sees its next token' if s > 0 else 'one token late'})"
            )
        kind = "offset" if o and not s else "shift" if s and not o else "offset+shift"
        mean = []
        if o:
            mean.append(
                f"a drafter trained on these learned {_name(l + o)} under the name of layer {l}; engines "
                f"feed layer {l}'s output (hidden_states[{l + 1}]), features it never saw: acceptance drops "
                "silently. Capture again with the right layers, or retrain"
            )
        if s > 0:
            mean.append(
                "its context at anchor p held token p's own state (the anchor-visible shortcut): it learns "
                "to copy and fails when served"
            )
        elif s < 0:
            mean.append(
                "it learned from context one token stale; served with current states its drafts shift by a position"
            )
        found.append(_f(kind, True, f"{what} ({ev})", "; ".join(mean)))
        return _merge(found)
    a = row["scale"]
    if a and abs(a - 1) > SCALE_OFF:
        resid = max(acc.cc - 2 * a * acc.cr + a * a * acc.r2[(0, 0)], 0.0) ** 0.5 / acc.r2[(0, 0)] ** 0.5
        if resid <= BACKEND_REL_L2 and resid < own / 2:
            found.append(
                _f(
                    "scale",
                    True,
                    f"layer {l}'s features are its output scaled by {a:.4g} (rel-L2 "
                    f"{resid:.3g} after rescaling, {own:.3g} before)",
                    "the drafter's fc learned that scale; served unscaled, the mixture of its taps shifts: "
                    "expect lower acceptance",
                )
            )
            return _merge(found)
    nb = row["neighbour_rel_l2"]
    far = nb is None or own < nb / 2
    base = f"rel-L2 {own:.3g}, cosine {row['cosine']:.6f}"
    if own <= EXACT:
        found.append(_f("exact", False, f"layer {l} equals the recomputation ({base})", "features as served"))
    elif own <= store:
        found.append(
            _f(
                "storage",
                False,
                f"layer {l} equals the recomputation at {str(dtype)[6:]} storage "
                f"precision ({base}; rounding alone leaves up to {store:.2g})",
                "storage rounding only",
            )
        )
    elif own <= BACKEND_REL_L2 and far:
        near = f"; the adjacent layers are {nb:.3g} apart" if nb is not None else ""
        found.append(
            _f(
                "backend",
                False,
                f"layer {l} differs at a kernel-backend level ({base}{near}): the same "
                f"layer computed with other kernels or precision (fla against torch reaches up to "
                f"{BACKEND_REL_L2:g}), not a different layer",
                "trained on numerics the engine may not serve: small, systematic; compare tau on both (Backend parity)",
            )
        )
    else:
        found.append(
            _f(
                "mismatch",
                True,
                f"layer {l} matches no layer within ±2, no one-token shift and no scale "
                f"({base}; best rel-L2 {best:.3g} at layer {l + o}, shift {s:+d}): features of another "
                "model or checkpoint, or a layer run differently (a sliding-window layer run as full "
                "attention)",
                "the drafter learned on features the served target does not produce",
            )
        )
    return _merge(found)


def _f(kind, fault, finding, meaning) -> dict:
    return {"kind": kind, "fault": fault, "finding": finding, "meaning": meaning}


def _merge(found: list[dict]) -> dict:
    return {
        "kind": "+".join(dict.fromkeys(f["kind"] for f in found)),
        "fault": any(f["fault"] for f in found),
        "finding": "; ".join(f["finding"] for f in found),
        "meaning": "; ".join(f["meaning"] for f in found if f["fault"]) or found[-1]["meaning"],
    }


def layers_needed(layer_ids: list[int], n_layers: int) -> list[int]:
    """Every layer a fit needs: l-2..l+2 of each id, within the embedding (-1) and the target's last layer."""
    return sorted({l + o for l in layer_ids for o in OFFSETS if -1 <= l + o < n_layers})


def run(
    cache: Cache,
    target: str,
    layer_ids: list[int],
    samples: int | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    progress: Progress = None,
) -> dict:
    """Audit `cache` (its first `samples` samples) against `target`'s recomputation; the report (plain JSON)."""
    info = describe(target)
    H = info.hidden_size
    if cache.hidden_size is not None and cache.hidden_size != H:
        raise FeatureError(
            f"{cache.path}: hidden_size {cache.hidden_size}, the target {info.path} has {H}: a cache "
            "of another target; give the target it was captured from"
        )
    bad = [l for l in layer_ids if not -1 <= l < info.num_layers]
    if bad:
        raise TargetError(
            f"layers: id {bad[0]} is out of range: {info.path} has {info.num_layers} layers (ids 0.."
            f"{info.num_layers - 1}, -1 the embedding)"
        )
    need = layers_needed(layer_ids, info.num_layers)
    if cache.strategy in LAST_KEPT:  # the post-norm last hidden state is audited too: the whole decoder runs
        need = sorted(set(need) | {info.num_layers - 1})
    hooked = [l for l in need if l >= 0]
    t0 = time.perf_counter()
    decoder, backend = target_mod.load(target, hooked, device, getattr(torch, dtype))
    embed = decoder.get_input_embeddings()
    norm = getattr(decoder, "norm", None) if hooked[-1] == info.num_layers - 1 else None
    K = len(layer_ids)
    accs = [_Acc() for _ in layer_ids]
    last_acc, n, positions, dtypes = _Acc(), 0, 0, set()
    total = cache.count if samples is None else min(samples, cache.count)
    for smp in cache.samples(total):
        T, W = smp.hidden.shape
        if W != K * H:
            raise FeatureError(
                f"{cache.path / smp.name}: hidden states {W} wide, expected {K} layers x {H} = {K * H}"
                f" (layers {layer_ids}); the cache holds {W / H:g} layers of this target: give its "
                "layer ids (the draft config's dflash_config.target_layer_ids)"
            )
        dtypes.add(str(smp.hidden.dtype).replace("torch.", ""))
        ids = smp.input_ids.to(next(decoder.parameters()).device)
        feats = target_mod.extract(decoder, ids, hooked).float()
        rec = {l: feats[:, i * H : (i + 1) * H] for i, l in enumerate(hooked)}
        if -1 in need:
            with torch.inference_mode():
                rec[-1] = embed(ids).float()
        c = smp.hidden.to(feats.device).float().view(T, K, H)
        for k, l in enumerate(layer_ids):
            _accumulate(accs[k], c[:, k], rec, l)
        if smp.last is not None and norm is not None:
            with torch.inference_mode():
                ref = norm(rec[info.num_layers - 1].to(next(norm.parameters()).dtype)).float()
            _accumulate(last_acc, smp.last.to(feats.device).float(), {0: ref}, 0)
        n, positions = n + 1, positions + T
        if progress:
            progress(n, total, f"sample {smp.name}: {T} positions")
    seconds = time.perf_counter() - t0
    cache_dtype = getattr(torch, sorted(dtypes)[0]) if dtypes else torch.bfloat16
    rows = [judge(l, a, cache_dtype) for l, a in zip(layer_ids, accs)]
    out = {
        "features": str(cache.path),
        "format": cache.format,
        "strategy": cache.strategy,
        "source": cache.source,
        "target": str(info.path),
        "layers": layer_ids,
        "hidden_size": H,
        "samples": n,
        "positions": positions,
        "dtype": ", ".join(sorted(dtypes)),
        "recompute": {"device": device, "dtype": dtype, "backend": backend, **target_mod.versions()},
        "rows": rows,
        "seconds": seconds,
    }
    if last_acc.rows:
        last = _stats(last_acc, (0, 0))
        out["last"] = {
            "rel_l2": last and last["rel_l2"],
            "cosine": last and last["cosine"],
            "zero_share": last_acc.zero / last_acc.rows,
            "nonfinite_share": last_acc.bad / last_acc.rows,
        }
    out |= verdict(rows, out)
    return out


def verdict(rows: list[dict], out: dict) -> dict:
    """The audit's verdict in words: clean, or each faulty layer's finding and what it means for the drafter."""
    faults = [r for r in rows if r["fault"]]
    rec = out["recompute"]
    how = f"recomputed on {rec['device']} ({rec['backend']} kernels, {rec['dtype']})"
    if not faults:
        worst = max((r["rel_l2"] or 0) for r in rows)
        kernel = [r for r in rows if r["kind"] == "backend"]
        note = (
            (
                f"; layers {[r['layer'] for r in kernel]} differ at a kernel-backend level (not another layer): "
                f"{kernel[0]['meaning']}"
            )
            if kernel
            else ": a drafter trained on these features saw what an engine feeds it"
        )
        return {
            "clean": True,
            "verdict": f"clean: every target layer {out['layers']} is the layer it names "
            f"(worst rel-L2 {worst:.3g}; {how}, {out['samples']} samples, {out['positions']} positions){note}",
        }
    kinds = sorted({k for r in faults for k in r["kind"].split("+")})
    return {
        "clean": False,
        "faults": kinds,
        "verdict": f"{len(faults)} of {len(rows)} layers faulty ({how}): "
        + " | ".join(f"{r['finding']}. For the drafter: {r['meaning']}" for r in faults),
    }
