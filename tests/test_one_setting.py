"""A new replay option is one field of `ops.ReplaySettings` and its use: a setting added in this file alone (a
subclass with one more field, embedded in a Replay of its own by `ops.embeds`, registered as the replay work's
settings in `ops.SETTINGS`) reaches the worker's work as it crosses a process (`jobs.wire`) and the stored run, with
nothing else changed; and two runs differing in any one setting are not reused for each other (`runs.wanted`).
docs/architecture.md's "Adding a replay option" names real code (each `NAME` in `PATH` it says is defined there)."""

from __future__ import annotations

import io
from dataclasses import dataclass, fields, replace
from pathlib import Path

from dflash_dash import cli, ops
from dflash_dash.jobs import wire
from dflash_dash.pipeline import runs, worker
from dflash_dash.pipeline.replay import replay as handle, same_run
from dflash_dash.store import Store

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Probed(ops.ReplaySettings):
    probe: int = ops.setting(0, "a replay option this test adds")


@dataclass
@ops.embeds(Probed)
class ProbedReplay(ops.Replay):
    pass


def summary_of(st: Store, run_id: str) -> dict:
    row = st.run_row(run_id)
    return row["summary"] if isinstance(row, dict) else row.summary


def test_a_new_setting_reaches_the_worker_and_the_stored_run(prepared, workspace_copy, monkeypatch):
    monkeypatch.setitem(ops.SETTINGS, "replay", Probed)  # the worker rebuilds the replay's settings as this record
    st = Store(workspace_copy)
    seen: list[ops.ReplayWork] = []

    def runner(spec, ids, progress):  # through the wire, as to a worker process, then the work here
        back, shard = wire.decode_spec(io.BytesIO(wire.encode_spec(spec, ids)))
        seen.append(back)
        return worker.here(st)(back, shard, progress)

    op = ProbedReplay(drafter=str(prepared.drafters[0]), extraction=prepared.extraction, anchors="chain", probe=3)
    assert op.settings == Probed(anchors="chain", probe=3)
    out = handle(st, op, None, runner)
    assert not out["reused"]
    (spec,) = seen
    assert isinstance(spec.settings, Probed) and spec.settings.probe == 3  # the worker's work carries it
    assert summary_of(st, out["id"])["settings"]["probe"] == 3  # and the stored run records it, whole

    again = handle(st, op, None, runner)  # the same settings: the run is reused, nothing replayed
    assert again == {"id": out["id"], "summary": again["summary"], "reused": True} and len(seen) == 1
    other = handle(st, replace(op, probe=4), None, runner)  # one setting changed: replayed anew
    assert not other["reused"] and other["id"] != out["id"] and seen[-1].settings.probe == 4
    assert same_run(st, replace(op, probe=3), st.extraction(op.extraction)).id == out["id"]

    # the CLI offers it, with the help it was declared with
    p = cli.argparse.ArgumentParser()
    cli.add_op_options(p, ProbedReplay)
    assert "a replay option this test adds" in p.format_help()
    assert cli.op_of(ProbedReplay, p.parse_args(["--drafter", "x", "--probe", "5"])).settings.probe == 5


VARIANT = {  # a value other than the base's for every field of ReplaySettings
    "tree_budget": 2,
    "anchors": "every",
    "dtype": "bfloat16",
    "chunk": 16,
    "sliding_block": "bidirectional",
    "draft_config": "draft.json",
    "max_prompts": 1,
    "temperature": 1.0,
    "verify": "rejection",
}


def test_runs_differing_in_any_one_setting_are_not_reused(prepared, tmp_path):
    assert set(VARIANT) == {f.name for f in fields(ops.ReplaySettings)}  # a new setting: give it a variant here
    st = Store(prepared.workspace)
    ex = st.extraction(prepared.extraction)
    ck = ops.CheckpointSpec(str(prepared.drafters[0]))
    (tmp_path / "draft.json").write_text((prepared.drafters[0] / "config.json").read_text())
    base = ops.ReplaySettings(anchors="chain", temperature=0.5)  # with a temperature its verify rule counts

    def key(s: ops.ReplaySettings) -> tuple:
        if s.draft_config:
            s = replace(s, draft_config=str(tmp_path / s.draft_config))
        return runs.wanted(st, ex, ck, s, "cpu")

    k0 = key(base)
    assert key(replace(base)) == k0
    for name, value in VARIANT.items():
        changed = replace(base, **{name: value})
        if name == "sliding_block":  # this drafter has no sliding layers: both semantics are one replay
            assert key(changed) == k0
            continue
        assert key(changed) != k0, name


def defines(path: Path, name: str) -> bool:
    """Whether the module at `path` defines `name` at its top level (a function, class or assignment), or for
    `Class.attr`, whether that class's body declares `attr`."""
    import ast

    def names(body: list) -> set[str]:
        out: set[str] = set()
        for n in body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(n.name)
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                out.add(n.target.id)
            elif isinstance(n, ast.Assign):
                out |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        return out

    body = ast.parse(path.read_text()).body
    owner, _, attr = name.rpartition(".")
    if not owner:
        return name in names(body)
    cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == owner), None)
    return cls is not None and attr in names(cls.body)


def test_the_recipe_names_real_code():
    """docs/architecture.md's "Adding a replay option": every "`NAME` in `PATH`" it says names a file that exists and
    defines NAME there (ReplaySettings and setting in work.py, VARIANT in this file among them), every path it names
    exists, and it points at this test."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text()
    m = re.search(r"^### Adding a replay option\n(.*?)(?=^#)", text, re.S | re.M)
    assert m, "docs/architecture.md has no section '### Adding a replay option'"
    recipe = m.group(1)
    said = re.findall(r"`([A-Za-z_][\w.]*)`\s+in\s+`((?:dflash_dash|pages|tests)/[\w/]+\.py)`", recipe)
    assert {("ReplaySettings", "dflash_dash/work.py"), ("setting", "dflash_dash/work.py")} <= set(said), said
    assert ("VARIANT", "tests/test_one_setting.py") in said, said
    bad = [f"{name} in {path}" for name, path in said if not (ROOT / path).is_file() or not defines(ROOT / path, name)]
    assert not bad, f"the recipe names what its file does not define: {bad}"
    paths = re.findall(r"`((?:dflash_dash|pages|tests)/[\w/]+\.py)`", recipe)
    assert [p for p in paths if not (ROOT / p).is_file()] == []
    assert "tests/test_one_setting.py" in recipe and "`spec.settings`" in recipe


def test_the_recipe_checker_sees_a_name_gone(tmp_path):
    """The same check on a copy of work.py whose settings record is renamed finds it missing."""
    work = tmp_path / "work.py"
    work.write_text((ROOT / "dflash_dash" / "work.py").read_text().replace("class ReplaySettings(", "class Other("))
    assert defines(ROOT / "dflash_dash" / "work.py", "ReplaySettings")
    assert not defines(work, "ReplaySettings") and defines(work, "setting")
    assert defines(ROOT / "dflash_dash" / "work.py", "ReplayWork.settings") and not defines(work, "ReplayWork.nope")
