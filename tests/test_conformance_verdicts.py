"""Conformance verdicts, two-sided and identity-aware: what each engine says it served (recorded at fetch), the
replayed drafter's fingerprint, and the run's verdict (conforms, engine-below, engine-above, other-drafter,
unverified) in `conformance --run ID`'s JSON.

End to end per protocol: the local stand-in speaking SGLang's, vLLM's (with VLLM_SERVER_DEV_MODE=1, the only way
vLLM says what it serves) and llama.cpp's protocol in real subprocesses, each serving tiny drafter X; one set
fetched from each, extracted, and replayed with X and with Y (same config, other weights). Where the engine names
its drafter (SGLang's /get_server_info, vLLM's dev-mode /server_info) the replay of X conforms and the replay of Y
is `other-drafter`, though Y's numbers match the engine's as closely (both tiny random drafters get almost nothing
accepted): only the fingerprint tells them apart. llama.cpp names no draft model (its /props carries the
speculative type, and in some builds the draft lengths, only), so both replays are `unverified`: numbers within the
threshold (or none: its verify steps come from /metrics, off here) cannot settle which drafter it served.

Engine above: the demo's healthy checkpoint decoded in-process under the stand-in's own speculative decoder, its
counters stored as an engine's, against the replay of a weaker snapshot of its training run: `engine-above`.
"""

from __future__ import annotations

import json

import pytest
from serving import Served, tiny_model
from speculative import FINAL, IDS, conformance_json, one_torch_thread, plant, private_copy

from dflash_dash import ops, pipeline, prompts
from dflash_dash.analysis import verdict
from dflash_dash.drafters.identity import identity
from dflash_dash.store import Store
from tools import tiny

N = 12  # new tokens per prompt
HEALTHY = FINAL  # the demo's healthy final drafter


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    x = tiny.write_drafter(base / "draft-x", tiny.TinyDrafter(seed=3))
    y = tiny.write_drafter(base / "draft-y", tiny.TinyDrafter(seed=4))  # same config, other weights
    return tiny_model(base / "target"), x, y


@pytest.fixture(scope="module")
def servers(models, tmp_path_factory):
    """The stand-in in each protocol serving drafter X, started together."""
    target, x, _ = models
    logs = tmp_path_factory.mktemp("logs")
    extra = ["--speculative-draft", str(x), "--speculative-stats", "summary"]
    env = {"vllm": {"VLLM_SERVER_DEV_MODE": "1"}}
    got = {e: Served(target, logs / f"{e}.log", extra=extra, engine=e, env=env.get(e)) for e in ENGINES}
    try:
        for s in got.values():
            s.wait(180)
        yield got
    finally:
        for s in got.values():
            s.stop()


ENGINES = ("sglang", "vllm", "llamacpp")
EXPECT = {  # engine -> (verdict against the replay of X, of Y)
    "sglang": ("conforms", "other-drafter"),
    "vllm": ("conforms", "other-drafter"),
    "llamacpp": ("unverified", "unverified"),  # names no draft model; the numbers match within the threshold
}


@pytest.fixture(scope="module")
def fetched(servers, models, tmp_path_factory):
    """One workspace: a set fetched from each engine, extracted, replayed with X and with Y ({engine: (run X,
    run Y)})."""
    target, x, y = models
    ws = tmp_path_factory.mktemp("ws")
    st = Store(ws)
    pfile = ws / "p.jsonl"
    pfile.write_text("".join(json.dumps(p) + "\n" for p in prompts.load("coding-10")[:2]))
    runs = {}
    with one_torch_thread():
        for e, s in servers.items():
            (ws / "config.toml").write_text(f'[server]\nurl = "{s.url}"\nengine = "{e}"\n')
            assert pipeline.fetch(st, ops.Fetch(prompt_set=str(pfile), name=e, max_new_tokens=N)) == 2
            ex = pipeline.extract(st, ops.Extract(target=str(target), completions=e, layers=[1, 4]))
            runs[e] = tuple(pipeline.replay(st, ops.Replay(drafter=str(d), extraction=ex))["id"] for d in (x, y))
    return {"ws": ws, "store": st, "runs": runs}


@pytest.mark.parametrize("engine", ENGINES)
def test_engine_serving_x_against_replays_of_x_and_y(fetched, models, engine):
    _, x, y = models
    st, (run_x, run_y) = fetched["store"], fetched["runs"][engine]
    rec = st.served(engine, engine)
    assert rec is not None, "fetch records what the engine says it served"
    if engine == "llamacpp":  # /props: the speculative type (and draft lengths, where a build gives them) only
        assert rec["served"]["draft_model_path"] is None and rec["served"]["source"] == "GET /props"
    else:
        assert rec["served"]["draft_model_path"] == str(x.resolve())
        assert rec["served"]["local"]["fingerprint"] == identity(x)["fingerprint"]
    got = {}
    for run, drafter in ((run_x, x), (run_y, y)):
        out = conformance_json(fetched["ws"], "--run", run, "--engine", engine)
        assert out["served"] == rec["served"] and out["replayed"]["fingerprint"] == identity(drafter)["fingerprint"]
        assert out["verdict"] in verdict.VERDICTS and out["why"]
        got[drafter.name] = out
    assert (got["draft-x"]["verdict"], got["draft-y"]["verdict"]) == EXPECT[engine], {
        k: (v["verdict"], v["why"]) for k, v in got.items()
    }
    for out in got.values():  # X's engine numbers match both replays within the threshold: only identity decides
        if out["gap_rel"] is None:  # llama.cpp's verify steps come from its /metrics only (off here): no numbers
            assert engine == "llamacpp" and out["verdict"] == "unverified"
            continue
        assert abs(out["gap_rel"]) <= out["threshold"], out["why"]
    if engine != "llamacpp":
        differs = got["draft-y"]["identity"]["differs"]
        assert [d["field"] for d in differs] == ["fingerprint"], differs  # same config: the weights tell
        assert "draft-x" in got["draft-y"]["why"] and "draft-y" in got["draft-y"]["why"]


def test_resumed_fetch_from_a_server_serving_another_drafter_is_refused(fetched, servers, models, tmp_path):
    """The set `sglang` was fetched from a server serving X; the record says another drafter served it (its path
    and fingerprint transformed to Y's): resuming it from the server serving X is refused before any request."""
    _, _, y = models
    ws = private_copy(fetched["ws"], tmp_path / "ws")
    st = Store(ws)
    rec = st.served("sglang", "sglang")["served"]
    rec |= {"draft_model_path": str(y.resolve()), "local": identity(y)}
    st.set_served("sglang", "sglang", rec, "GET /get_server_info")
    (ws / "config.toml").write_text(f'[server]\nurl = "{servers["sglang"].url}"\nengine = "sglang"\n')
    more = ws / "more.jsonl"
    more.write_text("".join(json.dumps(p) + "\n" for p in prompts.load("coding-10")[:3]))
    before = servers["sglang"].generates()
    with pytest.raises(ops.InputError, match="serving drafter .*draft-y but this one serves .*draft-x"):
        pipeline.fetch(st, ops.Fetch(prompt_set=str(more), name="sglang", max_new_tokens=N))
    assert servers["sglang"].generates() == before and len(st.completions("sglang")) == 2


def test_engine_above_the_replay_is_flagged(spec_workspace, tmp_path):
    """Engine stats of a better drafter (the demo's healthy checkpoint, decoded by the stand-in's own speculative
    decoder on the same completions) against the replay of a worse one (an earlier snapshot): the engine is above the
    replay on every prompt, and the verdict says so (no served record: numbers settle it)."""
    ws = private_copy(spec_workspace["ws"], tmp_path / "ws")
    st = Store(ws)
    plant(st, None, "better", IDS[:2], drafter=HEALTHY)
    out = conformance_json(ws, "--run", spec_workspace["run"], "--engine", "better")
    assert out["verdict"] == "engine-above", out["why"]
    assert out["served"] is None and out["identity"]["same"] is None
    assert out["gap_rel"] > out["threshold"] and sorted(out["above"]) == sorted(IDS[:2]) and out["below"] == []
    assert not any(p["flagged"] for p in out["prompts"])  # the old one-sided check saw nothing
    same = conformance_json(ws, "--run", spec_workspace["run"], "--engine", "sglang")  # the engine serving it
    assert same["verdict"] == "conforms", same["why"]


def test_match_reads_names_and_configs_where_weights_are_not_here():
    """Without the served weights here: a Hugging Face cache path names its repository; the same name with the same
    block size reads as the same drafter, another block size or algorithm as another config."""
    rep = {"path": "/ckpt/Qwen3-8B-DFlash-b16", "family": "dflash", "block_size": 16, "width": 16}
    hub = "/root/.cache/huggingface/hub/models--z-lab--Qwen3-8B-DFlash-b16/snapshots/0a1b"
    same = verdict.match({"draft_model_path": hub, "algorithm": "DFLASH", "block_size": 16}, rep)
    assert same["same"] is True and "not readable here" in same["how"]
    narrower = verdict.match({"draft_model_path": hub, "algorithm": "DFLASH", "verify_width": 8}, rep)
    assert narrower["same"] is False and [d["field"] for d in narrower["differs"]] == ["verify_width"]
    eagle = verdict.match({"draft_model_path": "z-lab/Qwen3-8B-DFlash-b16", "algorithm": "EAGLE3"}, rep)
    assert eagle["same"] is False and eagle["differs"][0]["field"] == "algorithm"
    assert verdict.match(None, rep)["same"] is None


def test_verdict_taus_in_two_decimals_and_the_torch_note_only_for_an_engine_above():
    """A correct engine's counters derived from the replay's rounds (one verify step per round, the prefill's token
    beside them), whole-number taus: the verdict names them with two decimals, as the tables do, and a torch-path
    replay's caveat (it can read below serving) explains nothing there. The same counters transformed, fewer verify
    steps for the same tokens (the engine above the replay) and more (below): the caveat applies only above."""
    from dflash_dash.analysis import conformance
    from dflash_dash.render.tables import verdict_table

    rounds = {"a": [16, 16, 13], "b": [16, 14, 15]}  # 45 committed tokens in 3 rounds: tau 15
    replay = [{"prompt_id": p, "prompt_len": 3, "accepted_at": [0] * 46, "rounds": r} for p, r in rounds.items()]
    correct = [{"prompt_id": p, "verify_steps": len(r), "completion_tokens": sum(r) + 1} for p, r in rounds.items()]
    ident = {"fingerprint": "f"}, {"fingerprint": "f"}

    def judged(stats):
        rows = conformance.compare(replay, stats, conformance.THRESHOLD)
        return verdict.verdict(rows, {"local": ident[0]}, ident[1], conformance.THRESHOLD)

    v = judged(correct)
    assert v["verdict"] == "conforms" and "engine tau 15.00 against the replay's 15.00" in v["why"], v["why"]
    assert [r for r in verdict_table(v, None, {}) if r["what"] == "tau (pooled)"][0]["engine"] == "15.00"
    assert not verdict.backend_explains("torch", v)
    above = judged([s | {"verify_steps": s["verify_steps"] - 1} for s in correct])
    assert above["verdict"] == "engine-above" and "engine tau 22.50 against the replay's 15.00" in above["why"]
    assert verdict.backend_explains("torch", above) and not verdict.backend_explains("fla", above)
    below = judged([s | {"verify_steps": 2 * s["verify_steps"]} for s in correct])
    assert below["verdict"] == "engine-below" and not verdict.backend_explains("torch", below)
