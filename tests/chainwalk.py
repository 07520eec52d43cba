"""Test helpers (not tests): the chain walk written out by hand, an independent reference for the dashboard's
walks. A round at anchor p commits min(accepted(p) + 1, T-1-p) tokens, the first accepted(p) of them drafts, the
rest the target's; the next round's anchor is the last committed position."""

from __future__ import annotations


def outcome_walk(accepted_at: list[int], P: int, T: int) -> list[str]:
    """Outcome per completion position, from a chain walk written out here: a round at anchor p commits
    min(accepted(p) + 1, T-1-p) tokens, the first accepted(p) of them drafts, the rest the target's."""
    out, anchor = ["prefill"] + ["none"] * (T - P - 1), P
    while anchor < T - 1:
        a = accepted_at[anchor - P]
        c = min(a + 1, T - 1 - anchor)
        for k in range(1, c + 1):
            out[anchor + k - P] = "draft" if k <= a else "target"
        anchor += c
    return out


def walk_by_hand(r: dict, comp: dict) -> list[tuple[int, int]]:
    """(anchor, accepted) per chain round, from accepted(p)."""
    P, T = r["prompt_len"], len(comp["prompt_ids"]) + len(comp["output_ids"])
    out, p = [], P
    while p < T - 1:
        a = r["accepted_at"][p - P]
        out.append((p, a))
        p += min(a + 1, T - 1 - p)
    return out
