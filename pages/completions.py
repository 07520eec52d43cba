"""Completions: fetch a prompt set from a serving engine as a job (live progress), greedy or sampled (temperature,
top-p, seed), import a completions JSONL, and list the completions of a set (how it was sampled first) with finish
reason, token counts and server-side speculative counters. Selecting a row shows that completion's prompt and text.
URL: completions?set=NAME&prompt=PID."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import streamlit as st

from dflash_dash import ops
from dflash_dash.render.missing import DASH
from dflash_dash.render.tables import SPEC_KEYS, completion_table
from dflash_dash.render.tokens import text_html
from pages import forms, frame, jobs_view, params, reads, server_view, widgets
from pages.guard import guard

frame.routed()

UPLOAD = "upload a JSONL file…"
FETCH = {  # ops.Fetch field -> its widget's label: errors name the form's fields, not CLI flags (forms.said)
    "prompt_set": "prompt set",
    "name": "completion set name",
    "server": "server URL",
    "max_new_tokens": "max new tokens",
    "temperature": "temperature",
    "top_p": "top-p",
    "seed": "seed",
    "chat": "chat template",
    "tokenizer": "tokenizer folder",
}
IMPORT = {"name": "set name"}  # the import form's labels, as FETCH


def save_upload(up, folder: str) -> Path:
    """An uploaded prompt-set or completions file saved into the workspace (validated by the job/import)."""
    d = Path(reads.workspace()) / folder
    d.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(up.name).name) or "upload.jsonl"
    dst = d / name
    dst.write_bytes(up.getvalue())
    return dst


def fetch_form() -> None:
    from dflash_dash import prompts

    st.subheader("Fetch completions from a server")
    url = server_view.server_url()
    with st.form("fetch"):
        c1, c2 = st.columns([2, 1])
        kept = sorted(f.stem for f in (Path(reads.workspace()) / "prompt_sets").glob("*.jsonl"))
        choice = c1.selectbox(
            FETCH["prompt_set"],
            list(prompts.SETS) + [k for k in kept if k not in prompts.SETS] + [UPLOAD],
            help="built-in sets (coding-10, HumanEval), sets imported below, or a JSONL file: {\"id\", \"prompt\"} "
            "per line, MT-Bench, SPEED-Bench, GSM8K, or any JSONL with a category (told by its fields)",
        )
        up = c1.file_uploader("prompt set JSONL (when uploading)", type=["jsonl", "json", "txt"])
        name = c2.text_input(FETCH["name"], value="")
        c3, c4, c5 = st.columns([2, 1, 1])
        server = c3.text_input(FETCH["server"], value=url)
        max_new = c4.number_input(FETCH["max_new_tokens"], 1, 32768, 256)
        chat = c5.toggle(
            FETCH["chat"],
            value=True,
            help="apply the target's chat template locally (thinking off) and send input_ids",
        )
        tok = st.text_input(f"{FETCH['tokenizer']} (for the chat template; empty: the server's tokenizer_path)", "")
        c6, c7, c8 = st.columns(3)
        temp = c6.number_input(
            FETCH["temperature"], 0.0, 100.0, 0.0, 0.1, help="0: greedy (the default); > 0: sample at this temperature"
        )
        top_p = c7.number_input(FETCH["top_p"], 0.0, 1.0, 1.0, 0.05, help="with a temperature: the nucleus mass kept")
        seed = c8.text_input(
            FETCH["seed"],
            "",
            help="with a temperature: an integer 0..4294967295 sent with every request (recorded); "
            "empty: the server's own randomness (not reproducible)",
        )
        go = st.form_submit_button("Fetch", type="primary")
    if go:
        if not name.strip():  # never a default: the prompt set's name may be a set already fetched otherwise
            example = (choice if choice != UPLOAD else "my-prompts") + ("-chat" if chat else "-plain")
            st.error(
                f"completion set name is empty: give the new set a name (for example {example}); type an existing "
                "set's name only to continue fetching that set (with the settings it was fetched with)."
            )
            return
        with guard(FETCH):  # every field checked before a job starts or an upload is kept
            if seed.strip() and not seed.strip().isdigit():
                raise ops.InputError(f"seed {seed.strip()!r}: give an integer 0..4294967295, or leave it empty", "seed")
            op = ops.Fetch(
                temperature=float(temp),
                top_p=float(top_p),
                seed=int(seed) if seed.strip() else None,
                server=server.strip() or None,
                prompt_set=choice,
                name=name,
                max_new_tokens=int(max_new),
                chat=bool(chat),
                tokenizer=forms.folder(tok, "tokenizer", hub=True),
            )
            if choice == UPLOAD:
                if up is None:
                    st.error("Choose a prompt-set JSONL file to upload, or pick a built-in set.")
                    return
                f = save_upload(up, "prompt_sets")
                prompts.load(str(f))  # validate now: a bad file is reported here, not in the job
                op = replace(op, prompt_set=str(f))
            jobs_view.start_job(op)
    jobs_view.job_panel(("fetch",), key="fetch")


def import_prompts_form() -> None:
    from dflash_dash import pipeline, prompts

    with st.expander("Import a prompt set (MT-Bench, SPEED-Bench, GSM8K, HumanEval, any JSONL with a category)"):
        st.caption(
            "Kept in the workspace under its name, with each prompt's category; fetch it above by that name. "
            "Multi-turn questions (MT-Bench, SPEED-Bench) send their first turn: a second turn is asked after the "
            "model's own first answer, which a fetch does not hold."
        )
        with st.form("import_prompts"):
            up = st.file_uploader(
                "prompt file (JSONL, JSONL.gz, or SPEED-Bench's parquet)", type=["jsonl", "json", "gz", "parquet"]
            )
            c1, c2 = st.columns(2)
            name = c1.text_input("prompt set name")
            fmt = c2.selectbox("format", prompts.FORMATS, help="auto: told by the first row's fields")
            go = st.form_submit_button("Import prompts")
        if go:
            if up is None or not name.strip():
                st.error("Choose a prompt file and give the prompt set a name.")
                return
            with guard({"name": "prompt set name"}):  # a bad file or name: one line naming the row (or
                # the field) and the fix, the rest of the page stays
                ops.check_name(name, "name", "the prompt set's name")  # before the upload is kept
                got = pipeline.import_prompts(reads.store(), save_upload(up, "imports"), name.strip(), fmt)
                cats = sorted({p["category"] for p in got if p["category"]})
                st.success(
                    f"imported {len(got)} prompts as prompt set {name.strip()}"
                    + (f" ({len(cats)} categories: {', '.join(cats)})" if cats else " (no categories)")
                )


def import_form() -> None:
    from dflash_dash import pipeline

    with st.expander("Import a completions JSONL ({\"id\", \"prompt_ids\", \"output_ids\"} per line)"):
        with st.form("import"):
            up = st.file_uploader("completions JSONL", type=["jsonl", "json", "txt"])
            name = st.text_input(IMPORT["name"])
            go = st.form_submit_button("Import")
        if go:
            if up is None or not name.strip():
                st.error("Choose a file and give the set a name.")
                return
            with guard(IMPORT):  # the name checked before the upload is kept
                set_name = ops.check_name(name, "name", "the set's name")
                n = pipeline.import_completions(reads.store(), save_upload(up, "imports"), set_name)
                st.success(f"imported {n} completions into set {set_name}")


def main() -> None:
    ws = reads.workspace()
    stamp = reads.stamp()
    st.title("Completions")
    sets = reads.sets(ws, stamp)
    if not sets:
        st.info(
            "No completions yet. Start a server (e.g. `python -m dflash_dash serve --model DIR`) and fetch "
            "a prompt set below, or import a completions JSONL."
        )
    else:
        names = [s.name for s in sets]
        counts = {s.name: s.prompts for s in sets}
        name = params.select_param(
            "completion set",
            names,
            "set",
            "comp_set",
            default=names[-1],
            format_func=lambda n: f"{n} ({counts[n]} completions)",
        )
        comps = reads.completions(ws, name, stamp)
        st.caption(f"Set `{name}`: {reads.set_sampling(ws, name, stamp)} (as its stored requests asked).")
        if not comps:
            st.info(f"Set {name!r} has no completions yet; a running fetch adds them as they arrive.")
        else:
            rows = completion_table(list(comps.values()))
            st.caption("pick a row (or the completion below) to show its prompt and completion text")
            ev = st.dataframe(
                rows,
                column_config=widgets.numbers(rows),
                hide_index=True,
                placeholder=DASH,
                width="stretch",
                on_select="rerun",
                selection_mode="single-row",
                key="comp_table",
            )
            picked = ev.selection.rows if ev is not None and hasattr(ev, "selection") else []
            if picked and st.session_state.get("_comp_table_last") != rows[picked[0]]["prompt"]:
                st.session_state["_comp_table_last"] = rows[picked[0]]["prompt"]
                params.set_param("comp_prompt", "prompt", rows[picked[0]]["prompt"])
            if not any(k in r for r in rows for k in SPEC_KEYS):
                st.caption("No server-side speculative counters: the server did not run speculative decoding.")
            else:
                st.caption(
                    "Server-side speculative counters as SGLang reported them (those present). server_tau = "
                    "completion_tokens / spec_verify_ct: tokens per verify step, the engine's tau for the "
                    "request. spec_accept_histogram as accepted:count."
                )
            pid = params.select_param("show completion", list(comps), "prompt", "comp_prompt")
            c = reads.completion(ws, name, pid, stamp)
            a, b = st.columns(2)
            with a:
                st.markdown("**prompt**")
                st.html(text_html((c and c.prompt) or "(prompt given as token ids)"))
            with b:
                st.markdown("**completion**")
                st.html(text_html((c and c.output) or ""))
            with st.expander("request and meta_info as stored"):
                st.json({"request": c.request, "meta_info": c.meta_info, "model_path": c.model_path} if c else {})
    import_prompts_form()  # above the fetch form, whose prompt-set list then holds the set just imported
    fetch_form()
    import_form()


with guard():
    main()
