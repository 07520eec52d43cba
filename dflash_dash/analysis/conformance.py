"""Engine conformance: does a serving engine reach the acceptance the replay says a correct greedy engine reaches
with the same drafter on the same completion? ("accepted length 3 here, 5.5 there: engine or drafter?")

Contract: pure computation (no torch, no store, no HTTP): engine-stats rows and run_prompts rows in, plain rows
out. Like with like, per prompt:
  - replay tau = committed tokens per round of the replay's chain walk (bonus included); the first completion
    token comes from the target's prefill and is in no round.
  - engine tau = (completion_tokens - 1) / verify_steps: the same count from the engine's counters (the prefill
    token left out). SGLang's own spec_accept_length = completion_tokens / spec_verify_ct counts the prefill
    token too, so it sits slightly above; it is shown beside, never compared.
  - flagged: the engine falls short of the replay by more than THRESHOLD of the replay's tau,
    replay_tau - engine_tau > THRESHOLD * replay_tau. A correct greedy engine with the replay's numerics matches
    exactly (the local stand-in does: same features, same drafter path); a real engine's bf16 kernels and batch
    shapes flip a few near-tie drafts, which moves a prompt's tau by a few percent either way (numeric noise);
    a broken engine (features from the wrong layer, truncated context, a wrong mask) costs far more.
Engine stats come from the engine's answers at fetch time (`engines.<engine>.spec_stats`: engine "sglang", "vllm"
or "llamacpp"; `engines.tau` converts each engine's numbers, its own figure beside) or from a JSONL file of
another engine (`parse_stats`): lines {"id", "verify_steps", "accepted_tokens"} or
{"id", "accept_lengths": [...]}.
The run-level figures are the CONFORMANCE block of the metric registry (`metrics`).
`replay_histogram` is the replay's side of the engine's verify steps by accepted drafts (`engine_histogram`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import engines, metrics, prompts
from ..errors import UserError
from . import steps as steps_mod
from .compare import is_baseline

if TYPE_CHECKING:
    from ..store import Run

THRESHOLD = 0.05  # flag when replay_tau - engine_tau > THRESHOLD * replay_tau (more than numeric noise)
ALIGNED = ("steps_equal", "first_divergence", "direction", "engine_step", "replay_step")  # compare's per-step keys
SGLANG = "sglang"  # the engine name of the stats recorded at fetch from an SGLang server's meta_info


class StatsError(UserError, ValueError):
    """An engine-stats file or row that cannot be used; the message names the line and the field."""


# ---------------------------------------------------------------------------
# engine stats rows: {verify_steps, accepted_tokens, completion_tokens, accept_lengths, histogram}


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def parse_stats(text: str, completion_tokens: dict[str, int], set_name: str = "the set") -> list[dict]:
    """Validate an engine-stats JSONL file against a completion set ({prompt id: completion tokens}); rows with
    "id" added. Each line is {"id", "verify_steps", "accepted_tokens"} (verify steps and draft tokens accepted
    over them, bonus tokens not counted) or {"id", "accept_lengths": [...]} (committed tokens of each verify
    step, bonus included). A bad line raises StatsError naming the line and the field; ids that are not in the
    set are refused by name (all of them, in one message)."""
    out, unknown = [], []
    for n, rec, pid in prompts.records(text, StatsError):
        at = f"line {n} (id {pid!r})"
        if pid not in completion_tokens:
            unknown.append(pid)
            continue
        total = completion_tokens[pid]
        has_counts = "verify_steps" in rec or "accepted_tokens" in rec
        if has_counts and "accept_lengths" in rec:
            raise StatsError(f"{at}: give either 'verify_steps' + 'accepted_tokens' or 'accept_lengths', not both")
        if "accept_lengths" in rec:
            lens = rec["accept_lengths"]
            if not isinstance(lens, list) or not lens:
                raise StatsError(
                    f"{at}: field 'accept_lengths' must be a non-empty list of committed tokens per "
                    f"verify step (integers >= 1), got {lens!r}"
                )
            for x in lens:
                if _count(x) is None or x < 1:
                    raise StatsError(
                        f"{at}: field 'accept_lengths' holds {x!r}; each verify step commits an "
                        "integer >= 1 tokens (accepted drafts + the bonus token)"
                    )
            verify, acc = len(lens), sum(lens) - len(lens)
        elif has_counts:
            for key in ("verify_steps", "accepted_tokens"):
                if key not in rec:
                    raise StatsError(
                        f"{at}: field '{key}' is missing (give 'verify_steps' and 'accepted_tokens', "
                        "or 'accept_lengths')"
                    )
                if _count(rec[key]) is None:
                    raise StatsError(f"{at}: field '{key}' must be an integer >= 0, got {rec[key]!r}")
            verify, acc, lens = rec["verify_steps"], rec["accepted_tokens"], None
        else:
            raise StatsError(
                f"{at}: no engine counters: give 'verify_steps' and 'accepted_tokens', or 'accept_lengths'"
            )
        key = "accept_lengths" if lens is not None else "verify_steps"
        if verify > total or (verify == 0 and total > 1):
            raise StatsError(
                f"{at}: field '{key}' gives {verify} verify steps for a completion of {total} tokens "
                f"(expected 1 to {total}: each step commits at least one token)"
            )
        out.append(
            {
                "id": pid,
                "verify_steps": verify,
                "accepted_tokens": acc,
                "completion_tokens": total,
                "accept_lengths": lens,
                "histogram": None,
            }
        )
    if unknown:
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        shown = ", ".join(repr(u) for u in unknown[:10]) + more
        raise StatsError(
            f"id(s) not in completion set {set_name!r}: {shown}; the stats must be for the completions "
            "of that set (same prompt ids)"
        )
    if not out:
        raise StatsError("the file holds no engine stats (expected one JSON object per line)")
    return out


# ---------------------------------------------------------------------------
# comparison


def default_run(runs: list[Run], with_stats: set[str]) -> str | None:
    """The run the Conformance page opens on (`runs` oldest first): the newest drafter run on a completion set that
    has engine stats (`with_stats`: set names), else the newest run there, else the newest; None without runs. The
    newest run alone may sit on a set no engine reported on, where the page has nothing to compare, or be a
    model-free baseline, which no engine serving a drafter served."""
    on = [r for r in runs if r.set_name in with_stats]
    drafters = [r for r in on if not is_baseline(r)]
    return ([r.id for r in drafters or on or runs] or [None])[-1]


def engine_tau(stats: dict) -> float | None:
    """(completion_tokens - 1) / verify_steps: committed tokens per verify step, the prefill token left out (the one
    definition across engines, `metrics.engine_tau`)."""
    return metrics.engine_replay_tau(stats.get("verify_steps"), stats.get("completion_tokens"))


def sglang_accept_length(stats: dict) -> float | None:
    """SGLang's own spec_accept_length = completion_tokens / spec_verify_ct (prefill token included)."""
    v, n = stats.get("verify_steps"), stats.get("completion_tokens")
    return n / v if v and n is not None else None


def replay_tau(row: dict) -> float | None:
    """The replay's per-prompt tau: committed / rounds of the chain walk (a run_prompts row)."""
    return metrics.tau(metrics.Prompt.from_row(row), metrics.Ctx(0, 0))


def flag(engine: float | None, replay: float | None, threshold: float = THRESHOLD) -> bool:
    """The engine falls short of the replay by more than `threshold` of the replay's tau."""
    return engine is not None and replay is not None and replay - engine > threshold * replay


def above(engine: float | None, replay: float | None, threshold: float = THRESHOLD) -> bool:
    """The engine exceeds the replay by more than `threshold` of the replay's tau: the replay is the ceiling only
    for the same drafter, config and numerics, so this is as suspect as falling short."""
    return engine is not None and replay is not None and engine - replay > threshold * replay


def compare(
    run_prompts: list[dict], stats: list[dict], threshold: float = THRESHOLD, engine: str = SGLANG
) -> list[dict]:
    """One row per prompt that has both a replay row and engine stats, in `run_prompts` order: id, engine_tau,
    replay_tau, gap (engine - replay), gap_rel (gap / replay), flagged (below), above, verify_steps, rounds (replay),
    committed (replay), completion_tokens, accepted_tokens, sglang_accept_length, histogram (the engine's, when it
    reported one), and `engine`'s own figure beside, never compared (`engines.tau`): engine_figure,
    engine_figure_label, engine_figure_formula, engine_missing (what it did not report), and where the engine gave
    per-step lengths the round-by-round alignment (`steps.align`: steps_equal, first_divergence (completion token
    index), direction, engine_step, replay_step; None without per-step lengths)."""
    by_id = {s.get("prompt_id", s.get("id")): s for s in stats}
    out = []
    for r in run_prompts:
        pid = r.get("prompt_id", r.get("id"))
        s = by_id.get(pid)
        if s is None:
            continue
        e, rp = engine_tau(s), replay_tau(r)
        conv = engines.tau(engine, s)
        lens, rounds = s.get("accept_lengths"), list(r.get("rounds") or [])
        al = steps_mod.align(list(lens), rounds) if lens and rounds else {}
        gap = e - rp if e is not None and rp is not None else None
        out.append(
            {
                "id": pid,
                "engine_tau": e,
                "replay_tau": rp,
                "gap": gap,
                "gap_rel": gap / rp if gap is not None and rp else None,
                "flagged": flag(e, rp, threshold),
                "above": above(e, rp, threshold),
                "verify_steps": s.get("verify_steps"),
                "rounds": len(r.get("rounds") or []),
                "committed": sum(r.get("rounds") or []),
                "completion_tokens": s.get("completion_tokens"),
                "accepted_tokens": s.get("accepted_tokens"),
                "sglang_accept_length": sglang_accept_length(s),
                "histogram": s.get("histogram"),
                "engine_figure": conv.engine_figure,
                "engine_figure_label": conv.engine_label,
                "engine_figure_formula": conv.engine_formula,
                "engine_missing": conv.missing,
                **{k: al.get(k) for k in ALIGNED},
            }
        )
    return out


def missing(run_prompts: list[dict], stats: list[dict]) -> list[str]:
    """Prompt ids of the run that have no engine stats."""
    have = {s.get("prompt_id", s.get("id")) for s in stats}
    return [pid for r in run_prompts if (pid := r.get("prompt_id", r.get("id"))) not in have]


def report(run: str, engine: str, threshold: float, rows: list[dict], ranking: dict | None = None) -> dict:
    """The CLI's JSON: {"run", "engine", "threshold", "prompts": [{"id", "engine_tau", "replay_tau", "flagged",
    "first_divergence"}], "steps" (`step_summary`), and when the fault ranking was computed (`diagnose`)
    "faults": [{"fault", "score"}] best first and "explained_by" (a fault name or null)}."""
    out = {
        "run": run,
        "engine": engine,
        "threshold": threshold,
        "prompts": [
            {
                "id": r["id"],
                "engine_tau": r["engine_tau"],
                "replay_tau": r["replay_tau"],
                "flagged": r["flagged"],
                "first_divergence": r.get("first_divergence"),
            }
            for r in rows
        ],
        "steps": step_summary(rows),
    }
    if ranking is not None:
        out["faults"] = [{"fault": f["fault"], "score": f["score"]} for f in ranking["faults"]]
        out["explained_by"] = ranking["explained_by"]
    return out


def step_summary(rows: list[dict]) -> dict | None:
    """Round by round over the prompts with per-step lengths (None without): {"prompts", "steps_equal",
    "diverging", "first_divergence_median", "above", "below"}."""
    al = [r for r in rows if r.get("steps_equal") is not None]
    if not al:
        return None
    firsts = sorted(r["first_divergence"] for r in al if r["first_divergence"] is not None)
    return {
        "prompts": len(al),
        "steps_equal": sum(r["steps_equal"] for r in al),
        "diverging": len(firsts),
        "first_divergence_median": firsts[len(firsts) // 2] if firsts else None,
        "above": sum(r["direction"] == "above" for r in al),
        "below": sum(r["direction"] == "below" for r in al),
    }


def summary(rows: list[dict], threshold: float = THRESHOLD) -> dict:
    """Run-level figures: every entry of the registry's CONFORMANCE block over `rows` (from `compare`)."""
    return {m.key: m.run(rows, threshold) for m in metrics.CONFORMANCE} | {"threshold": threshold}


def engine_histogram(rows: list[dict]) -> list[int] | None:
    """The engine's verify steps by accepted drafts, summed over prompts (None when it reported none)."""
    hs = [r["histogram"] for r in rows if r.get("histogram")]
    if not hs:
        return None
    out = [0] * max(len(h) for h in hs)
    for h in hs:
        for i, c in enumerate(h):
            out[i] += c
    return out


def replay_histogram(run_prompts: list[dict], ids: set[str], block_size: int) -> list[int]:
    """The replay's rounds by accepted drafts 0..B-1 over the prompts `ids` (the compared ones)."""
    ps = [metrics.Prompt.from_row(r) for r in run_prompts if r["prompt_id"] in ids]
    return metrics.accept_hist(ps, metrics.Ctx(block_size, 0))
