"""Property-based tests (hypothesis) over the input parsers: JSONL completions, server responses, checkpoint
configs. Any input gives either a valid result or the parser's own named error, never another exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dflash_dash import drafters as dr, pipeline
from dflash_dash.engines import ServerError
from dflash_dash.engines.sglang import parse_generate
from tools import tiny

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ids = st.lists(st.integers(0, 999), min_size=1, max_size=20)
record = st.fixed_dictionaries(
    {"id": st.text(min_size=1, max_size=12), "prompt_ids": ids, "output_ids": ids},
    optional={"prompt": st.text(max_size=30), "output": st.text(max_size=30)},
)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)


# ---------------------------------------------------------------------------
# JSONL completions


@SETTINGS
@given(st.lists(record, min_size=1, max_size=6, unique_by=lambda r: r["id"]))
def test_jsonl_valid_roundtrip(recs):
    text = "\n".join(json.dumps(r) for r in recs)
    got = pipeline.parse_jsonl(text, vocab_size=1000)
    assert [g["id"] for g in got] == [r["id"] for r in recs]
    assert [g["output_ids"] for g in got] == [r["output_ids"] for r in recs]


@SETTINGS
@given(st.lists(st.one_of(st.text(max_size=40), json_value.map(json.dumps), record.map(json.dumps)), max_size=6))
def test_jsonl_garbage_named(lines):
    try:
        pipeline.parse_jsonl("\n".join(lines), vocab_size=1000)
    except pipeline.InputError as e:
        assert str(e).startswith("line ") or "no completions" in str(e)


@pytest.mark.parametrize(
    "line,msg",
    [
        ('{"id": "a", "prompt_ids": [1], "output_ids": []}', "line 1 (id 'a'): field 'output_ids' must be a non-empty"),
        ('{"id": "a", "prompt_ids": [1], "output_ids": [5000]}', "token id 5000 in 'output_ids' is outside"),
        ('{"id": "a", "prompt_ids": [1]}', "field 'output_ids'"),
        ('{"prompt_ids": [1], "output_ids": [2]}', "line 1: field 'id'"),
        ('{"id": "a", "prompt_ids": [1], "output_ids": [2.5]}', "holds 2.5"),
        ('{"id": "a", "prompt_ids": [true], "output_ids": [2]}', "holds True"),
        ("{bad json", "line 1: not valid JSON"),
        ('[1, 2]', "expected a JSON object"),
    ],
)
def test_jsonl_errors_name_line_and_field(line, msg):
    with pytest.raises(pipeline.InputError) as e:
        pipeline.parse_jsonl(line, vocab_size=1000)
    assert msg in str(e.value)


def test_jsonl_error_names_later_line():
    ok = json.dumps({"id": "a", "prompt_ids": [1], "output_ids": [2]})
    with pytest.raises(pipeline.InputError, match="line 3: duplicate id 'a'"):
        pipeline.parse_jsonl("\n".join([ok, "", ok]))


# ---------------------------------------------------------------------------
# server responses


@SETTINGS
@given(
    st.one_of(
        st.binary(max_size=60),
        json_value.map(lambda v: json.dumps(v).encode()),
        st.fixed_dictionaries({"text": json_value, "output_ids": json_value, "meta_info": json_value}).map(
            lambda v: json.dumps(v).encode()
        ),
    )
)
def test_generate_response_garbage_named(body):
    wrong = problems(body)
    try:
        out = parse_generate(body)
    except ServerError as e:
        assert wrong, f"a valid answer refused: {e}"
        assert any(w in str(e) for w in wrong), (wrong, str(e))  # names (one of) what is wrong with it
        assert not e.transient
    else:
        assert not wrong, f"{wrong} accepted: {body!r}"
        data = json.loads(body)
        data = data[0] if isinstance(data, list) else data
        want = {
            "text": data.get("text") or "",
            "output_ids": data["output_ids"],
            "meta_info": data.get("meta_info") or {},
        }
        assert json.dumps(out) == json.dumps(want)  # (as JSON text: a NaN in meta_info equals itself)


def problems(body: bytes) -> set[str]:
    """What is wrong with a /generate answer, worked out here from the body itself (SGLang's shape: an object,
    or a batch of one, with `output_ids` a list of ints, `text` a string and `meta_info` an object, the last two
    optional or null), as the words the parser's message must hold."""
    try:
        data = json.loads(body)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return {"malformed JSON"}
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict):
        return {"expected an object"}
    out = set()
    if data.get("output_ids") is None:
        out.add("no `output_ids`")
    elif not (isinstance(data["output_ids"], list) and all(type(i) is int for i in data["output_ids"])):
        out.add("ill-typed `output_ids`")
    if data.get("text") is not None and not isinstance(data["text"], str):
        out.add("ill-typed `text`")
    if data.get("meta_info") is not None and not isinstance(data["meta_info"], dict):
        out.add("ill-typed `meta_info`")
    return out


@SETTINGS
@given(st.lists(st.integers(0, 10**6), max_size=30), st.text(max_size=40))
def test_generate_response_valid(out_ids, text):
    body = json.dumps({"text": text, "output_ids": out_ids, "meta_info": {"finish_reason": {"type": "length"}}})
    got = parse_generate(body.encode())
    assert got["output_ids"] == out_ids and got["text"] == text


# ---------------------------------------------------------------------------
# checkpoint configs


@SETTINGS
@given(st.dictionaries(st.sampled_from(list(tiny.drafter_config(tiny.TinyDrafter()))), json_value, max_size=8))
def test_checkpoint_config_garbage_named(patch):
    raw = tiny.drafter_config(tiny.TinyDrafter()) | patch
    try:
        dr.parse_config(raw)
    except dr.CheckpointError as e:
        assert "config.json" in str(e)


REFUSED_FORMS = [  # drafters this tool does not replay, and contradictory family configs: refused by name
    ({"dflash_config": {"conv_kernel_size": 2, "conv_group_size": 16}}, "DFlash2 drafter needs dflash_config.selector"),
    ({"dflash_config": {"selector_rank": 256, "selector_top_k": 16}}, "DFlash2 drafter needs dflash_config.conv"),
    ({"markov_rank": 4}, "belongs to a DSpark drafter"),
    ({"dflash_config": {"emb_dim": 256}}, "belongs to a Domino drafter"),
    ({"sample_from_anchor": True}, "sample_from_anchor = true on a DFlash drafter"),
    ({"dspark_markov_rank": 64}, "DeepSeek-V4 DSpark"),
    ({"speculators_model_type": "dflash"}, "speculators-format"),
    ({"architectures": ["LlamaForCausalLMEagle3"]}, "EAGLE-3"),
    ({"architectures": ["PEagleDraftModel"]}, "P-EAGLE"),
    ({"dflash_config": {"projector_type": "medusa"}}, "projector_type = 'medusa' is unknown"),
    ({"architectures": ["DSparkDraftModel"], "dflash_config": {"projector_type": "domino"}}, "contradicts"),
    ({"architectures": ["DSparkDraftModel"], "markov_head_type": "cond", "markov_rank": 4}, "markov_head_type"),
    ({"architectures": ["DominoDraftModel"], "dflash_config": {"emb_dim": 8}}, "gru_hidden_dim"),
]
SERVED_FORMS = [  # other families as engines and exporters write them: recognised as their family
    (  # SGLang's normalised DSpark export: Markov fields at the top level
        {"architectures": ["Qwen3DSparkModel"], "markov_rank": 4, "markov_head_type": "Gated"},
        "dspark",
    ),
    (  # SpecForge's normaliser: a Domino under a DFlash architecture, projector_type wins
        {"dflash_config": {"projector_type": "domino", "emb_dim": 8, "gru_hidden_dim": 6}},
        "domino",
    ),
    (  # SGLang: DFlash2 turned on by its fields on a DFlashDraftModel
        {"dflash_config": {"conv_kernel_size": 2, "conv_group_size": 4, "selector_rank": 3, "selector_top_k": 4}},
        "dflash2",
    ),
]


def _patched(patch: dict) -> dict:
    raw = tiny.drafter_config(tiny.TinyDrafter())
    return raw | patch | {"dflash_config": {**raw.get("dflash_config", {}), **patch.get("dflash_config", {})}}


@pytest.mark.parametrize("patch,name", REFUSED_FORMS)
def test_drafters_not_replayed_are_refused_by_name(patch, name):
    with pytest.raises(dr.CheckpointError, match=name):
        dr.parse_config(_patched(patch))
    assert dr.parse_config(tiny.drafter_config(tiny.TinyDrafter())).family == "dflash"  # plain DFlash still parses


@pytest.mark.parametrize("patch,family", SERVED_FORMS)
def test_other_families_in_served_forms_are_recognised(patch, family):
    c = dr.parse_config(_patched(patch))
    assert c.family == family
    assert set(dr.shapes(c)) > set(dr.shapes(dr.parse_config(tiny.drafter_config(tiny.TinyDrafter()))))
