"""Failure patterns (dflash_dash/analysis/patterns.py) on a hand-made run with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_dash import metrics
from dflash_dash.analysis import patterns

B = 3
TEXT = {
    10: "def",
    11: " foo",
    12: "(",
    13: "x",
    14: "):",
    15: "\n    ",
    20: "return",
    22: " 1",
    99: " bar",
    50: "#",
    7: "'s",
    100: "p",
    101: "q",
}


def strings(ids):
    return [TEXT.get(int(i), f"⟨{int(i)}⟩") for i in ids]


def hand_run():
    """a: P=2, output def foo ( x ): ↵ -> rounds at anchor 2 (drafts ' foo' '(' both accepted, 3 committed) and
    anchor 5 (drafts '):' ' bar': 1 accepted, ' bar' rejected for '↵    ', 2 committed).
    b: P=1, output return ↵ 1 -> rounds at anchor 1 (' bar' rejected for '↵    ') and anchor 2 ('#' for ' 1')."""
    comps = {
        "a": {"prompt_ids": [100, 101], "output_ids": [10, 11, 12, 13, 14, 15]},
        "b": {"prompt_ids": [100], "output_ids": [20, 15, 22]},
    }
    rows = [
        {
            "prompt_id": "a",
            "prompt_len": 2,
            "accepted_at": [2, 0, 0, 1, 0, 0],
            "rounds": [3, 2],
            "drafts": [11, 12, 50, 51, 50, 52, 14, 99, 50, 53, 54, 55],
        },
        {
            "prompt_id": "b",
            "prompt_len": 1,
            "accepted_at": [0, 0, 0],
            "rounds": [1, 1],
            "drafts": [99, 7, 50, 50, 0, 0],
        },
    ]
    return [metrics.Prompt.from_row(r) for r in rows], comps


@pytest.mark.parametrize(
    "text,cls",
    [
        (" return", "keyword"),
        ("None", "keyword"),
        ("\n    ", "whitespace"),
        ("\t", "whitespace"),
        (" foo", "identifier"),
        ("_x1", "identifier"),
        (" 42", "number"),
        ("0x1F", "number"),
        ("1.5e3", "number"),
        ("):", "punctuation"),
        ('"""', "string"),
        ("'s", "string"),
        ("a.b", "other"),
        ("é", "other"),
        ("⟨7⟩", "other"),
    ],
)
def test_token_class(text, cls):
    assert patterns.token_class(text) == cls


def test_rounds_and_classes_at_slot_one():
    rows, comps = hand_run()
    rs = patterns.rounds(rows, comps, B)
    assert [(r.prompt, r.anchor, r.accepted, r.committed, r.slots) for r in rs] == [
        ("a", 2, 2, 3, 2),
        ("a", 5, 1, 2, 2),
        ("b", 1, 0, 1, 2),
        ("b", 2, 0, 1, 1),
    ]
    got = {r["class"]: r for r in patterns.by_class(rs, strings)}
    assert list(got) == list(patterns.CLASSES)
    assert {
        c: (r["rounds"], r["first_slot_acceptance"], r["mean_accepted"], r["tau"])
        for c, r in got.items()
        if r["rounds"]
    } == {
        "identifier": (1, 1.0, 2.0, 3.0),
        "punctuation": (1, 1.0, 1.0, 2.0),
        "whitespace": (1, 0.0, 0.0, 1.0),
        "number": (1, 0.0, 0.0, 1.0),
    }
    assert got["keyword"]["rounds"] == 0 and got["keyword"]["tau"] is None
    assert sum(r["share_of_rounds"] for r in got.values() if r["rounds"]) == 1.0


def test_position_and_context_bins():
    rows, comps = hand_run()
    rs = patterns.rounds(rows, comps, B)
    pos = patterns.by_position(rs, width=2)
    assert [
        (r["completion_position"], r["rounds"], r["first_slot_acceptance"], r["mean_accepted"], r["tau"]) for r in pos
    ] == [("0-1", 3, 0.3333, 0.6667, 1.6667), ("2-3", 1, 1.0, 1.0, 2.0)]
    ctx = patterns.by_context(rs, width=2)
    assert [(r["context_length"], r["rounds"], r["first_slot_acceptance"], r["tau"]) for r in ctx] == [
        ("0-1", 1, 0.0, 1.0),
        ("2-3", 2, 0.5, 2.0),
        ("4-5", 1, 1.0, 2.0),
    ]
    assert patterns.nice_width(2500) == 250 and patterns.nice_width(7) == 1 and patterns.nice_width(130) == 20


def test_most_frequent_pairs_at_the_first_rejected_slot():
    rows, comps = hand_run()
    pairs = patterns.rejection_pairs(patterns.rounds(rows, comps, B), strings)
    assert [(p["draft"], p["target"], p["count"], p["share_of_rejections"]) for p in pairs] == [
        (" bar", "\n    ", 2, 0.6667),
        ("#", " 1", 1, 0.3333),
    ]
    assert pairs[0]["draft_id"] == 99 and pairs[0]["target_id"] == 15


def test_worst_spans_are_the_lowest_windows_without_overlap_and_link_to_the_token_view():
    rows, comps = hand_run()
    spans = patterns.worst_spans(rows, comps, "run-1", strings, window=2, top=3)
    assert [(s["prompt"], s["start"], s["end"], s["mean_accepted"], s["text"]) for s in spans] == [
        ("a", 3, 4, 0.0, " foo("),
        ("b", 1, 2, 0.0, "return↵    "),
        ("a", 5, 6, 0.5, "x):"),
    ]
    assert spans[0]["link"] == "acceptance?run=run-1&prompt=a&pos=3-4"
    assert patterns.link("r", "a b&c") == "acceptance?run=r&prompt=a+b%26c"


def test_analyse_returns_every_table():
    rows, comps = hand_run()
    out = patterns.analyse(rows, comps, B, strings, "run-1")
    assert set(out) == {
        "by_class",
        "by_position",
        "by_context",
        "context_position",
        "rejection_pairs",
        "rejections",
        "worst_spans",
        "worst_spans_end_cut",
    }
    assert out["worst_spans_end_cut"] == B - 1
    assert out["rejections"] == sum(r["count"] for r in out["rejection_pairs"]) > 0  # the pairs' total
    assert sum(r["rounds"] for r in out["by_position"]) == 4 == sum(r["rounds"] for r in out["by_context"])


def test_worst_spans_leave_out_the_end_where_no_full_block_fits():
    """A drafter that accepts every draft it can (accepted(p) = min(B-1, T-1-p)) on one completion, and a stretch
    accepting 2 of 3 in the middle of another: the end of the first is capped by the tokens left (2, 1, 0), not by
    the drafter, and would win; with the block size known only the middle stretch is a worst span."""
    b4, n = 4, 24
    ids = list(range(1, n + 1))
    comps = {"full": {"prompt_ids": [100], "output_ids": ids}, "dip": {"prompt_ids": [100], "output_ids": ids}}
    full = [min(b4 - 1, n - 1 - i) for i in range(n)]  # anchor i of n: n-1-i tokens after it
    dip = list(full)
    dip[8:12] = [2, 2, 2, 2]
    rows = [
        metrics.Prompt.from_row({"prompt_id": k, "prompt_len": 1, "accepted_at": a, "rounds": [], "drafts": []})
        for k, a in (("full", full), ("dip", dip))
    ]
    ends = patterns.worst_spans(rows, comps, "r", strings, window=2, top=1)  # the block size unknown: the end wins
    assert (ends[0]["prompt"], ends[0]["mean_accepted"]) == ("full", 1.5)
    spans = patterns.worst_spans(rows, comps, "r", strings, window=2, top=3, block_size=b4)
    assert [(s["prompt"], s["start"], s["mean_accepted"]) for s in spans] == [
        ("dip", 9, 2.0),
        ("dip", 11, 2.0),
        ("full", 1, 3.0),  # the dip's other windows overlap these two; the full drafter's first, never its end
    ]
    last = 1 + n - b4  # P + the last anchor with B-1 tokens after it
    assert all(s["end"] <= last for s in patterns.worst_spans(rows, comps, "r", strings, 2, 50, b4))


def test_worst_spans_of_a_chain_only_run_use_the_visited_anchors():
    rows, comps = hand_run()
    rows[0].accepted_at = np.array([2, -1, -1, 1, -1, -1])  # chain-only: only the round anchors 2 and 5 are known
    rows[1].accepted_at = np.array([0, 0, -1])
    spans = patterns.worst_spans(rows, comps, "run-1", strings, window=2, top=5)
    assert [(s["prompt"], s["start"], s["end"], s["anchors"], s["mean_accepted"]) for s in spans] == [
        ("b", 1, 2, 2, 0.0),
        ("a", 4, 5, 1, 1.0),
        ("a", 2, 3, 1, 2.0),
    ]


def test_context_bins_pool_every_anchor_and_the_rounds():
    """a's anchors 2..6 accept 2,0,0,1,0 and b's anchors 1..2 accept 0,0 (the last token drafts nothing); rounds:
    b@1 (1 committed), a@2 (3), b@2 (1), a@5 (2)."""
    rows, comps = hand_run()
    rs = patterns.rounds(rows, comps, B)
    ctx = patterns.by_context(rs, width=2, rows=rows)
    got = [
        (r["context_length"], r["samples"], r["every_anchor_tau"], r["rounds"], r["tau"], r["committed"]) for r in ctx
    ]
    assert got == [
        ("0-1", 1, 1.0, 1, 1.0, 1),
        ("2-3", 3, 1.6667, 2, 2.0, 4),
        ("4-5", 2, 1.5, 1, 2.0, 2),
        ("6-7", 1, 1.0, 0, None, 0),  # anchors but no round: kept
    ]
    assert [r["from_thousands"] for r in ctx] == [0.0, 0.002, 0.004, 0.006]
    # pooled over the bins: the run's every-anchor tau and its committed tokens
    n = sum(r["samples"] for r in ctx)
    pooled = sum(r["every_anchor_tau"] * r["samples"] for r in ctx) / n
    assert n == 7 and pooled == pytest.approx(metrics.core.every_anchor_run(rows, None), abs=1e-4)
    assert sum(r["committed"] for r in ctx) == sum(sum(p.rounds) for p in rows)
    # without rows it is the rounds-only table of before
    assert [r["context_length"] for r in patterns.by_context(rs, width=2)] == ["0-1", "2-3", "4-5"]


def long_prompt(pid: str, P: int, n: int, acc) -> metrics.Prompt:
    """A prompt row of `n` completion positions whose accepted(p) is acc(p), with its chain walk's rounds."""
    from dflash_dash import walks

    a = np.array([acc(P + i) for i in range(n)], dtype=np.int64)
    return metrics.Prompt(id=pid, prompt_len=P, accepted_at=a, rounds=[c for _, _, c in walks.chain_walk(a, P, P + n)])


def test_long_traces_bin_by_thousands_of_positions():
    """Acceptance that falls with the context (accepted(p) = 3 before position 1,000, 1 before 2,000, 0 after)
    shows as a falling curve in bins of 1,000 positions, pooled over two prompts of different lengths."""

    def acc(p):
        return 3 if p < 1000 else 1 if p < 2000 else 0

    rows = [long_prompt("long", 100, 3000, acc), long_prompt("short", 50, 1500, acc)]
    assert patterns.context_width(rows) == 1000
    comps = {
        r.id: {"prompt_ids": [0] * r.prompt_len, "output_ids": [1] * len(r.accepted_at)} for r in rows
    }  # token ids play no part in the bins
    ctx = patterns.by_context(patterns.rounds(rows, comps, 16), patterns.context_width(rows), rows)
    assert [r["context_length"] for r in ctx] == ["0-999", "1000-1999", "2000-2999", "3000-3999"]
    # samples: anchors P..T-2 of each prompt in the bin
    assert [r["samples"] for r in ctx] == [900 + 950, 1000 + 549, 1000, 99]
    assert [r["every_anchor_tau"] for r in ctx] == [4.0, 2.0, 1.0, 1.0]
    assert [r["from_thousands"] for r in ctx] == [0.0, 1.0, 2.0, 3.0]
    assert ctx[0]["tau"] == 4.0 and ctx[2]["tau"] == 1.0 and ctx[0]["rounds"] == 225 + 238
    assert sum(r["rounds"] for r in ctx) == sum(len(p.rounds) for p in rows)
    out = patterns.analyse(rows, comps, 16, strings, "run-1")
    assert out["context_position"] == ctx  # the kept table, at 1,000 positions a bin


def test_short_traces_get_a_round_width_and_chain_only_rows_use_their_known_anchors():
    rows = [long_prompt("a", 10, 300, lambda p: p % 3)]
    assert patterns.context_width(rows) == patterns.nice_width(310) == 50  # one bin of 1,000 would say nothing
    assert patterns.context_width(rows, width=100) == 100  # 310 positions span two bins of 100
    rows[0].accepted_at[1::2] = -1  # chain-only: half the anchors not computed
    ctx = patterns.by_context([], 50, rows)
    known = [p for p in range(10, 309) if (p - 10) % 2 == 0]
    assert sum(r["samples"] for r in ctx) == len(known)
    first = [p for p in known if p < 50]
    assert ctx[0]["samples"] == len(first) and ctx[0]["every_anchor_tau"] == round(
        (sum(p % 3 for p in first) + len(first)) / len(first), 4
    )
    assert patterns.by_context([], None, []) == []
