"""Engine conformance: whether an engine's measured acceptance (committed tokens per verify step) matches the
replay's (committed tokens per round) on the same completions and drafter. Covered: engine stats recorded at fetch
and imported (import-engine-stats, its refusals), the comparison and its summary, the conformance CLI, a
deliberately broken decoder flagged, the table/CSV/figure views and the Conformance page (AppTest).

The workspace is the session fixture `spec_workspace` (tests/speculative.py): completions fetched from the
speculative stand-in on the demo models, extracted and replayed, plus a broken server's counters as engine "bug".
The page in a browser is tests/browser/test_conformance_page.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from apptest import app as open_app, clean
from speculative import IDS, conformance_json, private_copy, run_cli

from dflash_dash import ops, pipeline
from dflash_dash.analysis import conformance
from dflash_dash.engines import SGLangClient
from dflash_dash.render.figures import conformance_fig
from dflash_dash.render.tables import conformance_csv, conformance_table
from dflash_dash.store import Store

# ---------------------------------------------------------------------------
# engine stats and conformance


def test_fetch_records_sglangs_counters_as_engine_stats(spec_workspace):
    st = spec_workspace["store"]
    assert st.engines("c4") == ["bug", "sglang"] and st.engines("c4-bug") == ["sglang"]
    comps = {c["prompt_id"]: c for c in st.completions("c4")}
    for s in st.engine_stats("c4", "sglang"):
        m = comps[s["prompt_id"]]["meta_info"]
        assert (s["verify_steps"], s["accepted_tokens"], s["completion_tokens"]) == (
            m["spec_verify_ct"],
            m["spec_accept_token_num"],
            m["completion_tokens"],
        )
        assert s["histogram"] == m["spec_accept_histogram"] and s["accept_lengths"] is None
        assert s["source"].startswith("meta_info of http://127.0.0.1:")


def test_fetch_sends_prompt_ids_as_input_ids(spec_servers, tmp_path):
    """A prompt file may give token ids instead of text: they are sent as `input_ids`, unchanged."""
    recs = [{"id": "ids-1", "prompt_ids": [6, 1071, 299, 502, 454]}, {"id": "ids-2", "prompt_ids": [202, 6, 202]}]
    f = tmp_path / "ids.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    st = Store(tmp_path / "ws")
    assert (
        pipeline.fetch(st, ops.Fetch(server=spec_servers["good"].url, prompt_set=str(f), name="ids", max_new_tokens=4))
        == 2
    )
    for r, c in zip(recs, st.completions("ids")):
        assert c["prompt_id"] == r["id"] and c["prompt_ids"] == r["prompt_ids"] and c["prompt"] is None
        assert c["request"]["input_ids"] == r["prompt_ids"] and "text" not in c["request"]
        assert (
            c["output_ids"]
            == spec_servers["good"].client.generate(input_ids=r["prompt_ids"], max_new_tokens=4)["output_ids"]
        )
    assert st.engines("ids") == ["sglang"]


def test_engine_tau_equals_replay_tau_exactly(spec_workspace):
    """Fetched from the speculative stand-in, extracted, replayed with the same drafter: per prompt, the engine's
    committed tokens per verify step equal the replay's committed tokens per round, exactly; nothing flagged."""
    got = conformance_json(spec_workspace["ws"], "--run", spec_workspace["run"])
    assert list(got)[:5] == ["run", "engine", "threshold", "prompts", "steps"]  # the old fields first, in order
    assert got["verdict"] == "conforms" and got["identity"]["same"] is True, got["why"]  # it served this drafter
    assert got["served"]["draft_model_path"] == got["replayed"]["path"]
    assert got["steps"] is None  # fetched with SGLang's counters only: no per-step lengths to align
    assert (
        got["run"] == spec_workspace["run"] and got["engine"] == "sglang" and got["threshold"] == conformance.THRESHOLD
    )
    assert [p["id"] for p in got["prompts"]] == IDS
    for p in got["prompts"]:
        assert list(p) == ["id", "engine_tau", "replay_tau", "flagged", "first_divergence"]
        assert p["first_divergence"] is None
        assert p["engine_tau"] == p["replay_tau"] and not p["flagged"], p
    st = spec_workspace["store"]
    rounds = {r["prompt_id"]: r["rounds"] for r in st.run_prompts(spec_workspace["run"])}
    for s in st.engine_stats("c4", "sglang"):  # verify steps = rounds; committed tokens = the completion after P
        assert s["verify_steps"] == len(rounds[s["prompt_id"]])
        assert sum(rounds[s["prompt_id"]]) == s["completion_tokens"] - 1
    taus = sorted(p["replay_tau"] for p in got["prompts"])
    assert 1 <= taus[0] and taus[-1] - taus[0] > 0.1  # the prompts span lower and higher acceptance


def test_broken_decoder_is_flagged_on_every_affected_prompt(spec_workspace):
    """truncate-context (the drafter sees only the last 4 context positions): a prompt where it costs acceptance
    by more than the threshold is flagged (at least two of the four); one it costs less, or where the changed chain
    happens to do better, is not."""
    got = conformance_json(spec_workspace["ws"], "--run", spec_workspace["run"], "--engine", "bug")
    assert got["engine"] == "bug"
    affected = {p["id"] for p in got["prompts"] if p["engine_tau"] < p["replay_tau"]}
    flagged = {p["id"] for p in got["prompts"] if p["flagged"]}
    assert flagged <= affected and len(flagged) >= 2, got
    for p in got["prompts"]:  # flagged exactly where the loss passes the threshold
        assert p["flagged"] == (p["replay_tau"] - p["engine_tau"] > conformance.THRESHOLD * p["replay_tau"]), p
    loose = conformance_json(
        spec_workspace["ws"], "--run", spec_workspace["run"], "--engine", "bug", "--threshold", "0.9"
    )
    assert loose["threshold"] == 0.9 and not any(p["flagged"] for p in loose["prompts"])


def test_conformance_engine_choice_and_errors(spec_workspace, tmp_path):
    ws = str(spec_workspace["ws"])
    assert conformance_json(spec_workspace["ws"])["engine"] == "sglang"  # latest run, default engine
    rc, _, err = run_cli("--workspace", ws, "conformance", "--engine", "vllm")
    assert rc == 2 and "--engine 'vllm'" in err and "bug, sglang" in err
    rc, _, err = run_cli("--workspace", ws, "conformance", "--threshold", "1.5")
    assert rc == 2 and "--threshold 1.5" in err
    empty = Store(tmp_path / "ws")
    empty.add_set("s", "test")
    empty.add_completion("s", {"id": "a", "prompt_ids": [1, 2], "output_ids": [3, 4]})
    rc, _, err = run_cli("--workspace", str(tmp_path / "ws"), "conformance")
    assert rc == 2 and "no finished run" in err


# ---------------------------------------------------------------------------
# import-engine-stats


@pytest.fixture
def small(tmp_path) -> Path:
    """A workspace with one completion set s: a (6 output tokens), b (4), c (1)."""
    ws = tmp_path / "ws"
    st = Store(ws)
    st.add_set("s", "test")
    for i, (pid, n) in enumerate((("a", 6), ("b", 4), ("c", 1))):
        st.add_completion("s", {"id": pid, "idx": i, "prompt_ids": [1, 2, 3], "output_ids": list(range(5, 5 + n))})
    return ws


def write(tmp_path: Path, *lines) -> str:
    f = tmp_path / "stats.jsonl"
    f.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return str(f)


def test_import_engine_stats_both_line_forms(small, tmp_path):
    f = write(
        tmp_path,
        {"id": "a", "verify_steps": 2, "accepted_tokens": 3},
        {"id": "b", "accept_lengths": [2, 1], "engine_version": "x"},
        {"id": "c", "verify_steps": 0, "accepted_tokens": 0},
    )
    rc, out, err = run_cli(
        "--workspace", str(small), "import-engine-stats", f, "--completions", "s", "--engine", "vllm"
    )
    assert rc == 0, err
    assert "imported vllm stats of 3 prompts of set s" in out
    rows = {r["prompt_id"]: r for r in Store(small).engine_stats("s", "vllm")}
    assert (rows["a"]["verify_steps"], rows["a"]["accepted_tokens"], rows["a"]["completion_tokens"]) == (2, 3, 6)
    assert (rows["b"]["verify_steps"], rows["b"]["accepted_tokens"], rows["b"]["accept_lengths"]) == (2, 1, [2, 1])
    assert rows["a"]["source"].startswith("import ") and rows["c"]["verify_steps"] == 0
    assert conformance.engine_tau(rows["a"]) == 2.5 and conformance.engine_tau(rows["b"]) == 1.5
    assert conformance.engine_tau(rows["c"]) is None and conformance.sglang_accept_length(rows["a"]) == 3.0


@pytest.mark.parametrize(
    "line, where, field",
    [
        ('{"id": "a", "verify_steps": 2}', "line 2 (id 'a')", "'accepted_tokens' is missing"),
        ({"id": "a", "verify_steps": -1, "accepted_tokens": 0}, "line 2 (id 'a')", "'verify_steps' must be an integer"),
        (
            {"id": "a", "verify_steps": 2, "accepted_tokens": 1.5},
            "line 2 (id 'a')",
            "'accepted_tokens' must be an integ",
        ),
        (
            {"id": "a", "verify_steps": True, "accepted_tokens": 1},
            "line 2 (id 'a')",
            "'verify_steps' must be an integer",
        ),
        ({"id": "a", "accept_lengths": []}, "line 2 (id 'a')", "'accept_lengths' must be a non-empty list"),
        ({"id": "a", "accept_lengths": [2, 0]}, "line 2 (id 'a')", "'accept_lengths' holds 0"),
        ({"id": "a", "accept_lengths": [1], "verify_steps": 1}, "line 2 (id 'a')", "not both"),
        ({"id": "a"}, "line 2 (id 'a')", "no engine counters"),
        (
            {"id": "a", "verify_steps": 9, "accepted_tokens": 0},
            "line 2 (id 'a')",
            "'verify_steps' gives 9 verify steps",
        ),
        (
            {"id": "a", "verify_steps": 0, "accepted_tokens": 0},
            "line 2 (id 'a')",
            "'verify_steps' gives 0 verify steps",
        ),
        ('{"id": "a", "verify_steps": 2', "line 2", "not valid JSON"),
        ({"verify_steps": 2, "accepted_tokens": 1}, "line 2", "field 'id'"),
        ({"id": "b", "verify_steps": 1, "accepted_tokens": 1}, "line 2", "duplicate id 'b'"),
    ],
)
def test_import_engine_stats_refuses_bad_lines(small, tmp_path, line, where, field):
    f = write(tmp_path, {"id": "b", "verify_steps": 1, "accepted_tokens": 1}, line)
    rc, _, err = run_cli("--workspace", str(small), "import-engine-stats", f, "--completions", "s", "--engine", "e")
    assert rc == 2 and f"error: {where}" in err and field in err, err
    assert Store(small).engines("s") == []  # nothing stored


def test_import_engine_stats_refuses_unknown_ids_by_name(small, tmp_path):
    f = write(
        tmp_path,
        {"id": "a", "verify_steps": 1, "accepted_tokens": 1},
        {"id": "zz-top", "verify_steps": 1, "accepted_tokens": 1},
        {"id": "<b>x", "accept_lengths": [1]},
    )
    rc, _, err = run_cli("--workspace", str(small), "import-engine-stats", f, "--completions", "s", "--engine", "e")
    assert rc == 2 and "not in completion set 's'" in err and "'zz-top'" in err and "'<b>x'" in err
    rc, _, err = run_cli("--workspace", str(small), "import-engine-stats", f, "--completions", "nope", "--engine", "e")
    assert rc == 2 and "no completion set named 'nope'" in err
    assert Store(small).engines("s") == []


# ---------------------------------------------------------------------------
# pure pieces


def test_sglang_meta_to_engine_stats_and_like_with_like():
    meta = {
        "completion_tokens": 12,
        "spec_verify_ct": 4,
        "spec_accept_length": 3.0,
        "spec_accept_token_num": 7,
        "spec_accept_histogram": [1, 0, 3],
    }
    row = SGLangClient.spec_stats(meta, 12)
    assert row == {
        "verify_steps": 4,
        "accepted_tokens": 7,
        "drafted_tokens": None,
        "completion_tokens": 12,
        "accept_lengths": None,
        "histogram": [1, 0, 3],
        "raw": {k: v for k, v in meta.items() if k != "completion_tokens"},
        "missing": ["drafted_tokens: none of spec_num_proposed_drafts, spec_proposed_drafts, spec_draft_token_num"],
    }
    assert conformance.engine_tau(row) == 11 / 4 and conformance.sglang_accept_length(row) == 3.0
    assert SGLangClient.spec_stats({"completion_tokens": 3}, 3) is None  # decoded plainly
    assert SGLangClient.spec_stats({"spec_verify_ct": 2, "spec_accepted_drafts": 1}, 5)["completion_tokens"] == 5
    replay = [
        {"prompt_id": "x", "prompt_len": 3, "accepted_at": [0] * 12, "rounds": [3, 3, 3, 2]},
        {"prompt_id": "y", "prompt_len": 3, "accepted_at": [0] * 12, "rounds": [3, 3, 3, 2]},
        {"prompt_id": "z", "prompt_len": 3, "accepted_at": [0] * 12, "rounds": [3, 3, 3, 2]},
    ]
    stats = [
        {"prompt_id": "x", "verify_steps": 4, "completion_tokens": 12},  # 2.75 = replay
        {"prompt_id": "y", "verify_steps": 5, "completion_tokens": 12},
    ]  # 2.2: 20 % short
    rows = conformance.compare(replay, stats, 0.05)
    assert [(r["id"], r["engine_tau"], r["replay_tau"], r["flagged"]) for r in rows] == [
        ("x", 2.75, 2.75, False),
        ("y", 2.2, 2.75, True),
    ]
    assert conformance.missing(replay, stats) == ["z"]
    assert not conformance.compare(replay, stats, 0.25)[1]["flagged"]
    s = conformance.summary(rows, 0.05)
    assert s["conformance_flagged"] == 1 and s["engine_tau"] == pytest.approx((2.75 + 2.2) / 2)
    assert s["engine_tau_pooled"] == pytest.approx(22 / 9) and s["replay_tau_pooled"] == 2.75
    assert s["conformance_prompts"] == 2 and s["threshold"] == 0.05


def test_views_sorted_by_gap_escaped_and_safe_csv():
    rows = [
        {
            "id": i,
            "engine_tau": e,
            "replay_tau": 3.0,
            "gap": e - 3.0,
            "gap_rel": (e - 3.0) / 3,
            "flagged": f,
            "verify_steps": 4,
            "rounds": 4,
            "committed": 12,
            "completion_tokens": 13,
            "accepted_tokens": 8,
            "sglang_accept_length": 3.25,
            "histogram": None,
        }
        for i, e, f in (("ok", 3.0, False), ("<script>x</script>", 2.0, True), ("=cmd()", 2.9, False))
    ]
    t = conformance_table(rows, "run-1")
    assert [r["prompt"] for r in t] == ["<script>x</script>", "=cmd()", "ok"]
    assert t[0]["token_view"] == "acceptance?run=run-1&prompt=%3Cscript%3Ex%3C%2Fscript%3E"
    csv = conformance_csv(t)
    assert "'=cmd()" in csv.splitlines()[2] and csv.splitlines()[0].startswith("prompt,flagged,above,engine_tau")
    fig = conformance_fig(rows, 0.05, "sglang")
    texts = [x for tr in fig.data for x in (tr.text or [])]
    assert "&lt;script&gt;x&lt;/script&gt;" in texts and "<script>x</script>" not in texts
    assert [len(tr.x) for tr in fig.data[:2]] == [2, 1]  # within the threshold, flagged


# ---------------------------------------------------------------------------
# the page (AppTest)


def app(ws: Path, monkeypatch, **params):
    return open_app(ws, monkeypatch, "conformance", **params)


def test_page_shows_conformant_engine(spec_workspace, monkeypatch):
    at = app(spec_workspace["ws"], monkeypatch, run=spec_workspace["run"])
    clean(at)
    assert [t.value for t in at.title] == ["Conformance"]
    assert any("engine or drafter" in c.value for c in at.caption)
    assert at.query_params["engine"] == "sglang"
    df = at.dataframe[-1].value
    assert sorted(df["prompt"]) == sorted(IDS) and not df["flagged"].any()
    assert list(df["engine_tau"]) == list(df["replay_tau"]) and list(df["gap"]) == [0.0] * len(IDS)
    assert all(u.startswith(f"acceptance?run={spec_workspace['run']}&prompt=") for u in df["token_view"])
    assert any("Verdict: conforms" in s.value and "same fingerprint" in s.value for s in at.success)
    assert [m.value for m in at.metric][3] == "0"  # flagged prompts
    assert any("(completion_tokens - 1) / verify_steps" in c.value for c in at.caption)
    assert at.get("plotly_chart") and at.get("download_button")


def test_page_flags_the_broken_engine(spec_workspace, monkeypatch):
    at = app(spec_workspace["ws"], monkeypatch, run=spec_workspace["run"], engine="bug")
    clean(at)
    df = at.dataframe[-1].value
    flagged = list(df[df["flagged"]]["prompt"])
    assert flagged and list(df["gap"]) == sorted(df["gap"])  # sorted by gap, most negative first
    assert flagged == list(df["prompt"])[: len(flagged)]
    assert any("Verdict: engine-below" in w.value for w in at.warning)  # imported stats: it does not say more
    body = " ".join(h.proto.body for h in at.get("html"))
    assert f"{len(flagged)} of {len(IDS)} prompt(s) below the replay" in body
    assert all(f"prompt={p}" in body for p in flagged)
    at.number_input(key="conf_thr").set_value(0.9).run()
    clean(at)
    assert not at.dataframe[-1].value["flagged"].any()


def test_page_conforming_engine_nothing_to_rank_no_torch_note(spec_workspace, monkeypatch):
    """The engine matches the replay on every prompt (a torch-path extraction): no gap, so no fault ranking to
    start, and no torch-path caveat (it could only explain an engine above the replay); the verdict's taus in two
    decimals, as the tables show them."""
    run = spec_workspace["run"]
    assert {r.id: r for r in spec_workspace["store"].runs()}[run].backend == "torch"
    at = app(spec_workspace["ws"], monkeypatch, run=run)
    clean(at)
    assert any("Verdict: conforms" in s.value for s in at.success)
    assert not any("torch-path" in w.value for w in at.warning)
    assert not any(b.label.startswith("Rank the faults") for b in at.button)
    assert any("nothing to rank" in s.value for s in at.success)
    assert not any("Not ranked yet" in c.value for c in at.caption)
    why = next(s.value for s in at.success if "Verdict:" in s.value).replace("\\", "")
    taus = re.search(r"engine tau (\S+) against the replay's (\S+) ", why)
    assert taus and all(re.fullmatch(r"\d+\.\d\d", t) for t in taus.groups()), why
    tau_row = next(r for r in at.dataframe[0].value.to_dict("records") if r["what"] == "tau (pooled)")
    assert (tau_row["engine"], tau_row["replay"]) == taus.groups()


@pytest.mark.parametrize("way", ["above", "below"])
def test_page_engine_off_the_replay_can_be_ranked(spec_workspace, tmp_path, monkeypatch, way):
    """The correct engine's counters transformed, the same tokens over fewer verify steps (above the replay) or
    more (below): there is a gap, so the ranking can be started; the torch-path caveat shows only above."""
    ws = private_copy(spec_workspace["ws"], tmp_path / "ws")
    steps = "greatest(1, verify_steps * 2 // 3)" if way == "above" else "least(completion_tokens - 1, verify_steps * 2)"
    Store(ws).run(f"UPDATE engine_stats SET verify_steps = {steps} WHERE engine = 'sglang' AND set_name = 'c4'")
    at = app(ws, monkeypatch, run=spec_workspace["run"])
    clean(at)
    assert any(f"Verdict: engine-{way}" in w.value for w in at.warning)
    assert any("torch-path" in w.value for w in at.warning) == (way == "above")
    assert any(b.label.startswith("Rank the faults") for b in at.button)
    assert any("Not ranked yet" in c.value for c in at.caption)


def test_page_without_engine_stats_says_how_to_get_them(spec_workspace, tmp_path, monkeypatch):
    ws = private_copy(spec_workspace["ws"], tmp_path / "ws")
    Store(ws).run("DELETE FROM engine_stats")
    at = app(ws, monkeypatch)
    clean(at)
    text = " ".join(i.value for i in at.info)
    assert "--speculative-draft" in text and "import-engine-stats" in text
