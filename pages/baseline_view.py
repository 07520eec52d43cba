"""Acceptance page section for model-free baseline runs: where the chosen round's drafts came from. A helper of
pages/acceptance.py, not a page: it reads the kept sources of the prompt (pipeline.baseline) and draws them."""

from __future__ import annotations

import streamlit as st

from dflash_dash.render.baseline import source_html
from dflash_dash.vocab import Vocab
from pages import common


def is_baseline(run: dict) -> bool:
    return str(run.get("checkpoint") or "").startswith("baseline:")


def source_note(ws: str, run: dict, row: dict, comp: dict, vocab: Vocab, rnd: int) -> None:
    """For a baseline run: the source of round `rnd`'s drafts (a copied span, or the cache that matched)."""
    if not is_baseline(run):
        return
    src = common.kept(ws, run["id"], "sources:" + row["prompt_id"])
    tokens = list(comp["prompt_ids"]) + list(comp["output_ids"])
    st.html(source_html(src or {}, rnd, tokens, vocab.strings))
