"""Extraction: target hidden states for a completion set, as a job with the GPU orchestration shown before
it runs (memory-release API, the configured stop/start commands, or none); GPU memory per device; every
existing extraction with its backend and a Re-extract button that asks for device and dtype (this machine's by
default). The new-extraction form takes several drafter checkpoints (one a line): the extraction holds the union
of their layers and serves each of them, with the target's top-K per completion position ("target top-K", 64 by
default: what the expected acceptance at a temperature reads). Both forms check before a job starts
(jobs.orchestrate.check_extract, as `extract` on the CLI): a device the machine lacks is refused, a duplicate of an
existing extraction (one holding the layers asked for) needs a tick, and an extraction whose feature files (and
top-K) would not fit on the workspace's disk is refused with both figures (pipeline.disk). "Evaluate without feature
files" streams instead: the target runs and a checkpoint (or every checkpoint of a training folder) replays on its
features in memory (replay/sweep --stream, at a sampling temperature too). Every job form runs on a device, this
host's GPUs or a Ray cluster (jobs_view.where_inputs). URL: extraction (forms, no selection)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st

from dflash_dash import ops
from dflash_dash.analysis.checks import backend_matters
from dflash_dash.errors import UserError
from dflash_dash.jobs import gpu
from dflash_dash.pipeline import disk
from dflash_dash.render.missing import DASH
from dflash_dash.render.tables import extraction_table, gpu_table
from pages import forms, frame, jobs_view, reads, server_view
from pages.guard import guard

if TYPE_CHECKING:
    from dflash_dash.store import Extraction, PromptSet

frame.routed()

ORCH = {
    "release": "memory-release API (server frees and retakes its GPU memory)",
    "command": "configured stop/start commands (config.toml)",
    "none": "none (the GPU is free, or extraction runs on CPU)",
}


def orchestration_plan(choice: str) -> list[str]:
    """The exact steps/commands the job will run, from the workspace configuration only."""
    from dflash_dash import config as cfg_mod

    cfg = server_view.config()
    if choice == "release":
        return [
            f"POST {cfg.server_url}/release_memory_occupation",
            "extract",
            f"POST {cfg.server_url}/resume_memory_occupation",
            f"wait for GET {cfg.server_url}/health = 200 (up to {cfg.readiness_timeout:g} s)",
        ]
    if choice == "command":
        cmds = cfg_mod.describe_commands(cfg)
        if not cmds:
            return []
        return (
            [c for c in cmds if c.startswith("stop")]
            + ["extract"]
            + [c for c in cmds if c.startswith("start")]
            + [f"wait for GET {cfg.server_url}/health = 200 (up to {cfg.readiness_timeout:g} s)"]
        )
    return ["extract (the server is not touched)"]


def gpu_block() -> None:
    st.subheader("GPU memory")
    try:
        gpus = gpu.gpu_memory()
    except Exception as e:  # noqa: BLE001  (no nvidia-smi, no driver: say so)
        st.caption(f"GPU memory unavailable: {e}")
        return
    if not gpus:
        st.caption("No GPU visible on this machine (extraction runs on CPU with the torch path).")
        return
    st.dataframe(gpu_table(gpus), hide_index=True, placeholder=DASH, width="stretch")


def existing(ws: str, stamp: str, orch: str) -> None:
    st.subheader("Extractions")
    exs = reads.extractions(ws, stamp)
    if not exs:
        st.info("No extractions yet: choose a completion set and a target below and press **Extract**.")
        return
    st.dataframe(extraction_table(exs), hide_index=True, placeholder=DASH, width="stretch")
    for e in reversed(exs):
        with st.container(border=True):
            c1, c2 = st.columns([5, 1])
            badge = {"fla": ":green[fla]", "torch": ":orange[torch]"}.get(e.backend, e.backend)
            c1.markdown(
                f"`{e.id}` · backend **{badge}** · set `{e.set_name}` · {e.prompts} prompts · "
                f"layers {e.layer_ids} · {e.device} {e.dtype} · {e.status}"
            )
            c1.caption(f"target {e.target_path}")
            if e.backend == "torch":
                c1.caption("torch path: drafters trained on fla states may accept less on it (see Diagnostics)")
            if c2.button(
                "Re-extract",
                key=f"reextract_{e.id}",
                help="a new extraction with the same target, set and layers, on a device and dtype you choose",
            ):
                st.session_state["reextract"] = e.id
            if st.session_state.get("reextract") == e.id:
                reextract_form(e, orch)


def check(target: str, set_name: str, layers: list[int], device: str, dtype: str, topk: int = 0) -> list[str]:
    """The checks before an extraction job (the CLI's `extract` makes the same): device and dtype, then the disk
    (both figures, the target's top-`topk` counted); raises the UserError naming the fix. Returns the duplicate
    warnings of check_extract."""
    from dflash_dash.jobs import orchestrate

    dups = orchestrate.check_extract(reads.store(), target, set_name, layers, device, dtype)
    disk.check(disk.plan(reads.store(), set_name, layers, target, topk=topk))
    return dups


def refusal(err: UserError, topk: int = 0) -> None:
    """A refused extraction, in the page; a disk too small also points at the streaming form (and at the target
    top-K field when it adds bytes)."""
    more = f"\n\nOn this page: **{STREAM}** below evaluates checkpoints without them."
    if topk:
        more += (
            f" The **{TOPK}** field ({topk}) adds {8 * topk + 4:,} bytes a completion token: a smaller one (0: none, "
            "no expected acceptance at a temperature) needs less."
        )
    st.error(f"{err}{more if isinstance(err, disk.DiskFull) else ''}")


def reextract_form(e: dict, orch: str) -> None:
    """Where a re-extraction runs and its dtype (this machine's device by default), checked before any job starts
    (jobs.orchestrate.check_extract, as the CLI's `extract`): a device the machine lacks is refused; a duplicate of an
    existing extraction needs a tick first."""
    key = f"rx_{e.id}"
    where = jobs_view.where_inputs(key)
    try:
        dups = check(e.target_path, e.set_name, list(e.layer_ids), where["device"], where["dtype"])
    except UserError as err:
        refusal(err)
        dups, ok = [], False
    else:
        ok = True
    again = False
    if dups:
        st.warning("\n\n".join(dups))
        again = st.checkbox(
            "extract again anyway",
            key=f"{key}_again",
            help="a second extraction like it, e.g. to check that extraction is reproducible",
        )
    b1, b2 = st.columns([1, 5])
    allowed = ok and (again or not dups)
    if b1.button("Start re-extraction", key=f"{key}_go", type="primary", disabled=not allowed) and allowed:
        with guard():  # a mistyped GPU list or Ray address: said here, no job
            what = dict(target=e.target_path, completions=e.set_name, layers=list(e.layer_ids))
            op = ops.Extract(**what, orchestrate=orch, **where)
            jobs_view.start_job(op)
            st.session_state.pop("reextract", None)
    if b2.button("Close", key=f"{key}_close"):
        st.session_state.pop("reextract", None)
        st.rerun()


def new_form(sets: list[PromptSet], exs: list[Extraction], orch: str) -> None:
    """The new-extraction form: target, set, layers (from drafters or explicit), where it runs; checked before a job."""
    st.subheader("New extraction")
    if not sets:
        st.info("No completion sets yet: fetch or import completions on the **Completions** page first.")
        return
    names = [s.name for s in sets]
    last = exs[-1] if exs else None
    with st.form("extract"):
        c1, c2 = st.columns([2, 1])
        target = c1.text_input("target model folder (Hugging Face causal LM)", value=last.target_path if last else "")
        set_name = c2.selectbox(
            "completion set", names, index=names.index(last.set_name) if last and last.set_name in names else 0
        )
        c3, c4 = st.columns(2)
        drafter = c3.text_area(
            "layers from drafter checkpoints (their target_layer_ids)",
            "",
            key="extract_drafters",
            help="one checkpoint folder per line; several drafters (DFlash, DSpark, DFlash2 tap different "
            "layers) get one extraction holding the union of their layers, and each replays on its own",
        )
        layers = c4.text_input(
            "…or explicit layer ids",
            value=",".join(map(str, (last.layer_ids if last else None) or [])),
            help="comma-separated, e.g. 1,16,31,46,61; ignored when a drafter is given",
        )
        topk = st.number_input(
            TOPK,
            0,
            4096,
            ops.TARGET_TOPK,
            key="extract_topk",
            help="the target's top-K log-probabilities kept per completion position (with the mass outside them), "
            "which the expected acceptance at a sampling temperature reads; 8K + 4 bytes a completion token; 0: none",
        )
        where = jobs_view.where_inputs("extract")
        again = st.checkbox("extract again even if an extraction like it exists", key="extract_again")
        go = st.form_submit_button("Extract", type="primary")
    if not go:
        return
    if not target.strip():
        st.error("Give the target model folder.")
        return
    if not drafter.strip() and not layers.strip():
        st.error("Give a drafter checkpoint (its layer ids are used) or explicit layer ids.")
        return
    from dflash_dash import pipeline

    args = {"target": target.strip(), "completions": set_name, "orchestrate": orch, "target_topk": int(topk), **where}
    if drafter.strip():
        args["drafter"] = drafter.splitlines()  # ops.parse_paths: one folder a line, blanks dropped
    else:
        args["layers"] = pipeline.layers_of(None, layers.strip())
    lay = args.get("layers") or pipeline.layers_of(args["drafter"], None)
    try:
        dups = check(args["target"], set_name, lay, args["device"], args["dtype"], int(topk))
    except UserError as err:
        refusal(err, int(topk))
        return
    if dups and not again:
        st.warning(
            "\n\n".join(dups) + "\n\nTick **extract again even if an extraction like it exists** and press "
            "**Extract** to make another one."
        )
        return
    if args["device"] == "cpu" and backend_matters(args["target"]):
        st.warning(
            "On CPU the torch path of the linear-attention kernels is used (backend `torch`), not the fla kernels "
            "the drafter was trained on."
        )
    with guard({"target_topk": TOPK}):  # a mistyped GPU list or Ray address: said here, no job
        jobs_view.start_job(ops.Extract(**args))


def main() -> None:
    ws = reads.workspace()
    stamp = reads.stamp()
    st.title("Extraction")
    sets = reads.sets(ws, stamp)
    exs = reads.extractions(ws, stamp)

    st.subheader("GPU orchestration")
    orch = st.radio("before loading the target", list(ORCH), format_func=ORCH.get, horizontal=True, index=2, key="orch")
    plan = orchestration_plan(orch)
    if not plan:
        st.warning(
            "No stop/start commands in the workspace's config.toml ([server] stop_command, "
            "start_command); add them there, or choose another orchestration."
        )
    else:
        st.caption("the job will run exactly these steps (commands come only from config.toml):")
        st.text("\n".join(plan))  # not st.code: its syntax highlighter costs the browser ~0.2 s per page load
    gpu_block()

    existing(ws, stamp, orch)

    new_form(sets, exs, orch)
    jobs_view.job_panel(("extract",), key="extract")
    stream_block(sets, exs)


STREAM = "Evaluate without feature files"
TOPK = "target top-K"  # the new-extraction form's label of ops.Extract.target_topk


def stream_block(sets: list[PromptSet], exs: list[Extraction]) -> None:
    """The streaming form: replay --stream for one checkpoint folder, sweep --stream for a training folder."""
    st.subheader(STREAM)
    st.caption(
        "Streaming: the target runs over the set's sequences and the checkpoint (or every checkpoint of a training "
        "folder) replays on their features while they are in memory. No feature file is written, so a set too "
        "large for the disk can still be evaluated; a later replay on such a run runs the target again."
    )
    if not sets:
        return
    names = [s.name for s in sets]
    last = exs[-1] if exs else None
    with st.form("stream"):
        c1, c2 = st.columns([2, 1])
        target = c1.text_input(
            "target model folder (Hugging Face causal LM)", value=last.target_path if last else "", key="stream_target"
        )
        set_name = c2.selectbox(
            "completion set",
            names,
            index=names.index(last.set_name) if last and last.set_name in names else 0,
            key="stream_set",
        )
        folder = st.text_input(
            "checkpoint folder, or a training output folder (each checkpoint in it)",
            key="stream_folder",
            placeholder="/path/to/epoch_0_step_1000 or /path/to/outputs",
        )
        how = (
            jobs_view.checkpoint_inputs("stream")
            | jobs_view.sampling_inputs("stream")
            | jobs_view.where_inputs("stream")
        )
        go = st.form_submit_button("Stream", type="primary")
    if go:
        if not target.strip() or not folder.strip():
            st.error("Give the target model folder and a checkpoint (or training output) folder.")
            return
        from dflash_dash import pipeline

        labels = {"target": "target model folder", "checkpoints": "checkpoint folder", "drafter": "checkpoint folder"}
        labels |= jobs_view.SAMPLING
        with guard(labels):  # a mistyped folder, a drafter the target cannot feed: said here, no job
            args = dict(stream=True, target=forms.folder(target, "target"), completions=set_name, **how)
            found, skipped = pipeline.checkpoints_in(folder.strip())
            if [str(p) for p in found] == [str(Path(folder.strip()).resolve())]:  # one checkpoint: its every anchor
                op = ops.Replay(drafter=folder.strip(), force=True, **args)
                pipeline.check_replay(reads.store(), op)
            else:  # a training folder: its checkpoints on one pass of the target
                op = ops.Sweep(checkpoints=folder.strip(), **args)
            jobs_view.start_job(op)
            if skipped:
                st.info(f"Not checkpoints, skipped: {'; '.join(skipped)}")
    jobs_view.job_panel(("replay", "sweep"), key="stream")


with guard():
    main()
