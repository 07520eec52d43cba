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
    assert set(out) == {"by_class", "by_position", "by_context", "rejection_pairs", "worst_spans"}
    assert sum(r["rounds"] for r in out["by_position"]) == 4 == sum(r["rounds"] for r in out["by_context"])


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
