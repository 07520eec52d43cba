"""The pages' job helpers: starting an operation as a job, the live job panel, the inputs the job forms share (where a
job runs: `where_inputs`; how a checkpoint is read: `checkpoint_inputs`), and Acceptance's Replay form. Helpers of
the page scripts, not a page (no torch, no SQL)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import streamlit as st

from dflash_dash import ops
from dflash_dash.jobs import gpu
from dflash_dash.render.formats import job_result
from dflash_dash.render.labels import extraction_label, streamed
from dflash_dash.render.tokens import pre_html
from pages import widgets
from pages.guard import guard
from pages.reads import store

if TYPE_CHECKING:
    from dflash_dash.store import Extraction, Job

ACTIVE = ("queued", "running")
STATUS_ICON = {
    "queued": ":material/schedule:",
    "running": ":blue[:material/autorenew:]",
    "done": ":green[:material/check_circle:]",
    "failed": ":red[:material/error:]",
    "cancelled": ":gray[:material/stop_circle:]",
}


def job_lifecycle():
    """The job lifecycle (start, cancel, rerun, log tail, ...), imported on first use: it loads the operations."""
    from dflash_dash.jobs import lifecycle

    return lifecycle


SLIDING_CHOICES = {
    "the checkpoint's own (causal unless its config sets is_causal)": None,
    "causal inside the block (SpecForge training, SGLang serving)": "causal",
    "bidirectional inside the block (z-lab HF reference)": "bidirectional",
}


def checkpoint_inputs(key: str) -> dict:
    """The two ways a checkpoint can be read (replay and sweep forms): its draft config JSON, for SpecForge
    runtime checkpoints without a config.json, and the sliding-layer block semantics. Job arguments."""
    c1, c2 = st.columns(2)
    cfg = c1.text_input(
        "draft config JSON (only for SpecForge runtime checkpoints without config.json)",
        "",
        key=f"{key}_draft_config",
        placeholder="/path/to/draft_config.json",
    )
    how = c2.selectbox("sliding_attention layers", list(SLIDING_CHOICES), key=f"{key}_sliding")
    out = {"draft_config": cfg.strip() or None, "sliding_block": SLIDING_CHOICES[how]}
    return {k: v for k, v in out.items() if v}


VERIFY_CHOICES = {  # ops.VERIFY, each rule as an engine runs it (pages/expected_view.RULES names the sources)
    "target-sample: greedy drafts, accepted while the target's sample equals them (SGLang DFlash)": "target-sample",
    "rejection: drafts sampled at T, accepted with min(1, p/q) (Leviathan et al.)": "rejection",
}
SAMPLING = {"temperature": "sampling temperature T", "verify": "verify rule"}  # the form labels of ops' fields


def sampling_inputs(key: str) -> dict:
    """The expected acceptance at a sampling temperature (replay, sweep and streaming forms): T (empty: greedy
    only) and the verify rule. Job arguments: {} without a temperature."""
    c1, c2 = st.columns(2)
    t = c1.number_input(
        SAMPLING["temperature"],
        min_value=0.0,
        max_value=100.0,
        value=None,
        step=0.1,
        key=f"{key}_temperature",
        placeholder="empty: greedy tau only",
        help="also the expected acceptance at this temperature, teacher-forced along the stored completion (needs "
        "an extraction with the target's top-K); 0: the greedy limit",
    )
    how = "how the engine you serve with verifies drafts at T"
    rule = c2.selectbox(SAMPLING["verify"], list(VERIFY_CHOICES), key=f"{key}_verify", help=how)
    return {} if t is None else {"temperature": float(t), "verify": VERIFY_CHOICES[rule]}


def has_topk(e: Extraction, args: dict) -> None:
    """Refuse a temperature on extraction `e` that kept no target top-K (a streamed job computes it), in the forms'
    words: the field and where the fix is made."""
    from dflash_dash.pipeline.extract import topk_of

    if args.get("temperature") is None or args.get("stream") or topk_of(e):
        return
    raise ops.InputError(
        f"temperature: extraction {e.id} kept no target top-K, which the expected acceptance at a temperature "
        f"reads; make an extraction with target top-K {ops.TARGET_TOPK} on the Extraction page (or pick another "
        "extraction), or clear the sampling temperature",
        "temperature",
    )


def where_inputs(key: str) -> dict:
    """Where a job runs, the inputs every job form shares: one process on a device, the one-host pool (GPUs), or a
    Ray cluster (its address; on a cluster without GPUs, its CPU workers), and the compute dtype. Job arguments
    (`ops` fields), checked by the op itself when the job is built. Defaults: this machine's first device, bf16
    on a GPU and fp32 on the CPU."""
    have = gpu.devices()
    c1, c2, c3 = st.columns(3)
    device = c1.text_input(
        "device", have[0], key=f"{key}_device", help=f"cpu, cuda or cuda:N; this machine has {', '.join(have)}"
    )
    gpus = c1.text_input(
        "GPUs",
        "",
        key=f"{key}_gpus",
        help="one worker process per device of this host, prompts sharded: GPU indices like 0,1 (cpu,cpu: CPU "
        "workers); empty: the device above",
    )
    ray = c2.text_input(
        "Ray cluster",
        "",
        key=f"{key}_ray",
        placeholder="auto or HOST:PORT",
        help="run on a Ray cluster, one worker per GPU of every host (auto: the cluster this host runs, or "
        "RAY_ADDRESS; HOST:PORT: the address `ray start --head` prints); the workspace must be at the same path "
        "on every host; empty: this host",
    )
    cpus = c2.number_input(
        "Ray CPU workers",
        0,
        1024,
        0,
        key=f"{key}_ray_cpus",
        help="with a Ray cluster that has no GPUs: this many CPU workers (one CPU slot each); 0: one worker per GPU",
    )
    dtypes = list(ops.DTYPES)
    dtype = c3.selectbox(
        "dtype", dtypes, index=dtypes.index("float32" if have[0] == "cpu" else "bfloat16"), key=f"{key}_dtype"
    )
    out = {"device": device.strip() or "cpu", "gpus": gpus, "dtype": dtype}
    if ray.strip() or cpus:  # Ray CPU workers without a cluster: the op names the missing address
        out |= {"ray": ray.strip() or None, "ray_cpus": int(cpus) or None}
    return out


def start_job(op) -> str:
    """Start operation `op` (a `dflash_dash.ops` dataclass) as a job (a separate process) and remember it so its
    panel follows it."""
    job_id = job_lifecycle().start(store(), op)
    st.session_state.setdefault("_started_jobs", []).append(job_id)
    st.toast(f"started {op.kind} job {job_id}")
    return job_id


PANEL_S, SIDEBAR_S = 1.0, 2.0  # how often a job panel and the sidebar's list redraw while a job of theirs runs


def busy(kinds: tuple[str, ...] | None = None) -> bool:
    """Whether a job of the workspace (of `kinds`; None: any) is queued or running (a dead one settled first). The
    fragments that follow jobs poll only then: an idle tab costs the server nothing. A page that starts a job reruns
    (a form's click) and draws its panel after the start; a fragment whose jobs end reruns the app, which polls no
    more. A job started elsewhere (the CLI, another tab) shows at this tab's next rerun."""
    try:
        return any(kinds is None or j.kind in kinds for j in job_lifecycle().active(store()))
    except Exception:  # noqa: BLE001  (a fragment's cadence must never break the page)
        return False


def running_jobs() -> None:
    """The sidebar's running jobs, redrawn while one runs; when the last ends the app reruns (its result shows)."""
    polling = busy()

    @st.fragment(run_every=SIDEBAR_S if polling else None)
    def listing() -> None:
        try:
            active = job_lifecycle().active(store())
        except Exception as e:  # noqa: BLE001  (the sidebar must never break the page)
            st.caption(f"jobs unavailable: {e}")
            return
        if polling and not active:
            st.rerun()  # the last job ended: the page shows its result, and this list stops polling
        if not active:
            st.caption("no running jobs")
        for j in active:
            st.progress(
                min(1.0, max(0.0, float(j.progress or 0.0))),
                text=f"{j.kind} · {j.status} · {str(j.step or '')[:60]}",
            )

    listing()


def ended(job: Job) -> str:
    """When a job ended, for its error's label (' at 2026-12-06 14:02, 12 min ago'; '' when not recorded)."""
    t = job.updated
    if not isinstance(t, datetime):
        return ""
    mins = max(0, int((datetime.now() - t).total_seconds() // 60))  # the store's timestamps are local, as now()
    return f" at {t:%Y-%m-%d %H:%M}, " + (f"{mins} min ago" if mins < 120 else f"{mins // 60} h ago")


def job_panel(kinds: tuple[str, ...], key: str, n: int = 6) -> None:
    """Live list of the recent jobs of `kinds`: status, step, progress bar, error, log tail, cancel/rerun, and
    dismiss for a failed or cancelled job (hidden from the panel from then on; `jobs` on the CLI still lists it).
    Polls every second while a job of `kinds` runs (`busy`); when a job reaches a final state the whole page reruns
    to show its result (and the panel stops polling)."""

    @st.fragment(run_every=PANEL_S if busy(kinds) else None)
    def panel():
        with guard():
            body()

    def body():
        jobs = job_lifecycle()
        st_ = store()
        rows = [j for j in jobs.recent(st_, 30, dismissed=False) if j.kind in kinds][:n]
        final = {j.id for j in rows if j.status not in ACTIVE}
        seen_key = f"_final_{key}"
        seen = st.session_state.get(seen_key)
        st.session_state[seen_key] = final
        if seen is not None and final - seen:
            st.rerun()  # a job finished: rerun the page so its result is listed
        if not rows:
            st.caption(f"No {' / '.join(kinds)} jobs yet.")
            return
        for j in rows:
            with st.container(border=True):
                icon = STATUS_ICON.get(j.status, "")
                st.markdown(f"{icon} **{j.kind}** `{j.id}` · {j.status}")
                if j.status in ACTIVE:
                    st.progress(min(1.0, max(0.0, float(j.progress or 0.0))), text=str(j.step or ""))
                else:
                    st.caption(str(j.step or ""))
                if j.status == "done" and j.result:
                    st.caption(job_result(j.result))  # run ids link to their Acceptance page
                if j.error:  # labelled: an old job's error must not read as the latest click's
                    say = st.error if j.status == "failed" else st.caption
                    say(f"{j.kind} job `{j.id}` {j.status}{ended(j)}: {j.error}")
                c1, c2, c4, c3 = st.columns([1, 1, 1, 3])
                if j.status in ACTIVE and c1.button("Cancel", key=f"cancel_{key}_{j.id}"):
                    jobs.cancel(st_, j.id)
                    st.rerun()
                if j.status in ("failed", "cancelled") and c2.button("Rerun", key=f"rerun_{key}_{j.id}"):
                    jobs.rerun(st_, j.id)
                    st.rerun()
                if j.status in ("failed", "cancelled") and c4.button(
                    "Dismiss", key=f"dismiss_{key}_{j.id}", help="hide this job from the panel"
                ):
                    st_.dismiss_job(j.id)
                    st.rerun()
                with c3.expander("log"):
                    st.html(pre_html(jobs.log_tail(st_, j.id) or "(empty)"))

    panel()


def replay_form(extractions: list[Extraction], default_ex: str | None, default_ck: str = "") -> None:
    st.subheader("Replay another checkpoint")
    done = [e for e in extractions if e.status == "done"]
    if not done:
        st.info(
            "No finished extraction to replay on: extract hidden states first on the **Extraction** page "
            "(or `python -m dflash_dash extract ...`)."
        )
        return
    ids = [e.id for e in done]
    by_id = {e.id: e for e in done}
    with st.form("replay"):
        ck = st.text_input(
            "checkpoint folder (config.json + *.safetensors, or a SpecForge {run_id}-step{N}/ folder)",
            value=default_ck,
            placeholder="/path/to/epoch_0_step_1000",
        )
        how = checkpoint_inputs("replay")
        c1, c2 = st.columns(2)
        ex = c1.selectbox(
            "extraction",
            ids,
            index=ids.index(default_ex) if default_ex in ids else len(ids) - 1,
            format_func=extraction_label(by_id),
        )
        budget = c2.number_input("DDTree budget", 0, 256, 8)
        sampled = sampling_inputs("replay")
        where = where_inputs("replay")
        go = st.form_submit_button("Replay", type="primary")
    if go:
        if not ck.strip():
            st.error(
                "Give the checkpoint folder to replay (a folder with config.json and *.safetensors, or a "
                "SpecForge runtime folder with training_state.pt)."
            )
        else:
            from dflash_dash import pipeline

            widgets.backend_note(by_id[ex].backend, f"Extraction {ex}")
            e = by_id[ex]
            stream = (  # no feature files: the job runs the target again over the set (GPUs too)
                dict(stream=True, target=e.target_path, completions=e.set_name) if streamed(e) else {}
            )
            if stream:
                st.info(f"Extraction {ex} was streamed (no feature files): this replay runs the target again.")
            with guard({"drafter": "checkpoint folder"} | SAMPLING):  # a mistyped folder, a damaged
                # checkpoint, a drafter this extraction cannot feed, a temperature without its top-K: said here, no job
                has_topk(e, sampled | stream)
                op = ops.Replay(
                    drafter=ck.strip(),
                    extraction=ex,
                    tree_budget=int(budget),
                    **where,
                    force=True,  # a click on Replay asks for a new run (the run list shows any earlier one)
                    **how,
                    **stream,
                    **sampled,
                )
                pipeline.check_replay(store(), op)
                start_job(op)
    job_panel(("replay", "sweep"), key="acc")
