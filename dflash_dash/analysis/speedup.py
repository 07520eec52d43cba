"""Predicted speedup of a run from its chain rounds and a measured cost table, and the "what to serve" advisor.

Contract: numpy and `costs` only (no torch, no store). Inputs are a run's scored `metrics.Prompt`s (as
`Store.prompts` gives them back), its summary, and a `costs.CostTable`.
  - `rounds_of(p, acc)`: the chain walk of one prompt as (context length, committed) pairs, the context length of a
    round being its anchor position (the target's cache holds positions 0..anchor-1 when it verifies the block
    [anchor token, drafts]); `acc` (optional) replaces accepted(p) (the capped re-walk).
  - `predict(prompts, table, verify)`: the run's predicted speedup `costs.speedup` over every round of every prompt
    (verify = the block size B: every family verifies its whole block, DFlash2 its own B), with tau pooled and the
    predicted tokens/s on the table's device.
  - `capped(p, k)`: accepted(p) capped at k drafts, min(accepted(p), k), from the every-anchor arrays: the same
    drafter serving k drafts per step (its first k drafts are the ones it proposes; a k-draft block accepts
    min(accepted, k)). Needs every anchor (a chain-only run has -1 off its own rounds): None then.
  - `advise(runs, table)`: one row per setting: k = 1..B-1 drafts (verify k + 1), each DDTree budget replayed (a run
    with tree_budget b: its DDTree rounds, a tree drafted and verified as b + 1 tokens), and each temperature replayed
    (a run with tau_expected at T: tau_expected x the chain rounds' per-round costs at verify B); the setting with the
    highest predicted speedup among those one chooses at T = 0 (drafts, tree) marked best.
  - `measured_rate(meta)`: the engine's own tokens/s of one completion where it reports timings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import costs
from ..metrics import Prompt

if TYPE_CHECKING:
    from ..store import Run

FORMULA = costs.FORMULA + "; per round at its context length (its anchor), summed over the run's rounds"
CAPPED = "accepted capped at k drafts: acc_k(p) = min(accepted(p), k), the chain walked again with it, verify k + 1"


def rounds_of(p: Prompt, acc: np.ndarray | None = None) -> list[tuple[int, int]]:
    """(context length = anchor, committed) of each chain round of `p` (its stored rounds, or walked with `acc`)."""
    if acc is None:
        a = p.round_anchors
        return [(int(x), int(c)) for x, c in zip(a, p.rounds)]
    out, at, T = [], p.prompt_len, p.T
    while at < T - 1:
        c = min(int(acc[at - p.prompt_len]) + 1, T - 1 - at)
        out.append((at, c))
        at += c
    return out


def tree_rounds_of(p: Prompt) -> list[tuple[int, int]]:
    """(context length, committed) of each DDTree round: anchors P, then + committed."""
    at, out = p.prompt_len, []
    for c in p.tree_rounds:
        out.append((at, int(c)))
        at += int(c)
    return out


def capped(p: Prompt, k: int) -> np.ndarray | None:
    """min(accepted(p), k) at every completion anchor; None where the run did not compute every anchor."""
    acc = np.asarray(p.accepted_at, dtype=np.int64)
    if not len(acc) or (acc < 0).any():
        return None
    return np.minimum(acc, k)


def _spent(rounds: list[tuple[int, int]], table: costs.CostTable, verify: int, tree: int = 0) -> float:
    """Seconds the speculative decoder spends on `rounds`: a draft (block, or DDTree of budget `tree`) and a verify
    forward of `verify` tokens per round, each at the round's context length."""
    if tree:
        return sum(table.t_tree(tree, x) + table.t_target(verify, x) for x, _ in rounds)
    return sum(table.t_draft(x) + table.t_target(verify, x) for x, _ in rounds)


def _summary(rounds: list[tuple[int, int]], table: costs.CostTable, verify: int, tree: int = 0) -> dict[str, Any]:
    n, spec = sum(c for _, c in rounds), _spent(rounds, table, verify, tree)
    plain = sum(c * table.t_target(1, x) for x, c in rounds)
    speed = costs.tree_speedup(table, rounds, tree) if tree else costs.speedup(table, rounds, verify)
    return {
        "tau": n / len(rounds) if rounds else None,
        "speedup": speed if rounds else None,
        "tokens_per_s": n / spec if spec else None,
        "plain_tokens_per_s": n / plain if plain else None,
        "rounds": len(rounds),
    }


def predict(prompts: Sequence[Prompt], table: costs.CostTable, verify: int) -> dict[str, Any]:
    """The run's predicted speedup over all its chain rounds (module docstring), tau pooled beside it."""
    rounds = [r for p in prompts for r in rounds_of(p)]
    return _summary(rounds, table, verify) | {"verify": verify, "formula": FORMULA, "costs": table.label()}


def advise(runs: Sequence[tuple[Run, Sequence[Prompt]]], table: costs.CostTable) -> dict[str, Any]:
    """Rows per setting (module docstring) over `runs` [(run row with its summary, its prompts)], the first run the
    one asked about: {"rows", "best", "formula", "costs", "skipped"}; a setting the table cannot price (a tree
    budget it did not time) is left out and named in `skipped`."""
    run, prompts = runs[0]
    B = run.block_size
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for k in range(1, B):
        accs = [capped(p, k) for p in prompts]
        if any(a is None for a in accs):
            skipped.append(f"k = 1..{B - 1} drafts: run {run.id} replayed only its chain's anchors (replay with "
                           "every anchor to cap its drafts)")  # fmt: skip
            break
        rounds = [r for p, a in zip(prompts, accs) for r in rounds_of(p, a)]
        rows.append({"setting": f"{k} drafts", "kind": "drafts", "k": k, "verify": k + 1, "temperature": 0.0}
                    | _summary(rounds, table, k + 1) | {"run": run.id})  # fmt: skip
    if not rows:  # the run's own setting, B-1 drafts, from its stored rounds
        rows.append({"setting": f"{B - 1} drafts", "kind": "drafts", "k": B - 1, "verify": B, "temperature": 0.0}
                    | _summary([r for p in prompts for r in rounds_of(p)], table, B) | {"run": run.id})  # fmt: skip
    seen: set[int] = set()
    for r, ps in runs:
        b = int(r.summary.get("tree_budget") or 0)
        if b and b not in seen and any(p.tree_rounds for p in ps):
            seen.add(b)
            if b not in table.budgets():
                skipped.append(f"DDTree-{b}: the cost table has no tree of budget {b} (profile --tree-budget {b})")
                continue
            rounds = [x for p in ps for x in tree_rounds_of(p)]
            rows.append({"setting": f"DDTree-{b}", "kind": "tree", "k": None, "verify": b + 1, "temperature": 0.0}
                        | _summary(rounds, table, b + 1, tree=b) | {"run": r.id})  # fmt: skip
    for r, ps in runs:
        s = r.summary
        t, tau = s.get("temperature"), s.get("tau_expected")
        if t is None or not isinstance(tau, (int, float)) or tau != tau:
            continue
        rounds = [x for p in ps for x in rounds_of(p)]
        if not rounds:
            continue
        cost = _spent(rounds, table, B) / len(rounds)  # mean seconds per round at the rounds' contexts
        t1 = sum(table.t_target(1, x) for x, _ in rounds) / len(rounds)
        rows.append({
            "setting": f"{B - 1} drafts at T = {t:g} ({s.get('verify', '?')})", "kind": "temperature", "k": B - 1,
            "verify": B, "temperature": float(t), "tau": float(tau),
            "speedup": tau * t1 / cost, "tokens_per_s": tau / cost, "plain_tokens_per_s": 1 / t1,
            "rounds": len(rounds), "run": r.id,
        })  # fmt: skip
    choosable = [x for x in rows if x["kind"] != "temperature" and x["speedup"] is not None]
    best = max(choosable, key=lambda x: x["speedup"])["setting"] if choosable else None
    for x in rows:
        x["best"] = x["setting"] == best
    return {
        "run": run.id,
        "block_size": B,
        "rows": rows,
        "best": best,
        "formula": FORMULA,
        "capped": CAPPED,
        "temperature_rule": "tau_expected x mean t_target(1) / mean (t_draft + t_target(B)) over the chain rounds",
        "costs": table.label(),
        "skipped": skipped,
    }


def measured_rate(meta: dict[str, Any] | None, completion_tokens: int | None = None) -> tuple[float | None, str]:
    """(tokens/s, how) the engine reported for one completion: llama.cpp's timings.predicted_per_second (decode
    only), else completion_tokens / e2e_latency (SGLang's meta_info: prefill and queueing included); (None, why)."""
    meta = meta or {}
    t = meta.get("timings") or {}
    rate = t.get("predicted_per_second")
    if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0:
        return float(rate), "llama.cpp timings.predicted_per_second (decode only)"
    n = meta.get("completion_tokens", completion_tokens)
    lat = meta.get("e2e_latency")
    if isinstance(lat, (int, float)) and lat > 0 and isinstance(n, int) and n > 0:
        return n / lat, "completion_tokens / e2e_latency (SGLang meta_info; prefill included)"
    return None, "the engine reported no timings for this completion"


def run_rate(metas: Sequence[tuple[dict[str, Any] | None, int | None]]) -> dict[str, Any] | None:
    """The engine's measured tokens/s over a set's completions: all tokens / all seconds, by the first rule any
    completion answers to; None when none reports timings."""
    got = [(measured_rate(m, n), n) for m, n in metas]
    ok = [(r, how, (m or {}).get("completion_tokens", n)) for ((r, how), n), (m, _) in zip(got, metas) if r]
    if not ok:
        return None
    toks = sum(int(n or 0) for _, _, n in ok)
    secs = sum(int(n or 0) / r for r, _, n in ok)
    return {"tokens_per_s": toks / secs if secs else None, "how": ok[0][1], "completions": len(ok)}
