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
  - `rank`: the faults best first, and the rule (`explained`): the best fault is named when it removes at least
    SHARE of the clean replay's disagreement with the engine, score - clean >= SHARE x (1 - clean) with
    score > clean; no fault is named when the clean replay reproduces the engine exactly (nothing to explain), when
    no fault does clearly better, or when the best fault ties another one.
FAULTS holds the fault names, fixed; `EVIDENCE` says in words what each one means for the page and the README.
"""

from __future__ import annotations

import numpy as np

CLEAN = "clean"  # the run's own replay: what a correct greedy engine reaches
SHARE = 0.5  # a fault is named when it removes at least this share of the clean replay's disagreement
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
    "layer-shift": "the engine behaves like a replay with the target layers shifted by one",
    "sliding-ignored": "the engine behaves like a replay whose sliding-window layers attend over the full context",
    "sliding-bidirectional": "the engine behaves like a replay whose sliding layers are bidirectional inside the block",
    "draft-tokens": "the engine behaves like a replay that verifies fewer draft tokens per step than the block",
    "context-window": "the engine behaves like a replay whose drafter sees only the last context positions",
    "prefill-count": "the engine counts the prefill token as a verify step (a definitional offset, not a bug)",
    "numerics": "the engine behaves like a replay with a bf16 drafter (numeric noise)",
}
NONE_EXPLAINS = "no known fault explains the gap"


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


def rank(engine: dict[str, dict], variants: dict[str, dict], skipped: dict[str, str]) -> dict:
    """The faults ranked: `variants` {fault or CLEAN: {"steps": {id: committed per step}, "detail": str}},
    `skipped` {fault: why it was not replayed}. Returns {"mode", "clean_score", "faults": [{"fault", "score",
    "detail"}] best first (ties in FAULTS order), "explained_by" (`explained`), "evidence", "skipped"}."""
    clean = score(engine, variants[CLEAN]["steps"]) if CLEAN in variants else None
    scored = [
        {"fault": f, "score": s, "detail": variants[f].get("detail", "")}
        for f in FAULTS
        if f in variants and (s := score(engine, variants[f]["steps"])) is not None
    ]
    scored.sort(key=lambda r: -r["score"])  # stable: ties stay in FAULTS order
    best = explained(clean, scored)
    return {
        "mode": mode(engine),
        "clean_score": clean,
        "faults": scored,
        "explained_by": best,
        "evidence": EVIDENCE[best] if best else NONE_EXPLAINS,
        "share": SHARE,
        "skipped": skipped,
    }


def explained(clean: float | None, scored: list[dict]) -> str | None:
    """The fault named: the best one when it removes SHARE of the clean replay's disagreement and no other fault
    scores the same."""
    if not scored or clean is None:
        return None
    top = scored[0]
    if top["score"] <= clean or top["score"] - clean < SHARE * (1 - clean):
        return None
    if len(scored) > 1 and scored[1]["score"] == top["score"]:
        return None  # two faults reproduce the engine equally well: neither is named
    return top["fault"]


def draft_cut(accepted: np.ndarray, prompt_len: int, T: int, k: int) -> list[int]:
    """The chain walk's committed tokens per round when the engine verifies only `k` drafts a step."""
    from ..walks import chain_walk

    return [c for _, _, c in chain_walk(np.minimum(np.asarray(accepted), k), prompt_len, T)]


def prefill_step(rounds: list[int]) -> list[int]:
    """The replay's rounds as an engine that counts the prefill token as a verify step reports them."""
    return [1, *rounds]
