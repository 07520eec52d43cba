"""analysis and render (token roles, escaped HTML, figures, tables), parity and the sweep operation/CLI."""

from __future__ import annotations

import re
import shutil
import time

import numpy as np
import pytest
import torch

from dflash_dash import cache, cli, metrics, ops, parity, pipeline
from dflash_dash.analysis.checks import consistency
from dflash_dash.analysis.compare import config_diff, sweep_points
from dflash_dash.analysis.trace import Trace, differing, trace
from dflash_dash.render.figures import depth_fig, hist_fig, sweep_fig
from dflash_dash.render.tables import completion_table, prompt_table, summary_rows
from dflash_dash.render.tokens import esc, token_html
from dflash_dash.store import CompletionEntry, Run, Store
from dflash_dash.vocab import Vocab, load_vocab
from tools import tiny

# ---------------------------------------------------------------------------
# escaping


def test_esc_makes_markup_and_control_characters_inert_and_visible():
    s = '<script>alert("x")</script>\n\tA & B\x01\x7f\u2028'
    out = esc(s)
    assert "<script" not in out and "</script" not in out
    assert "&lt;script&gt;" in out and "&quot;x&quot;" in out and "&amp;" in out
    assert out.count("↵<br>") == 1 and "⇥" in out
    assert "\\x01" in out and "\\x7f" in out and "\\u2028" in out
    assert "\x01" not in out and "\x7f" not in out
    # the only tag left is the <br> we add for the newline
    assert re.findall(r"<[a-z/][^>]*>", out) == ["<br>"]


def test_vocab_without_tokenizer_shows_ids(tmp_path):
    v = load_vocab(str(tmp_path))
    assert v.tok is None
    assert v.strings([5, 17, 5]) == ["⟨5⟩", "⟨17⟩", "⟨5⟩"]


def test_vocab_decodes_with_the_target_tokenizer(prepared):
    v = load_vocab(str(prepared.target))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(prepared.target)
    ids = tok.encode("def f(x):\n    return x", add_special_tokens=False)
    assert "".join(v.strings(ids)) == tok.decode(ids)


# ---------------------------------------------------------------------------
# traces


def synthetic(P=5, T=40, B=4, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(10, 100, T).tolist()
    acc = []
    drafts = []
    for p in range(P, T):
        a = int(rng.integers(0, B))
        a = min(a, T - 1 - p)
        acc.append(a)
        row = [tokens[p + k] if p + k < T else 0 for k in range(1, B)]
        if a < B - 1 and p + a + 1 < T:
            row[a] = tokens[p + a + 1] + 1000  # a wrong draft right after the accepted ones
        drafts.extend(row)
    row = {"prompt_len": P, "accepted_at": acc, "drafts": drafts, "tau": None, "tree_tau": None}
    comp = {"prompt_ids": tokens[:P], "output_ids": tokens[P:]}
    return row, comp


def walked_by_hand(row: dict, comp: dict, B: int) -> dict:
    """The chain walk's trace written out here, position by position, independently of walks.chain_walk and
    analysis.trace: the first completion position comes from the prefill; a round at anchor p commits its accepted
    drafts (depth 1..a), then the target's bonus token (beside it the rejected draft d_{a+1}, when a < B-1),
    stopping at the completion's end; the next round's anchor is the last committed position."""
    P, acc, drafts = row["prompt_len"], row["accepted_at"], row["drafts"]
    T = len(comp["prompt_ids"]) + len(comp["output_ids"])
    n = T - P
    out = {
        "role": ["pre"] + ["tail"] * (n - 1),
        "depth": [0] * n,
        "round": [-1] * n,
        "start": [False] * n,
        "rejected": [None] * n,
        "rounds": [],
    }
    anchor = P
    while anchor < T - 1:
        r, a, pos = len(out["rounds"]), acc[anchor - P], anchor + 1
        out["start"][pos - P] = True
        while pos < T and pos - anchor <= a:  # the accepted drafts
            out["role"][pos - P], out["depth"][pos - P], out["round"][pos - P] = "acc", pos - anchor, r
            pos += 1
        if pos < T:  # the target's bonus token
            out["role"][pos - P], out["round"][pos - P] = "bonus", r
            if a < B - 1:
                out["rejected"][pos - P] = drafts[(anchor - P) * (B - 1) + a]
            pos += 1
        out["rounds"].append((anchor, a, pos - 1 - anchor))
        anchor = pos - 1
    return out


def as_dict(tr: Trace) -> dict:
    return {
        "role": tr.role,
        "depth": tr.depth,
        "round": tr.round,
        "start": tr.start,
        "rejected": tr.rejected,
        "rounds": [tuple(r) for r in tr.rounds],
    }


def test_trace_of_a_hand_worked_example():
    # P = 2, T = 12, B = 4; accepted(p) for p = 2..11. The chain walk, worked by hand:
    #   anchor 2:  accepted 2 -> positions 3, 4 drafted (depth 1, 2), 5 bonus (draft d_3 at p=2 rejected)
    #   anchor 5:  accepted 0 -> position 6 bonus (draft d_1 at p=5 rejected)
    #   anchor 6:  accepted 3 -> positions 7, 8, 9 drafted, 10 bonus (all B-1 drafts accepted: none rejected)
    #   anchor 10: accepted 1 -> position 11 drafted, the completion's end (no bonus)
    tokens = list(range(100, 112))
    row = {"prompt_len": 2, "accepted_at": [2, 1, 0, 0, 3, 2, 1, 0, 1, 0], "drafts": [900 + j for j in range(30)]}
    tr = trace(row, {"prompt_ids": tokens[:2], "output_ids": tokens[2:]}, 4)
    assert as_dict(tr) == {
        "role": ["pre", "acc", "acc", "bonus", "bonus", "acc", "acc", "acc", "bonus", "acc"],
        "depth": [0, 1, 2, 0, 0, 1, 2, 3, 0, 1],
        "round": [-1, 0, 0, 0, 1, 2, 2, 2, 2, 3],
        "start": [False, True, False, False, True, True, False, False, False, True],
        "rejected": [None, None, None, 902, 909, None, None, None, None, None],
        "rounds": [(2, 2, 3), (5, 0, 1), (6, 3, 4), (10, 1, 1)],
    }
    assert as_dict(tr) == walked_by_hand(row, {"prompt_ids": tokens[:2], "output_ids": tokens[2:]}, 4)


@pytest.mark.parametrize("seed", range(4))
def test_trace_roles_follow_the_chain_walk(seed):
    B = 4
    row, comp = synthetic(B=B, seed=seed)
    tr = trace(row, comp, B)
    want = walked_by_hand(row, comp, B)
    assert as_dict(tr) == want
    assert "tail" not in tr.role  # every completion position after the first is committed by a round
    assert sum(c for _, _, c in want["rounds"]) == len(tr.role) - 1
    assert any(x is not None for x in tr.rejected) and "bonus" in tr.role and "acc" in tr.role  # not trivial


def test_token_html_marks_roles_depth_blocks_and_rejections():
    B = 4
    row, comp = synthetic(B=B, seed=3)
    tr = trace(row, comp, B)
    out = token_html(tr, Vocab(), B)
    spans = re.findall(r'<span class="([^"]+)" title="([^"]*)">', out)
    token_spans = [s for s in spans if not s[0].startswith("dfv-rej")]
    assert len(token_spans) == len(tr.role)
    for (cls, _tip), role, depth, start in zip(token_spans, tr.role, tr.depth, tr.start):
        assert (f"dfv-a{depth}" if role == "acc" else f"dfv-{role}") in cls.split()
        assert ("dfv-b" in cls.split()) == start
    n_rej = sum(x is not None for x in tr.rejected)
    assert len([s for s in spans if s[0] == "dfv-rej"]) == n_rej
    assert out.count("<sup>") == tr.role.count("acc")
    plain = token_html(tr, Vocab(), B, superscript=False, inline_rejects=False)
    assert "<sup>" not in plain and 'class="dfv-rej"' not in plain


class EvilVocab(Vocab):
    def _one(self, i):
        return ["<script>window.x=1</script>", "<img src=x onerror=alert(1)>", "a\nb", '"q"', "\t"][i % 5]


def test_token_html_escapes_every_token_and_tooltip():
    B = 4
    row, comp = synthetic(B=B, seed=1)
    out = token_html(trace(row, comp, B), EvilVocab(), B)
    body = out[out.index('<div class="dfv">') :]
    assert "<script" not in body and "<img" not in body
    tags = set(re.findall(r"<([a-z]+)", body))
    assert tags <= {"div", "span", "sup", "br"}
    assert "&lt;script&gt;" in body and "&lt;img" in body


def test_token_html_is_fast_for_4000_tokens():
    B = 16
    row, comp = synthetic(P=200, T=4200, B=B, seed=5)
    tr = trace(row, comp, B)
    t = time.perf_counter()
    out = token_html(tr, EvilVocab(), B)
    took = time.perf_counter() - t
    assert out.count('title="pos ') == 4000
    assert took < 1.0, f"token view of 4,000 tokens took {took:.2f} s"


def test_differing_positions():
    B = 4
    row, comp = synthetic(B=B, seed=2)
    a = trace(row, comp, B)
    assert differing(a, a) == set()
    row2 = dict(row, accepted_at=[0] * len(row["accepted_at"]))
    b = trace(row2, comp, B)
    d = differing(a, b)
    # B accepts nothing, so the outcome differs exactly where A committed an accepted draft (tests/test_compare.py
    # has the hand-made pair)
    assert d == {i for i in range(len(a.role)) if a.role[i] == "acc"}
    assert d and all(b.role[i] in ("bonus", "pre") for i in range(len(b.role)))


def test_trace_of_a_real_run(prepared):
    st = Store(prepared.workspace)
    run = st.run_row(prepared.runs[0])
    comps = {c["prompt_id"]: c for c in st.completions(prepared.set_name)}
    B = run["summary"]["block_size"]
    for row in st.run_prompts(run["id"]):
        tr = trace(row, comps[row["prompt_id"]], B)
        assert [c for _, _, c in tr.rounds] == row["rounds"]
        # every committed position has a role: accepted draft or bonus
        assert sum(1 for r in tr.role if r in ("acc", "bonus")) == sum(row["rounds"])
        assert row["tau"] == pytest.approx(sum(row["rounds"]) / len(row["rounds"]))


# ---------------------------------------------------------------------------
# figures and tables


def test_hist_and_depth_figures():
    s = {"accept_hist": [5, 3, 2, 0], "depth_conditional": [0.5, 0.4, None], "depth_marginal": [0.5, 0.2, None]}
    f = hist_fig({"A": s, "B": s})
    assert len(f.data) == 2 and sum(f.data[0].y) == pytest.approx(1.0)
    assert list(f.data[0].y) == pytest.approx([0.5, 0.3, 0.2, 0.0])
    assert list(f.data[0].customdata) == [5, 3, 2, 0]  # the rounds behind each share
    d = depth_fig({"A": s})
    assert len(d.data) == 3 and list(d.data[0].x) == [1, 2, 3]
    assert list(d.data[2].x) == [3] and "n = 0" in d.data[2].name  # the empty depth is announced (tests/test_stats)
    assert d.layout.yaxis2.tickformat == ",d"  # round counts tick as integers (not 42.3, 84.6)
    # a pair of runs, one with adjacent empty depths: no 'n = 0' labels to collide, and room for the longer legend
    e = {"accept_hist": [9, 0, 0, 0], "depth_conditional": [0.1, None, None], "depth_marginal": [0.1, 0.0, 0.0]}
    pair = depth_fig({"A": e, "B": s})
    marks = [t for t in pair.data if "n = 0" in t.name]
    assert len(marks) == 2 and all(t.mode == "markers" and t.text is None for t in marks)
    assert pair.layout.height > d.layout.height


def test_prompt_table_sorted_by_tau():
    rows = [
        metrics.Prompt(p, 3, [0, 1, 2], [1], tau=t, tree_tau=t)
        for p, t in (("a", 2.5), ("b", None), ("c", 1.2), ("d", 3.0))
    ]
    out = prompt_table(metrics.prompt_rows(rows, 4, 0), {})
    assert [r["prompt"] for r in out] == ["c", "a", "d", "b"]
    assert out[0]["every_anchor_tau"] == pytest.approx(1.5)


def test_summary_rows_carry_formulas():
    s = {
        "tau_macro": 2.0,
        "tau_pooled": 1.9,
        "every_anchor_tau": 1.5,
        "ddtree_tau": 2.5,
        "ddtree_tau_pooled": 2.4,
        "tree_budget": 8,
        "rounds": 10,
        "committed": 19,
    }
    rows = summary_rows(s)
    assert all(r["formula"] for r in rows)
    assert {r["metric"] for r in rows} >= {"tau (macro)", "tau (pooled)", "every-anchor tau", "DDTree-8 tau (macro)"}


def test_config_diff_marks_only_differences():
    a = {"block_size": 16, "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": 5}, "x": 1}
    b = {"block_size": 16, "dflash_config": {"target_layer_ids": [1, 3], "mask_token_id": 5}, "y": 2}
    rows = {r["key"]: r for r in config_diff(a, b)}
    assert rows["dflash_config.target_layer_ids"]["differs"] == "≠"
    assert rows["block_size"]["differs"] == "" and rows["dflash_config.mask_token_id"]["differs"] == ""
    assert rows["x"]["differs"] == "≠" and rows["y"]["B"] == "2" and rows["y"]["A"] == "—"
    assert [r["differs"] for r in config_diff(a, b)][:3] == ["≠", "≠", "≠"]  # differences first


def test_completion_table_server_counters():
    rows = [
        {
            "prompt_id": "p",
            "prompt_tokens": 2,
            "output_tokens": 12,
            "finish_reason": "length",
            "meta_info": {"spec_verify_ct": 4, "e2e_latency": 0.5},
            "model_path": "/m",
        },
        {"prompt_id": "q", "prompt_tokens": 1, "output_tokens": 1, "finish_reason": "stop", "meta_info": {}},
    ]
    out = completion_table([CompletionEntry.of(r) for r in rows])
    assert out[0]["server_tau"] == pytest.approx(3.0) and out[0]["spec_verify_ct"] == 4
    assert "server_tau" not in out[1] and out[1]["completion_tokens"] == 1


def test_sweep_points_and_steps(tmp_path):
    root = tmp_path / "train"
    runs = [
        {
            "id": "r1",
            "checkpoint": str(root / "epoch_0_step_200"),
            "name": "s200",
            "extraction_id": "e",
            "summary": {"tau_macro": 2.0},
        },
        {
            "id": "r2",
            "checkpoint": str(root / "epoch_0_step_100"),
            "name": "s100",
            "extraction_id": "e",
            "summary": {"tau_macro": 1.5},
        },
        {
            "id": "r3",
            "checkpoint": str(tmp_path / "other" / "epoch_0_step_50"),
            "name": "x",
            "extraction_id": "e",
            "summary": {},
        },
        {
            "id": "r4",
            "checkpoint": str(root / "epoch_0_step_200"),
            "name": "s200",
            "extraction_id": "e",
            "summary": {"tau_macro": 2.2},
        },
        {"id": "r5", "checkpoint": str(root) + "-old/epoch_9_step_1", "name": "y", "extraction_id": "e", "summary": {}},
    ]
    pts = sweep_points([Run.of(r) for r in runs], str(root))
    assert [p["step"] for p in pts] == [100, 200]
    assert [p["run"] for p in pts] == ["r2", "r4"]  # the latest run of a checkpoint wins
    fig = sweep_fig(pts)
    assert list(fig.data[0].y) == [1.5, 2.2]


def test_consistency_flags_mismatches(prepared):
    from dflash_dash import drafters as drafter, target

    st = Store(prepared.workspace)
    ex = st.extraction(prepared.extraction)
    info = target.describe(ex["target_path"])
    ok = consistency(drafter.read_config(prepared.drafters[0]), ex, info)
    assert all(r["ok"] == "✓" for r in ok if r["check"] != "extraction backend")
    assert next(r for r in ok if r["check"] == "extraction backend")["ok"] == ("✓" if ex["backend"] == "fla" else "✗")
    bad = tiny.write_drafter(prepared.workspace.parent / "bad-layers", tiny.TinyDrafter(target_layer_ids=[2, 5]))
    rows = {r["check"]: r for r in consistency(drafter.read_config(bad), ex, info)}
    assert rows["target layer ids"]["ok"] == "✗" and rows["vocab size"]["ok"] == "✓"
    shutil.rmtree(bad)


# ---------------------------------------------------------------------------
# parity


def test_parity_zero_for_the_same_states_and_measured_for_perturbed(prepared, workspace_copy):
    st = Store(workspace_copy)
    ex = st.extraction(prepared.extraction)
    again = pipeline.extract(
        st,
        ops.Extract(
            target=ex["target_path"], completions=ex["set_name"], layers=ex["layer_ids"], device="cpu", dtype="float32"
        ),
    )
    same = parity.compare(st, again, ex["id"])
    assert same["prompts"] == 3
    for r in same["layers"]:
        assert r["rel_l2"] == pytest.approx(0.0, abs=1e-6) and r["cosine"] == pytest.approx(1.0, abs=1e-6)
    # perturb layer 2 of one prompt in the second extraction; compare against numpy
    K, H = len(ex["layer_ids"]), ex["hidden_size"]
    root = pipeline.features_root(st)
    items = {i["prompt_id"]: i["tokens"] for i in st.items(again)}
    g = torch.Generator().manual_seed(0)
    pid = sorted(items)[0]
    f = cache.read(root, again, pid, items[pid], K * H).float()
    f[:, H:] += 0.05 * torch.randn(f.shape[0], H, generator=g) * f[:, H:].abs().mean()
    cache.write(root, again, pid, f, cache.meta(root, again, pid))
    out = parity.compare(st, again, ex["id"])
    A = np.concatenate([cache.read(root, again, p, items[p], K * H).double().numpy() for p in sorted(items)])
    B = np.concatenate([cache.read(root, ex["id"], p, items[p], K * H).double().numpy() for p in sorted(items)])
    for k in range(K):
        a, b = A[:, k * H : (k + 1) * H], B[:, k * H : (k + 1) * H]
        rel = np.linalg.norm(a - b) / np.linalg.norm(b)
        cos = np.mean((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))
        assert out["layers"][k]["rel_l2"] == pytest.approx(rel, rel=1e-6)
        assert out["layers"][k]["cosine"] == pytest.approx(cos, rel=1e-6)
    assert out["layers"][0]["rel_l2"] == pytest.approx(0.0, abs=1e-6) and out["layers"][1]["rel_l2"] > 1e-3


def test_parity_refuses_different_layers(prepared, workspace_copy):
    st = Store(workspace_copy)
    ex = st.extraction(prepared.extraction)
    other = pipeline.extract(
        st,
        ops.Extract(target=ex["target_path"], completions=ex["set_name"], layers=[0, 3], device="cpu", dtype="float32"),
    )
    with pytest.raises(ValueError, match="different layers"):
        parity.compare(st, other, ex["id"])


# ---------------------------------------------------------------------------
# sweep


def test_sweep_replays_new_checkpoints_in_step_order(prepared, workspace_copy, tmp_path, capsys):
    train = tmp_path / "train"
    shutil.copytree(prepared.train, train)
    tiny.write_drafter(train / "epoch_0_step_50", tiny.TinyDrafter(seed=3))
    ws = str(workspace_copy)
    rc = cli.main(["--workspace", ws, "sweep", "--checkpoints", str(train), "--extraction", prepared.extraction])
    assert rc == 0
    ids = capsys.readouterr().out.split()
    st = Store(workspace_copy)
    runs = {r["id"]: r for r in st.runs()}
    assert len(ids) == 3 and len(runs) == 5  # 2 prepared + 3 new (the copies live at new paths)
    assert [runs[i]["name"] for i in ids] == ["epoch_0_step_50", "epoch_0_step_100", "epoch_1_step_200"]
    # a second sweep replays nothing new and returns the same runs
    assert pipeline.sweep(st, ops.Sweep(checkpoints=str(train), extraction=prepared.extraction)) == ids
    assert len(st.runs()) == 5
    pts = sweep_points(st.runs(), str(train))
    assert [p["run"] for p in pts] == ids


def test_sweep_errors_name_the_fix(prepared, workspace_copy, tmp_path, capsys):
    ws = str(workspace_copy)
    assert cli.main(["--workspace", ws, "sweep", "--checkpoints", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["--workspace", ws, "sweep", "--checkpoints", str(tmp_path / "empty")]) == 2
    assert "no checkpoint inside" in capsys.readouterr().err


def test_job_result_links_every_run_to_its_acceptance_page():
    from dflash_dash.render.formats import job_result

    assert job_result({"run": "run-1"}) == "result: run [`run-1`](acceptance?run=run-1)"
    assert (
        job_result({"runs": ["r-1", "r&2"]})
        == "result: runs [`r-1`](acceptance?run=r-1), [`r&2`](acceptance?run=r%262)"
    )
    assert job_result({"set": "s`x", "fetched": 3}) == "result: set `sx`, fetched `3`"  # no link, no stray backtick


def test_formulas_are_plain_text_for_tables():
    """Compare's formula column showed raw markdown backticks (a dataframe draws text, not markdown)."""
    from dflash_dash import metrics

    assert [m.key for m in metrics.REGISTRY if "`" in m.formula] == []


def test_tau_axes_print_two_decimals_over_a_readable_range():
    """A narrow tau range on a right axis got ticks like 1.2081."""
    from dflash_dash.render.analysis_figures import binned_fig, class_fig
    from dflash_dash.render.figures import TAU_SPAN, sweep_fig

    rows = [
        {"class": c, "bin": i, "rounds": 5, "first_slot_acceptance": 0.3, "tau": t}
        for i, (c, t) in enumerate((("a", 1.2081), ("b", 1.2085)))
    ]
    pts = [{"step": s, "name": "n", "tau_macro": 1.2081, "tau_pooled": 1.2083, "ddtree_tau": None} for s in (1, 2)]
    for axis in (
        class_fig(rows).layout.yaxis2,
        binned_fig(rows, "bin", "t", "x").layout.yaxis2,
        sweep_fig(pts).layout.yaxis,
    ):
        lo, hi = axis.range
        assert axis.tickformat == ".2f" and hi - lo >= TAU_SPAN - 1e-9 and lo < 1.2081 and hi > 1.2085


def test_token_cells_show_whitespace_and_stay_plain_text():
    """Whitespace tokens were blank cells in "most frequent rejections"."""
    import html

    from dflash_dash.render.tables import pattern_rows
    from dflash_dash.render.tokens import shown, visible

    assert shown(" ") == "·" and shown("\n") == "⏎" and shown("\t") == "→" and shown("\x1b") == "\\x1b"
    assert shown("<b>") == "<b>"  # a dataframe draws text: entities would show as typed
    for s in (" ", "\n  x", "<script>&", "\x1b\r", "a\u2028b"):
        assert visible(s) == html.escape(shown(s), quote=True)  # one mapping, the HTML view escaped
    rows = [{"draft": " ", "target": "\n", "draft_id": 1, "target_id": 2, "count": 3, "share_of_rejections": 0.5}]
    assert pattern_rows("rejection_pairs", rows) == [rows[0] | {"draft": "·", "target": "⏎"}]
    assert pattern_rows("by_class", [{"class": " "}]) == [{"class": " "}]


def test_one_number_format_per_kind_of_number():
    """Tables printed 1.6558 beside a card's 1.66."""
    from dflash_dash.render.tables import number_formats

    rows = [{"prompt": "p", "tau A": 1.6558, "delta (B − A)": -0.1, "share_of_rejections": 0.25, "count": 3}]
    rows.append({"prompt": "q", "tau A": None, "delta (B − A)": None, "share_of_rejections": 0.5, "count": 1})
    assert number_formats(rows) == {"tau A": "%.2f", "delta (B − A)": "%.2f", "share_of_rejections": "%.3f"}
    from dflash_dash.render.tables import number_specs

    conf = [{"engine_tau": 15.5, "gap": 0.0, "gap_pct": -1.25, "sglang_accept_length": 16.5, "verify_steps": 10}]
    assert number_specs(conf) == dict.fromkeys(["engine_tau", "gap", "gap_pct", "sglang_accept_length"], "{:.2f}")


def test_numbers_round_to_zero_without_a_minus_sign():
    """A figure that rounds to zero prints 0.000, not -0.000 (a signature's -0.00001 over-confidence)."""
    from dflash_dash.render.formats import ci, count, fmt, prob

    assert (fmt(-0.001), prob(-0.00001), ci(-0.0002, [-0.0004, 0.0001], 3)) == ("0.00", "0.000", "0.000 [0.000, 0.000]")
    assert (fmt(-0.006), fmt(14.746)) == ("-0.01", "14.75")
    assert (count(1, "run"), count(7, "run"), count(1200, "set")) == ("1 run", "7 runs", "1,200 sets")


def test_a_run_keeps_its_colors_on_every_chart():
    """Run A is blue and run B red on every chart of a pair (the theme's colorway gave each trace the next color,
    so a run changed color from the histogram to the per-depth and calibration charts)."""
    from dflash_dash.render.analysis_figures import confidence_fig, reliability_fig
    from dflash_dash.render.figures import run_color

    s = {"accept_hist": [5, 3, 2, 0], "depth_conditional": [0.5, 0.4, 0.2], "depth_marginal": [0.5, 0.2, 0.1]}
    rel = [{"depth": "pooled", "lo": 0.0, "hi": 0.1, "n": 3, "predicted": 0.05, "observed": 0.3}]
    conf = [{"depth": 1, "observed": 0.5, "mean_p": 0.6}]
    figs = [
        hist_fig({"A": s, "B": s}),
        depth_fig({"A": s, "B": s}),
        reliability_fig({"A": rel, "B": rel}),
        confidence_fig({"A": conf, "B": conf}),
    ]
    for fig in figs:
        for run, i in (("A", 0), ("B", 1)):
            traces = [t for t in fig.data if t.name.startswith(run)]
            used = {t.marker.color if t.type == "bar" else t.line.color for t in traces}
            assert traces and used <= set(run_color(i)), (fig.layout.title.text, run, used)


def test_many_runs_keep_a_color_each():
    """Compare's tau-per-category chart of the demo's extraction (seven drafters and the n-gram baseline): each
    drafter's bars have a color no other drafter's have (with four colors the final run and dflash2-head shared
    one red)."""
    from dflash_dash.render.many import many_fig

    names = ["domino-head", "dflash2-head", "bug-noisy-labels", "bug-soft-kl", "bug-anchor-visible", "final", "early"]
    rows = [
        {"run": f"r{i}", "name": n, "baseline": False, "category": "all", "prompts": 10, "tau": 1.0 + i, "lo": 1.0,
         "hi": 2.0 + i}
        for i, n in enumerate(names)
    ] + [{"run": "ng", "name": "ngram", "baseline": True, "category": "all", "prompts": 10, "tau": 1.0, "lo": 1.0,
          "hi": 1.0}]  # fmt: skip
    fig = many_fig(rows)
    bars = [t for t in fig.data if t.type == "bar"]
    assert [t.name for t in bars] == names
    assert len({t.marker.color for t in bars}) == len(names)


def test_lag_chart_lines_stay_distinguishable_where_they_coincide():
    """Run A's on-target line at 1.0 and run B's lag line at 1.0 (and both lag lines at 0) once hid one another:
    every line has its own (color, dash) and (dash, marker) pair, B's lines are drawn on top of A's and thinner with
    smaller markers so both show, and each legend entry names its run and its metric."""
    from dflash_dash.render.figures import lag_fig, run_color

    rows = [{"slot k": k, "lag A": 0.0, "lag B": 1.0, "on target A": 1.0, "on target B": 0.0} for k in (1, 2, 3)]
    fig = lag_fig(rows, "final <b>", "bug")
    lines = [(t.name, t.line.color, t.line.dash, t.marker.symbol, t.line.width, t.marker.size) for t in fig.data]
    assert len(lines) == 4
    assert len({(c, d) for _, c, d, *_ in lines}) == 4 and len({(d, m) for _, _, d, m, *_ in lines}) == 4
    by = {(n[0], "on target" if "on target" in n else "lag"): ln for n, *ln in lines}
    assert set(by) == {(r, m) for r in "AB" for m in ("lag", "on target")}
    assert by["A", "on target"][1] != by["B", "lag"][1]  # the coinciding pair: dashed vs solid
    assert by["A", "on target"][2] != by["B", "lag"][2]  # and its own marker
    for m in ("lag", "on target"):  # B on top (drawn later) stays visible inside A's wider line and markers
        assert by["B", m][3] < by["A", m][3] and by["B", m][4] < by["A", m][4]
    assert [t.name[0] for t in fig.data] == ["A", "A", "B", "B"]
    assert {t.line.color for t in fig.data[:2]} == {run_color(0)[0]} and {t.line.color for t in fig.data[2:]} == {
        run_color(1)[0]
    }
    assert all("final &lt;b&gt;" in t.name for t in fig.data[:2]) and all("bug" in t.name for t in fig.data[2:])


def test_parity_chart_shows_the_layers_compared_and_tiny_cosines_as_powers_of_ten():
    from dflash_dash.render.figures import parity_fig

    fig = parity_fig([{"layer": l, "rel_l2": 0.001 * l, "cosine": 1 - 1e-6 * l} for l in (1, 3, 5)])
    assert fig.layout.xaxis.type == "category" and list(fig.data[0].x) == ["1", "3", "5"]
    assert fig.layout.yaxis2.tickformat == ".1e"


def test_context_position_chart_draws_the_drafters_limits_inside_the_traces():
    from dflash_dash.render.analysis_figures import context_position_fig

    rows = [
        {"context_length": f"{k}000-{k}999", "from_thousands": k, "to": k * 1000 + 999, "samples": 1000,
         "every_anchor_tau": 3.0 - k, "tau": 2.5 - k, "rounds": 400, "committed": 900}
        for k in range(3)
    ]  # fmt: skip
    fig = context_position_fig(rows, [(2048, "sliding window 2,048 (1 of 2 layers)"), (40960, "past the traces")])
    assert [s.x0 for s in fig.layout.shapes] == [2.048]  # the one limit the traces reach
    assert [a.text for a in fig.layout.annotations if a.text.startswith(("sliding", "past"))] == [
        "sliding window 2,048 (1 of 2 layers)"
    ]
    assert not context_position_fig(rows).layout.shapes
    assert (fig.layout.yaxis2.tickmode, fig.layout.yaxis2.tickformat) == ("auto", ",d")  # counts: 0, 500, 1,000


def test_a_right_axis_ticks_its_own_values():
    """A second quantity's axis keeps its own round ticks (synced to the left grid, they read 48, 344, 640)."""
    from dflash_dash.render.figures import right_axis

    assert right_axis("samples", count=True) == dict(
        overlaying="y", side="right", title="samples", showgrid=False, tickmode="auto", tickformat=",d"
    )
    assert right_axis("1 - cosine", tickformat=".1e")["tickformat"] == ".1e" and "tickformat" not in right_axis("x")
