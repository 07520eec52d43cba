"""Small widgets the pages share: a dataframe's number formats and missing-value helps, a CSV download button,
and the notes shown where a streamed or torch-path extraction feeds what is drawn."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from dflash_dash.render import missing
from dflash_dash.render.formats import csv_text
from dflash_dash.render.labels import streamed
from dflash_dash.render.tables import number_formats

if TYPE_CHECKING:
    from dflash_dash.store import Extraction


def numbers(rows: list[dict], **config) -> dict:
    """A dataframe's column_config printing its float columns one way per kind of number (render.tables
    number_formats: tau-like 2 decimals, probabilities 3), a help saying why on each column with a missing value
    (drawn as `missing.DASH`: `st.dataframe(placeholder=DASH)`), plus `config`."""
    fmts, why = number_formats(rows), missing.helps(rows)
    cfg = {c: st.column_config.NumberColumn(format=f, help=why.get(c)) for c, f in fmts.items()}
    return cfg | {c: st.column_config.Column(help=h) for c, h in why.items() if c not in cfg} | config


def download(label: str, rows: list[dict], file_name: str, key: str) -> None:
    """A CSV download button for one table (or figure data)."""
    st.download_button(
        label, csv_text(rows) if rows else "", file_name=file_name, mime="text/csv", key=key, disabled=not rows
    )


def streamed_note(e: Extraction | None, what: str = "This run") -> None:
    """Say so where a streamed extraction's runs are shown: a replay on it runs the target again."""
    if streamed(e):
        st.info(
            f"{what} was computed by **streaming**: the target `{e.target_path}` ran over set `{e.set_name}` "
            f"({e.backend}, {e.device} {e.dtype}) and the drafter replayed on the features in memory; no "
            f"feature file was written. A replay on extraction `{e.id}` needs the target again: the Replay "
            f"button below streams it (CLI: `replay --stream --target {e.target_path} --completions "
            f"{e.set_name} --drafter CKPT`)."
        )


def backend_note(backend: str | None, what: str = "This run", then: str | None = None) -> None:
    """A warning wherever a torch-path extraction feeds a drafter (trained on fla states, which differ); `then`:
    what that means where it is shown (default: acceptance here can be lower than in serving)."""
    if backend == "torch":
        then = then or "so acceptance here can be lower than in serving"
        st.warning(
            f"{what} uses a **torch-path** extraction (backend `torch`, the CPU fallback of the "
            "linear-attention kernels). The drafter was trained on states from the **fla** kernels; the "
            f"two differ, {then}. Compare both on the Diagnostics page (backend parity)."
        )
