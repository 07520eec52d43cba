"""Shared test fixtures: a prepared dashboard workspace built with the CLI on tiny seeded models, and a planted
workspace of a healthy and an anchor-visible-bug run (`bug_pair`).

`prepared` (session): a tiny hybrid target with a tokenizer, two drafter checkpoints (different seeds) in a
SpecForge-style training folder, three imported completions (one whose output holds `<script>` and HTML,
with token ids from the tokenizer's encoding of that text; one built from drafter A's own drafts so that
acceptance is partly high), a CPU extraction and a replay of each checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from prepared import CODE_TEXT, SCRIPT_TEXT, Prepared, drafted
from serving import ROOT
from web import SCREENSHOTS


def _cli(ws: Path, *args: str) -> None:
    from dflash_dash import cli

    rc = cli.main(["--workspace", str(ws), *args])
    assert rc == 0, f"cli {args} exited {rc}"


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> Prepared:
    from transformers import AutoTokenizer

    from dflash_dash.store import Store
    from tools import tiny

    base = tmp_path_factory.mktemp("dash")
    models = base / "models"
    target = tiny.write_target(models / "target", tiny.TinyTarget())
    tiny.write_tokenizer(target, vocab_size=512)
    train = models / "train"
    da = tiny.write_drafter(train / "epoch_0_step_100", tiny.TinyDrafter(seed=1))
    db = tiny.write_drafter(train / "epoch_1_step_200", tiny.TinyDrafter(seed=2, rope_theta=20000.0))
    tok = AutoTokenizer.from_pretrained(target)

    def enc(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False)

    recs = [
        {"id": "html-script", "prompt": "Write a web page.", "output": SCRIPT_TEXT},
        {"id": "code-add", "prompt": "Write an add function.", "output": CODE_TEXT},
        {"id": "drafted", "prompt": "Continue the sequence.", "output": None},
    ]
    for r in recs:
        r["prompt_ids"] = enc(r["prompt"])
        r["output_ids"] = enc(r["output"]) if r["output"] else drafted(target, da, r["prompt_ids"], 48, seed=7)
        if r["output"] is None:
            r["output"] = tok.decode(r["output_ids"])
    assert tok.decode(recs[0]["output_ids"]) == SCRIPT_TEXT
    jsonl = base / "completions.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in recs))

    ws = base / "workspace"
    _cli(ws, "import-completions", str(jsonl), "--name", "tiny3")
    _cli(ws, "extract", "--target", str(target), "--completions", "tiny3", "--drafter", str(da))
    store = Store(ws)
    ex = store.extractions()[-1]["id"]
    _cli(ws, "replay", "--drafter", str(da), "--extraction", ex)
    _cli(ws, "replay", "--drafter", str(db), "--extraction", ex)
    runs = [r["id"] for r in store.runs()]
    assert len(runs) == 2
    return Prepared(ws, models, target, train, [da, db], ex, runs, "tiny3", "html-script")


@pytest.fixture(scope="session")
def demo_workspace(tmp_path_factory) -> Path:
    """The demo workspace built once per session from the committed assets by the real CLI (`demo`, as `make run`
    does; a few minutes on 2 cores). Read-only: copy it (`shutil.copytree(..., ignore=*.lock)`) to write. The
    build's stdout and stderr are kept beside it (`build.stdout`, `build.stderr` in its parent folder)."""
    import subprocess
    import sys

    from dflash_dash import demo

    if not (demo.ASSETS / "MANIFEST.json").is_file():
        pytest.skip("demo assets are not in this checkout")
    ws = tmp_path_factory.mktemp("demo") / "ws"
    p = subprocess.run(
        [sys.executable, "-m", "dflash_dash", "--workspace", str(ws), "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    (ws.parent / "build.stdout").write_text(p.stdout)
    (ws.parent / "build.stderr").write_text(p.stderr)
    return ws


@pytest.fixture(scope="session")
def bug_pair(tmp_path_factory) -> dict:
    """A planted workspace (tools/planted.py: no replay) of 16 completions and two runs of one extraction: a healthy
    drafter ("step_100") and one drafting 60 % of its anchors one position behind and sure of it, as the
    anchor-visible bug does ("step_200"). Read-only. {"ws", "healthy", "buggy"}: run ids."""
    from dflash_dash.store import Store
    from tools import planted

    ws = planted.build(tmp_path_factory.mktemp("bug-pair"), 16, 96, 2, block_size=8, budget=0, lags=(0.0, 0.6))
    runs = {Path(r["checkpoint"]).name: r["id"] for r in Store(ws).runs()}
    return {"ws": ws, "healthy": runs["step_100"], "buggy": runs["step_200"]}


@pytest.fixture
def workspace_copy(prepared, tmp_path) -> Path:
    """A private copy of the prepared workspace, for tests that write to it."""
    dst = tmp_path / "ws"
    shutil.copytree(prepared.workspace, dst, ignore=shutil.ignore_patterns("*.lock"))
    return dst


_STARTED = [0.0]
_BROWSER_SKIPS: list[str] = []  # browser tests skipped because Chromium is missing
INSTALL_CHROMIUM = "apt-get install -y chromium"


def pytest_runtest_logreport(report):
    if report.skipped and "chromium" in str(report.longrepr).lower():
        _BROWSER_SKIPS.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    """Under CI=true a skipped browser test fails the run: the browser tests are part of the suite."""
    import os

    if _BROWSER_SKIPS and os.environ.get("CI", "").lower() == "true" and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_sessionstart(session):
    import time

    _STARTED[0] = time.time()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print where this run's browser screenshots are (the e2e tests write them); say loudly when the browser
    tests were skipped."""
    if _BROWSER_SKIPS:
        terminalreporter.write_sep(
            "!", f"{len(_BROWSER_SKIPS)} BROWSER TESTS SKIPPED: Debian chromium is missing", red=True, bold=True
        )
        terminalreporter.write_line(f"install it with: {INSTALL_CHROMIUM}   (under CI=true this run fails)")
    if SCREENSHOTS.is_dir() and any(f.stat().st_mtime >= _STARTED[0] for f in SCREENSHOTS.glob("*.png")):
        terminalreporter.write_sep("-", "dashboard screenshots")
        terminalreporter.write_line(f"screenshots of each page: {SCREENSHOTS}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item (`item.rep_call.failed`), e.g. for a screenshot on failure."""
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture(scope="session")
def spec_servers(tmp_path_factory):
    """The demo target served with speculative decoding: {"good", "bad", "base"}, a correct stand-in and one with
    --speculative-bug truncate-context (tests/speculative.py). Shared by the speculative decoding, conformance and
    conformance browser tests, so the servers start once per session."""
    from speculative import spec_servers as start

    with start(tmp_path_factory.mktemp("spec-servers")) as servers:
        yield servers


@pytest.fixture(scope="session")
def spec_workspace(spec_servers, tmp_path_factory) -> dict:
    """A conformance workspace fetched from `spec_servers`, extracted and replayed (tests/speculative.py).
    Read-only: copy it with `speculative.private_copy` to write."""
    from speculative import spec_workspace as build

    return build(spec_servers, tmp_path_factory.mktemp("spec-ws") / "ws")
