"""The demo workspace, built from the committed assets in a temporary folder through the real CLI.

Checks what the demo promises, from `export` / `runs` / `signatures` and the store: the final checkpoint drafts
well (tau >= 3, macro and pooled, on coding-10), every bug checkpoint and the early one stay below it, each bug
run's signatures name its bug against the final checkpoint (and name none for the healthy run's own snapshots),
the shortcut's drafts lag one position, the completions are on-task code that repeats no line, the parity
diagnostic measures a non-zero fla vs torch difference, and a second `demo` call does nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_dash import demo, parity
from dflash_dash.store import Store

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    not (demo.ASSETS / "MANIFEST.json").is_file(), reason="demo assets are not in this checkout"
)


def cli(ws: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dflash_dash", "--workspace", str(ws), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def ws(demo_workspace) -> Path:
    return demo_workspace  # built once per session (tests/conftest.py)


def runs(ws: Path) -> dict[str, dict]:
    p = cli(ws, "runs")
    assert p.returncode == 0, p.stderr
    return {r["name"]: r for r in json.loads(p.stdout)}


def export(ws: Path, run_id: str) -> dict:
    p = cli(ws, "export", "--run", run_id)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


CKS = demo.checkpoints(demo.ASSETS / demo.CHECKPOINTS)  # as MANIFEST.json lists them
RUNS = len(CKS) + 3  # every checkpoint on the torch extraction, the final one on the fla extraction too, the baseline
# and the final one at a temperature on the sampled set
LINEAGE = [c for c in CKS if c.role != "family"]  # the healthy run's snapshots and the bug runs (one recipe)


def by_prefix(rs: dict[str, dict], prefix: str, fla: bool = False) -> dict:
    """The run of the demo checkpoint with this role ("early", "final") or bug ("anchor_visible")."""
    (ck,) = [c for c in CKS if prefix in (c.role, c.bug)]
    return rs[ck.name + (demo.FLA_SUFFIX if fla else "")]


def test_runs_and_tau(ws):
    rs = runs(ws)
    base = [n for n, r in rs.items() if r["checkpoint"].startswith("baseline:")]
    hot = [demo.final(CKS).name + demo.extras.SAMPLED_SUFFIX]
    assert sorted(rs) == sorted([c.name for c in CKS] + [demo.final(CKS).name + demo.FLA_SUFFIX] + base + hot)
    assert len(base) == 1
    early, final, buggy = (export(ws, by_prefix(rs, p)["id"]) for p in ("early", "final", "anchor_visible"))
    fla = export(ws, by_prefix(rs, "final", fla=True)["id"])
    for e in (early, final, buggy, fla):
        assert len(e["prompts"]) >= 1 and e["summary"]["block_size"] == 16
    assert len(final["prompts"]) == 10
    tau = {
        k: e["summary"]["tau_macro"] for k, e in {"early": early, "final": final, "buggy": buggy, "fla": fla}.items()
    }
    ci = {k: e["summary"]["tau_macro_ci"] for k, e in {"early": early, "final": final, "buggy": buggy}.items()}
    assert tau["final"] >= 3 and final["summary"]["tau_pooled"] >= 3, tau  # a drafter that drafts well
    assert tau["early"] < tau["final"] and tau["buggy"] < tau["final"], tau
    for c in LINEAGE:  # the healthy run's snapshots reach the final's tau at most; every bug stays below it
        t = rs[c.name]["summary"]["tau_macro"]
        assert t < tau["final"] if c.role == "bug" else t <= tau["final"] + 1e-9, c
    assert ci["final"][0] > max(ci["early"][1], ci["buggy"][1]), ci  # clearly above: the intervals apart
    # same model, other kernels: the features differ by a relative L2 of about 1e-3, enough to flip a draft at a
    # near-tie now and then
    assert tau["fla"] == pytest.approx(tau["final"], rel=0.02), tau
    # every run's rounds and tau are what the chain walk over its accepted_at gives (walked here, by hand)
    comps = {c["prompt_id"]: c for c in Store(ws).completions(demo.SET_NAME)}
    for e in (early, final, buggy, fla):
        for p in e["prompts"]:
            c = comps[p["id"]]
            P, T = len(c["prompt_ids"]), len(c["prompt_ids"]) + len(c["output_ids"])
            assert p["prompt_len"] == P and len(p["accepted_at"]) == T - P, p["id"]
            rounds = chain_rounds(p["accepted_at"], P, T)
            assert sum(rounds) == T - 1 - P  # every completion token committed once
            assert p["rounds"] == rounds, p["id"]
            assert p["tau"] == sum(rounds) / len(rounds), p["id"]
        assert e["summary"]["tau_macro"] == pytest.approx(
            sum(p["tau"] for p in e["prompts"]) / len(e["prompts"]), rel=1e-12
        )


def chain_rounds(accepted_at: list[int], P: int, T: int) -> list[int]:
    """Tokens committed per round of the chain walk, written out here independently of walks.chain_walk:
    a round at anchor p commits its accepted drafts plus the target's bonus token, cut at the completion's end,
    and the next round starts after them."""
    out, anchor = [], P
    while anchor < T - 1:
        committed = min(accepted_at[anchor - P] + 1, T - 1 - anchor)
        out.append(committed)
        anchor += committed
    return out


def test_each_bug_run_is_named_by_its_signatures(ws):
    """Against the final checkpoint, each bug run's separating signatures point to its own bug and no
    other, and the healthy run's earlier snapshots point to none (what they show, less training explains)."""
    from dflash_dash.analysis import signatures as sig

    named = {"anchor_visible": sig.SHORTCUT, "noisy_labels": sig.NOISY, "soft_kl": sig.SOFT}
    rs, fin = runs(ws), demo.final(CKS)
    for c in (c for c in LINEAGE if c is not fin):
        p = cli(ws, "signatures", "--run", rs[c.name]["id"], "--reference", rs[fin.name]["id"])
        assert p.returncode == 0, p.stderr
        got = json.loads(p.stdout)
        assert list(got["points_to"]) == ([named[c.bug]] if c.role == "bug" else []), (c.name, got["points_to"])


def test_completions_repeat_no_line(ws):
    """The target's coding-10 completions read as code, not loops: under 5 % of their non-blank lines repeat an
    earlier line of the same completion."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ws / "demo" / "target"))
    lines = repeats = 0
    for c in Store(ws).completions(demo.SET_NAME):
        seen: set[str] = set()
        for line in tok.decode(c["output_ids"]).splitlines():
            if line.strip():
                lines, repeats = lines + 1, repeats + (line in seen)
                seen.add(line)
    assert lines >= 50 and repeats / lines < 0.05, (repeats, lines)


def test_buggy_signature_in_depth_curves(ws):
    rs = runs(ws)
    final = export(ws, by_prefix(rs, "final")["id"])["summary"]
    buggy = export(ws, by_prefix(rs, "anchor_visible")["id"])["summary"]
    # the anchor-visible bug: trained with the anchor's own hidden state in view, at inference (context
    # strictly before the anchor) its drafts lag one position, so acceptance collapses from depth 1 on
    assert buggy["depth_conditional"][0] < 0.5 * final["depth_conditional"][0], (buggy, final)
    assert buggy["depth_marginal"][1] < 0.5 * final["depth_marginal"][1]
    assert buggy["tau_pooled"] < final["tau_pooled"] and buggy["ddtree_tau"] < final["ddtree_tau"]


LAG_SLOTS = (1, 3)  # the slots where the demo drafters are good enough for the lag to show (final: 20 % right)


def lag(ws: Path, run_id: str, slots: tuple[int, int] = LAG_SLOTS) -> tuple[float, float]:
    """Over every anchor and slots lo..hi where tokens p+i and p+i-1 differ: how often draft d_i equals token
    p+i (right) and token p+i-1 (one position behind)."""
    store = Store(ws)
    comps = {c["prompt_id"]: c for c in store.completions(demo.SET_NAME)}
    right = behind = n = 0
    for p in store.run_prompts(run_id):
        c = comps[p["prompt_id"]]
        tok, P = c["prompt_ids"] + c["output_ids"], len(c["prompt_ids"])
        d = [p["drafts"][k : k + 15] for k in range(0, len(p["drafts"]), 15)]
        for a, row in enumerate(d):
            for i in range(slots[0], slots[1] + 1):
                if P + a + i < len(tok) and tok[P + a + i] != tok[P + a + i - 1]:
                    n += 1
                    right += row[i - 1] == tok[P + a + i]
                    behind += row[i - 1] == tok[P + a + i - 1]
    return right / n, behind / n


def test_buggy_drafts_lag_one_position(ws):
    rs = runs(ws)
    f_right, f_behind = lag(ws, by_prefix(rs, "final")["id"])
    b_right, b_behind = lag(ws, by_prefix(rs, "anchor_visible")["id"])
    assert f_right > 2 * f_behind  # the good drafter drafts the right positions
    assert b_behind > 2 * b_right  # the buggy one drafts the token one position behind


def test_compare_lag_rate_flags_the_buggy_checkpoint(ws):
    """Compare's per-slot lag rate (metrics.lag_rate, via analysis lag_rows) is higher for the buggy checkpoint at
    slots 1..6 (further on both drafters are weak and the rates are noise), and pooled over LAG_SLOTS it is what
    `lag` above counts."""
    from dflash_dash import pipeline
    from dflash_dash.analysis.compare import lag_rows

    rs, store = runs(ws), Store(ws)
    final, buggy = by_prefix(rs, "final")["id"], by_prefix(rs, "anchor_visible")["id"]
    rows = lag_rows(*(pipeline.analysis(store, x, "lag") for x in (final, buggy)), 16, 16)
    assert all(r["lag B"] > r["lag A"] for r in rows if r["slot k"] <= 6), rows
    for side, run in (("A", final), ("B", buggy)):
        sel = [r for r in rows if LAG_SLOTS[0] <= r["slot k"] <= LAG_SLOTS[1]]
        pooled = sum(r[f"lag {side}"] * r[f"anchors {side}"] for r in sel) / sum(r[f"anchors {side}"] for r in sel)
        assert pooled == pytest.approx(lag(ws, run)[1], abs=1e-3)


def test_parity_fla_vs_torch_measured_nonzero(ws):
    store = Store(ws)
    exs = {e["backend"]: e for e in store.extractions()}
    assert set(exs) == {"torch", "fla"}
    assert exs["fla"]["device"].startswith("cuda") and exs["torch"]["device"] == "cpu"
    res = parity.compare(store, exs["torch"]["id"], exs["fla"]["id"])
    assert res["prompts"] >= 1
    rel = [layer["rel_l2"] for layer in res["layers"]]
    assert all(r > 0 for r in rel), rel  # measured, non-zero ...
    assert all(r < 0.1 for r in rel), rel  # ... and small: same model, other kernels
    assert all(layer["cosine"] > 0.99 for layer in res["layers"])


def test_demo_is_idempotent(ws):
    before = (len(Store(ws).runs()), len(Store(ws).extractions()), len(Store(ws).completions(demo.SET_NAME)))
    p = cli(ws, "demo", timeout=120)
    assert p.returncode == 0, p.stderr
    assert "already built" in p.stderr
    after = (len(Store(ws).runs()), len(Store(ws).extractions()), len(Store(ws).completions(demo.SET_NAME)))
    assert before == after == (RUNS, 3, 10)  # extractions: the torch and fla ones, the sampled set's
    assert demo.built(ws)


def test_the_build_says_one_line(ws):
    """The session's build (`demo`, as `make run` runs it) prints one line and no library warning in its progress."""
    record = ws.resolve() / "demo" / "BUILD.json"
    out, err = (ws.parent / "build.stdout").read_text(), (ws.parent / "build.stderr").read_text()
    assert out.splitlines() == [f"demo workspace ready: {ws.resolve()} ({RUNS} runs; the build's record: {record})"]
    assert "Warning" not in err, err
    assert record.is_file()


def test_demo_leaves_a_later_extraction_alone(ws, tmp_path):
    """After one Re-extract (a newer extraction of the demo set, same target, layers and backend), the next
    `make run` (`demo`) took it for the demo's and replayed every demo checkpoint onto it. A built demo workspace is
    left as it is. On a copy of the session's built workspace (store, features, run arrays; the session's is
    read-only) whose `demo/` folder links to the session's: the store names the session's demo files by their
    resolved paths, and the link keeps them the copy's own, as they are in the workspace that built them."""
    mine = tmp_path / "ws"
    shutil.copytree(ws, mine, ignore=shutil.ignore_patterns("*.lock", "demo"))
    (mine / "demo").symlink_to(ws.resolve() / "demo", target_is_directory=True)
    assert demo.built(mine)
    target = str((mine / "demo" / demo.TARGET).resolve())
    p = cli(mine, "extract", "--target", target, "--completions", demo.SET_NAME, "--layers", "1,3,5", "--device", "cpu")
    assert p.returncode == 0, p.stderr
    newer = p.stdout.strip().splitlines()[-1]
    before = {(r["id"], r["extraction_id"]) for r in Store(mine).runs()}
    assert newer in {e["id"] for e in Store(mine).extractions()} and newer not in {x for _, x in before}
    assert demo.built(mine)
    p = cli(mine, "demo", timeout=300)
    assert p.returncode == 0, p.stderr
    assert "already built" in p.stderr
    assert {(r["id"], r["extraction_id"]) for r in Store(mine).runs()} == before
    assert len(Store(ws).extractions()) == len(Store(mine).extractions()) - 1  # the session's store untouched


def test_config_points_at_the_demo_server(ws, tmp_path):
    from dflash_dash import config

    assert config.load(ws).server_url == demo.SERVER_URL and config.load(ws).memory_release
    mine = tmp_path / "config.toml"
    mine.write_text('[server]\nurl = "http://10.0.0.7:30000"\n')
    assert demo.configure(tmp_path) is None  # a user's config.toml is never overwritten
    assert config.load(tmp_path).server_url == "http://10.0.0.7:30000"


def test_completions_match_the_shipped_ids(ws):
    build = json.loads((ws / "demo" / "BUILD.json").read_text())
    shipped = [json.loads(line) for line in (demo.ASSETS / demo.FLA / "completions.jsonl").read_text().splitlines()]
    rows = {r["prompt_id"]: r for r in Store(ws).completions(demo.SET_NAME)}
    differ = sorted(c["id"] for c in shipped if rows[c["id"]]["output_ids"] != c["output_ids"])
    assert differ == sorted(build["mismatched_completions"])
    items = {r["prompt_id"] for r in Store(ws).items(build["fla_extraction"])}
    assert items == {c["id"] for c in shipped} - set(differ)


def test_the_demo_server_decoded_speculatively_with_the_final_checkpoint(ws):
    """The demo's fetch is served with the final checkpoint (speculative greedy decoding): its counters,
    with per-step lengths, are the Conformance page's engine statistics, and a correct engine on the replay's own
    numerics (CPU, fp32, the torch extraction) commits in every verify step exactly the replay's round: no prompt
    flagged. The completions stay the plain greedy ones (test_completions_match_the_shipped_ids)."""
    from speculative import conformance_json

    store = Store(ws)
    assert "sglang" in store.engines(demo.SET_NAME)  # beside it the faulty engine (tests/test_demo_extras.py)
    comps = {c["prompt_id"]: c for c in store.completions(demo.SET_NAME)}
    stats = {s["prompt_id"]: s for s in store.engine_stats(demo.SET_NAME, "sglang")}
    assert set(stats) == set(comps)
    for pid, s in stats.items():
        assert s["completion_tokens"] == len(comps[pid]["output_ids"]) and s["accept_lengths"], s
    final = by_prefix(runs(ws), "final")["id"]
    got = conformance_json(ws, "--run", final, "--engine", "sglang")
    assert not [p for p in got["prompts"] if p["flagged"]], got
    assert got["steps"]["prompts"] == len(comps), got["steps"]
    assert got["verdict"] == "conforms", got["why"]  # the stand-in says what it served: the replayed drafter


def test_overview_tells_the_demo_story_with_links(ws, monkeypatch):
    """The demo's Overview says in three sentences what the checkpoints are, from MANIFEST.json's `what`
    fields, each linking the view that reveals it: Acceptance for the final (its run on the fla extraction, what
    serving sees), the sweep chart of the healthy run's folder, Diagnostics' signatures for each bug against the final
    checkpoint on the bug's extraction."""
    from html import escape
    from urllib.parse import quote

    from apptest import app, clean, htmls

    rs, fin = runs(ws), demo.final(CKS)
    at = app(ws, monkeypatch)
    clean(at)
    (story,) = [h for h in htmls(at) if "demo-story" in h]
    assert story.count("<li>") == 3 + 3  # healthy run, final, bugs; other families, two engines, baseline
    for c in CKS:  # the series' middle snapshots are counted in the healthy run's sentence, not described
        if c.role != "series":
            assert escape(c.what.rstrip(".")) in story, c.what
    assert f'href="acceptance?run={rs[fin.name + demo.FLA_SUFFIX]["id"]}"' in story
    assert f'href="compare?sweep={quote(demo.series_folder(ws), safe="")}"' in story
    for c in (c for c in CKS if c.role == "bug"):
        assert f'href="diagnostics?sig_run={rs[c.name]["id"]}&amp;sig_ref={rs[fin.name]["id"]}"' in story


def test_acceptance_opens_on_the_final_checkpoint_on_the_fla_extraction(ws, monkeypatch):
    """The default run on Acceptance is the healthiest checkpoint on the extraction that matches serving
    (the fla extraction, from the GPU), not the newest run; a caption says why."""
    from apptest import app, clean

    at = app(ws, monkeypatch, "acceptance")
    clean(at)
    assert at.query_params["run"] == by_prefix(runs(ws), "final", fla=True)["id"]
    assert any("matches serving" in c.value for c in at.caption)


def test_sweep_chart_defaults_to_the_healthy_run(ws):
    """The sweep chart of a demo workspace opens on the healthy run's folder and on the extraction holding its
    whole curve (not the fla extraction, where only the final checkpoint was replayed): one point per step, the bug
    checkpoints left out."""
    from dflash_dash.analysis.compare import sweep_extraction, sweep_points

    store = Store(ws)
    folder, rs = demo.series_folder(ws), store.runs()
    ex = sweep_extraction(rs, folder, [e["id"] for e in store.extractions()])
    assert store.extraction(ex)["backend"] == "torch"
    healthy = [c.name for c in CKS if c.role in ("early", "series", "final")]
    assert [p["name"] for p in sweep_points(rs, folder, ex)] == healthy
