"""Engine conformance (issue 11): the stand-in's real DFlash speculative decoding (same tokens as plain greedy,
SGLang's counters, exactly the replay's tau), engine stats in the store (at fetch, imported), the conformance
computation and CLI, a deliberately broken decoder flagged, the Conformance page (AppTest) and the browser.

Models: the committed demo assets (a trained qwen3_5_text target and a trained DFlash drafter, fp32 on CPU) and
tiny seeded ones. Servers are real subprocesses (tests/serving.py); nothing sleeps to synchronise."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
import torch
from serving import Served, until

from dflash_dash import cache, cli, ops, pipeline, prompts, server
from dflash_dash.analysis import conformance
from dflash_dash.engines import SGLangClient
from dflash_dash.render.figures import conformance_fig
from dflash_dash.render.tables import conformance_csv, conformance_table
from dflash_dash.server import specdec
from dflash_dash.store import Store
from tools import tiny

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "dflash_dash" / "demo" / "assets"
TARGET = DEMO / "target"
DRAFT = next((DEMO / "checkpoints").glob("final-step*"))  # the demo's trained drafter
IDS = ["json_parser", "merge_sort", "graph_bfs", "matrix_multiply"]  # replay tau 1.07 to 1.26; two stop at EOS
N = 40  # new tokens per prompt


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(list(args))
    return rc, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread in this process, as the servers run (serving.ENV): the 2 shared cores are oversubscribed."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def engine():
    """The demo target in-process (the stand-in's own Engine, plain greedy) and a speculator on it."""
    eng = server.Engine(model_dir=TARGET.resolve(), device="cpu")
    eng.load()
    eng.load_tokenizer()
    spec = specdec.Speculator(str(DRAFT))
    spec.load(eng.model)
    return eng, spec


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Two speculative stand-ins on the demo target: a correct one and one with --speculative-bug truncate-context
    (started together, waited for together)."""
    base = tmp_path_factory.mktemp("spec-servers")
    good = Served(TARGET, base / "good.log", extra=["--speculative-draft", str(DRAFT)])
    bad = Served(
        TARGET, base / "bad.log", extra=["--speculative-draft", str(DRAFT), "--speculative-bug", "truncate-context"]
    )
    try:
        good.wait(180)
        bad.wait(180)
        yield {"good": good, "bad": bad, "base": base}
    finally:
        good.stop()
        bad.stop()


@pytest.fixture(scope="module")
def conf(served, tmp_path_factory):
    """A workspace: IDS fetched from the correct server (set c4) and from the broken one (set c4-bug), c4 extracted
    on the CPU and the drafter replayed on it; the broken server's counters imported for c4 as engine "bug"."""
    base = served["base"]
    ws = tmp_path_factory.mktemp("conf") / "ws"
    st = Store(ws)
    pfile = base / "prompts.jsonl"
    pfile.write_text("".join(json.dumps(p) + "\n" for p in prompts.load("coding-10") if p["id"] in IDS))
    assert pipeline.fetch(
        st, ops.Fetch(server=served["good"].url, prompt_set=str(pfile), name="c4", max_new_tokens=N)
    ) == len(IDS)
    assert pipeline.fetch(
        st, ops.Fetch(server=served["bad"].url, prompt_set=str(pfile), name="c4-bug", max_new_tokens=N)
    ) == len(IDS)
    layers = pipeline.layers_of(str(DRAFT), None)
    ex = pipeline.extract(st, ops.Extract(target=str(TARGET), completions="c4", layers=layers))
    run = pipeline.replay(st, ops.Replay(drafter=str(DRAFT), extraction=ex))["id"]
    bug = base / "bug-stats.jsonl"
    bug.write_text(
        "".join(
            json.dumps(
                {
                    "id": c["prompt_id"],
                    "verify_steps": c["meta_info"]["spec_verify_ct"],
                    "accepted_tokens": c["meta_info"]["spec_accept_token_num"],
                }
            )
            + "\n"
            for c in st.completions("c4-bug")
        )
    )
    rc, out, err = run_cli(
        "--workspace", str(ws), "import-engine-stats", str(bug), "--completions", "c4", "--engine", "bug"
    )
    assert rc == 0, err
    return {"ws": ws, "store": st, "run": run, "extraction": ex, "prompts": pfile}


def conformance_json(ws: Path, *extra: str) -> dict:
    rc, out, err = run_cli("--workspace", str(ws), "conformance", *extra)
    assert rc == 0, err
    return json.loads(out)


# ---------------------------------------------------------------------------
# the speculative stand-in


def test_speculative_tokens_equal_plain_greedy(conf, engine):
    eng, _ = engine
    st = conf["store"]
    good = {c["prompt_id"]: c for c in st.completions("c4")}
    bad = {c["prompt_id"]: c for c in st.completions("c4-bug")}
    for p in prompts.load("coding-10"):
        if p["id"] not in IDS:
            continue
        ids = eng.encode(p["prompt"])
        plain, text, finish = eng.greedy(ids, N, eng.eos_ids, [])
        assert good[p["id"]]["prompt_ids"] == ids
        assert good[p["id"]]["output_ids"] == plain, p["id"]
        assert bad[p["id"]]["output_ids"] == plain, p["id"]  # a broken drafter costs speed, never tokens
        assert good[p["id"]]["output"] == text


def test_meta_info_carries_sglangs_counters(conf, served):
    B = 16
    seen = set()
    for c in conf["store"].completions("c4"):
        m = c["meta_info"]
        n, v = m["completion_tokens"], m["spec_verify_ct"]
        assert n == len(c["output_ids"]) and 1 <= v <= n - 1
        assert m["spec_accept_length"] == pytest.approx(n / v)  # SGLang's: all completion tokens / verify steps
        h = m["spec_accept_histogram"]
        assert len(h) == B and sum(h) == v
        assert sum(i * k for i, k in enumerate(h)) == m["spec_accept_token_num"] == m["spec_accepted_drafts"]
        assert m["spec_draft_token_num"] == m["spec_proposed_drafts"] == v * (B - 1)
        assert m["spec_accept_rate"] == pytest.approx(m["spec_accept_token_num"] / (v * (B - 1)))
        seen |= {i for i, k in enumerate(h) if k}
    assert 0 in seen and seen - {0}  # rejections and accepted drafts (the demo drafter never has a whole block)
    info = served["good"].client.server_info()
    assert info["speculative_algorithm"] == "DFLASH" and info["speculative_num_draft_tokens"] == B
    assert info["speculative_draft_model_path"] == str(DRAFT.resolve()) and info["speculative_bug"] is None
    assert served["bad"].client.server_info()["speculative_bug"] == "truncate-context"


def test_features_are_bit_identical_to_the_extraction_cache(conf, engine):
    """What the stand-in's drafter sees at anchor p equals the cached features of positions 0..p-1 bit for bit
    (bf16), for completions that ran to max_new_tokens."""
    eng, spec = engine
    st, ex = conf["store"], conf["extraction"]
    e = st.extraction(ex)
    width = len(e["layer_ids"]) * e["hidden_size"]
    checked = 0
    for c in st.completions("c4"):
        if c["finish_reason"] != "length":
            continue
        seq = c["prompt_ids"] + c["output_ids"]
        cached = cache.read(pipeline.features_root(st), ex, c["prompt_id"], len(seq), width)
        P = len(c["prompt_ids"])
        for p in (P, P + 7, len(seq) - 1):
            got = spec.features(eng.model, seq[:p], P + N)
            assert got.dtype == torch.bfloat16 and torch.equal(got[:p], cached[:p]), (c["prompt_id"], p)
            checked += 1
    assert checked >= 6


def test_speculative_stops_like_greedy(engine):
    """Stop strings (trimmed or not), stop ids and max_new_tokens end a speculative request exactly where they end
    a plain one; one new token means no verify step."""
    eng, spec = engine
    eng.spec = spec
    try:
        ids = eng.encode(prompts.CODING_10["merge_sort"])
        plain, _, _ = eng.greedy(ids, 20, set(), [])
        text = eng.decode(plain)
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        for args in [
            (20, eng.eos_ids, [stop], True, True),
            (20, eng.eos_ids, [stop], True, False),
            (20, {plain[9]}, [], True, True),
            (1, eng.eos_ids, [], True, True),
            (13, eng.eos_ids, [], True, True),
        ]:
            want = eng.greedy(ids, *args)
            out, txt, fin, meta = eng.speculative(ids, *args)
            assert (out, txt, fin) == want, args
            if args[0] == 1:
                assert meta["spec_verify_ct"] == 0 and "spec_accept_length" not in meta
            else:
                assert meta["spec_verify_ct"] >= 1
    finally:
        eng.spec = None


def test_rollback_restores_gated_deltanet_state(tmp_path):
    """A tiny hybrid target (6 Gated DeltaNet layers) with a random drafter: nearly every verify step rejects
    drafts, so the cache is rolled back almost every step, recurrent and conv states included; the tokens still
    equal plain greedy's."""
    target = tiny.write_target(tmp_path / "t", tiny.TinyTarget())
    draft = tiny.write_drafter(tmp_path / "d", tiny.TinyDrafter(seed=3))
    eng = server.Engine(model_dir=target.resolve(), device="cpu")
    eng.load()
    spec = specdec.Speculator(str(draft))
    spec.load(eng.model)
    for ids in ([5, 6, 7, 8, 9], [40, 41, 300, 17, 2, 9, 11, 12, 13]):
        plain, _, _ = eng.greedy(ids, 24, set(), [])
        out, fin, counters = spec.decode(eng.model, ids, 24, lambda o: None)
        assert out == plain and fin == {"type": "length", "length": 24}
        assert counters.verify_ct >= 8 and sum(a < spec.block_size - 1 for a in counters.accepted) >= 4


def test_release_frees_the_drafter_and_resume_reloads_it(tmp_path):
    target = tiny.write_target(tmp_path / "t", tiny.TinyTarget())
    draft = tiny.write_drafter(tmp_path / "d", tiny.TinyDrafter(seed=3))
    eng = server.Engine(model_dir=target.resolve(), device="cpu", spec=specdec.Speculator(str(draft)))
    eng.load()
    before = eng.speculative([5, 6, 7], 6, set(), [])
    eng.release()
    assert eng.model is None and eng.spec.drafter is None
    with pytest.raises(server.BadRequest, match="released"):
        eng.speculative([5, 6, 7], 6, set(), [])
    eng.resume()
    assert eng.speculative([5, 6, 7], 6, set(), []) == before
    assert server.speculative_info(eng)["speculative_algorithm"] == "DFLASH"
    assert server.speculative_info(server.Engine(model_dir=target, device="cpu"))["speculative_algorithm"] is None


def test_broken_mode_needs_a_drafter_and_a_known_bug(tmp_path):
    with pytest.raises(SystemExit, match="--speculative-bug needs --speculative-draft"):
        server.serve(str(TARGET), port=0, speculative_bug="truncate-context")
    with pytest.raises(SystemExit, match="expected one of truncate-context"):
        server.serve(str(TARGET), port=0, speculative_draft=str(DRAFT), speculative_bug="nope")


# ---------------------------------------------------------------------------
# engine stats and conformance


def test_fetch_records_sglangs_counters_as_engine_stats(conf):
    st = conf["store"]
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


def test_engine_tau_equals_replay_tau_exactly(conf):
    """Fetched from the speculative stand-in, extracted, replayed with the same drafter: per prompt, the engine's
    committed tokens per verify step equal the replay's committed tokens per round, exactly; nothing flagged."""
    got = conformance_json(conf["ws"], "--run", conf["run"])
    assert list(got) == ["run", "engine", "threshold", "prompts"]
    assert got["run"] == conf["run"] and got["engine"] == "sglang" and got["threshold"] == conformance.THRESHOLD
    assert [p["id"] for p in got["prompts"]] == IDS
    for p in got["prompts"]:
        assert list(p) == ["id", "engine_tau", "replay_tau", "flagged"]
        assert p["engine_tau"] == p["replay_tau"] and not p["flagged"], p
    st = conf["store"]
    rounds = {r["prompt_id"]: r["rounds"] for r in st.run_prompts(conf["run"])}
    for s in st.engine_stats("c4", "sglang"):  # verify steps = rounds; committed tokens = the completion after P
        assert s["verify_steps"] == len(rounds[s["prompt_id"]])
        assert sum(rounds[s["prompt_id"]]) == s["completion_tokens"] - 1
    taus = sorted(p["replay_tau"] for p in got["prompts"])
    assert 1 <= taus[0] and taus[-1] - taus[0] > 0.1  # the prompts span lower and higher acceptance


def test_broken_decoder_is_flagged_on_every_affected_prompt(conf):
    """truncate-context (the drafter sees only the last 4 context positions): a prompt where it costs acceptance
    by more than the threshold is flagged (at least two of the four); one it costs less, or where the changed chain
    happens to do better, is not."""
    got = conformance_json(conf["ws"], "--run", conf["run"], "--engine", "bug")
    assert got["engine"] == "bug"
    affected = {p["id"] for p in got["prompts"] if p["engine_tau"] < p["replay_tau"]}
    flagged = {p["id"] for p in got["prompts"] if p["flagged"]}
    assert flagged <= affected and len(flagged) >= 2, got
    for p in got["prompts"]:  # flagged exactly where the loss passes the threshold
        assert p["flagged"] == (p["replay_tau"] - p["engine_tau"] > conformance.THRESHOLD * p["replay_tau"]), p
    loose = conformance_json(conf["ws"], "--run", conf["run"], "--engine", "bug", "--threshold", "0.9")
    assert loose["threshold"] == 0.9 and not any(p["flagged"] for p in loose["prompts"])


def test_conformance_engine_choice_and_errors(conf, tmp_path):
    ws = str(conf["ws"])
    assert conformance_json(conf["ws"])["engine"] == "sglang"  # latest run, default engine
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
        "completion_tokens": 12,
        "accept_lengths": None,
        "histogram": [1, 0, 3],
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
    assert "'=cmd()" in csv.splitlines()[2] and csv.splitlines()[0].startswith("prompt,flagged,engine_tau")
    fig = conformance_fig(rows, 0.05, "sglang")
    texts = [x for tr in fig.data for x in (tr.text or [])]
    assert "&lt;script&gt;x&lt;/script&gt;" in texts and "<script>x</script>" not in texts
    assert [len(tr.x) for tr in fig.data[:2]] == [2, 1]  # within the threshold, flagged


# ---------------------------------------------------------------------------
# prompt files with token ids


def test_fetch_sends_prompt_ids_as_input_ids(served, tmp_path):
    """A prompt file may give token ids instead of text: they are sent as `input_ids`, unchanged."""
    recs = [{"id": "ids-1", "prompt_ids": [6, 1071, 299, 502, 454]}, {"id": "ids-2", "prompt_ids": [202, 6, 202]}]
    f = tmp_path / "ids.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    st = Store(tmp_path / "ws")
    assert (
        pipeline.fetch(st, ops.Fetch(server=served["good"].url, prompt_set=str(f), name="ids", max_new_tokens=4)) == 2
    )
    for r, c in zip(recs, st.completions("ids")):
        assert c["prompt_id"] == r["id"] and c["prompt_ids"] == r["prompt_ids"] and c["prompt"] is None
        assert c["request"]["input_ids"] == r["prompt_ids"] and "text" not in c["request"]
        assert (
            c["output_ids"] == served["good"].client.generate(input_ids=r["prompt_ids"], max_new_tokens=4)["output_ids"]
        )
    assert st.engines("ids") == ["sglang"]


# ---------------------------------------------------------------------------
# the page (AppTest)


def app(ws: Path, monkeypatch, **params):
    from apptest import app as open_app

    return open_app(ws, monkeypatch, "conformance", **params)


def clean(at) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@pytest.fixture
def conf_copy(conf, tmp_path) -> Path:
    dst = tmp_path / "ws"
    shutil.copytree(conf["ws"], dst, ignore=shutil.ignore_patterns("*.lock"))
    return dst


def test_page_shows_conformant_engine(conf, monkeypatch):
    at = app(conf["ws"], monkeypatch, run=conf["run"])
    clean(at)
    assert [t.value for t in at.title] == ["Conformance"]
    assert any("engine or drafter" in c.value for c in at.caption)
    assert at.query_params["engine"] == "sglang"
    df = at.dataframe[-1].value
    assert sorted(df["prompt"]) == sorted(IDS) and not df["flagged"].any()
    assert list(df["engine_tau"]) == list(df["replay_tau"]) and list(df["gap"]) == [0.0] * len(IDS)
    assert all(u.startswith(f"acceptance?run={conf['run']}&prompt=") for u in df["token_view"])
    assert any("No prompt falls short" in s.value for s in at.success)
    assert [m.value for m in at.metric][3] == "0"  # flagged prompts
    assert any("(completion_tokens - 1) / verify_steps" in c.value for c in at.caption)
    assert at.get("plotly_chart") and at.get("download_button")


def test_page_flags_the_broken_engine(conf, monkeypatch):
    at = app(conf["ws"], monkeypatch, run=conf["run"], engine="bug")
    clean(at)
    df = at.dataframe[-1].value
    flagged = list(df[df["flagged"]]["prompt"])
    assert flagged and list(df["gap"]) == sorted(df["gap"])  # sorted by gap, most negative first
    assert flagged == list(df["prompt"])[: len(flagged)]
    assert any(f"{len(flagged)} of {len(IDS)} prompt(s) flagged" in w.value for w in at.warning)
    body = " ".join(h.proto.body for h in at.get("html"))
    assert all(f"prompt={p}" in body for p in flagged)
    at.number_input(key="conf_thr").set_value(0.9).run()
    clean(at)
    assert not at.dataframe[-1].value["flagged"].any()


def test_page_without_engine_stats_says_how_to_get_them(conf_copy, monkeypatch):
    Store(conf_copy).run("DELETE FROM engine_stats")
    at = app(conf_copy, monkeypatch)
    clean(at)
    text = " ".join(i.value for i in at.info)
    assert "--speculative-draft" in text and "import-engine-stats" in text


# ---------------------------------------------------------------------------
# the browser


def test_browser_shows_table_scatter_and_downloads_csv(conf_copy, tmp_path):
    from web import ARGS, CHROMIUM, SCREENSHOTS, dashboard, drawn, settle, shot

    if not CHROMIUM.exists():
        pytest.skip(f"Debian chromium is not installed at {CHROMIUM} (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    run = Store(conf_copy).runs()[-1]["id"]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with dashboard(conf_copy, tmp_path) as url, sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = b.new_page(viewport={"width": 1500, "height": 1400}, accept_downloads=True)
            page.set_default_timeout(60_000)
            page.goto(f"{url}/conformance?run={run}&engine=bug")
            page.get_by_role("heading", name="Conformance").first.wait_for()
            settle(page)
            page.get_by_text("prompt(s) flagged").first.wait_for()
            page.locator("[data-testid=stPlotlyChart] .main-svg").first.wait_for()
            page.locator("[data-testid=stDataFrame] canvas").first.wait_for()
            drawn(page)
            assert page.locator("[data-testid=stException]").count() == 0
            shot(page, "conformance")  # the whole page, under out/screenshots/
            with page.expect_download() as dl:
                page.get_by_role("button", name="Download the table (CSV)").click()
            text = Path(dl.value.path()).read_text()
            lines = text.splitlines()
            assert dl.value.suggested_filename == f"conformance-{run}-bug.csv"
            assert lines[0].startswith("prompt,flagged,engine_tau,replay_tau,gap") and len(lines) == len(IDS) + 1
            assert lines[1].split(",")[1] == "True"  # most negative gap first: a flagged prompt
            # a flagged prompt's link opens its token view
            first = lines[1].split(",")[0]
            page.locator("a", has_text=first).first.click()
            page.get_by_text(f"Token view · {first}").wait_for()
            until(
                lambda: "acceptance" in page.url and f"prompt={first}" in page.url,
                timeout=10,
                what="the deep link to open the Acceptance page",
            )
        finally:
            b.close()
