"""Acceptance page section for model-free baseline runs: where the chosen round's drafts came from. A helper of
pages/acceptance.py and the Overview, not a page: it reads the kept sources of the prompt (pipeline.baseline) and
draws them, and says how much a drafter run beats the best baseline on the same completions."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from dflash_dash.analysis.compare import is_baseline
from dflash_dash.analysis.reference import best_baseline, versus
from dflash_dash.render.baseline import source_html, versus_html
from dflash_dash.vocab import Vocab
from pages import reads

if TYPE_CHECKING:
    from dflash_dash.store import Completion, Run


def source_note(ws: str, run: Run, row: dict, comp: Completion, vocab: Vocab, rnd: int) -> None:
    """For a baseline run: the source of round `rnd`'s drafts (a copied span, or the cache that matched)."""
    if not is_baseline(run):
        return
    src = reads.kept(ws, run.id, "sources:" + row["prompt_id"])
    tokens = list(comp.prompt_ids) + list(comp.output_ids)
    st.html(source_html(src or {}, rnd, tokens, vocab.strings))


def beside(runs: list[Run], run: Run, who: str = "this drafter") -> None:
    """For a drafter run: its tau against the best baseline run on the same extraction (nothing when none)."""
    base = None if is_baseline(run) else best_baseline(runs, run)
    if base is not None and (run.summary or {}).get("tau_macro") is not None:
        st.html(versus_html(versus(run, base), who))
