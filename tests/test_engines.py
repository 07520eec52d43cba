"""Each engine's answers and speculative statistics parsed from payloads shaped as the engine's own code writes them
(the source named beside each payload), the tau conversion on hand-worked numbers, and the engine registry."""

from __future__ import annotations

import json

import pytest

from dflash_dash import config, engines
from dflash_dash.engines import (
    LlamaCppClient,
    ServerError,
    SGLangClient,
    VLLMClient,
    llamacpp as llamacpp_mod,
    vllm as vllm_mod,
)

# ---------------------------------------------------------------------------
# SGLang: meta_info of POST /generate under every name the counters have had


def test_sglang_newer_names_and_aliases():
    # sgl-project/sglang python/sglang/srt/managers/tokenizer_manager.py,
    # TokenizerManager._calculate_spec_decoding_metrics (v0.5.15): spec_num_correct_drafts /
    # spec_num_proposed_drafts with the backward-compat aliases spec_accepted_drafts / spec_proposed_drafts,
    # spec_correct_drafts_histogram with the alias spec_accept_histogram
    meta = {
        "id": "r1",
        "prompt_tokens": 20,
        "completion_tokens": 13,
        "finish_reason": {"type": "length", "length": 13},
        "spec_accept_rate": 9 / 16,
        "spec_accept_length": 13 / 4,
        "spec_num_correct_drafts": 9,
        "spec_num_proposed_drafts": 16,
        "spec_verify_ct": 4,
        "spec_accepted_drafts": 9,
        "spec_proposed_drafts": 16,
        "spec_correct_drafts_histogram": [0, 1, 1, 1, 1],
        "spec_accept_histogram": [0, 1, 1, 1, 1],
    }
    row = SGLangClient.spec_stats(meta, 13)
    assert (row["verify_steps"], row["accepted_tokens"], row["drafted_tokens"], row["completion_tokens"]) == (
        4,
        9,
        16,
        13,
    )
    assert row["histogram"] == [0, 1, 1, 1, 1] and row["accept_lengths"] is None and row["missing"] == []
    assert row["raw"]["spec_num_correct_drafts"] == 9 and "prompt_tokens" not in row["raw"]


def test_sglang_older_names():
    # older SGLang (docker/patch/v0.5.5.post1 era): spec_accept_token_num / spec_draft_token_num, spec_accept_histogram
    meta = {"completion_tokens": 12, "spec_verify_ct": 4, "spec_accept_token_num": 7, "spec_draft_token_num": 12}
    meta["spec_accept_histogram"] = [1, 0, 3]
    row = SGLangClient.spec_stats(meta, 12)
    assert (row["verify_steps"], row["accepted_tokens"], row["drafted_tokens"]) == (4, 7, 12)
    assert row["histogram"] == [1, 0, 3]


def test_sglang_detailed_stats_carry_per_step_lengths():
    # sgl-project/sglang test/registered/unit/... test of TokenizerManager._calculate_spec_decoding_metrics with
    # --speculative-decoding-stats detailed: meta_info["speculative_decoding_stats"] with verify_lengths /
    # accept_lengths (drafts + 1 per step: sum(length - 1) = the draft counts)
    meta = {
        "completion_tokens": 8,
        "speculative_decoding_stats": {
            "num_verification_steps": 2,
            "num_verified_draft_tokens": 9,
            "num_accepted_draft_tokens": 5,
            "draft_acceptance_rate": 5 / 9,
            "mean_accept_length": 3.5,
            "verify_lengths": [6, 5],
            "accept_lengths": [4, 3],
        },
    }
    row = SGLangClient.spec_stats(meta, 8)
    assert row["verify_steps"] == 2 and row["accepted_tokens"] == 5 and row["drafted_tokens"] == 9
    assert row["accept_lengths"] == [4, 3] and row["missing"] == []
    arrays_only = {"completion_tokens": 8, "verify_lengths": [6, 5], "accept_lengths": [4, 3]}  # per-step only
    row = SGLangClient.spec_stats(arrays_only, 8)
    assert (row["verify_steps"], row["accepted_tokens"], row["drafted_tokens"]) == (2, 5, 9)
    assert row["raw"] == {"verify_lengths": [6, 5], "accept_lengths": [4, 3]}


def test_sglang_partial_payload_is_kept_and_the_gaps_named():
    meta = {"completion_tokens": 10, "spec_accept_length": 2.5, "spec_accept_rate": 0.3}  # rates only
    row = SGLangClient.spec_stats(meta, 10)
    assert row["verify_steps"] is None and row["accepted_tokens"] is None
    assert row["raw"] == {"spec_accept_length": 2.5, "spec_accept_rate": 0.3}  # as it came
    assert [m.split(":")[0] for m in row["missing"]] == ["verify_steps", "accepted_tokens", "drafted_tokens"]
    assert "spec_num_correct_drafts" in row["missing"][1]
    tau = engines.tau("sglang", row)
    assert tau.tau is None and tau.missing and tau.missing[0].startswith("verify_steps")
    assert SGLangClient.spec_stats({"completion_tokens": 3}, 3) is None  # decoded plainly


# ---------------------------------------------------------------------------
# vLLM: POST /v1/completions with return_token_ids and --per-request-spec-decode-metrics


def vllm_answer(metrics_obj: dict | None, token_ids=(11, 12, 13, 14, 15, 16, 17, 18, 19)) -> bytes:
    # vllm-project/vllm vllm/entrypoints/openai/completion/protocol.py: CompletionResponse (id "cmpl-...",
    # object "text_completion", model, choices [CompletionResponseChoice: index, text, logprobs, finish_reason,
    # stop_reason, token_ids, prompt_token_ids, ...], usage {prompt_tokens, total_tokens, completion_tokens}, metrics)
    return json.dumps(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": "/models/target",
            "choices": [
                {
                    "index": 0,
                    "text": " hello",
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                    "token_ids": list(token_ids),
                    "prompt_logprobs": None,
                    "prompt_token_ids": [1, 2, 3],
                    "routed_experts": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {"prompt_tokens": 3, "total_tokens": 3 + len(token_ids), "completion_tokens": len(token_ids)},
            "kv_transfer_params": None,
            "metrics": metrics_obj,
        }
    ).encode()


# vllm/entrypoints/generate/base/protocol.py, SpeculativeDecodingMetrics (summary level), and
# docs/features/speculative_decoding/acceptance_metrics.md; 4 steps of k = 3 drafts accepting 0, 3, 2, 3
VLLM_SUMMARY = {
    "mean_acceptance_length": 1 + 8 / 4,
    "draft_acceptance_rate": 8 / 12,
    "acceptance_histogram": [1, 0, 1, 2],
    "num_spec_steps": 4,
    "num_accepted_draft_tokens": 8,
    "num_draft_tokens": 12,
    "num_spec_tokens": 3,
}


def test_vllm_completion_and_summary_metrics():
    timing = {"time_to_first_token_ms": 5.0, "generation_time_ms": 20.0, "queue_time_ms": 0.1}
    out = vllm_mod.parse_completion(vllm_answer({**timing, "mean_itl_ms": 2.0, "speculative_decoding": VLLM_SUMMARY}))
    assert out["output_ids"] == [11, 12, 13, 14, 15, 16, 17, 18, 19] and out["prompt_ids"] == [1, 2, 3]
    assert out["text"] == " hello" and out["meta_info"]["finish_reason"] == "length"
    row = VLLMClient.spec_stats(out["meta_info"], 9)
    assert (row["verify_steps"], row["accepted_tokens"], row["drafted_tokens"], row["completion_tokens"]) == (
        4,
        8,
        12,
        9,
    )
    assert row["histogram"] == [1, 0, 1, 2] and row["accept_lengths"] is None and row["missing"] == []
    assert row["raw"] == {"speculative_decoding": VLLM_SUMMARY}


def test_vllm_detailed_per_step_arrays():
    detailed = {**VLLM_SUMMARY, "per_step_accepted": [0, 3, 2, 3], "per_step_drafted": [3, 3, 3, 3]}
    out = vllm_mod.parse_completion(vllm_answer({"speculative_decoding": detailed}))
    row = VLLMClient.spec_stats(out["meta_info"], 9)
    assert row["accept_lengths"] == [1, 4, 3, 4]  # accepted + the bonus token
    # position 1 accepted in 3 of 4 steps; 2 in 3 of 4; 3 in 2 of 4
    assert vllm_mod.per_position(out["meta_info"]) == [0.75, 0.75, 0.5]


def test_vllm_without_spec_metrics_or_token_ids():
    out = vllm_mod.parse_completion(vllm_answer(None))  # metrics null: --per-request-spec-decode-metrics none
    assert VLLMClient.spec_stats(out["meta_info"], 9) is None
    out = vllm_mod.parse_completion(vllm_answer({"speculative_decoding": None}))  # n > 1 or no spec decode
    assert VLLMClient.spec_stats(out["meta_info"], 9) is None
    body = json.loads(vllm_answer(None))
    del body["choices"][0]["token_ids"]
    with pytest.raises(ServerError, match="no `token_ids`.*return_token_ids"):
        vllm_mod.parse_completion(json.dumps(body).encode())
    partial = {"mean_acceptance_length": 2.0, "num_spec_steps": 4}  # a shape this client does not know whole
    row = VLLMClient.spec_stats({"metrics": {"speculative_decoding": partial}, "completion_tokens": 9}, 9)
    assert row["verify_steps"] == 4 and row["raw"] == {"speculative_decoding": partial}
    assert [m.split(":")[0] for m in row["missing"]] == ["accepted_tokens", "drafted_tokens"]


# ---------------------------------------------------------------------------
# llama.cpp: POST /completion with return_tokens


def llamacpp_answer(timings_extra: dict, n_max: int = 4, n_min: int = 4, tokens=tuple(range(30, 43))) -> bytes:
    # ggml-org/llama.cpp tools/server/server-task.cpp: server_task_result_cmpl_final::to_json_non_oaicompat
    # (index, content, tokens, id_slot, stop, model, tokens_predicted, tokens_evaluated, generation_settings
    # (task_params::to_json, with speculative.n_max / n_min), prompt, has_new_line, truncated, stop_type,
    # stopping_word, tokens_cached, timings) and result_timings::to_json (draft_n, draft_n_accepted only when
    # draft_n > 0)
    return json.dumps(
        {
            "index": 0,
            "content": "abc",
            "tokens": list(tokens),
            "id_slot": 0,
            "stop": True,
            "model": "target.gguf",
            "tokens_predicted": len(tokens),
            "tokens_evaluated": 5,
            "generation_settings": {
                "seed": 4294967295,
                "temperature": 0.0,
                "top_k": 1,
                "n_predict": len(tokens),
                "speculative.n_max": n_max,
                "speculative.n_min": n_min,
                "speculative.p_min": 0.75,
            },
            "prompt": "",
            "has_new_line": False,
            "truncated": False,
            "stop_type": "limit",
            "stopping_word": "",
            "tokens_cached": 17,
            "timings": {
                "cache_n": 0,
                "prompt_n": 5,
                "prompt_ms": 1.0,
                "prompt_per_token_ms": 0.2,
                "prompt_per_second": 5000.0,
                "predicted_n": len(tokens),
                "predicted_ms": 10.0,
                "predicted_per_token_ms": 0.7,
                "predicted_per_second": 1300.0,
                **timings_extra,
            },
        }
    ).encode()


def test_llamacpp_completion_and_draft_counts():
    out = llamacpp_mod.parse_completion(llamacpp_answer({"draft_n": 12, "draft_n_accepted": 9}))
    assert out["output_ids"] == list(range(30, 43)) and out["text"] == "abc"
    assert out["meta_info"]["finish_reason"] == "length" and out["meta_info"]["completion_tokens"] == 13
    row = LlamaCppClient.spec_stats(out["meta_info"], 13)
    assert (row["verify_steps"], row["accepted_tokens"], row["drafted_tokens"], row["completion_tokens"]) == (
        3,
        9,
        12,
        13,
    )
    assert row["raw"] == {
        "timings": {"draft_n": 12, "draft_n_accepted": 9},
        "draft_length": 4,
        "verify_steps_from": "draft_n / the fixed draft length 4",  # an older llama-server: n_min == n_max
    }
    assert [m.split(":")[0] for m in row["missing"]] == ["accept_lengths"]  # no per-step acceptance reported


def test_llamacpp_variable_drafts_name_the_missing_steps():
    out = llamacpp_mod.parse_completion(llamacpp_answer({"draft_n": 12, "draft_n_accepted": 9}, n_min=0))
    row = LlamaCppClient.spec_stats(out["meta_info"], 13)
    assert row["verify_steps"] is None and row["accepted_tokens"] == 9
    assert "no verify-step count" in row["missing"][0]
    tau = engines.tau("llamacpp", row)
    assert tau.tau is None and tau.engine_figure == 0.75 and tau.engine_formula == "draft_n_accepted / draft_n"
    plain = llamacpp_mod.parse_completion(llamacpp_answer({}))  # no draft made: timings carry no draft_n
    assert LlamaCppClient.spec_stats(plain["meta_info"], 13) is None


def prometheus_text(drafts: float, draft_tokens: float, accepted: float, processing: int = 0, deferred: int = 0) -> str:
    # ggml-org/llama.cpp tools/server/server-task.cpp, server_task_result_metrics::to_metrics: "# HELP", "# TYPE" and
    # "llamacpp:NAME VALUE" per item, the value a double through an ostream (6 significant digits, C's %g)
    items = [
        ("counter", "prompt_tokens_total", 120),
        ("counter", "tokens_predicted_total", 300),
        ("counter", "spec_decode_num_draft_tokens_total", draft_tokens),
        ("counter", "spec_decode_num_accepted_tokens_total", accepted),
        ("counter", "spec_decode_num_drafts_total", drafts),
        ("gauge", "requests_processing", processing),
        ("gauge", "requests_deferred", deferred),
    ]
    lines = [f"# HELP llamacpp:{n} x\n# TYPE llamacpp:{n} {k}\nllamacpp:{n} {v:g}" for k, n, v in items]
    lines.append('llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 5')
    return "\n".join(lines) + "\n"


def with_readings(meta: dict, before: str, after: str) -> dict:
    return meta | {
        llamacpp_mod.METRICS_KEY: {
            "before": llamacpp_mod.parse_prometheus(before),
            "after": llamacpp_mod.parse_prometheus(after),
        }
    }


def test_llamacpp_verify_steps_from_the_metrics_difference():
    """A current llama-server's generation_settings hold speculative.types and no n_min / n_max: the verify steps
    come from llamacpp:spec_decode_num_drafts_total around the request, only when nothing else could have added to
    it; each "unknown" carries its own reason."""
    body = json.loads(llamacpp_answer({"draft_n": 12, "draft_n_accepted": 9}))
    st = body["generation_settings"]
    del st["speculative.n_max"], st["speculative.n_min"], st["speculative.p_min"]
    st["speculative.types"] = "draft-dflash"
    meta = llamacpp_mod.parse_completion(json.dumps(body).encode())["meta_info"]
    before = prometheus_text(40, 400, 250)
    row = LlamaCppClient.spec_stats(with_readings(meta, before, prometheus_text(43, 412, 259)), 13)
    assert row["verify_steps"] == 3 and row["raw"]["verify_steps_from"].startswith("the difference of llamacpp:")
    assert engines.tau("llamacpp", row).tau == 4.0
    cases = {  # the same request's readings, each transformed so the difference no longer belongs to it alone
        "another request processing": (prometheus_text(40, 400, 250, processing=1), prometheus_text(43, 412, 259)),
        "a request deferred after": (before, prometheus_text(43, 412, 259, deferred=1)),
        "another request in between": (before, prometheus_text(45, 432, 270)),
        "counters past 10^6": (prometheus_text(40, 1_000_400, 250), prometheus_text(43, 1_000_412, 259)),
    }
    reasons = {}
    for what, (b, a) in cases.items():
        got = LlamaCppClient.spec_stats(with_readings(meta, b, a), 13)
        assert got["verify_steps"] is None and got["accepted_tokens"] == 9, what
        reasons[what] = next(m for m in got["missing"] if m.startswith("verify_steps"))
    assert "requests_processing 1 before" in reasons["another request processing"]
    assert "requests_deferred 1 after" in reasons["a request deferred after"]
    assert "rose by 32 drafted / 20 accepted" in reasons["another request in between"]
    assert "6 significant digits" in reasons["counters past 10^6"]
    off = meta | {llamacpp_mod.METRICS_KEY: {"off": "GET /metrics answered 501 (...): start it with --metrics"}}
    why = LlamaCppClient.spec_stats(off, 13)["missing"][0]
    assert "--metrics" in why and "speculative.types 'draft-dflash'" in why
    assert "no /metrics reading" in LlamaCppClient.spec_stats(meta, 13)["missing"][0]  # a row stored before


def test_each_engine_reads_its_own_request_fields():
    """The settings a fetch keeps equal across a set, read back from each engine's own request shape."""
    bodies = {
        "sglang": {"input_ids": [5, 6], "sampling_params": {"temperature": 0, "max_new_tokens": 8}},
        "vllm": {"model": "m", "prompt": [5, 6], "max_tokens": 8, "temperature": 0, "return_token_ids": True},
        "llamacpp": {"prompt": [5, 6], "n_predict": 8, "temperature": 0, "top_k": 1, "return_tokens": True},
    }
    for name, body in bodies.items():
        got = engines.ENGINES[name].read_request(body)
        assert got == {"max_new_tokens": 8, "temperature": 0, "top_p": None, "seed": None, "prompt_ids": [5, 6]}
        other = next(b for n, b in bodies.items() if n != name)  # another engine's shape: nothing read as this one's
        assert engines.ENGINES[name].read_request(other)["max_new_tokens"] is None
    assert LlamaCppClient.read_request({"prompt": "text", "max_tokens": 4}) == {
        "max_new_tokens": 4,  # llama-server reads max_tokens when n_predict is absent
        "temperature": None,
        "top_p": None,
        "seed": None,
        "prompt_ids": None,  # text was sent
    }
    sampled = {  # each engine's own names for top-p and the seed (SGLang: sampling_params.sampling_seed)
        "sglang": {"input_ids": [5], "sampling_params": {"temperature": 0.7, "top_p": 0.9, "sampling_seed": 3}},
        "vllm": {"prompt": [5], "temperature": 0.7, "top_p": 0.9, "seed": 3},
        "llamacpp": {"prompt": [5], "temperature": 0.7, "top_p": 0.9, "seed": 3},
    }
    for name, body in sampled.items():
        got = engines.ENGINES[name].read_request(body)
        assert (got["temperature"], got["top_p"], got["seed"]) == (0.7, 0.9, 3)
        other = sampled["vllm" if name == "sglang" else "sglang"]  # another shape: its seed is not this engine's
        assert engines.ENGINES[name].read_request(other)["seed"] is None


def test_llamacpp_cannot_serve_the_last_layer():
    assert LlamaCppClient.unservable([1, 4], 8) == {}
    why = LlamaCppClient.unservable([1, 7], 8)
    assert list(why) == [7] and "t_layer_inp" in why[7] and "layers 0..7" in why[7]
    assert engines.SGLangClient.unservable([1, 7], 8) == {}
    assert engines.layer_limits([1, 7], 8) == [f"llamacpp cannot serve target layer 7: {why[7]}"]


def test_checkpoint_check_names_the_last_layer_for_llamacpp(tmp_path):
    """The checkpoint-vs-extraction check (Diagnostics) names, before anyone deploys it, the layer of a drafter
    that llama.cpp cannot serve: a tiny drafter moved from target layers [1, 4] to [1, 7] of 8 (the last)."""
    from dflash_dash import drafters, target_info
    from dflash_dash.analysis.checks import consistency
    from dflash_dash.store import Extraction
    from tools import tiny

    target = tiny.write_target(tmp_path / "t")
    info = target_info.describe(target)
    ex = Extraction(
        id="ex1",
        set_name="s",
        target_path=str(target),
        layer_ids=[1, 4, 7],
        hidden_size=info.hidden_size,
        backend="fla",
    )
    for layers, flagged in (([1, 4], False), ([1, info.num_layers - 1], True)):
        ck = tiny.write_drafter(tmp_path / f"d{layers[-1]}", tiny.TinyDrafter(target_layer_ids=layers))
        rows = {r["check"]: r for r in consistency(drafters.read_config(ck), ex, info)}
        assert rows["served by sglang"]["ok"] == rows["served by vllm"]["ok"] == "✓"
        got = rows["served by llamacpp"]
        assert (got["ok"] == "⚠") is flagged and ("llamacpp cannot serve target layer 7" in got["problem"]) is flagged


def test_llamacpp_answer_without_tokens_is_refused():
    body = json.loads(llamacpp_answer({}))
    body["tokens"] = []  # an older llama-server that ignores return_tokens
    with pytest.raises(ServerError, match="empty `tokens` for 13 predicted tokens"):
        llamacpp_mod.parse_completion(json.dumps(body).encode())


# ---------------------------------------------------------------------------
# one tau across engines, on hand-worked numbers


def test_tau_conversion_hand_worked():
    # SGLang: 13 completion tokens, 4 verify steps. Its spec_accept_length = 13 / 4 = 3.25 (the prefill token
    # counted); the replay's tau = (13 - 1) / 4 = 3.0.
    t = engines.tau("sglang", {"verify_steps": 4, "accepted_tokens": 8, "completion_tokens": 13})
    assert t.tau == 3.0 and t.engine_figure == 3.25 and t.engine_label == "spec_accept_length"
    # vLLM: 4 steps accepting 0, 3, 2, 3 = 8 drafts; mean_acceptance_length = 1 + 8 / 4 = 3.0. The completion was
    # cut at max_tokens = 9: prefill 1 + steps 1 + 4 + 3 = 9, the last step's 4 committed tokens never emitted,
    # so the replay's tau = (9 - 1) / 4 = 2.0, below the engine's own 3.0.
    t = engines.tau("vllm", {"verify_steps": 4, "accepted_tokens": 8, "completion_tokens": 9})
    assert t.tau == 2.0 and t.engine_figure == 3.0 and t.engine_formula.startswith("1 + num_accepted")
    # llama.cpp: draft_n 12, draft_n_accepted 9, drafts of fixed length 4 -> 3 steps; 13 tokens predicted:
    # prefill 1 + 3 steps of (accepted + 1) = 1 + 12 = 13, tau = 12 / 3 = 4.0; its figure 9 / 12 = 0.75.
    row = {"verify_steps": 3, "accepted_tokens": 9, "drafted_tokens": 12, "completion_tokens": 13}
    t = engines.tau("llamacpp", row)
    assert t.tau == 4.0 and t.engine_figure == 0.75 and t.missing == []
    # an imported engine: tau only, no figure of its own
    t = engines.tau("other", {"verify_steps": 5, "completion_tokens": 11})
    assert t.tau == 2.0 and t.engine_figure is None
    assert engines.tau("vllm", {"verify_steps": 0, "completion_tokens": 1}).tau is None


# ---------------------------------------------------------------------------
# registry and config


def test_workspace_config_picks_the_engine(tmp_path, monkeypatch):
    assert config.WorkspaceConfig().engine == "sglang"
    (tmp_path / "config.toml").write_text('[server]\nurl = "http://127.0.0.1:8000"\nengine = "vllm"\n')
    cfg = config.load(tmp_path)
    monkeypatch.setenv("VLLM_API_KEY", "k-vllm")
    c = engines.for_workspace(cfg)
    assert isinstance(c, VLLMClient) and c.api_key == "k-vllm" and c.key_env == "VLLM_API_KEY"
    assert "k-vllm" not in repr(c)
    assert isinstance(engines.for_workspace(cfg, engine="llamacpp"), LlamaCppClient)
    (tmp_path / "config.toml").write_text('[server]\nengine = "tgi"\n')
    with pytest.raises(config.ConfigError, match=r"line 2: \[server\] engine must be one of 'sglang', 'vllm'"):
        config.load(tmp_path)


def test_conformance_rows_keep_the_engines_own_figure_beside():
    from dflash_dash.analysis import conformance

    replay = [{"prompt_id": "x", "prompt_len": 3, "accepted_at": [0] * 9, "rounds": [1, 4, 3]}]  # 8 committed
    stats = [{"prompt_id": "x", "verify_steps": 4, "accepted_tokens": 8, "completion_tokens": 9, "missing": []}]
    (row,) = conformance.compare(replay, stats, 0.05, "vllm")
    assert row["engine_tau"] == 2.0 and row["replay_tau"] == 8 / 3  # (9 - 1) / 4 beside 8 / 3 rounds
    assert row["engine_figure"] == 3.0 and row["engine_figure_label"] == "mean_acceptance_length"
    assert row["flagged"]  # the engine's own 3.0 is never what is compared


def test_vllm_prometheus_counters_and_per_position():
    # vllm-project/vllm vllm/v1/spec_decode/metrics.py, SpecDecodingProm: counters named
    # vllm:spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens / _num_accepted_tokens_per_pos
    # (label position), exported by prometheus_client with the _total suffix; two engines summed
    text = "\n".join(
        [
            "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 3.0',
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 1.0',
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 12.0',
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 8.0',
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 3.0',
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 3.0',
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 2.0',
            'vllm:num_requests_running{engine="0",model_name="m"} 0.0',
        ]
    )
    c = vllm_mod.parse_prometheus(text)
    assert c == {"num_drafts": 4.0, "num_draft_tokens": 12.0, "num_accepted_tokens": 8.0, "accepted_per_pos": [3, 3, 2]}
    assert vllm_mod.per_position_of(c) == [0.75, 0.75, 0.5]  # the same steps as the detailed arrays above
    assert vllm_mod.parse_prometheus("") == {
        "num_drafts": None,
        "num_draft_tokens": None,
        "num_accepted_tokens": None,
        "accepted_per_pos": [],
    }
