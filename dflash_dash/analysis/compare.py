"""Runs side by side: which run Acceptance and which two runs Compare open with, per-prompt tau deltas, the
one-position draft lag per slot, two checkpoint configs key by key, and a checkpoint sweep's tau against training step.

Contract: pure functions over store rows (`store.Run`s oldest first as Store.runs lists them, run_prompts rows by
prompt id, the kept "lag" analysis) that return plain rows with numbers rounded for tables (`analysis.rounded`);
sorting is part of the contract (the pages show the rows as they come). Column names are the pages' headers.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .. import metrics
from . import rounded

if TYPE_CHECKING:
    from ..store import Run

SERVING_BACKENDS = ("fla", "n/a")  # extraction backends that match serving: the fla kernels SGLang and vLLM run
#                                    for linear attention on a GPU; n/a: a target without linear attention (no choice)


def healthiest_run(runs: list[Run]) -> tuple[str | None, str]:
    """(run id, basis) Acceptance opens on: the healthiest run (highest tau macro, ties: the newest) on an extraction
    that matches serving (backend in SERVING_BACKENDS: the hidden states a serving engine's kernels give), basis
    "serving"; without one, the healthiest run on any extraction ("any"); without a tau anywhere, the newest run
    ("newest"); (None, "") without runs. `runs` oldest first, as Store.runs lists them."""

    def best(rs: list[Run]) -> str | None:
        scored = [(_tau(r), i, r.id) for i, r in enumerate(rs) if _tau(r) is not None]
        return max(scored)[2] if scored else None

    for basis, rs in (("serving", [r for r in runs if r.backend in SERVING_BACKENDS]), ("any", runs)):
        if (got := best(rs)) is not None:
            return got, basis
    return (runs[-1].id, "newest") if runs else (None, "")


def _tau(r: Run) -> float | None:
    t = (r.summary or {}).get("tau_macro")
    return t if isinstance(t, (int, float)) and t == t else None  # NaN: no tau


def default_pair(runs: list[Run]) -> tuple[str, str] | None:
    """(A, B) run ids compared by default: the newest two runs on one extraction (B the newer); without such a
    pair the two newest runs; None for fewer than two runs. `runs` oldest first, as Store.runs lists them."""
    for j in range(len(runs) - 1, 0, -1):
        for i in range(j - 1, -1, -1):
            if runs[i].extraction_id == runs[j].extraction_id:
                return runs[i].id, runs[j].id
    return (runs[-2].id, runs[-1].id) if len(runs) >= 2 else None


def delta_rows(ra: dict[str, dict], rb: dict[str, dict]) -> list[dict]:
    """Per prompt of both runs (run_prompts rows by prompt id): tau A, tau B, delta = B − A, and DDTree tau of
    each run when either has one; sorted by |delta| descending (prompts without both taus last), then by id."""
    tree = any(r.get("tree_tau") is not None for r in (*ra.values(), *rb.values()))
    out = []
    for p in ra:
        if p not in rb:
            continue
        ta, tb = ra[p].get("tau"), rb[p].get("tau")
        d = None if ta is None or tb is None else tb - ta
        row = {"prompt": p, "tau A": rounded(ta, 4), "tau B": rounded(tb, 4), "delta (B − A)": rounded(d, 4)}
        if tree:
            row |= {
                "DDTree tau A": rounded(ra[p].get("tree_tau"), 4),
                "DDTree tau B": rounded(rb[p].get("tree_tau"), 4),
            }
        out.append((d is None, -abs(d or 0.0), p, row))
    return [row for *_, row in sorted(out, key=lambda x: x[:3])]


def lag_rows(ca: dict[str, list], cb: dict[str, list], block_a: int, block_b: int) -> list[dict]:
    """One-position draft lag per slot k (metrics.lag_pool) of run A and run B over the prompts both hold, from
    their per-prompt `metrics.lag_counts` (the kept analysis "lag")."""
    shared = [p for p in ca if p in cb]
    la, lb = metrics.lag_pool([ca[p] for p in shared], block_a), metrics.lag_pool([cb[p] for p in shared], block_b)
    out = []
    for k in range(1, max(block_a, block_b)):
        out.append(
            {
                "slot k": k,
                "lag A": _slot(la, "lag", k),
                "lag B": _slot(lb, "lag", k),
                "on target A": _slot(la, "on_target", k),
                "on target B": _slot(lb, "on_target", k),
                "anchors A": la["anchors"][k - 1] if k <= len(la["anchors"]) else 0,
                "anchors B": lb["anchors"][k - 1] if k <= len(lb["anchors"]) else 0,
            }
        )
    return out


def _slot(pool: dict, key: str, k: int) -> float | None:
    """Slot k's rate `key` of a `metrics.lag_pool` (None past the run's block)."""
    return rounded(pool[key][k - 1], 4) if k <= len(pool[key]) else None


def _flat(d: dict, prefix: str = "") -> dict:
    """A nested config as one level of dotted keys."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(a: dict, b: dict) -> list[dict]:
    """Two checkpoint configs side by side (flattened keys); `differs` marks the keys whose values differ."""
    fa, fb = _flat(a or {}), _flat(b or {})
    keys = sorted(set(fa) | set(fb), key=lambda k: (fa.get(k, object()) == fb.get(k, object()), k))
    return [
        {"key": k, "A": _show(fa.get(k)), "B": _show(fb.get(k)), "differs": "≠" if fa.get(k) != fb.get(k) else ""}
        for k in keys
    ]


def _show(v) -> str:
    """A config value as the diff prints it ('—': absent)."""
    return "—" if v is None else str(v)


def sweep_extraction(runs: list[Run], folder: str, ids: list[str]) -> str | None:
    """The extraction the sweep chart opens on, among `ids` (oldest first): the one holding runs of the most
    checkpoints inside `folder` (a curve, not the one point a checkpoint replayed on a second extraction gives;
    ties: the newest), else the newest holding any run, else the newest. Never a newer extraction without runs (a
    Re-extract) while the folder's runs sit on an older one."""
    if folder:
        n = {i: len(sweep_points(runs, folder, i)) for i in ids}
        most = max(n.values(), default=0)
        if most:
            return [i for i in ids if n[i] == most][-1]
    with_runs = {r.extraction_id for r in runs}
    got = [i for i in ids if i in with_runs]
    return got[-1] if got else (ids[-1] if ids else None)


def sweep_points(runs: list[Run], folder: str, extraction: str | None = None) -> list[dict]:
    """Runs whose checkpoint lies inside `folder` (latest run per checkpoint), ordered by step."""
    from ..drafters import step_of

    root = str(Path(folder).resolve())
    best: dict[str, Run] = {}
    for r in runs:
        ck = r.checkpoint or ""
        if not (ck == root or ck.startswith(root + "/")):
            continue
        if extraction and r.extraction_id != extraction:
            continue
        best[ck] = r  # runs come oldest first: the latest wins
    pts = []
    for ck, r in best.items():
        step = r.step if r.step is not None else step_of(ck)
        s = r.summary or {}
        pts.append(
            {
                "step": step,
                "name": r.name,
                "family": s.get("family", "DFlash"),
                "run": r.id,
                "checkpoint": ck,
                "sliding_block": r.sliding_block,
                "tau_macro": s.get("tau_macro"),
                "tau_pooled": s.get("tau_pooled"),
                "ddtree_tau": s.get("ddtree_tau"),
            }
        )
    pts.sort(key=lambda p: (p["step"] is None, p["step"] or 0, p["checkpoint"]))
    return pts


# ---------------------------------------------------------------------------
# many runs on one extraction (Compare's table and chart; the CLI's `compare`)

MANY = 6  # runs Compare opens with: the newest drafter runs of the default pair's extraction


def is_baseline(run: Run) -> bool:
    """A model-free baseline's run (kind `baseline:<method>`, dflash_dash.baselines): a reference line, not a
    checkpoint. Told by its summary's kind or family or a checkpoint named `baseline:...`."""
    s = run.summary or {}
    kinds = (s.get("kind"), s.get("family"), run.checkpoint)
    return any(str(k or "").startswith("baseline:") for k in kinds)


def default_runs(runs: list[Run], most: int = MANY) -> list[str]:
    """The runs Compare opens with: the newest `most` drafter runs on the extraction of `default_pair` (oldest
    first) and every baseline run on it. `runs` oldest first, as Store.runs lists them."""
    pair = default_pair(runs)
    if pair is None:
        return [r.id for r in runs]
    ex = next(r.extraction_id for r in runs if r.id == pair[1])
    on = [r for r in runs if r.extraction_id == ex]
    drafters = [r.id for r in on if not is_baseline(r)][-most:]
    return [r.id for r in on if r.id in drafters or is_baseline(r)]


def many_rows(runs: list[Run], taus: dict[str, dict], cats: dict[str, str | None]) -> list[dict]:
    """tau per run and per category (the chart's data): for each run (in order) `stats.by_category` of its
    per-prompt taus ({run id: {prompt id: tau}}), one row per category: run, name, baseline, category, prompts,
    tau (macro) and its bootstrap interval lo, hi."""
    from .stats import by_category

    return [
        {"run": r.id, "name": r.name, "baseline": is_baseline(r)} | row
        for r in runs
        for row in by_category(taus[r.id], cats)
    ]


def many_table(runs: list[Run], rows: list[dict]) -> list[dict]:
    """One row per run (`many_rows` folded): run, kind, tau macro with its 95% interval, tau pooled (the run's
    summary), prompts, and tau per category ("tau · <category>") where the set has categories."""
    out = []
    for r in runs:
        mine = [x for x in rows if x["run"] == r.id]
        whole = next(x for x in mine if x["category"] == "all")
        s = r.summary or {}
        row = {
            "run": r.name,
            "kind": "baseline" if is_baseline(r) else s.get("family", "DFlash"),
            "prompts": whole["prompts"],
            "tau (macro)": rounded(whole["tau"], 4),
            "95% interval": _span(whole["lo"], whole["hi"]),
            "tau (pooled)": rounded(s.get("tau_pooled"), 4),
        }
        out.append(row | {f"tau · {x['category']}": rounded(x["tau"], 4) for x in mine if x["category"] != "all"})
    return out


def _span(lo: float | None, hi: float | None) -> str:
    return "—" if lo is None or hi is None else f"[{lo:.2f}, {hi:.2f}]"


def verdict_rows(ref: Run, runs: list[Run], taus: dict[str, dict], cats: dict[str, str | None]) -> list[dict]:
    """Each run of `runs` other than `ref` against `ref` on the same prompts (`stats.paired_by_category`: over all
    prompts, then per category): run, category, prompts, B − A (mean per-prompt difference, B the run), its 95%
    interval, the verdict in words and the warning when the set cannot separate them."""
    from .stats import paired_by_category

    out = []
    for r in runs:
        if r.id == ref.id:
            continue
        for p in paired_by_category(taus[ref.id], taus[r.id], cats, ref.name, r.name):
            out.append(
                {
                    "run": r.name,
                    "category": p["category"],
                    "prompts": p["prompts"],
                    "B − A": rounded(p["diff"], 4),
                    "95% interval": _span(p["lo"], p["hi"]),
                    "verdict": p["verdict"],
                    "warning": p["warning"] or "",
                }
            )
    return out
