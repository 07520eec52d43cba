"""Test helpers (not tests): the stand-in serving the demo target with speculative decoding, and a conformance
workspace fetched from it. The session fixtures `spec_servers` and `spec_workspace` (tests/conftest.py) build these
once for test_specdec.py, test_conformance.py, test_engine_faults.py and browser/test_conformance_page.py.

Models: the committed demo assets, a trained qwen3_5_text target and its noisy-labels DFlash checkpoint (fp32 on CPU).

Contract: `spec_servers(base)` yields {"good", "bad", "base"}: a correct speculative server and one started with
--speculative-bug truncate-context (the drafter sees only the last 4 context positions), both `Served`.
`spec_workspace(servers, ws)` fetches IDS (N new tokens each) from both into set c4 (correct) and c4-bug (broken),
extracts and replays c4 with the drafter, and imports the broken server's counters for c4 as engine "bug"; it
returns {"ws", "store", "run", "extraction", "prompts"}. Read-only: copy it with `private_copy` to write.
`plant(store, bug, engine, ids)` decodes prompts of c4 in-process under a planted engine fault and stores its
per-step counters as `engine` (for the fault ranking's tests).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

from serving import ROOT, Served

from dflash_dash import demo

DEMO = ROOT / "dflash_dash" / "demo" / "assets"
FINAL = demo.final(demo.checkpoints(DEMO / demo.CHECKPOINTS)).path  # the demo's healthy final drafter
TARGET = DEMO / "target"
# the healthy run's last snapshot before the final (MANIFEST.json): a trained drafter that still misses often (about
# half the final's tau), so engine faults move accepted steps and the prompts span lower and higher acceptance
DRAFT = [c for c in demo.checkpoints(DEMO / demo.CHECKPOINTS) if c.role == "series"][-1].path
IDS = ["json_parser", "merge_sort", "graph_bfs", "matrix_multiply"]
N = 40  # new tokens per prompt


def run_cli(*args: str) -> tuple[int, str, str]:
    """`dflash-dash ARGS` in-process: (exit code, stdout, stderr)."""
    from dflash_dash import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(list(args))
    return rc, out.getvalue(), err.getvalue()


def conformance_json(ws: Path, *extra: str) -> dict:
    """`dflash-dash conformance` on `ws` with `extra` options, its JSON output parsed (exit code 0 asserted)."""
    rc, out, err = run_cli("--workspace", str(ws), "conformance", *extra)
    assert rc == 0, err
    return json.loads(out)


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """One torch thread in this process, as the servers run (serving.ENV): the 2 shared cores are oversubscribed,
    and torch's own thread pool would then slow everything down."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@contextlib.contextmanager
def spec_servers(base: Path) -> Iterator[dict]:
    """A correct speculative stand-in and a broken one on the demo target, started together and waited for
    together; both stopped on exit."""
    good = Served(TARGET, base / "good.log", extra=["--speculative-draft", str(DRAFT)])
    bad = Served(
        TARGET, base / "bad.log", extra=["--speculative-draft", str(DRAFT), "--speculative-bug", "truncate-context"]
    )
    try:
        good.wait(180)
        bad.wait(180)
        yield {"good": good, "bad": bad, "base": base}
    finally:
        good.stop()
        bad.stop()


def spec_workspace(servers: dict, ws: Path) -> dict:
    """The conformance workspace described in the module docstring, built at `ws`."""
    from dflash_dash import ops, pipeline, prompts
    from dflash_dash.store import Store

    base = servers["base"]
    st = Store(ws)
    pfile = base / "prompts.jsonl"
    pfile.write_text("".join(json.dumps(p) + "\n" for p in prompts.load("coding-10") if p["id"] in IDS))
    for name, server in (("c4", servers["good"]), ("c4-bug", servers["bad"])):
        got = pipeline.fetch(st, ops.Fetch(server=server.url, prompt_set=str(pfile), name=name, max_new_tokens=N))
        assert got == len(IDS), (name, got)
    with one_torch_thread():
        layers = pipeline.layers_of(str(DRAFT), None)
        ex = pipeline.extract(st, ops.Extract(target=str(TARGET), completions="c4", layers=layers))
        run = pipeline.replay(st, ops.Replay(drafter=str(DRAFT), extraction=ex))["id"]
    bug = base / "bug-stats.jsonl"
    bug.write_text(
        "".join(
            json.dumps(
                {
                    "id": c["prompt_id"],
                    "verify_steps": c["meta_info"]["spec_verify_ct"],
                    "accepted_tokens": c["meta_info"]["spec_accept_token_num"],
                }
            )
            + "\n"
            for c in st.completions("c4-bug")
        )
    )
    rc, _, err = run_cli(
        "--workspace", str(ws), "import-engine-stats", str(bug), "--completions", "c4", "--engine", "bug"
    )
    assert rc == 0, err
    return {"ws": ws, "store": st, "run": run, "extraction": ex, "prompts": pfile}


def plant(st, bug: str | None, engine: str, ids: list[str], drafter: Path = DRAFT, speculator=None) -> None:
    """Decode prompts `ids` of set c4 in-process with the stand-in's own Engine and Speculator (drafter
    `drafter`; `speculator`: a subclass of it to use instead) under `--speculative-bug bug` (None: the correct
    decoder) and store its counters for c4 as engine `engine`, as a server at --speculative-stats detailed answers
    them (SGLang's per-step accept_lengths included)."""
    from dflash_dash import server
    from dflash_dash.engines import sglang
    from dflash_dash.server import protocol, specdec

    eng = server.Engine(model_dir=TARGET.resolve(), device="cpu")
    eng.load()
    eng.spec = (speculator or specdec.Speculator)(str(drafter), bug=bug)
    eng.spec.load(eng.model)
    comps = {c["prompt_id"]: c for c in st.completions("c4")}
    rows = []
    with one_torch_thread():
        for pid in ids:
            c = comps[pid]
            out, _, _, counters = eng.speculative(list(c["prompt_ids"]), N, set(eng.eos_ids), [])
            assert out == list(c["output_ids"]), (bug, pid)  # a broken decoder costs speed, never tokens
            meta = {"completion_tokens": len(out)} | protocol.sglang_stats(counters, len(out), "detailed")
            rows.append(sglang.spec_stats(meta, len(out)) | {"id": pid})
    st.add_engine_stats("c4", engine, rows, f"in-process stand-in, bug {bug}")


def private_copy(ws: Path, dst: Path) -> Path:
    """A copy of workspace `ws` at `dst` (its lock files left out), for a test that writes to it."""
    shutil.copytree(ws, dst, ignore=shutil.ignore_patterns("*.lock"))
    return dst
