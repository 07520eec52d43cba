"""Every dashboard page through streamlit.testing AppTest on the prepared workspace (and on an empty one).

Jobs started from buttons are real processes; the tests poll the store with a deadline."""

from __future__ import annotations

import re
import time

import pytest
from apptest import APP, PAGES, TITLES, app, by_label, clean, htmls, visible_text
from streamlit.testing.v1 import AppTest
from waiting import wait_job

from dflash_dash import ops, pipeline
from dflash_dash.analysis.compare import config_diff
from dflash_dash.render.formats import fmt
from dflash_dash.store import Store

# ---------------------------------------------------------------------------
# routing


@pytest.mark.parametrize("page", PAGES + ["overview"])
def test_a_deep_link_on_first_visit_renders_that_page_under_the_router(tmp_path, monkeypatch, page):
    """Each AppTest run starts like a fresh server process (Streamlit's pages/-directory mode on, as it is while
    no script has declared st.navigation): a deep link opened first renders that page with app.py's sidebar, not
    the page script alone."""
    monkeypatch.setenv("DFLASH_WORKSPACE", str(tmp_path / "ws"))
    at = AppTest.from_file(APP, default_timeout=90)
    if page != "overview":
        at.switch_page(f"pages/{page}.py")  # the URL path /{page}, before any run: a first visit
    at.run()
    clean(at)
    assert [t.value for t in at.title] == [TITLES[page]]
    assert str((tmp_path / "ws").resolve()) in " ".join(c.value for c in at.sidebar.text)  # app.py ran
    assert at.run().title[0].value == TITLES[page]  # and the next run (the router from then on) stays there


# ---------------------------------------------------------------------------
# every page


@pytest.mark.parametrize("page", PAGES + ["overview"])
def test_every_page_renders_without_errors(prepared, monkeypatch, page):
    at = app(prepared.workspace, monkeypatch, page)
    clean(at)
    assert [t.value for t in at.title] == [TITLES[page]]


def sidebar_server(at: AppTest) -> str:
    return " ".join(m.value for m in at.sidebar.markdown if "**Server**" in m.value)


def test_sidebar_shows_workspace_server_and_jobs(prepared, monkeypatch):
    from pages import server_view

    at = app(prepared.workspace, monkeypatch)
    clean(at)
    assert [t.value for t in at.title] == ["dflash-dash"]  # the Overview page at /
    assert str(prepared.workspace.resolve()) in " ".join(c.value for c in at.sidebar.text)
    assert server_view.health_poller("http://127.0.0.1:30000", "SGLANG_API_KEY").wait(30)
    at.run()
    assert "not ready" in sidebar_server(at)  # nothing listens on the default URL
    assert "no running jobs" in " ".join(c.value for c in at.sidebar.caption)


@pytest.mark.parametrize("page", PAGES + ["overview"])
def test_empty_workspace_says_what_to_do(tmp_path, monkeypatch, page):
    at = app(tmp_path / "empty", monkeypatch, page)
    clean(at)
    assert at.info, "an empty page must say what to do next"
    text = " ".join(i.value for i in at.info)
    assert any(w in text for w in ("Fetch", "fetch", "Extract", "extract", "replay", "Replay"))


# ---------------------------------------------------------------------------
# acceptance


def test_acceptance_metrics_and_formulas_match_the_store(prepared, monkeypatch):
    st = Store(prepared.workspace)
    for rid in prepared.runs:
        s = st.run_row(rid)["summary"]
        at = app(prepared.workspace, monkeypatch, "acceptance", run=rid)
        clean(at)
        m = {x.label: x.value for x in at.metric}
        assert m["tau (macro)"] == fmt(s["tau_macro"])
        assert m["tau (pooled)"] == fmt(s["tau_pooled"])
        assert m["every-anchor tau"] == fmt(s["every_anchor_tau"])
        assert m[f"DDTree-{s['tree_budget']} tau (macro)"] == fmt(s["ddtree_tau"])
        captions = " ".join(c.value for c in at.caption)
        from dflash_dash import metrics

        for mt in metrics.HEADLINE:
            assert mt.formula in captions
        assert at.query_params["run"] == rid
        # backend shown, with the torch-path warning
        assert any(f"backend **{st.extraction(prepared.extraction)['backend']}**" in c.value for c in at.caption)
        assert any("torch-path" in w.value for w in at.warning) == (s["backend"] == "torch")


def test_acceptance_url_opens_the_prompt_and_escapes_untrusted_text(prepared, monkeypatch):
    at = app(prepared.workspace, monkeypatch, "acceptance", run=prepared.runs[1], prompt=prepared.script_id)
    clean(at)
    assert by_label(at.selectbox, "prompt").value == prepared.script_id
    view = next(h for h in htmls(at) if 'class="dfv"' in h and "pos " in h)
    assert "<script" not in view and "<img" not in view
    assert "<script>window.__pwned = 1; alert(1)</script>" in visible_text(view)
    row = Store(prepared.workspace).run_prompts(prepared.runs[1])
    n = len(next(r for r in row if r["prompt_id"] == prepared.script_id)["accepted_at"])
    assert view.count('title="pos ') == n
    # choosing another prompt updates the URL
    by_label(at.selectbox, "prompt").set_value("drafted").run()
    clean(at)
    assert at.query_params["prompt"] == "drafted"


def test_a_long_trace_is_drawn_a_window_at_a_time(prepared, monkeypatch):
    """A completion longer than `render.tokens.WINDOW` positions (patched to 8 here) is drawn one window at a time
    (Acceptance and Compare): a picker of windows, `&win=K` in the URL, a `pos=` link opening the window that holds
    it, and another prompt opening at its own first window."""
    from dflash_dash.render import tokens

    monkeypatch.setattr(tokens, "WINDOW", 8)
    rid, pid = prepared.runs[1], prepared.script_id
    row = Store(prepared.workspace).run_prompt(rid, pid)
    P, n = row["prompt_len"], len(row["accepted_at"])
    assert n > 16

    def view(at):
        return next(h for h in htmls(at) if 'class="dfv"' in h and "pos " in h)

    at = app(prepared.workspace, monkeypatch, "acceptance", run=rid, prompt=pid)
    clean(at)
    win = by_label(at.selectbox, "positions shown")
    assert win.value == "0" and len(win.options) == -(-n // 8) and win.options[1] == f"positions {P + 8}–{P + 15}"
    assert view(at).count('title="pos ') == 8 and f'title="pos {P} ' in view(at)
    win.set_value("1").run()
    clean(at)
    assert at.query_params["win"] == "1" and view(at).count('title="pos ') == 8
    assert f'title="pos {P + 8} ' in view(at) and f'title="pos {P + 7} ' not in view(at)
    by_label(at.selectbox, "prompt").set_value("drafted").run()  # another prompt: its first window
    clean(at)
    P2 = Store(prepared.workspace).run_prompt(rid, "drafted")["prompt_len"]
    assert at.query_params.get("win") in (None, "0") and f'title="pos {P2} ' in view(at)
    at = app(prepared.workspace, monkeypatch, "acceptance", run=rid, prompt=pid, pos=f"{P + 17}-{P + 18}")
    clean(at)
    assert by_label(at.selectbox, "positions shown").value == "2" and f'title="pos {P + 17} ' in view(at)
    at = app(prepared.workspace, monkeypatch, "compare", a=prepared.runs[0], b=rid, prompt=pid)
    clean(at)
    pane = next(h for h in htmls(at) if 'class="dfcmp"' in h)
    assert pane.count('title="pos ') == 16 and by_label(at.selectbox, "positions shown")  # 8 a pane


def test_unknown_id_in_the_link_is_reported_not_fatal(prepared, monkeypatch):
    at = app(prepared.workspace, monkeypatch, "acceptance", run="run-does-not-exist")
    clean(at)
    assert any("run='run-does-not-exist'" in w.value for w in at.warning)
    assert at.query_params["run"] in prepared.runs


def test_acceptance_table_sorted_by_tau(prepared, monkeypatch):
    at = app(prepared.workspace, monkeypatch, "acceptance", run=prepared.runs[0])
    df = at.dataframe[1].value if len(at.dataframe) > 1 else at.dataframe[0].value
    taus = [t for t in df["tau"].tolist()]
    assert taus == sorted(taus) and len(taus) == 3


def test_replay_button_starts_a_job_that_adds_a_run(prepared, workspace_copy, monkeypatch):
    at = app(workspace_copy, monkeypatch, "acceptance")
    by_label(at.text_input, "checkpoint folder").input(str(prepared.drafters[1]))
    by_label(at.button, "Replay").click().run()
    clean(at)
    job = wait_job(workspace_copy, "replay")
    assert job["status"] == "done", job
    assert job["args"]["drafter"] == str(prepared.drafters[1])
    runs = Store(workspace_copy).runs()
    assert len(runs) == 3 and runs[-1]["id"] == job["result"]["run"]
    at.run()
    assert at.query_params["run"] in {r["id"] for r in runs}
    # the job's result links to its run's Acceptance page
    link = f"[`{runs[-1]['id']}`](acceptance?run={runs[-1]['id']})"
    assert any(c.value == f"result: run {link}" for c in at.caption), [c.value for c in at.caption]


def test_replay_form_refuses_a_mistyped_checkpoint_before_any_job(prepared, workspace_copy, monkeypatch):
    """A mistyped checkpoint path started a job that failed seconds later; the form says so at once, in
    the page, without a traceback, and starts nothing."""
    at = app(workspace_copy, monkeypatch, "acceptance")
    typo = str(prepared.drafters[1]) + "x"
    by_label(at.text_input, "checkpoint folder").input(typo)
    by_label(at.button, "Replay").click().run()
    assert not at.exception
    assert [e.value for e in at.error] == [f"{typo}: no such checkpoint folder"]
    assert Store(workspace_copy).jobs() == []
    by_label(at.text_input, "checkpoint folder").input(str(prepared.target))  # a target, not a drafter
    by_label(at.button, "Replay").click().run()
    assert any("a target model folder" in e.value for e in at.error), [e.value for e in at.error]
    assert Store(workspace_copy).jobs() == []


# ---------------------------------------------------------------------------
# compare


def test_compare_by_url_shows_both_checkpoints(prepared, monkeypatch):
    a, b = prepared.runs
    at = app(prepared.workspace, monkeypatch, "compare", a=a, b=b, section="config")  # configs: drawn when chosen
    clean(at)
    assert at.query_params["a"] == a and at.query_params["b"] == b
    st = Store(prepared.workspace)
    names = [st.run_row(r)["name"] for r in (a, b)]
    md = " ".join(m.value for m in at.markdown) + " ".join(htmls(at))  # the token views' heads name the runs
    assert all(n in md for n in names)
    cap = " ".join(c.value for c in at.caption)
    assert all(str(p) in cap for p in prepared.drafters)
    # the two token views, with differing positions outlined
    views_ = [h for h in htmls(at) if 'title="pos ' in h]  # one element holds both (scroll-synced)
    assert len(views_) == 1 and views_[0].count('<div class="dfv">') == 2
    n = sum(1 for r in config_diff(st.run_row(a)["config"], st.run_row(b)["config"]) if r["differs"])
    assert n >= 1 and f"{n} key" in cap
    cfg = at.dataframe[-1].value
    cfg = cfg.data if hasattr(cfg, "data") else cfg
    assert cfg.set_index("key").loc["rope_theta", "differs"] == "≠"
    assert cfg.set_index("key").loc["block_size", "differs"] == ""


def test_sweep_section_plots_runs_of_the_folder(prepared, monkeypatch):
    at = app(prepared.workspace, monkeypatch, "compare", sweep=str(prepared.train))
    clean(at)
    links = [m.value for m in at.markdown if "open in Acceptance" in m.value]
    assert len(links) == 2 and "step 100" in links[0] and "step 200" in links[1]
    assert all(f"acceptance?run={r}" in " ".join(links) for r in prepared.runs)


# ---------------------------------------------------------------------------
# completions, extraction, diagnostics


def test_completions_table_and_escaped_text(prepared, monkeypatch):
    at = app(prepared.workspace, monkeypatch, "completions", set=prepared.set_name, prompt=prepared.script_id)
    clean(at)
    df = at.dataframe[0].value
    comps = Store(prepared.workspace).completions(prepared.set_name)
    assert sorted(df["prompt"]) == sorted(c["prompt_id"] for c in comps)
    assert dict(zip(df["prompt"], df["completion_tokens"])) == {c["prompt_id"]: len(c["output_ids"]) for c in comps}
    body = " ".join(htmls(at))
    assert "&lt;script&gt;window.__pwned" in body and "<script" not in body
    assert by_label(at.button, "Fetch")


def test_fetch_with_an_empty_set_name_is_refused_in_the_page(prepared, workspace_copy, monkeypatch):
    """An empty set name fell back to the prompt set's name, silently reused that set and fetched 0."""
    at = app(workspace_copy, monkeypatch, "completions")
    assert by_label(at.text_input, "completion set name").value == ""
    by_label(at.button, "Fetch").click().run()
    assert not at.exception
    assert [e.value for e in at.error if e.value.startswith("completion set name is empty: give the new set a name")]
    assert Store(workspace_copy).jobs() == []


def test_reextract_button_adds_an_extraction(prepared, workspace_copy, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # this machine's defaults: cpu, float32 (a duplicate)
    at = app(workspace_copy, monkeypatch, "extraction")
    clean(at)
    buttons = [b for b in at.button if b.label == "Re-extract"]
    assert len(buttons) == 1
    assert "extract (the server is not touched)" in at.main.text[0].value
    buttons[0].click().run()
    at.checkbox(key=f"rx_{prepared.extraction}_again").check().run()  # the same as the one there: confirm
    at.button(key=f"rx_{prepared.extraction}_go").click().run()
    clean(at)
    job = wait_job(workspace_copy, "extract")
    assert job["status"] == "done", job
    old = Store(prepared.workspace).extraction(prepared.extraction)
    assert job["args"]["layers"] == old["layer_ids"] and job["args"]["target"] == old["target_path"]
    exs = Store(workspace_copy).extractions()
    assert len(exs) == 2 and exs[-1]["id"] == job["result"]["extraction"] and exs[-1]["status"] == "done"
    at.run()
    assert len([b for b in at.button if b.label == "Re-extract"]) == 2
    assert set(at.dataframe[0].value["id"]) == {e["id"] for e in exs}


def test_orchestration_shows_commands_from_config(prepared, workspace_copy, monkeypatch):
    (workspace_copy / "config.toml").write_text(
        '[server]\nurl = "http://127.0.0.1:9"\nstop_command = ["systemctl", "--user", "stop", "sglang"]\n'
        'start_command = "systemctl --user start sglang"\n'
    )
    at = app(workspace_copy, monkeypatch, "extraction")
    at.radio(key="orch").set_value("command").run()
    clean(at)
    plan = at.main.text[0].value
    assert "stop: systemctl --user stop sglang" in plan and "start: systemctl --user start sglang" in plan
    assert plan.index("stop:") < plan.index("extract") < plan.index("start:")
    at.radio(key="orch").set_value("release").run()
    assert "POST http://127.0.0.1:9/release_memory_occupation" in at.main.text[0].value


def test_diagnostics_parity_consistency_and_errors(prepared, workspace_copy, monkeypatch):
    st = Store(workspace_copy)
    ex = st.extraction(prepared.extraction)
    again = pipeline.extract(
        st,
        ops.Extract(
            target=ex["target_path"], completions=ex["set_name"], layers=ex["layer_ids"], device="cpu", dtype="float32"
        ),
    )
    at = app(workspace_copy, monkeypatch, "diagnostics", a=again, b=ex["id"])  # a link's a, b: the parity check
    clean(at)
    assert at.query_params["section"] == "parity"
    # computed by a job (torch stays out of the page's process), drawn from its result once done
    assert not [d for d in at.dataframe if "relative L2" in d.value.columns]
    by_label(at.button, "Compare features").click().run()
    clean(at)
    job = wait_job(workspace_copy, "parity")
    assert job["status"] == "done", job
    assert (job["args"]["a"], job["args"]["b"]) == (again, ex["id"])
    at.run()
    clean(at)
    assert not [b for b in at.button if b.label == "Compare features"]  # kept: no second job for the same pair
    df = at.dataframe[0].value
    assert list(df["layer"]) == ex["layer_ids"]
    assert all(abs(v) < 1e-6 for v in df["relative L2"]) and all(abs(v - 1) < 1e-6 for v in df["cosine"])
    at.get("segmented_control")[0].set_value("consistency").run()  # one check at a time, drawn when chosen
    clean(at)
    assert at.query_params["section"] == "consistency" and "relative L2" not in at.dataframe[0].value.columns
    cons = at.dataframe[0].value
    assert "target layer ids" in list(cons["check"])
    # the consistency check defaults to the extraction the runs were made on, not the newest one (no runs)
    assert at.selectbox(key="diag_ex").value == ex["id"] != again
    assert any(re.fullmatch(r"1 of \d+ checks fail", w.value) for w in at.warning)  # only the torch backend
    by_label(at.text_input, "drafter checkpoint folder").input(str(workspace_copy / "nope")).run()
    assert not at.exception
    assert any("no such checkpoint folder" in e.value for e in at.error)


def test_defaults_skip_a_newer_extraction_without_runs(prepared, workspace_copy, monkeypatch):
    """After a Re-extract (a newer extraction, no runs yet) the sweep chart said "No run ... yet" while the
    folder's runs existed, and Diagnostics' parity opened with tau None on A. Both open where the runs are."""
    st = Store(workspace_copy)
    ex = st.extraction(prepared.extraction)
    again = pipeline.extract(
        st,
        ops.Extract(
            target=ex["target_path"], completions=ex["set_name"], layers=ex["layer_ids"], device="cpu", dtype="float32"
        ),
    )
    assert st.extractions()[-1]["id"] == again
    at = app(workspace_copy, monkeypatch, "compare", sweep=str(prepared.train))
    clean(at)
    assert at.selectbox(key="sweep_ex").value == prepared.extraction
    assert not [i.value for i in at.info if "No run of a checkpoint" in i.value]
    assert len([m.value for m in at.markdown if "open in Acceptance" in m.value]) == 2
    at = app(workspace_copy, monkeypatch, "diagnostics", section="parity")
    clean(at)
    assert at.selectbox(key="par_a").value == prepared.extraction and at.selectbox(key="par_b").value == again
    taus = at.dataframe[0].value  # the tau table (the parity's numbers wait for its job)
    assert taus.columns[1].startswith("tau macro on A") and taus.iloc[:, 1].notna().all()


def test_sweep_form_refuses_a_folder_without_checkpoints_before_any_job(prepared, workspace_copy, monkeypatch):
    """A mistyped folder is named in the page at once, not by a job failing seconds later."""
    typo = str(prepared.train) + "x"
    at = app(workspace_copy, monkeypatch, "compare", sweep=typo)
    by_label(at.button, "Start sweep").click().run()
    assert not at.exception
    errs = [e.value for e in at.error]  # in the form's words (its field's label), never the CLI flag
    assert [e for e in errs if e.startswith(f"Training output folder {typo!r}: no such folder")], errs
    assert Store(workspace_copy).jobs() == []


def test_sweep_button_replays_the_folder_and_plots_it(prepared, workspace_copy, tmp_path, monkeypatch):
    import shutil

    from tools import tiny

    train = tmp_path / "train"
    shutil.copytree(prepared.train, train)
    tiny.write_drafter(train / "epoch_2_step_300", tiny.TinyDrafter(seed=4))
    at = app(workspace_copy, monkeypatch, "compare", sweep=str(train))
    clean(at)
    assert any("No run of a checkpoint inside this folder" in i.value for i in at.info)
    by_label(at.button, "Start sweep").click().run()
    job = wait_job(workspace_copy, "sweep")
    assert job["status"] == "done", job
    assert job["args"] == ops.Sweep(checkpoints=str(train), extraction=prepared.extraction).to_args()
    at.run()
    clean(at)
    links = [m.value for m in at.markdown if "open in Acceptance" in m.value]
    assert [re.search(r"step (\d+)", m).group(1) for m in links] == ["100", "200", "300"]
    assert all(f"acceptance?run={r}" in " ".join(links) for r in job["result"]["runs"])


def test_running_job_shows_progress_and_can_be_cancelled(workspace_copy, monkeypatch):
    from serving import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: the fetch waits for readiness
    (workspace_copy / "config.toml").write_text(f'[server]\nurl = "{dead}"\nreadiness_timeout = 300\n')
    at = app(workspace_copy, monkeypatch, "completions")
    by_label(at.text_input, "completion set name").input("never")
    by_label(at.button, "Fetch").click().run()
    clean(at)
    st = Store(workspace_copy)
    job = next(j for j in st.jobs() if j["kind"] == "fetch")
    assert job["args"]["server"] == dead and job["args"]["name"] == "never"
    deadline = time.monotonic() + 60
    while Store(workspace_copy).job(job["id"])["status"] != "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    at.run()
    assert any(job["id"] in m.value and "running" in m.value for m in at.markdown)
    assert len(at.get("progress")) >= 1
    cancel = [b for b in at.button if b.label == "Cancel"]
    assert len(cancel) == 1
    cancel[0].click().run()
    clean(at)
    assert st.job(job["id"])["status"] == "cancelled"
    assert any(b.label == "Rerun" for b in at.button)


# ---------------------------------------------------------------------------
# a real server's slow /health, and its speculative counters


def test_slow_health_shows_ready_not_not_ready(tmp_path, monkeypatch):
    """A real /health generates a token and takes seconds: the sidebar and Diagnostics say "checking…" (never
    "not ready") until the background poller's answer, then "ready"; no page run waits for it."""
    from serving import Served, tiny_model

    from pages import server_view

    srv = Served(tiny_model(tmp_path / "model"), tmp_path / "server.log", extra=["--health-delay", "1.5"])
    try:
        srv.wait()
        ws = tmp_path / "ws"
        ws.mkdir()
        (ws / "config.toml").write_text(f'[server]\nurl = "{srv.url}"\n')
        at = app(ws, monkeypatch)
        clean(at)
        first = sidebar_server(at)
        assert "not ready" not in first and ("checking" in first or "ready" in first), first
        assert server_view.health_poller(srv.url, "SGLANG_API_KEY").wait(30)
        at.run()
        assert "ready" in sidebar_server(at) and "not ready" not in sidebar_server(at)
        at.switch_page("pages/diagnostics.py")
        at.query_params["section"] = "server"  # one check at a time, drawn when chosen
        at.run()
        clean(at)
        assert any(s.value.startswith("GET /health: ready") for s in at.success), [s.value for s in at.success]
        assert not any("not ready" in w.value for w in at.warning)
    finally:
        srv.stop()


def test_completions_page_shows_server_counters(tmp_path, monkeypatch):
    st_ = Store(tmp_path / "ws")
    st_.add_set("spec", "test")
    st_.add_completion(
        "spec",
        {
            "id": "p0",
            "idx": 0,
            "prompt_ids": [1, 2],
            "output_ids": list(range(12)),
            "finish_reason": "length",
            "model_path": "/m",
            "meta_info": {
                "completion_tokens": 12,
                "spec_verify_ct": 4,
                "spec_accept_length": 3.0,
                "spec_accept_histogram": [1, 0, 3],
            },
        },
    )
    at = app(tmp_path / "ws", monkeypatch, "completions")
    clean(at)
    df = at.dataframe[0].value
    assert list(df["spec_verify_ct"]) == [4] and list(df["spec_accept_histogram"]) == ["0:1 2:3"]
    assert list(df["server_tau"]) == [3.0]
    assert any("completion_tokens / spec_verify_ct" in c.value for c in at.caption)
