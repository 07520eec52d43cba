"""How a set was sampled, on the pages: the Completions page names a sampled set's temperature, top-p and
seed (read from its stored requests in the engine's own fields) and a greedy set as greedy; the Fetch form refuses
sampling fields without a temperature, in the form's words, before any job."""

from __future__ import annotations

from apptest import app, by_label, clean

from dflash_dash.store import Store


def add(st_: Store, name: str, engine: str, request: dict) -> None:
    st_.add_set(name, "test")
    row = {"id": "p0", "idx": 0, "prompt_ids": [1, 2], "output_ids": [3, 4], "finish_reason": "length"}
    st_.add_completion(name, row | {"model_path": "/m", "meta_info": {}, "request": request, "engine": engine})


def test_completions_page_says_how_each_set_was_sampled(tmp_path, monkeypatch):
    st_ = Store(tmp_path / "ws")
    add(st_, "hot", "vllm", {"prompt": [1, 2], "max_tokens": 2, "temperature": 0.7, "top_p": 0.95, "seed": 1})
    add(st_, "cold", "sglang", {"input_ids": [1, 2], "sampling_params": {"temperature": 0, "max_new_tokens": 2}})
    said = {}
    for name in ("hot", "cold"):
        at = app(tmp_path / "ws", monkeypatch, "completions", set=name)
        clean(at)
        said[name] = [c.value for c in at.caption if c.value.startswith(f"Set `{name}`")]
    assert said == {
        "hot": ["Set `hot`: sampled at T=0.7, top-p 0.95, seed 1 (as its stored requests asked)."],
        "cold": ["Set `cold`: greedy (as its stored requests asked)."],
    }


def test_fetch_form_refuses_a_seed_without_temperature(tmp_path, monkeypatch):
    at = app(tmp_path / "ws", monkeypatch, "completions")
    by_label(at.text_input, "completion set name").input("s")
    by_label(at.text_input, "seed").input("5")
    by_label(at.button, "Fetch").click().run()
    assert not at.exception
    assert [e.value for e in at.error] == ["Seed 5: it seeds sampling; give a temperature > 0, or no seed (greedy)"]
    by_label(at.number_input, "temperature").set_value(0.7)
    by_label(at.text_input, "seed").input("x")
    by_label(at.button, "Fetch").click().run()
    assert [e.value for e in at.error] == ["Seed 'x': give an integer 0..4294967295, or leave it empty"]
    assert Store(tmp_path / "ws").jobs() == []
