"""Acceptance's "Measure a cost table" form, inside its Predicted speedup section: starts the `profile` job
(ops.Profile) that times the target's verify forwards and the drafter's block on a device of this machine and keeps
the cost table the predictions price with. A helper of pages/speed_view.py, not a page (no torch, no SQL): the
folders are checked here and the token counts by ops.Profile before any job, every refusal in the form's words
(guard)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from dflash_dash import ops
from dflash_dash.jobs import gpu
from pages import forms, jobs_view, reads
from pages.guard import guard

if TYPE_CHECKING:
    from dflash_dash.store import Run

TITLE = "Measure a cost table"  # the expander's stable title (tests open it)
LABELS = {  # the form's label of each ops.Profile field
    "target": "target model folder",
    "drafter": "drafter checkpoint folder",
    "contexts": "context lengths",
    "sizes": "new tokens per target forward",
    "tree_budget": "DDTree budget",
    "repeats": "timed forwards per point",
}


def form(ws: str, run: Run, expanded: bool) -> None:
    """The profile form, its fields defaulting to the run's target (its extraction's) and checkpoint; then the
    profile jobs' panel. `expanded`: open (no cost table kept yet)."""
    ex = next((e for e in reads.extractions(ws, reads.stamp()) if e.id == run.extraction_id), None)
    with st.expander(TITLE, expanded=expanded):
        st.caption(
            "Times the target's forward of q new tokens after c context tokens (every verify size of the block "
            "included) and the drafter's block, on a device of this machine, and keeps the table. CPU costs are "
            "labelled as CPU costs: measure on the GPU you serve with for a speedup to serve by."
        )
        with st.form("profile"):
            c1, c2 = st.columns(2)
            target = c1.text_input(LABELS["target"], ex.target_path if ex else "", key="profile_target")
            drafter = c2.text_input(LABELS["drafter"], run.checkpoint or "", key="profile_drafter")
            c3, c4, c5 = st.columns(3)
            have = gpu.devices()
            device = c3.selectbox("device", have, key="profile_device", help="a device of this machine")
            dtypes = list(ops.DTYPES)
            dtype = c3.selectbox(
                "dtype", dtypes, dtypes.index("float32" if have[0] == "cpu" else "bfloat16"), key="profile_dtype"
            )
            contexts = c4.text_input(
                LABELS["contexts"], "512,2048,8192", key="profile_contexts", help="tokens already in the cache"
            )
            sizes = c4.text_input(LABELS["sizes"], "1,2,4,8,16,32,64", key="profile_sizes")
            budget = c5.number_input(LABELS["tree_budget"], 0, 256, 0, key="profile_budget", help="0: no tree")
            repeats = c5.number_input(LABELS["repeats"], 1, 100, 5, key="profile_repeats", help="their median")
            go = st.form_submit_button("Profile", type="primary")
        if go:
            if not target.strip():
                st.error("Give the target model folder to time.")
            else:
                with guard(LABELS):  # a mistyped folder, a bad token count: said here, no job
                    op = ops.Profile(
                        target=forms.folder(target, "target"),
                        drafter=forms.folder(drafter, "drafter"),
                        device=device,
                        dtype=dtype,
                        contexts=contexts,
                        sizes=sizes,
                        repeats=int(repeats),
                        tree_budget=int(budget),
                    )
                    jobs_view.start_job(op)
        jobs_view.job_panel(("profile",), key="profile")
