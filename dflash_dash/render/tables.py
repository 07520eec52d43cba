"""Tables for eyes: a run's metrics with formulas, its prompts and outliers, completions with the engine's
speculative counters, extractions, runs grouped by extraction, GPUs, engine conformance per prompt, and the
training-bug signatures of a run against its reference.

Contract: rows of the store, `metrics` and `analysis` in, lists of dicts out (a dataframe, a CSV download and a
test read the same rows); sorting is part of the contract. Column labels and formulas come from the metric
registry, numbers print with their metric's format, links are relative page URLs (`formats`). A CSV cell that
starts like a spreadsheet formula is quoted (`conformance_csv`): prompt ids are untrusted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import metrics
from ..analysis import rounded
from .formats import acceptance_link, backend_label, ci, count, csv_text, divergence_link, fmt, run_link

if TYPE_CHECKING:
    from ..store import Completion, CompletionEntry, Extraction, Run

# columns of tokens per round (or their change)
TAU_WORDS = ("tau", "delta", "mean_accepted", "accept_length", "gap", "lost", "minus")
PROB_WORDS = ("share", "acceptance", "observed", "mean_p", "ece", "predicted", "lag", "target", "rate", "P(")
PARITY_FORMATS = {"relative L2": "%.2e", "cosine": "%.6f", "max |A−B|": "%.3g"}  # tiny differences: one each
TOKEN_CELLS = {"rejection_pairs": ("draft", "target")}  # pattern tables whose cells are tokens


def printf(spec: str) -> str:
    """A metrics format ("{:.2f}") as the printf format a dataframe column takes ("%.2f")."""
    return spec.replace("{:", "%").replace("}", "")


def number_specs(rows: list[dict]) -> dict[str, str]:
    """{column: format spec ("{:.2f}")} for the float columns of `rows`, one format per kind of number: a tau-like
    column (tokens per round, or a difference of them) as metrics.TAU, a probability or share as metrics.PROB; so a
    table never prints 1.6558 beside a card's 1.66. Integer and text columns are left as they are."""
    out: dict[str, str] = {}
    for col in dict.fromkeys(k for r in rows for k in r):
        if not any(isinstance(r.get(col), float) for r in rows):
            continue
        name = col.lower()
        if any(w.lower() in name for w in TAU_WORDS):
            out[col] = metrics.TAU
        elif any(w.lower() in name for w in PROB_WORDS):
            out[col] = metrics.PROB
    return out


def number_formats(rows: list[dict]) -> dict[str, str]:
    """`number_specs` as the printf formats a dataframe's NumberColumn takes ("%.2f")."""
    return {c: printf(f) for c, f in number_specs(rows).items()}


def pattern_rows(key: str, rows: list[dict]) -> list[dict]:
    """A failure-pattern table as a page shows it: token cells with their whitespace visible (`tokens.shown`), so a
    space or newline token is never a blank cell. Downloads keep the raw rows."""
    from .tokens import shown

    cols = TOKEN_CELLS.get(key, ())
    return [{k: shown(v) if k in cols else v for k, v in r.items()} for r in rows]


def summary_rows(s: dict) -> list[dict]:
    """The run's metrics with formulas, for a table next to the numbers (scalars, counts, intervals, id lists;
    the DDTree ones only for a run with a tree), each printed with its metric's format (metrics.show)."""
    return [
        {"metric": metrics.label(m.key, s), "value": metrics.show(m.key, s.get(m.key)), "formula": m.formula}
        for m in metrics.REGISTRY
        if m.kind in ("scalar", "count", "interval", "ids")
        and m.key in s
        and not (metrics.tree_only(m.key) and not s.get("tree_budget"))
    ]


def outlier_links(s: dict, rows: list[dict], run_id: str) -> list[dict]:
    """The run's outlier prompts (summary `tau_outliers`): id, tau, side of the fences ("low" / "high") and a link
    to the prompt's token view; lowest tau first."""
    taus, f = {r["prompt_id"]: r.get("tau") for r in rows}, s.get("tau_fences") or [0.0, 0.0]
    out = [
        {
            "prompt": p,
            "tau": taus.get(p),
            "side": "low" if (taus.get(p) or 0) < f[0] else "high",
            "link": acceptance_link(run_id, p),
        }
        for p in s.get("tau_outliers") or []
    ]
    return sorted(out, key=lambda o: (o["tau"] is None, o["tau"] or 0, o["prompt"]))


TAU_COLUMNS = ("tau", "ddtree_tau", "chain_tau_at_budget", "every_anchor_tau")  # prompt_table: printed as fmt


def prompt_table(rows: list[dict], completions: dict[str, Completion], tree_budget: int = 0) -> list[dict]:
    """Per-prompt results from `metrics.prompt_rows`, sorted by tau (lowest first); tau-like columns (TAU_COLUMNS)
    at 2 decimals (like `fmt`); `outlier`: "low" / "high" for a prompt outside Tukey's fences of per-prompt tau
    (metrics.TUKEY_RULE), else ""; with a tree budget N, `chain_tau_at_budget`: tau of the block-(N+1) chain beside
    `ddtree_tau`."""
    out = []
    odd = metrics.outliers_of({r["prompt_id"]: r["tau"] for r in rows})
    for r in rows:
        c = completions.get(r["prompt_id"])
        out.append(
            {
                "prompt": r["prompt_id"],
                "tau": rounded(r["tau"], 2),
                "outlier": odd.get(r["prompt_id"], ""),
                "ddtree_tau": rounded(r["tree_tau"], 2),
                **({"chain_tau_at_budget": rounded(r.get("chain_tau_at_budget"), 2)} if tree_budget else {}),
                "rounds": r["rounds"],
                "completion_tokens": r["completion_tokens"],
                "prompt_tokens": r["prompt_len"],
                "every_anchor_tau": rounded(r.get("every_anchor_tau"), 2),
                "finish": c.finish_reason if c else None,
                "_tau": r["tau"],
            }
        )
    out.sort(key=lambda x: (x["_tau"] is None, x["_tau"] if x["_tau"] is not None else 0, x["prompt"]))
    return [{k: v for k, v in x.items() if k != "_tau"} for x in out]


SPEC_KEYS = (
    "spec_verify_ct",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_accept_token_num",
    "spec_draft_token_num",
    "spec_accepted_drafts",
    "spec_proposed_drafts",
    "spec_accept_histogram",
)
# the speculative-decoding counters SGLang reports in meta_info (names vary by version; shown when present)


def compact_histogram(h) -> str:
    """spec_accept_histogram (a list of counts, index = accepted tokens per verify step) as "0:3 1:5 2:2"
    (zero counts left out); a dict {k: count} the same way; anything else as its text."""
    if isinstance(h, dict):
        items = sorted(h.items(), key=lambda kv: str(kv[0]))
    elif isinstance(h, (list, tuple)):
        items = list(enumerate(h))
    else:
        return str(h)
    return " ".join(f"{k}:{v}" for k, v in items if v) or "—"


def completion_table(rows: list[CompletionEntry]) -> list[dict]:
    """Completions (Store.completion_index rows: token counts, no ids) with finish reason, token counts and any
    server-side speculative counters; `server_tau` (tokens per verify step) = completion_tokens / spec_verify_ct,
    the engine's tau for that request."""
    out = []
    for r in rows:
        meta = r.meta_info or {}
        fin = r.finish_reason
        n_out = meta.get("completion_tokens")
        if isinstance(n_out, bool) or not isinstance(n_out, int):
            n_out = r.output_tokens or 0
        d = {
            "prompt": r.prompt_id,
            "prompt_tokens": r.prompt_tokens or 0,
            "completion_tokens": n_out,
            "finish": fin,
            "latency_s": meta.get("e2e_latency"),
            "model": r.model_path,
        }
        for k in SPEC_KEYS:
            if k in meta:
                d[k] = compact_histogram(meta[k]) if k == "spec_accept_histogram" else meta[k]
        verify = meta.get("spec_verify_ct")
        if isinstance(verify, (int, float)) and not isinstance(verify, bool) and verify > 0:
            d["server_tau"] = n_out / verify
        out.append(d)
    return out


def extraction_table(rows: list[Extraction]) -> list[dict]:
    return [
        {
            "id": e.id,
            "backend": e.backend,
            "completions": e.set_name,
            "prompts": e.prompts,
            "layers": ",".join(map(str, e.layer_ids or [])),
            "device": e.device,
            "dtype": e.dtype,
            "status": e.status,
            "features": "none: streamed" if (e.versions or {}).get("streamed") else "files",  # replay --stream
            "target": e.target_path,
            "created": str(e.created)[:19],
        }
        for e in rows
    ]


def run_columns() -> dict[str, str]:
    """Column label -> formula of the headline metrics in `run_groups` rows (the metric registry's labels)."""
    return {metrics.label(m.key): m.formula for m in metrics.HEADLINE}


ALONE = "set:"  # + set name: the group key of runs without an extraction


def run_groups(runs: list[Run], extractions: list[Extraction]) -> list[dict]:
    """Runs grouped by the extraction they replayed (newest extraction first), each group's rows ordered by
    checkpoint, step and creation, with human column labels (headline metrics by the registry's label, shown
    with its format) and the run's Acceptance link: [{"extraction", "title", "ids" (run id per row), "rows"}]."""
    exs = {e.id: e for e in extractions}
    order = {e.id: i for i, e in enumerate(extractions)}
    groups: dict[str, list[Run]] = {}
    for r in runs:  # a run on a completion set alone (a baseline) groups by its set
        groups.setdefault(r.extraction_id or ALONE + str(r.set_name), []).append(r)
    out = []
    for ex_id in sorted(groups, key=lambda x: -order.get(x, len(order))):
        rs = sorted(
            groups[ex_id],
            key=lambda r: (str(r.name or r.checkpoint), r.step or 0, str(r.created), r.id),
        )
        e = exs.get(ex_id)
        title = (
            f"Extraction {ex_id} · {backend_label(e.backend)} · set {e.set_name} · {e.device} "
            f"{e.dtype} · {count(len(rs), 'run')}"
            if e
            else f"Set {rs[0].set_name} · model-free baselines, no extraction · {count(len(rs), 'run')}"
            if ex_id.startswith(ALONE)
            else f"Extraction {ex_id} (no longer in the store) · {count(len(rs), 'run')}"
        )
        rows = []
        for r in rs:
            s = r.summary or {}
            rows.append(
                {
                    "open": run_link(r.id),
                    "checkpoint": r.name,
                    "family": s.get("family", "DFlash"),
                    "training step": r.step,
                    **{metrics.label(m.key): metrics.show(m.key, s.get(m.key)) for m in metrics.HEADLINE},
                    "sliding layers": r.sliding_block or "—",
                    "checkpoint folder": r.checkpoint,
                    "run id": r.id,
                    "created": str(r.created)[:19],
                }
            )
        out.append({"extraction": ex_id, "title": title, "ids": [r.id for r in rs], "rows": rows})
    return out


def gpu_table(gpus: list[dict]) -> list[dict]:
    """jobs.gpu_memory() rows for eyes: GiB and who holds the memory."""
    g = 1 << 30
    return [
        {
            "gpu": x.get("index"),
            "name": x.get("name"),
            "total_GiB": round((x.get("total") or 0) / g, 1),
            "free_GiB": round((x.get("free") or 0) / g, 1),
            "held by": "; ".join(
                f"pid {p.get('pid')} {p.get('name')} ({(p.get('used') or 0) / g:.1f} GiB)"
                for p in x.get("processes") or []
            )
            or "—",
        }
        for x in gpus
    ]


CONFORMANCE_NOTE = (
    "engine tau = (completion_tokens − 1) / verify_steps: committed tokens per verify step with the "
    "prefill's first token left out, like the replay's committed / rounds. SGLang's own "
    "spec_accept_length = completion_tokens / spec_verify_ct counts the prefill token too (last "
    "column, for reference only). accepted_drafts is the engine's own count: an engine that counts before its stop "
    "check (vLLM, llama.cpp) can count drafts past the completion's end, so it can exceed the completion's tokens."
)


def conformance_table(rows: list[dict], run_id: str) -> list[dict]:
    """Per prompt: flagged, engine tau, replay tau, gap (engine − replay) and its share of the replay tau, the
    counts behind them and a link to the prompt's token view; sorted by gap, most negative first."""
    out = []
    for r in rows:
        out.append(
            {
                "prompt": r["id"],
                "flagged": bool(r["flagged"]),
                "above": bool(r.get("above")),
                "engine_tau": rounded(r["engine_tau"], 4),
                "replay_tau": rounded(r["replay_tau"], 4),
                "gap": rounded(r["gap"], 4),
                "gap_pct": rounded(None if r["gap_rel"] is None else 100 * r["gap_rel"], 2),
                "verify_steps": r["verify_steps"],
                "rounds": r["rounds"],
                "completion_tokens": r["completion_tokens"],
                "accepted_drafts": r["accepted_tokens"],
                "sglang_accept_length": rounded(r["sglang_accept_length"], 4),
                "token_view": acceptance_link(run_id, r["id"]),
            }
        )
    out.sort(key=lambda x: (x["gap"] is None, x["gap"] if x["gap"] is not None else 0, x["prompt"]))
    return out


def divergence_table(rows: list[dict], run_id: str, prompt_lens: dict[str, int], only_flagged: bool) -> list[dict]:
    """Per prompt whose engine steps leave the replay's rounds (`conformance.compare` rows with per-step lengths;
    `only_flagged`: just the flagged prompts): the steps equal before it, the completion token index where the
    first divergent step starts, what the engine and the replay committed there, and a link that opens that step
    in the token view (`divergence_link`); earliest divergence first."""
    out = []
    for r in rows:
        if r.get("first_divergence") is None or (only_flagged and not r["flagged"]):
            continue
        n = max(r["engine_step"] or 0, r["replay_step"] or 0)
        out.append(
            {
                "prompt": r["id"],
                "flagged": bool(r["flagged"]),
                "steps_equal": r["steps_equal"],
                "first_divergence": r["first_divergence"],
                "engine_step": r["engine_step"],
                "replay_step": r["replay_step"],
                "engine": r["direction"],
                "token_view": divergence_link(
                    run_id, r["id"], prompt_lens.get(r["id"], 0), r["first_divergence"], n, r["steps_equal"] + 1
                ),
            }
        )
    out.sort(key=lambda x: (x["first_divergence"], x["prompt"]))
    return out


DIVERGENCE_COLUMNS = {  # column -> meaning (help text of the round-by-round table)
    "steps_equal": "verify steps that commit exactly the replay's rounds before the first that differs",
    "first_divergence": "completion token index where the first differing step starts (0: the prefill's token)",
    "engine_step": "tokens the engine's step commits there (accepted drafts + bonus)",
    "replay_step": "tokens the replay's round commits there",
    "engine": "above: the engine's step commits more than the replay's round; below: fewer",
    "token_view": "the prompt on the Acceptance page, that step outlined and its round shown",
}


def fault_table(ranking: dict) -> list[dict]:
    """The fault ranking (`pipeline.diagnose`) as rows: the clean replay first, then the faults best first, each
    with its score and the variant it was scored on; skipped faults last with why."""
    out = [{"variant": "clean replay", "score": rounded(ranking.get("clean_score"), 4), "detail": "the run's own"}]
    out += [
        {"variant": f["fault"], "score": rounded(f["score"], 4), "detail": f.get("detail", "")}
        for f in ranking["faults"]
    ]
    out += [
        {"variant": f, "score": None, "detail": f"skipped: {why}"} for f, why in (ranking.get("skipped") or {}).items()
    ]
    return out


CONFORMANCE_COLUMNS = {  # column -> formula (help text of the table, and the CSV's meaning)
    "flagged": "replay tau − engine tau > threshold × replay tau",
    "above": "engine tau − replay tau > threshold × replay tau (the replay is the ceiling for its own drafter)",
    "engine_tau": "(completion_tokens − 1) / verify_steps",
    "replay_tau": "committed / rounds of the replay's chain walk (bonus included, prefill token excluded)",
    "gap": "engine tau − replay tau",
    "gap_pct": "100 × (engine tau − replay tau) / replay tau",
    "verify_steps": "verify steps the engine ran for the request",
    "rounds": "rounds of the replay's chain walk",
    "completion_tokens": "tokens of the completion (the prefill's first one included)",
    "accepted_drafts": "draft tokens the engine accepted over its verify steps (bonus tokens not counted), as the "
    "engine counts them: SGLang counts only drafts inside the completion (accepted + verify_steps = "
    "completion_tokens − 1); vLLM and llama.cpp count what verification accepted before their stop check, so a "
    "last step cut at max_tokens or a stop adds drafts past the completion's end",
    "sglang_accept_length": "completion_tokens / verify_steps, as SGLang reports it (prefill token included)",
    "token_view": "the prompt on the Acceptance page",
}


def _cell(v):
    """A CSV cell that a spreadsheet will not run as a formula (untrusted ids may start with = + - @)."""
    return "'" + v if isinstance(v, str) and v[:1] in ("=", "+", "-", "@", "\t", "\r") else v


def conformance_csv(table: list[dict]) -> str:
    """The conformance table as CSV text (st.download_button)."""
    return csv_text([{k: _cell(v) for k, v in r.items()} for r in table])


SEPARATES = {True: "yes", False: "no", None: "not measured"}  # the "separates?" column of the signatures table


def signature_table(rows: list[dict]) -> list[dict]:
    """The training-bug signatures of a run against its reference (`analysis.signatures.compare` rows) as the
    Diagnostics table: each figure with its 95 % interval printed as a probability ('0.432 [0.349, 0.503]',
    `formats.ci`), the difference signed, separates? yes / no / not measured, what it suggests (or why it was not
    measured) and the formula; in the registry's order."""
    return [
        {
            "signature": r["label"],
            "this run": ci(r["run"], r["run_ci"], 3),
            "reference": ci(r["reference"], r["reference_ci"], 3),
            "difference": fmt(r["difference"], 3, signed=True),
            "separates?": SEPARATES[r["separates"]],
            "what it suggests": r["suggests"] or r["why"] or "",
            "formula": r["formula"],
        }
        for r in rows
    ]


VERDICT_FIELDS = (  # (evidence row, key of analysis.verdict.engine_side / replay_side)
    ("draft model", "name"),
    ("fingerprint (config + weights)", "fingerprint"),
    ("algorithm / family", "algorithm"),
    ("block size", "block_size"),
    ("verify width (tokens per step)", "verify_width"),
    ("target layer ids", "target_layer_ids"),
)


def verdict_table(v: dict, served: dict | None, replayed: dict) -> list[dict]:
    """The verdict's evidence as rows {"what", "engine", "replay", "compared"}: what the engine said it served
    beside the replayed drafter, field by field (None where a side does not say), then the pooled taus."""
    from ..analysis.verdict import engine_side, replay_side

    e, r = engine_side(served), replay_side(replayed)
    differs = {d["field"] for d in v["identity"]["differs"]}
    agrees = set(v["identity"]["agrees"])
    out = [
        {
            "what": label,
            "engine": None if e[k] is None else str(e[k]),
            "replay": None if r[k] is None else str(r[k]),
            "compared": "differs" if k in differs else "same" if k in agrees else None,
        }
        for label, k in VERDICT_FIELDS
    ]
    out.append(
        {
            "what": "draft path",
            "engine": (served or {}).get("draft_model_path"),
            "replay": replayed.get("path"),
            "compared": None,
        }
    )
    e_tau, r_tau = v.get("engine_tau_pooled"), v.get("replay_tau_pooled")
    gap = v.get("gap_rel")
    out.append(
        {
            "what": "tau (pooled)",
            "engine": None if e_tau is None else metrics.TAU.format(e_tau),
            "replay": None if r_tau is None else metrics.TAU.format(r_tau),
            "compared": None if gap is None else f"{gap:+.1%}",
        }
    )
    return out
