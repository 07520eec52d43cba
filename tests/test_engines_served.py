"""Fetch end to end from the local stand-in speaking each engine's protocol (sglang, vllm, llamacpp) in a real
subprocess, with a drafter, per-step statistics and an API key: the wait through each engine's startup, ids equal
to the server's own output, the engine recorded with the set and its statistics in its own shape, a killed fetch
job resumed without duplicates, and each engine's API-key and error shapes."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request

import pytest
from serving import Served, status_now, stop_jobs, tiny_model, until

from dflash_dash import drafters, engines, ops, pipeline, prompts
from dflash_dash.engines import ServerError
from dflash_dash.jobs import lifecycle
from dflash_dash.store import Store
from tools import tiny

KEY = "k-standin-123"
ENV = {"sglang": "SGLANG_API_KEY", "vllm": "VLLM_API_KEY", "llamacpp": "LLAMA_API_KEY"}  # each engine's own
N = 16  # new tokens per prompt


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    return tiny_model(base / "target"), tiny.write_drafter(base / "draft", tiny.TinyDrafter(seed=3))


@pytest.fixture(scope="module", params=["sglang", "vllm", "llamacpp"])
def srv(request, models, tmp_path_factory):
    """The stand-in in one engine's protocol, started with a startup delay and NOT waited for."""
    target, draft = models
    extra = ["--speculative-draft", str(draft), "--speculative-stats", "detailed", "--token-delay", "0.02"]
    extra += ["--metrics"] if request.param == "llamacpp" else []  # llama-server's /metrics: its verify steps
    s = Served(
        target,
        tmp_path_factory.mktemp("log") / "server.log",
        delay=2.0,
        extra=extra,
        api_key=KEY,
        engine=request.param,
    )
    yield s
    s.stop()


def workspace(path, srv, monkeypatch) -> Store:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(f'[server]\nurl = "{srv.url}"\nengine = "{srv.engine}"\n')
    monkeypatch.setenv(ENV[srv.engine], KEY)  # inherited by job processes
    return Store(path)


def test_fetch_waits_through_startup_and_records_the_engine(srv, tmp_path, monkeypatch):
    store = workspace(tmp_path / "ws", srv, monkeypatch)
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps(p) + "\n" for p in prompts.load("coding-10")[:3]))
    seen: list[str] = []
    got = pipeline.fetch(
        store, ops.Fetch(prompt_set=str(f), name="w", max_new_tokens=N), progress=lambda d, t, m: seen.append(m)
    )
    assert got == 3
    waits = [m for m in seen if m.startswith("waiting for")]
    first = {"sglang": "503 warming up", "vllm": "refused", "llamacpp": "Loading model"}[srv.engine]
    assert any(first in m for m in waits), waits  # each engine's own startup, waited through
    rows = store.completions("w")
    assert {r["engine"] for r in rows} == {srv.engine}
    for r in rows:  # the server's own ids, not re-tokenised text
        direct = srv.client.generate(input_ids=r["prompt_ids"], max_new_tokens=N)
        assert r["output_ids"] == direct["output_ids"]
    stats = {s["prompt_id"]: s for s in store.engine_stats("w", srv.engine)}
    assert sorted(stats) == sorted(r["prompt_id"] for r in rows)
    for r in rows:
        s, n = stats[r["prompt_id"]], len(r["output_ids"])
        assert s["completion_tokens"] == n and s["verify_steps"] >= 1 and s["raw"]
        tau = engines.tau(srv.engine, s)
        assert tau.tau == (n - 1) / s["verify_steps"] and tau.engine_label is not None
        if srv.engine == "llamacpp":  # no per-step arrays: named, not guessed
            assert s["accept_lengths"] is None and any(m.startswith("accept_lengths") for m in s["missing"])
        else:  # per-step arrays (--speculative-stats detailed): one per verify step, bonus included
            assert len(s["accept_lengths"]) == s["verify_steps"] and min(s["accept_lengths"]) >= 1
            assert sum(s["accept_lengths"]) - s["verify_steps"] == s["accepted_tokens"]
    other = next(e for e in ENV if e != srv.engine)  # the same set refilled from another engine: refused by name
    (tmp_path / "ws" / "config.toml").write_text(f'[server]\nurl = "{srv.url}"\nengine = "{other}"\n')
    f.write_text("".join(json.dumps(p) + "\n" for p in prompts.load("coding-10")[:4]))
    with pytest.raises(ops.InputError, match=f"set 'w' was fetched from engine {srv.engine} but .* is {other}"):
        pipeline.fetch(store, ops.Fetch(prompt_set=str(f), name="w", max_new_tokens=N))
    assert len(store.completions("w")) == 3


def test_killed_fetch_job_resumes_without_duplicates(srv, tmp_path, monkeypatch, request):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # inherited by the job processes
    srv.wait()
    store = workspace(tmp_path / "ws", srv, monkeypatch)
    request.addfinalizer(lambda: stop_jobs(store))
    before = srv.generates()
    job = lifecycle.start(store, "fetch", {"prompt_set": "coding-10", "name": "k", "max_new_tokens": N})
    until(lambda: len(store.completion_ids("k")) >= 3, 120, what="3 completions from the job")
    os.killpg(store.job(job)["pid"], signal.SIGKILL)
    until(lambda: status_now(store, job) == "failed", 30, what="refresh to see the killed job")
    kept = {r["prompt_id"]: r for r in store.completions("k")}
    assert 3 <= len(kept) < 10, "the job finished before it was killed; the test proves nothing"

    again = lifecycle.rerun(store, job)
    until(lambda: store.job(again)["status"] not in lifecycle.ACTIVE, 180, what="the rerun job")
    done = store.job(again)
    assert done["status"] == "done", (done, lifecycle.log_tail(store, again))
    assert done["result"] == {"set": "k", "fetched": 10 - len(kept)}
    rows = store.completions("k")
    assert [r["prompt_id"] for r in rows] == [p["id"] for p in prompts.load("coding-10")]  # each once
    assert {r["engine"] for r in rows} == {srv.engine}
    for r in rows:
        if r["prompt_id"] in kept:  # not fetched again: the very same row
            assert r["created"] == kept[r["prompt_id"]]["created"]
    assert len(store.engine_stats("k", srv.engine)) == 10
    assert srv.generates() - before <= 11  # ten, plus at most the one in flight when killed


def raw(srv, method: str, path: str, body: dict | None = None, key: str | None = None) -> tuple[int, object]:
    req = urllib.request.Request(
        srv.url + path, data=None if body is None else json.dumps(body).encode(), method=method
    )
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            data = r.read()
            return r.status, json.loads(data) if data.strip() else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


ROUTE = {"sglang": "/generate", "vllm": "/v1/completions", "llamacpp": "/completion"}
BAD = {  # a prompt id outside the vocabulary, in each engine's request shape
    "sglang": {"input_ids": [5, 100000], "sampling_params": {"temperature": 0, "max_new_tokens": 2}},
    "vllm": {"prompt": [5, 100000], "max_tokens": 2, "temperature": 0},
    "llamacpp": {"prompt": [5, 100000], "n_predict": 2, "temperature": 0},
}


def test_keys_and_errors_in_each_engines_shape(srv):
    srv.wait()
    plain = engines.ENGINES[srv.engine](srv.url, timeout=30, retries=0)  # no key
    assert plain.health() == (True, "ready")  # /health needs no key
    with pytest.raises(ServerError) as e:
        plain.generate(input_ids=[5, 6], max_new_tokens=2)
    assert e.value.status == 401 and ENV[srv.engine] in str(e.value) and KEY not in str(e.value)
    status, body = raw(srv, "POST", ROUTE[srv.engine], BAD[srv.engine])
    assert status == 401
    assert (
        body
        == {
            "sglang": {"error": "Unauthorized"},
            "vllm": {"error": "Unauthorized"},
            "llamacpp": {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}},
        }[srv.engine]
    )
    status, body = raw(srv, "POST", ROUTE[srv.engine], BAD[srv.engine], key=KEY)
    assert status == 400 and "out of the vocabulary" in body["error"]["message"]
    shape = {"sglang": {"message", "code"}, "vllm": {"message", "type", "param", "code"}}
    assert set(body["error"]) == shape.get(srv.engine, {"code", "message", "type"})
    with pytest.raises(ServerError) as e:  # through the client: the server's message, unchanged
        srv.client.generate(input_ids=[5, 100000], max_new_tokens=2)
    assert e.value.status == 400 and "out of the vocabulary" in e.value.detail


def test_vllm_prometheus_counters_count_the_request(srv):
    if srv.engine != "vllm":
        pytest.skip("vLLM's /metrics counters")
    srv.wait()
    before = srv.client.spec_counters()
    res = srv.client.generate(input_ids=[5, 6, 7, 8], max_new_tokens=N)
    after = srv.client.spec_counters()
    sd = res["meta_info"]["metrics"]["speculative_decoding"]
    assert after["num_drafts"] - (before["num_drafts"] or 0) == sd["num_spec_steps"]
    assert after["num_accepted_tokens"] - (before["num_accepted_tokens"] or 0) == sd["num_accepted_draft_tokens"]
    was = before["accepted_per_pos"] or [0.0] * len(after["accepted_per_pos"])
    got = [a - b for a, b in zip(after["accepted_per_pos"], was)]
    assert got == [sum(a > k for a in sd["per_step_accepted"]) for k in range(sd["num_spec_tokens"])]


def test_speculative_bug_shows_in_every_protocols_statistics():
    """--speculative-bug truncate-context (the drafter sees 4 context positions) on the demo target and drafter:
    the same greedy tokens, fewer accepted drafts, in vLLM's metrics.speculative_decoding and llama.cpp's timings
    alike (in process: the protocol modules over one Engine each)."""
    import torch
    from speculative import DRAFT, TARGET

    from dflash_dash import server
    from dflash_dash.server import llamacpp_api, specdec, vllm_api

    torch.set_num_threads(1)
    got = {}
    for bug in (None, "truncate-context"):
        eng = server.Engine(
            model_dir=TARGET.resolve(),
            device="cpu",
            spec=specdec.Speculator(str(DRAFT), "cpu", bug),
            spec_stats="summary",
        )
        eng.load()
        eng.load_tokenizer()
        for pid in ("graph_bfs", "matrix_multiply"):  # prompts where the truncated context costs acceptance
            ids = eng.encode(prompts.CODING_10[pid])
            v = vllm_api.run_completion(
                eng, {"prompt": ids, "max_tokens": 40, "temperature": 0, "return_token_ids": True}
            )
            c = llamacpp_api.run_completion(
                eng, {"prompt": ids, "n_predict": 40, "temperature": 0, "return_tokens": True}
            )
            sd = v["metrics"]["speculative_decoding"]
            assert v["choices"][0]["token_ids"] == c["tokens"]
            assert c["timings"]["draft_n_accepted"] == sd["num_accepted_draft_tokens"]
            got[bug, pid] = (c["tokens"], sd["num_accepted_draft_tokens"])
    for pid in ("graph_bfs", "matrix_multiply"):
        assert got[None, pid][0] == got["truncate-context", pid][0]  # greedy: the same tokens
        assert got["truncate-context", pid][1] < got[None, pid][1]  # fewer drafts accepted


def test_fetch_settings_refused_in_each_protocols_shape(srv, tmp_path, monkeypatch):
    """A resumed fetch with another max_new_tokens was refused for SGLang only (the check read
    sampling_params.max_new_tokens); each engine's stored requests are read in its own fields (vLLM's max_tokens,
    llama.cpp's n_predict). Refused before anything is sent, naming the field."""
    store = workspace(tmp_path / "ws", srv, monkeypatch)
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps(p) + "\n" for p in prompts.load("coding-10")[:2]))
    assert pipeline.fetch(store, ops.Fetch(prompt_set=str(f), name="s", max_new_tokens=4)) == 2
    f.write_text("".join(json.dumps(p) + "\n" for p in prompts.load("coding-10")[:3]))  # one more: a resume
    before = srv.generates()
    field = {"sglang": "sampling_params.max_new_tokens", "vllm": "max_tokens", "llamacpp": "n_predict"}[srv.engine]
    with pytest.raises(ops.InputError, match=rf"max_new_tokens 4 \({srv.engine}'s {field}\), this fetch asks for 8"):
        pipeline.fetch(store, ops.Fetch(prompt_set=str(f), name="s", max_new_tokens=8))
    assert srv.generates() == before and len(store.completions("s")) == 2
    assert pipeline.fetch(store, ops.Fetch(prompt_set=str(f), name="s", max_new_tokens=4)) == 1  # same: resumes


def test_llamacpp_verify_steps_from_metrics(srv, models):
    """llama.cpp's answers count no verify steps and a current llama-server reports no draft length; with --metrics
    its server-wide llamacpp:spec_decode_num_drafts_total, read around each request, gives them. The stand-in drafts
    B-1 tokens per step, so draft_n / (B-1) is the truth to compare with; a request that another one overlaps is
    named unknown, with why."""
    if srv.engine != "llamacpp":
        pytest.skip("llama.cpp's /metrics")
    import threading

    srv.wait()
    block = drafters.read_config(models[1]).block_size
    res = srv.client.generate(input_ids=[5, 6, 7, 8], max_new_tokens=N)
    assert res["meta_info"]["generation_settings"]["speculative.types"] == "draft-dflash"
    assert "speculative.n_max" not in res["meta_info"]["generation_settings"]
    row = srv.client.spec_stats(res["meta_info"], len(res["output_ids"]))
    assert row["verify_steps"] == row["drafted_tokens"] // (block - 1) >= 1
    assert not any(m.startswith("verify_steps") for m in row["missing"])
    long = threading.Thread(target=srv.client.generate, kwargs={"input_ids": [9, 10, 11], "max_new_tokens": 64})
    long.start()  # another client's request: running while ours starts
    until(lambda: srv.client.reading().get("processing"), 60, what="the other request processing")
    res = srv.client.generate(input_ids=[5, 6, 7, 8], max_new_tokens=N)
    long.join()
    row = srv.client.spec_stats(res["meta_info"], len(res["output_ids"]))
    assert row["verify_steps"] is None and row["accepted_tokens"] is not None
    assert "other requests may have run alongside this one" in row["missing"][0]


def test_llamacpp_metrics_only_with_the_flag(models):
    """Like llama-server, the stand-in serves /metrics only when started with --metrics: else 501
    not_supported_error (server-context.cpp, get_metrics), and /props says endpoint_metrics."""
    from dflash_dash import server
    from dflash_dash.server import llamacpp_api

    eng = server.Engine(model_dir=models[0].resolve(), device="cpu")  # not loaded: these routes need no model
    assert llamacpp_api.get(eng, "/metrics", "") == (
        501,
        {
            "error": {
                "code": 501,
                "message": "This server does not support metrics endpoint. Start it with `--metrics`",
                "type": "not_supported_error",
            }
        },
    )
    assert llamacpp_api.get(eng, "/props", "")[1]["endpoint_metrics"] is False
    eng.metrics = True
    text = llamacpp_api.get(eng, "/metrics", "")[2]
    assert "llamacpp:spec_decode_num_drafts_total 0" in text and "llamacpp:requests_processing 0" in text


def test_what_each_engine_says_it_served(srv, models):
    """Each protocol's own report of its drafter (`served_drafter`): SGLang's /get_server_info names the draft path
    and block size; vLLM registers /server_info only with VLLM_SERVER_DEV_MODE=1 (off here), so it does not say
    (None, the route 404 as vLLM answers it); llama.cpp's /props names no draft model."""
    srv.wait()
    got = srv.client.served_drafter()
    if srv.engine == "sglang":
        assert got["draft_model_path"] == str(models[1].resolve()) and got["algorithm"] == "DFLASH"
        assert got["block_size"] == got["verify_width"] == tiny.TinyDrafter().block_size
    elif srv.engine == "vllm":
        assert got is None
        assert raw(srv, "GET", "/server_info", key=KEY)[0] == 404
    else:
        assert got["draft_model_path"] is None and got["source"] == "GET /props"


def test_sampled_fetch_in_each_protocols_fields(srv, tmp_path, monkeypatch):
    """Fetch at T = 1, top-p 0.9, seed 1 sends each engine's own sampling fields (SGLang's
    sampling_params.sampling_seed, vLLM's and llama.cpp's seed) and the stand-in samples with them, speculatively
    here: the same seed gives the same ids, another seed others; the set says how it was sampled; a resume with
    other sampling (or greedy) is refused before anything is sent."""
    store = workspace(tmp_path / "ws", srv, monkeypatch)
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps(p) + "\n" for p in prompts.load("coding-10")[:1]))
    hot = {"prompt_set": str(f), "max_new_tokens": 8, "temperature": 1.0, "top_p": 0.9}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        assert pipeline.fetch(store, ops.Fetch(name=name, seed=seed, **hot)) == 1
    ids = {n: store.completions(n)[0]["output_ids"] for n in "abc"}
    assert ids["a"] == ids["b"] != ids["c"]  # a seed reproduces; another seed samples another completion
    sent = store.completions("a")[0]["request"]
    field = {"sglang": sent.get("sampling_params", {}), "vllm": sent, "llamacpp": sent}[srv.engine]
    seed_key = "sampling_seed" if srv.engine == "sglang" else "seed"
    assert (field["temperature"], field["top_p"], field[seed_key]) == (1.0, 0.9, 1)
    assert pipeline.set_sampling(store, "a") == "sampled at T=1, top-p 0.9, seed 1"
    f.write_text("".join(json.dumps(p) + "\n" for p in prompts.load("coding-10")[:2]))  # one more: a resume
    before = srv.generates()
    with pytest.raises(ops.InputError, match=r"set 'a' was fetched sampled at T=1, top-p 0.9, seed 1 .* would be "):
        pipeline.fetch(store, ops.Fetch(name="a", seed=2, **hot))
    with pytest.raises(ops.InputError, match="would be greedy"):
        pipeline.fetch(store, ops.Fetch(prompt_set=str(f), name="a", max_new_tokens=8))
    assert srv.generates() == before and len(store.completions("a")) == 1
