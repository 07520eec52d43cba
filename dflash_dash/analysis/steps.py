"""Round-by-round conformance and "which fault explains the gap": the engine's verify steps beside the replay's
chain-walk rounds, and known engine faults ranked by how well their replays reproduce the engine.

Contract: pure computation (numpy, no torch, no store): lists of committed tokens per step in, plain rows out.
Both sides partition the same completion: its first token comes from the target's prefill and is in no step,
then each engine verify step (SGLang `accept_lengths`, vLLM `per_step_accepted` + 1) and each replay round
commits accepted drafts + the bonus token.
  - `align`: per prompt, the steps equal before the first one that differs; `first_divergence` is the completion
    token index where that step starts (1 + the tokens committed before it), None when every step agrees;
    `direction` "above" when the engine's step there commits more than the replay's round, else "below". The
    engine's last step may count drafts past the end of the completion (counted before the cut at max_new or a
    stop): the engine's steps are cut to the completion before comparing.
  - `score`: how well predicted steps (a variant replay's rounds) reproduce the engine, in [0, 1]. With per-step
    lengths: the mean over prompts of the Jaccard overlap of the two step-boundary sets (token indices where a
    step ends; 1.0: the same partition). Without (verify_steps only): 1 - min(1, mean |engine tau - predicted
    tau| / mean engine tau), tau = (completion_tokens - 1) / steps.
  - `rank`: every candidate (a fault at one parameter: a layer offset, a window, a draft count) scored, each
    fault at its best parameter best first, and the rule (`explained`): no fault is named when the clean replay
    reproduces the engine exactly ("no gap to explain", `gap` false); else the best fault is named when it removes
    at least SHARE of the clean replay's disagreement with the engine, score - clean >= SHARE x (1 - clean), and
    beats the runner-up (the next fault, or the clean replay when it scores higher) by a clear margin,
    score - runner-up >= MARGIN x (1 - clean). Its parameter is named when it scores above the fault's other
    parameters (`param_margin` > 0), else the parameters that tie are listed.
FAULTS holds the fault names, fixed; `EVIDENCE` says in words what each one means for the page and the README.
"""

from __future__ import annotations

import numpy as np

CLEAN = "clean"  # the run's own replay: what a correct greedy engine reaches
SHARE = 0.5  # a fault is named when it removes at least this share of the clean replay's disagreement
MARGIN = 0.25  # ... and beats the runner-up by at least this share of the clean replay's disagreement
FAULTS = (
    "layer-shift",
    "sliding-ignored",
    "sliding-bidirectional",
    "draft-tokens",
    "context-window",
    "prefill-count",
    "numerics",
)
EVIDENCE = {
    "layer-shift": "the engine behaves like a replay whose drafter reads target layers shifted from its own",
    "sliding-ignored": "the engine behaves like a replay whose sliding-window layers attend over the full context",
    "sliding-bidirectional": "the engine behaves like a replay whose sliding layers are bidirectional inside the block",
    "draft-tokens": "the engine behaves like a replay that verifies fewer draft tokens per step than the block",
    "context-window": "the engine behaves like a replay whose drafter sees only the last context positions",
    "prefill-count": "the engine counts the prefill token as a verify step (a definitional offset, not a bug)",
    "numerics": "the engine behaves like a replay with a bf16 drafter (numeric noise)",
}
NONE_EXPLAINS = "no known fault explains the gap"
NO_GAP = "no gap to explain: the engine's steps are the replay's"


# ---------------------------------------------------------------------------
# alignment


def cut(steps: list[int], total: int) -> list[int]:
    """`steps` cut so they commit `total` tokens at most (the engine's last step may reach past the end)."""
    out, done = [], 0
    for s in steps:
        if done >= total:
            break
        out.append(min(int(s), total - done))
        done += out[-1]
    return out


def align(engine: list[int], replay: list[int]) -> dict:
    """One prompt: {"steps" (engine's), "rounds" (replay's), "steps_equal", "first_divergence", "direction",
    "engine_step", "replay_step"} (module docstring)."""
    e = cut(engine, int(sum(replay)))
    n = min(len(e), len(replay))
    diff = np.flatnonzero(np.asarray(e[:n]) != np.asarray(replay[:n]))
    i = int(diff[0]) if len(diff) else (n if len(e) != len(replay) else None)
    out = {"steps": len(e), "rounds": len(replay), "steps_equal": n if i is None else i, "first_divergence": None}
    out |= {"direction": None, "engine_step": None, "replay_step": None}
    if i is not None:
        es, rs = (e[i] if i < len(e) else 0), (replay[i] if i < len(replay) else 0)
        out |= {"first_divergence": 1 + int(sum(replay[:i])), "engine_step": es, "replay_step": rs}
        out["direction"] = "above" if es > rs else "below"
    return out


def align_run(engine: dict[str, list[int]], replay: dict[str, list[int]]) -> tuple[dict[str, dict], dict]:
    """Per prompt `align` over the prompts both sides hold ({id: steps}), and the run's summary: {"prompts",
    "steps", "steps_equal", "steps_equal_share", "diverging", "first_divergence_median", "above", "below"}."""
    rows = {pid: align(engine[pid], replay[pid]) for pid in replay if engine.get(pid)}
    firsts = [r["first_divergence"] for r in rows.values() if r["first_divergence"] is not None]
    steps, equal = sum(r["steps"] for r in rows.values()), sum(r["steps_equal"] for r in rows.values())
    return rows, {
        "prompts": len(rows),
        "steps": steps,
        "steps_equal": equal,
        "steps_equal_share": equal / steps if steps else None,
        "diverging": len(firsts),
        "first_divergence_median": float(np.median(firsts)) if firsts else None,
        "above": sum(r["direction"] == "above" for r in rows.values()),
        "below": sum(r["direction"] == "below" for r in rows.values()),
    }


# ---------------------------------------------------------------------------
# scoring and ranking


def boundaries(steps: list[int]) -> set[int]:
    """Token indices (from the first verify step) where each step ends."""
    return set(np.cumsum(steps).tolist())


def jaccard(engine: list[int], predicted: list[int]) -> float:
    """Overlap of the two partitions' step boundaries (1.0: the same steps)."""
    a, b = boundaries(cut(engine, int(sum(predicted)))), boundaries(predicted)
    return len(a & b) / len(a | b) if a | b else 1.0


def score(engine: dict[str, dict], predicted: dict[str, list[int]]) -> float | None:
    """How well `predicted` ({id: committed per step}) reproduces `engine` ({id: stats row with accept_lengths,
    or verify_steps and completion_tokens}) in [0, 1] (module docstring); None when no prompt is on both sides."""
    ids = [pid for pid in predicted if pid in engine and predicted[pid]]
    if not ids:
        return None
    if all(engine[pid].get("accept_lengths") for pid in ids):
        return float(np.mean([jaccard(list(engine[pid]["accept_lengths"]), predicted[pid]) for pid in ids]))
    pairs = [
        ((s["completion_tokens"] - 1) / s["verify_steps"], (s["completion_tokens"] - 1) / len(predicted[pid]))
        for pid in ids
        if (s := engine[pid]).get("verify_steps") and s.get("completion_tokens")
    ]
    if not pairs:
        return None
    e, p = np.asarray(pairs).T
    return float(1 - min(1.0, np.abs(e - p).mean() / e.mean()))


def mode(engine: dict[str, dict]) -> str:
    """ "steps" when every prompt's stats carry per-step lengths, else "prompts" (per-prompt tau only)."""
    return "steps" if engine and all(s.get("accept_lengths") for s in engine.values()) else "prompts"


def candidates(variant) -> list[dict]:
    """A fault's variant replays as a list of {"steps", "detail", "param"}: `variant` is one such dict or a list."""
    return [v for v in (variant if isinstance(variant, list) else [variant]) if v]


def rank(engine: dict[str, dict], variants: dict[str, dict | list[dict]], skipped: dict[str, str]) -> dict:
    """The faults ranked: `variants` {fault or CLEAN: {"steps": {id: committed per step}, "detail": str, "param":
    the fault's parameter or None} or a list of them (one per parameter searched)}, `skipped` {fault: why it was
    not replayed}. Returns {"mode", "clean_score", "gap" (the clean replay does not reproduce the engine exactly),
    "candidates": every [{"fault", "param", "score", "detail"}] best first, "faults": each fault at its best
    parameter, best first (ties in FAULTS order), "explained_by" (`explained`), "explained_param" (its parameter
    when it is clear, else None), "explained_params" (the parameters tied at its best score), "margin" (the best
    fault's score over "runner_up": the next fault, or "clean" when the clean replay scores higher), "param_margin"
    (the best parameter's score over the same fault's next one; None with one parameter), "evidence", "share",
    "margin_share", "skipped"}."""
    clean = score(engine, variants[CLEAN]["steps"]) if CLEAN in variants else None
    every = [
        {"fault": f, "param": v.get("param"), "score": s, "detail": v.get("detail", "")}
        for f in FAULTS
        if f in variants
        for v in candidates(variants[f])
        if (s := score(engine, v["steps"])) is not None
    ]
    every.sort(key=lambda r: -r["score"])  # stable: ties stay in FAULTS order, then the order searched
    scored, seen = [], set()
    for c in every:
        if c["fault"] not in seen:
            seen.add(c["fault"])
            scored.append(c)
    margin, runner = runner_up(clean, scored)
    best = explained(clean, scored)
    own = [c for c in every if scored and c["fault"] == scored[0]["fault"]]
    tied = [c["param"] for c in own if c["score"] == own[0]["score"]]
    gap = clean is None or clean < 1.0
    return {
        "mode": mode(engine),
        "clean_score": clean,
        "gap": gap,
        "candidates": every,
        "faults": scored,
        "explained_by": best,
        "explained_param": tied[0] if best and len(tied) == 1 else None,
        "explained_params": tied if best else [],
        "margin": margin,
        "runner_up": runner,
        "param_margin": own[0]["score"] - own[1]["score"] if len(own) > 1 else None,
        "evidence": EVIDENCE[best] if best else (NONE_EXPLAINS if gap else NO_GAP),
        "share": SHARE,
        "margin_share": MARGIN,
        "skipped": skipped,
    }


def runner_up(clean: float | None, scored: list[dict]) -> tuple[float | None, str | None]:
    """(the best fault's score over the runner-up, the runner-up's name): the next fault, or CLEAN when the clean
    replay scores higher; (None, None) without a scored fault."""
    if not scored:
        return None, None
    nxt = [(scored[1]["score"], scored[1]["fault"])] if len(scored) > 1 else []
    if clean is not None:
        nxt.append((clean, CLEAN))
    if not nxt:
        return None, None
    s, name = max(nxt, key=lambda x: x[0])
    return scored[0]["score"] - s, name


def explained(clean: float | None, scored: list[dict]) -> str | None:
    """The fault named: the best one when there is a gap, it removes SHARE of the clean replay's disagreement and
    beats the runner-up by MARGIN of it (a tie is no margin)."""
    if not scored or clean is None or clean >= 1.0:
        return None
    top = scored[0]
    if top["score"] <= clean or top["score"] - clean < SHARE * (1 - clean):
        return None
    margin, _ = runner_up(clean, scored)
    if margin is None or margin <= 0 or margin < MARGIN * (1 - clean):
        return None  # another fault reproduces the engine (nearly) as well: neither is named
    return top["fault"]


def verdict(ranking: dict) -> str:
    """The ranking in one sentence (the page's and the CLI's): "no gap to explain", the fault named with its
    parameter and margin, or why none is (the closest candidate, its margin and the rule). Rankings kept before
    margins were recorded give their evidence."""
    top = (ranking.get("faults") or [None])[0]
    if ranking.get("gap") is False:
        return NO_GAP
    if "margin" not in ranking or top is None:
        return ranking.get("evidence") or NONE_EXPLAINS
    clean, margin, runner = ranking.get("clean_score"), ranking.get("margin") or 0.0, ranking.get("runner_up")
    what = f"{top['fault']} ({top.get('detail') or 'its variant'}) scores {top['score']:.3f}"
    over = f"{margin:.3f} above {'the clean replay' if runner == CLEAN else runner}"
    if ranking.get("explained_by"):
        tied = ranking.get("explained_params") or []
        which = "" if len(tied) < 2 else f"; parameters {tied} reproduce it equally well"
        return f"{EVIDENCE[top['fault']]}: {what}, {over}{which}"
    rule = (
        f"a fault is named when it removes {ranking.get('share', SHARE):g} of the clean replay's disagreement "
        f"({1 - clean:.3f}) and beats the runner-up by {ranking.get('margin_share', MARGIN):g} of it"
        if clean is not None
        else "the clean replay could not be scored"
    )
    return f"{NONE_EXPLAINS}: the closest, {what}, {over}; {rule}"


def draft_cut(accepted: np.ndarray, prompt_len: int, T: int, k: int) -> list[int]:
    """The chain walk's committed tokens per round when the engine verifies only `k` drafts a step."""
    from ..walks import chain_walk

    return [c for _, _, c in chain_walk(np.minimum(np.asarray(accepted), k), prompt_len, T)]


def prefill_step(rounds: list[int]) -> list[int]:
    """The replay's rounds as an engine that counts the prefill token as a verify step reports them."""
    return [1, *rounds]
