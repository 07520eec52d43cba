"""A fourth serving engine from this file alone: a toy engine, its client declaring itself in one `EngineSpec` and its
stand-in protocol (a JSON protocol of its own: other routes, another readiness path, per-round statistics in its
own shape, its own error and 401 bodies, its own key variable) registered beside SGLang's, with no product file
edited. The product's stand-in serves one tiny target with a drafter in both protocols at once; completions
fetched through the product's fetch path (config.toml naming the engine, the key from the engine's own variable)
must carry the same tokens, verify steps and accepted drafts from the toy as from SGLang, the same replay tau and
the toy's own figure beside. An unknown engine name is a UserError naming it and the fix, in config.toml, in a
client and in the stand-in. docs/engines.md's "Adding an engine" names every field this test has to declare."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
from speculative import DRAFT, TARGET, one_torch_thread

from dflash_dash import config, engines, ops, pipeline, prompts
from dflash_dash.engines.base import EngineClient, ServerError, served_row, stats_row
from dflash_dash.errors import UserError
from dflash_dash.server import httpd, protocols, specdec
from dflash_dash.server.model import Engine
from dflash_dash.server.protocol import BadRequest, decode, not_ready
from dflash_dash.store import Store

ROOT = Path(__file__).resolve().parents[1]
KEY = "k-toy-7"
N = 16  # new tokens per prompt


# ---------------------------------------------------------------------------
# the toy engine: its stand-in protocol (server side)


class ToyProtocol:
    """POST /toy/complete {"ids", "limit"} -> {"tokens", "text", "rounds": drafts kept per round, "per_round"};
    GET /toy/ready (open) 200 {"ready": true} or 503; GET /toy/about {"model", "drafter", "per_round"}; errors
    {"problem"}."""

    NAME = "toy"
    GENERATE = "/toy/complete"
    LOADING = None  # binds after loading
    WARMUP = 0.0
    POSTS = frozenset({"/toy/complete"})

    @staticmethod
    def open_path(path: str) -> bool:
        return path == "/toy/ready"

    @staticmethod
    def unauthorized() -> dict:
        return {"problem": "wrong or missing key"}

    @staticmethod
    def error(status: int, message: str) -> dict:
        return {"problem": message}

    @staticmethod
    def not_found(method: str, path: str) -> dict:
        return {"problem": f"no {method} {path}"}

    @staticmethod
    def get(eng: Engine, path: str, query: str):
        if path == "/toy/ready":
            why = not_ready(eng)
            return (200, {"ready": True}) if why is None else (503, {"problem": why})
        if path == "/toy/about":
            s = eng.spec
            return 200, {
                "model": str(eng.model_dir),
                "drafter": str(Path(s.path).resolve()) if s else None,
                "per_round": s.block_size - 1 if s else None,
            }
        return None

    @staticmethod
    def post(eng: Engine, path: str, req):
        if not isinstance(req, dict) or not isinstance(req.get("ids"), list) or not req["ids"]:
            raise BadRequest("`ids` must be a non-empty list of token ids")
        out, text, _, counters = decode(eng, req["ids"], int(req.get("limit", 16)), set(eng.eos_ids), [])
        rounds = list(counters.within) if counters is not None else None  # drafts kept inside the completion
        per = counters.block_size - 1 if counters is not None else None
        return 200, {"tokens": out, "text": text, "rounds": rounds, "per_round": per}


# ---------------------------------------------------------------------------
# the toy engine: its client (product side), declared in one spec


def toy_stats(meta: dict, output_tokens: int) -> dict | None:
    """The toy's per-round list as an engine-stats row; None without rounds (no drafter)."""
    rounds, per = meta.get("rounds"), meta.get("per_round")
    if not isinstance(rounds, list):
        return None
    return stats_row(
        verify_steps=len(rounds),
        accepted_tokens=sum(rounds),
        drafted_tokens=len(rounds) * per if per else None,
        completion_tokens=output_tokens,
        accept_lengths=[a + 1 for a in rounds],
        raw={"rounds": rounds, "per_round": per},
    )


def kept_per_round(row: dict) -> float | None:
    a, v = row.get("accepted_tokens"), row.get("verify_steps")
    return a / v if a is not None and v else None


@dataclass
class ToyClient(EngineClient):
    spec = engines.EngineSpec(
        name="toy",
        label="Toy",
        key_env="TOY_API_KEY",
        stats=toy_stats,
        stats_source="rounds",
        figure=engines.Figure("kept per round", "sum(rounds) / len(rounds)", kept_per_round),
        request_fields={"max_new_tokens": ("limit",), "prompt_ids": ("ids",)},
        ready_path="/toy/ready",
    )

    def model_info(self) -> dict:
        about = self._json("GET", "/toy/about")
        return {"model_path": about["model"], "tokenizer_path": about["model"]}

    def served_drafter(self) -> dict:
        about = self._json("GET", "/toy/about")
        per = about.get("per_round")
        return served_row(
            source="GET /toy/about", raw=about, draft_model_path=about.get("drafter"), verify_width=per + 1
        )

    def generate(self, input_ids=None, text=None, max_new_tokens=256, stop=None, extra=None, sampled=None) -> dict:
        if input_ids is None or sampled is not None:
            raise ServerError("the toy engine takes token ids, greedy only")
        body = {"ids": [int(i) for i in input_ids], "limit": int(max_new_tokens)}
        got = self._json("POST", "/toy/complete", body)
        meta = {"rounds": got["rounds"], "per_round": got["per_round"], "finish_reason": "length"}
        return {"request": body, "text": got["text"], "output_ids": got["tokens"], "meta_info": meta}


# ---------------------------------------------------------------------------
# fixtures


@pytest.fixture
def toy():
    """The toy engine registered on both sides, taken out again after the test."""
    engines.register(ToyClient)
    protocols.register(ToyProtocol)
    yield
    del engines.ENGINES["toy"], protocols.PROTOCOLS["toy"]


@pytest.fixture(scope="module")
def standin():
    """One stand-in engine on the CPU, loaded once: the demo target and a trained drafter of its (some
    drafts accepted, most not), one torch thread as the servers run."""
    with one_torch_thread():
        eng = Engine(model_dir=TARGET.resolve(), device="cpu", spec_stats="detailed")
        eng.spec = specdec.Speculator(str(DRAFT), "cpu", None)
        httpd.load(eng, str(DRAFT), None)
        eng.ready_at = 0.0  # ready at once: no startup delay here
        yield eng


def serving(eng: Engine, name: str):
    """The product's stand-in HTTP server for `eng` in engine `name`'s protocol, on a free port, with the API key."""
    srv = httpd.bind("127.0.0.1", 0, eng, KEY, name)
    httpd.background(srv)
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def fetched(tmp: Path, engine: str, url: str, prompts_file: Path) -> Store:
    ws = tmp / engine
    ws.mkdir()
    (ws / "config.toml").write_text(f'[server]\nurl = "{url}"\nengine = "{engine}"\n')
    store = Store(ws)
    assert pipeline.fetch(store, ops.Fetch(prompt_set=str(prompts_file), name="s", max_new_tokens=N)) == 3
    return store


# ---------------------------------------------------------------------------
# tests


def test_a_toy_engine_registered_from_a_test_fetches_like_sglang(toy, standin, tmp_path, monkeypatch):
    monkeypatch.setenv("TOY_API_KEY", KEY)  # each engine's own key variable, declared in its spec
    monkeypatch.setenv("SGLANG_API_KEY", KEY)
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps(p) + "\n" for p in prompts.load("coding-10")[:3]))
    servers = {name: serving(standin, name) for name in ("toy", "sglang")}
    try:
        toy_url, sg_url = servers["toy"][1], servers["sglang"][1]
        # the toy's own readiness path, error and 401 shapes, from the same server code that speaks SGLang
        assert ToyClient(toy_url).health() == (True, "ready")
        with pytest.raises(ServerError, match=r'HTTP 401: \{"problem": "wrong or missing key"\}; .*TOY_API_KEY'):
            ToyClient(toy_url, retries=0).model_info()
        with pytest.raises(ServerError, match=r'HTTP 400: \{"problem": "`ids` must be a non-empty list'):
            ToyClient(toy_url, api_key=KEY, retries=0)._json("POST", "/toy/complete", {"ids": []})
        with pytest.raises(ServerError, match=r'HTTP 404: \{"problem": "no POST /generate"'):  # not the toy's route
            ToyClient(toy_url, api_key=KEY, retries=0)._json("POST", "/generate", {"input_ids": [1]})
        toy_store = fetched(tmp_path, "toy", toy_url, f)
        sg_store = fetched(tmp_path, "sglang", sg_url, f)
    finally:
        for srv, _ in servers.values():
            srv.shutdown()
            srv.server_close()
    toy_rows, sg_rows = toy_store.completions("s"), sg_store.completions("s")
    assert (
        [r.prompt_id for r in toy_rows]
        == [r.prompt_id for r in sg_rows]
        == [p["id"] for p in prompts.load("coding-10")[:3]]
    )
    assert {r.engine for r in toy_rows} == {"toy"}
    toy_stats_rows = {s["prompt_id"]: s for s in toy_store.engine_stats("s", "toy")}
    sg_stats_rows = {s["prompt_id"]: s for s in sg_store.engine_stats("s", "sglang")}
    for t, g in zip(toy_rows, sg_rows, strict=True):
        assert t.output_ids == g.output_ids and t.prompt_ids == g.prompt_ids  # one engine, two protocols
        assert engines.ENGINES["toy"].read_request(t.request)["max_new_tokens"] == N  # its own request field
        ts, gs = toy_stats_rows[t.prompt_id], sg_stats_rows[g.prompt_id]
        assert ts["verify_steps"] == gs["verify_steps"] >= 1
        assert ts["accepted_tokens"] == gs["accepted_tokens"] and ts["accept_lengths"] == gs["accept_lengths"]
        tt, gt = engines.tau("toy", ts), engines.tau("sglang", gs)
        assert tt.tau == gt.tau == (len(t.output_ids) - 1) / ts["verify_steps"]
        assert tt.engine_label == "kept per round" and tt.engine_figure == gs["accepted_tokens"] / gs["verify_steps"]
        assert gt.engine_label == "spec_accept_length" and gt.engine_figure != tt.engine_figure
    assert sum(s["accepted_tokens"] for s in toy_stats_rows.values()) > 0  # drafts accepted: not a trivial match
    toy_served = toy_store.served("s", "toy")["served"]
    sg_served = sg_store.served("s", "sglang")["served"]
    assert toy_served["draft_model_path"] == sg_served["draft_model_path"]
    assert toy_served["verify_width"] == sg_served["verify_width"]
    assert toy_served["local"]["fingerprint"] == sg_served["local"]["fingerprint"]


def test_unknown_engine_names_the_engine_and_the_fix(tmp_path):
    (tmp_path / "config.toml").write_text('[server]\nengine = "toy"\n')  # not registered outside the fixture
    with pytest.raises(UserError, match=r"line 2: \[server\] engine must be one of 'sglang', .*got 'toy'.*engines\.md"):
        config.load(tmp_path)
    with pytest.raises(UserError, match=r"\[server\] engine 'toy' is not a known serving engine: .*engines\.md"):
        engines.for_workspace(config.WorkspaceConfig(engine="toy"))
    with pytest.raises(UserError, match=r"engine 'tgi' is not a known serving engine: use one of 'sglang'"):
        engines.for_workspace(config.WorkspaceConfig(), engine="tgi")
    with pytest.raises(SystemExit, match=r"--protocol 'toy': expected one of sglang, vllm, llamacpp"):
        protocols.get("toy")


def test_the_recipe_names_what_an_engine_declares():
    text = (ROOT / "docs" / "engines.md").read_text()
    m = re.search(r"^## Adding an engine\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, "docs/engines.md has no section '## Adding an engine'"
    recipe = m.group(1)
    for name in [f.name for f in fields(engines.EngineSpec)] + list(protocols.REQUIRED):
        assert f"`{name}" in recipe, f"the recipe does not name {name}"
    for path in re.findall(r"`((?:dflash_dash|tests)/[\w/<>.]+\.py)`", recipe):
        if "<" not in path:
            assert (ROOT / path).is_file(), f"the recipe names {path}, which does not exist"
    assert "tests/test_engine_plugin.py" in recipe
