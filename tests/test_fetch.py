"""Fetch against the local SGLang stand-in in a real subprocess: startup wait, ids equal to the server's own
output, resume after a killed job without duplicates, and clear errors that keep what was fetched."""

from __future__ import annotations

import json
import os
import signal

import pytest
from serving import Served, free_port, status_now, stop_jobs, tiny_model, until
from transformers import AutoTokenizer

from dflash_dash import cli, ops, pipeline, prompts
from dflash_dash.engines import ServerError, chat_ids
from dflash_dash.jobs import lifecycle
from dflash_dash.store import Store

COD10 = [
    "fizzbuzz",
    "binary_search",
    "linked_list_reverse",
    "json_parser",
    "async_rate_limiter",
    "trie_autocomplete",
    "merge_sort",
    "lru_cache",
    "graph_bfs",
    "matrix_multiply",
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def srv(model, tmp_path_factory):
    """Started with a startup delay and NOT waited for: the first fetch must wait through it."""
    s = Served(model, tmp_path_factory.mktemp("srvlog") / "server.log", delay=3.0)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def fetched(srv, tmp_path_factory):
    """coding-10 fetched right after the server process was started (8 new tokens each)."""
    store = Store(tmp_path_factory.mktemp("ws"))
    seen: list[str] = []
    n = pipeline.fetch(
        store,
        ops.Fetch(server=srv.url, prompt_set="coding-10", name="c10", max_new_tokens=8),
        progress=lambda d, t, m: seen.append(m),
    )
    return store, n, seen


def test_coding_10_is_ten_code_starts():
    got = prompts.load("coding-10")
    assert [p["id"] for p in got] == COD10
    for p in got:
        assert p["prompt"].endswith("\n") and len(p["prompt"]) < 400
        assert ("def " in p["prompt"] or "class " in p["prompt"]) and p["prompt"].startswith("# ")


def test_fetch_waits_through_startup(fetched):
    store, n, seen = fetched
    waits = [m for m in seen if m.startswith("waiting for")]
    assert any("refused" in m for m in waits) and any("503" in m for m in waits), waits
    assert waits[-1].split(": ", 1)[1].startswith("ready")
    assert seen.index(waits[-1]) < min(i for i, m in enumerate(seen) if m.startswith("fetching"))
    assert n == 10


def test_fetched_ids_equal_the_servers_output(fetched, srv, model):
    store, _, _ = fetched
    rows = store.completions("c10")
    assert [r["prompt_id"] for r in rows] == COD10
    tok = AutoTokenizer.from_pretrained(model)
    texts = {p["id"]: p["prompt"] for p in prompts.load("coding-10")}
    for r in rows:
        assert r["prompt"] == texts[r["prompt_id"]]
        assert r["prompt_ids"] == tok(r["prompt"])["input_ids"]
        direct = srv.client.generate(input_ids=r["prompt_ids"], max_new_tokens=8)
        assert r["output_ids"] == direct["output_ids"] and len(r["output_ids"]) == 8
        assert r["output"] == direct["text"]
        assert r["request"] == {
            "input_ids": r["prompt_ids"],
            "sampling_params": {"temperature": 0, "max_new_tokens": 8},
        }
        assert r["model_path"] == str(model.resolve())
        assert r["finish_reason"] == "length"
        assert r["meta_info"]["completion_tokens"] == 8 and r["meta_info"]["prompt_tokens"] == len(r["prompt_ids"])


def test_export_completions_cli_prints_the_set(fetched, capsys):
    store, _, _ = fetched
    assert cli.main(["--workspace", str(store.workspace), "export-completions", "--name", "c10"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    rows = store.completions("c10")
    assert [x["id"] for x in lines] == COD10
    assert [x["output_ids"] for x in lines] == [r["output_ids"] for r in rows]
    assert [x["prompt_ids"] for x in lines] == [r["prompt_ids"] for r in rows]


def test_refetch_fetches_nothing(fetched, srv, capsys):
    store, _, _ = fetched
    before = srv.generates()
    assert (
        cli.main(
            [
                "--workspace",
                str(store.workspace),
                "fetch",
                "--server",
                srv.url,
                "--prompt-set",
                "coding-10",
                "--name",
                "c10",
                "--max-new-tokens",
                "8",
            ]
        )
        == 0
    )
    assert "fetched 0 new completions into set c10 (10 in total)" in capsys.readouterr().out
    assert srv.generates() == before


def test_killed_fetch_job_resumes_without_duplicates(srv, tmp_path, monkeypatch, request):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # inherited by the job processes
    srv.wait()
    store = Store(tmp_path / "ws")
    (tmp_path / "ws" / "config.toml").write_text(f'[server]\nurl = "{srv.url}"\n')
    request.addfinalizer(lambda: stop_jobs(store))
    before = srv.generates()
    job = lifecycle.start(store, "fetch", {"prompt_set": "coding-10", "name": "k", "max_new_tokens": 32})
    until(lambda: len(store.completion_ids("k")) >= 3, 90, what="3 completions from the job")
    os.killpg(store.job(job)["pid"], signal.SIGKILL)

    until(
        lambda: status_now(store, job) == "failed", 30, what="refresh to see the killed job"
    )  # SIGKILL lands asynchronously
    dead = store.job(job)
    assert dead["status"] == "failed" and "process died (killed by signal 9 SIGKILL)" in dead["error"]
    kept = {r["prompt_id"]: r for r in store.completions("k")}
    assert 3 <= len(kept) < 10, "the job finished before it was killed; the test proves nothing"

    again = lifecycle.rerun(store, job)
    until(lambda: store.job(again)["status"] not in lifecycle.ACTIVE, 90, what="the rerun job")
    done = store.job(again)
    assert done["status"] == "done", (done, lifecycle.log_tail(store, again))
    assert done["result"] == {"set": "k", "fetched": 10 - len(kept)} and done["progress"] == 1.0
    rows = store.completions("k")
    assert [r["prompt_id"] for r in rows] == COD10
    for r in rows:
        if r["prompt_id"] in kept:  # not fetched again: the very same row
            assert (
                r["created"] == kept[r["prompt_id"]]["created"] and r["meta_info"] == kept[r["prompt_id"]]["meta_info"]
            )
    assert srv.generates() - before <= 11  # ten, plus at most the one in flight when killed


def test_server_error_gives_clear_cli_error_and_keeps_what_was_fetched(srv, tmp_path, capsys):
    srv.wait()
    f = tmp_path / "p.jsonl"
    recs = [{"id": f"p{i}", "prompt_ids": [5 + i, 6, 7, 8]} for i in range(5)]
    recs[3]["prompt_ids"] = [5, 6, 100000]  # outside the vocabulary: the server answers 400
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    ws = tmp_path / "ws"
    rc = cli.main(
        [
            "--workspace",
            str(ws),
            "fetch",
            "--server",
            srv.url,
            "--prompt-set",
            str(f),
            "--name",
            "bad",
            "--max-new-tokens",
            "4",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: prompt 'p3'") and "HTTP 400" in line and "out of the vocabulary" in line
    assert "3 completions fetched so far are kept in set 'bad'" in line and "run the same fetch again" in line
    assert "Traceback" not in err
    assert sorted(Store(ws).completion_ids("bad")) == ["p0", "p1", "p2"]
    with pytest.raises(ServerError):  # the same through the API: a ServerError, not a crash
        pipeline.fetch(Store(ws), ops.Fetch(server=srv.url, prompt_set=str(f), name="bad", max_new_tokens=4))


def test_unreachable_server_times_out_clearly(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    rc = cli.main(
        [
            "--workspace",
            str(tmp_path),
            "fetch",
            "--server",
            url,
            "--prompt-set",
            "coding-10",
            "--name",
            "x",
            "--readiness-timeout",
            "1",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and err.startswith("error: server at") and "not ready after 1 s (last: refused)" in err
    assert Store(tmp_path).completion_ids("x") == set()


def test_chat_fetch_sends_the_chat_template_ids(srv, model, tmp_path):
    srv.wait()
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "q", "prompt": "Write hello world."}) + "\n")
    store = Store(tmp_path / "ws")
    assert (
        pipeline.fetch(
            store,
            ops.Fetch(
                server=srv.url, prompt_set=str(f), name="chat", max_new_tokens=4, chat=True, tokenizer=str(model)
            ),
        )
        == 1
    )
    tok = AutoTokenizer.from_pretrained(model)
    (r,) = store.completions("chat")
    assert r["prompt_ids"] == chat_ids(tok, "Write hello world.", enable_thinking=False)
    assert "<think>\n\n</think>" in tok.decode(r["prompt_ids"])  # thinking off by default
    assert r["output_ids"] == srv.client.generate(input_ids=r["prompt_ids"], max_new_tokens=4)["output_ids"]


def test_bad_prompt_file_names_the_line(tmp_path, capsys):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "prompt": "x"}\n{"id": "b"}\n')
    rc = cli.main(
        [
            "--workspace",
            str(tmp_path / "ws"),
            "fetch",
            "--server",
            "http://127.0.0.1:1",
            "--prompt-set",
            str(f),
            "--name",
            "x",
        ]
    )
    assert rc == 2
    assert "line 2 (id 'b'): give 'prompt'" in capsys.readouterr().err


def test_fetch_into_a_set_with_other_settings_is_refused(fetched, srv, model, capsys):
    """Fetching into an existing set with the chat template on while the set was fetched as plain text
    (or with another max_new_tokens) mixed settings silently. Refused, naming the setting and both values; nothing
    is sent."""
    store, _, _ = fetched
    before = srv.generates()
    base = ["--workspace", str(store.workspace), "fetch", "--server", srv.url, "--prompt-set", "coding-10"]
    assert cli.main([*base, "--name", "c10", "--max-new-tokens", "8", "--chat", "--tokenizer", str(model)]) == 2
    err = capsys.readouterr().err
    assert "chat: set 'c10' was fetched with chat template off" in err and "asks for chat template on" in err
    assert "another completion set name" in err
    assert cli.main([*base, "--name", "c10", "--max-new-tokens", "16"]) == 2
    err = capsys.readouterr().err
    assert "max_new_tokens 8" in err and "asks for 16" in err
    assert srv.generates() == before and len(store.completions("c10")) == 10


def test_fetch_of_an_imported_mt_bench_set_keeps_categories(srv, tmp_path):
    """An MT-Bench question.jsonl (FastChat's llm_judge shape: question_id, category, turns) kept with
    import-prompts and fetched by name: each completion keeps its question's category, its first turn was sent."""
    from test_standard_sets import MT_BENCH, write_jsonl

    store = Store(tmp_path / "ws")
    pipeline.import_prompts(store, write_jsonl(tmp_path / "question.jsonl", MT_BENCH), "mt")
    pipeline.fetch(store, ops.Fetch(server=srv.url, prompt_set="mt", name="mt-set", max_new_tokens=4))
    assert store.categories("mt-set") == {"81": "writing", "111": "math", "131": "extraction"}
    assert [r["prompt"] for r in store.completions("mt-set")] == [q["turns"][0] for q in MT_BENCH]
    assert store.sets()[-1]["source"] == str(pipeline.prompt_folder(store) / "mt.jsonl")
