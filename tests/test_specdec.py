"""The stand-in's DFlash speculative decoding: the same tokens as plain greedy (a broken drafter included: it costs
speed, never tokens), SGLang's counters in meta_info and /server_info, the drafter fed exactly the features the
extraction caches, stops and rollback handled as plain greedy handles them, release/resume, and the options a
broken server needs.

Models: the committed demo assets (tests/speculative.py) and tiny seeded ones. Servers are real subprocesses
(the session fixture `spec_servers`); nothing sleeps to synchronise."""

from __future__ import annotations

import pytest
import torch
from speculative import DRAFT, IDS, TARGET, N, one_torch_thread

from dflash_dash import cache, pipeline, prompts, server
from dflash_dash.server import specdec
from tools import tiny


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The in-process engine runs on one torch thread, as the servers do."""
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def engine():
    """The demo target in-process (the stand-in's own Engine, plain greedy) and a speculator on it."""
    eng = server.Engine(model_dir=TARGET.resolve(), device="cpu")
    eng.load()
    eng.load_tokenizer()
    spec = specdec.Speculator(str(DRAFT))
    spec.load(eng.model)
    return eng, spec


def test_speculative_tokens_equal_plain_greedy(spec_workspace, engine):
    eng, _ = engine
    st = spec_workspace["store"]
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


def test_meta_info_carries_sglangs_counters(spec_workspace, spec_servers):
    B = 16
    seen = set()
    for c in spec_workspace["store"].completions("c4"):
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
    info = spec_servers["good"].client.server_info()
    assert info["speculative_algorithm"] == "DFLASH" and info["speculative_num_draft_tokens"] == B
    assert info["speculative_draft_model_path"] == str(DRAFT.resolve()) and info["speculative_bug"] is None
    assert spec_servers["bad"].client.server_info()["speculative_bug"] == "truncate-context"


def test_features_are_bit_identical_to_the_extraction_cache(spec_workspace, engine):
    """What the stand-in's drafter sees at anchor p equals the cached features of positions 0..p-1 bit for bit
    (bf16), for completions that ran to max_new_tokens."""
    eng, spec = engine
    st, ex = spec_workspace["store"], spec_workspace["extraction"]
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
            out, txt, fin, counters = eng.speculative(ids, *args)
            assert (out, txt, fin) == want, args
            meta = counters.meta(len(out))
            if args[0] == 1:
                assert meta["spec_verify_ct"] == 0 and "spec_accept_length" not in meta
            else:
                assert meta["spec_verify_ct"] >= 1
    finally:
        eng.spec = None


def test_sglang_counts_only_drafts_inside_the_completion(engine):
    """A correct completion cut inside a verify step that accepted drafts (max_new_tokens, or a stop id, at the
    step's first token): SGLang's counters count the drafts the completion kept (accepted + verify steps =
    completion_tokens - 1, histogram and per-step accept_lengths alike), as its DFlash verify counts appended
    tokens - 1; verification's own count (what vLLM and llama.cpp report) keeps the drafts past the end."""
    from dflash_dash.engines import sglang
    from dflash_dash.render.tables import conformance_table
    from dflash_dash.server import protocol

    eng, spec = engine
    ids = eng.encode(prompts.CODING_10["merge_sort"])
    full, _, whole = spec.decode(eng.model, ids, N, lambda o: None)
    # a step that accepted 2+ drafts, and the completion token index of its first committed token
    starts = [1 + sum(a + 1 for a in whole.accepted[:k]) for k in range(whole.verify_ct)]
    k = next(k for k, a in enumerate(whole.accepted) if a >= 2 and starts[k] < N - 2)
    at = starts[k]
    stop_id = full[at]
    cuts = {"max_new": (at + 1, lambda o: None)}
    if stop_id not in full[:at]:  # a stop id first seen there (EOS-like)
        cuts["stop"] = (N, lambda o: {"type": "stop", "matched": stop_id} if o[-1] == stop_id else None)
    for how, (max_new, stop) in cuts.items():
        out, _, c = spec.decode(eng.model, ids, max_new, stop)
        n = len(out)
        assert out == full[:n] and n == at + 1, how
        assert c.accepted == whole.accepted[: k + 1], how  # verification's count: the cut step's drafts kept
        assert sum(c.accepted) + c.verify_ct > n - 1, how  # ... so it reaches past the completion
        meta = {"completion_tokens": n} | protocol.sglang_stats(c, n, "detailed")
        assert meta["spec_accept_token_num"] + meta["spec_verify_ct"] == n - 1, how
        h = meta["spec_accept_histogram"]
        assert sum(h) == c.verify_ct and sum(i * x for i, x in enumerate(h)) == meta["spec_accept_token_num"], how
        assert sum(meta["speculative_decoding_stats"]["accept_lengths"]) == n - 1, how
        row = sglang.spec_stats(meta, n)
        assert row["accepted_tokens"] + row["verify_steps"] == n - 1, how
        shown = conformance_table(
            [
                {
                    "id": "p",
                    "engine_tau": (n - 1) / row["verify_steps"],
                    "replay_tau": None,
                    "gap": None,
                    "gap_rel": None,
                    "flagged": False,
                    "verify_steps": row["verify_steps"],
                    "rounds": 0,
                    "completion_tokens": n,
                    "accepted_tokens": row["accepted_tokens"],
                    "sglang_accept_length": None,
                }
            ],
            "r",
        )[0]
        assert shown["accepted_drafts"] < shown["completion_tokens"], how
    assert "max_new" in cuts


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


def test_broken_mode_needs_a_drafter_and_a_known_bug():
    with pytest.raises(SystemExit, match="--speculative-bug needs --speculative-draft"):
        server.serve(str(TARGET), port=0, speculative_bug="truncate-context")
    with pytest.raises(SystemExit, match="expected one of truncate-context"):
        server.serve(str(TARGET), port=0, speculative_draft=str(DRAFT), speculative_bug="nope")
