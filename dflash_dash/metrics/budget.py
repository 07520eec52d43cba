"""DDTree against a chain of the same token budget: the chain whose block verifies as many drafts as the tree.

Contract: `Prompt`s and a `Ctx` in, numbers out: per round commit min(accepted(p), N) + 1 (capped to the tokens
left), walking from P over the same drafts cut to N slots (N = the tree budget); None without a tree budget or
where the walk reaches an anchor a chain-only replay did not compute.
"""

from __future__ import annotations

from .base import Ctx, Prompt, _mean


def budget_rounds(p: Prompt, ctx: Ctx) -> list[int] | None:
    """Committed tokens per round of a chain whose block verifies as many drafts as the DDTree budget N (block
    N+1), from the same drafts cut to their first N slots: walk from P, commit min(min(accepted(p), N) + 1,
    T-1-p) per round (`walks.chain_walk` with accepted capped at N). None without a tree budget, or where the walk
    reaches an anchor whose accepted(p) was not computed (chain-only replay)."""
    N = ctx.tree_budget
    if not N:
        return None
    if ("_budget", N) in p.__dict__:  # once per Prompt and budget
        got = p.__dict__[("_budget", N)]
        return None if got is None else list(got)
    out, a, T, P, at = [], p.prompt_len, p.T, p.prompt_len, p.accepted_at
    while a < T - 1:
        acc = int(at[a - P])
        if acc < 0:
            out = None
            break
        c = min(min(acc, N) + 1, T - 1 - a)
        out.append(c)
        a += c
    p.__dict__[("_budget", N)] = out
    return None if out is None else list(out)


def chain_tau_at_budget(p: Prompt, ctx: Ctx) -> float | None:
    rs = budget_rounds(p, ctx)
    return sum(rs) / len(rs) if rs else None


def _budget_all(ps: list[Prompt], ctx: Ctx) -> list[list[int]] | None:
    """budget_rounds of every prompt with rounds; None when any is unknown (a mean over the rest would be biased)."""
    rs = [budget_rounds(p, ctx) for p in ps if p.rounds]
    return None if not rs or any(r is None for r in rs) else rs


def chain_tau_at_budget_run(ps: list[Prompt], ctx: Ctx) -> float | None:
    rs = _budget_all(ps, ctx)
    return None if rs is None else _mean([sum(r) / len(r) for r in rs if r])


def chain_tau_at_budget_pooled(ps: list[Prompt], ctx: Ctx) -> float | None:
    rs = _budget_all(ps, ctx)
    flat = [c for r in rs or [] for c in r]
    return sum(flat) / len(flat) if flat else None
