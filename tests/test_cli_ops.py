"""Every CLI command is an operation: each subcommand of the parser maps to an `ops` dataclass that `pipeline.perform`
has a handler for and `cli.PRINTERS` a printer for, and every option's help and choices are its field's metadata.
Running each command (with its handler stood in) shows the op reaching `perform` and its answer reaching the printer.
Placement (device, gpus, Ray cluster) is one record embedded in Extract, Replay and Sweep, and jobs.workers /
jobs.cluster read it as `op.placement`. The stand-in's option lists match server/protocols.py and server/faults.py."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

import pytest

from dflash_dash import cli, ops, pipeline
from dflash_dash.store import Store


def subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_command_is_an_op_with_a_handler_and_a_printer():
    cmds = subcommands()
    assert len(cmds) == len(ops.COMMANDS) + len(ops.OPS) - 1  # every op but parity (a page's job) is a command
    for name, sp in cmds.items():
        op = sp.get_default("op")
        assert op is not None and issubclass(op, ops.Op), f"{name}: no op type"
        assert op.kind == name, f"{name}: runs {op.__name__} (kind {op.kind})"
        assert op in pipeline.TABLE, f"{name}: pipeline.perform has no handler for {op.__name__}"
        assert op in cli.PRINTERS, f"{name}: no printer for {op.__name__}"
    offered = {sp.get_default("op") for sp in cmds.values()}
    assert offered == set(ops.COMMANDS) | {c for c in ops.OPS if c is not ops.Parity}


def test_every_option_is_a_field_with_its_help_and_choices():
    for name, sp in subcommands().items():
        op = sp.get_default("op")
        by_name = {f.name: f for f in fields(op)}
        options = [a for a in sp._actions if a.dest not in ("help", "workspace")]
        assert {a.dest for a in options} == set(by_name), name
        for a in options:
            f = by_name[a.dest]
            assert ops.setting_help(f), f"{name} {a.dest}: declared without help"
            assert a.help == ops.setting_help(f).replace("%", "%%"), f"{name} {a.dest}: help not the field's"
            assert (tuple(a.choices) if a.choices else None) == ops.choices(f), f"{name} {a.dest}: choices"
            if a.option_strings:  # a flag is required exactly when the field has no default
                assert a.required == (f.default is MISSING and f.default_factory is MISSING), f"{name} {a.dest}"


def test_no_choices_by_field_name_are_left_in_the_cli():
    assert not hasattr(cli, "CHOICES")
    for cls in (*ops.OPS, *ops.COMMANDS):  # every dtype field offers the dtypes, from its own metadata
        for f in fields(cls):
            if f.name == "dtype":
                assert ops.choices(f) == ops.DTYPES, cls


ARGS = {  # the least each command needs beside its required fields (given "x")
    "sliding-check": [],
    "baseline": ["--completions", "x"],
    "jobs": [],
}
SKIP = {"extract"}  # checks the completion set and the disk before perform (tests/test_cli.py, test_disk.py)


def argv_of(name: str, sp: argparse.ArgumentParser) -> list[str]:
    """`name` with "x" for each required field (positional or flag)."""
    out = [name]
    for a in sp._actions:
        if a.dest in ("help", "workspace"):
            continue
        if not a.option_strings and a.nargs != "?":
            out.append("x")
        elif a.option_strings and a.required:
            out += [a.option_strings[0], "x"]
    return out + ARGS.get(name, [])


def test_each_command_runs_its_op_through_perform_and_its_printer(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    Store(ws).runs()  # a workspace (its database made), for the read-only commands
    seen: list[tuple[str, object]] = []
    for name, sp in subcommands().items():
        if name in SKIP:
            continue
        cls = sp.get_default("op")
        answer = object()

        def handler(store, op, progress, runner, cls=cls, answer=answer):
            assert type(op) is cls and runner is not None  # perform hands every handler its runner
            seen.append(("handled", op))
            return answer

        def printer(a, store, op, out, answer=answer):
            assert out is answer  # the handler's own answer (perform(..., answer=True))
            seen.append(("printed", op))

        monkeypatch.setitem(pipeline.TABLE, cls, handler)
        monkeypatch.setitem(cli.PRINTERS, cls, printer)
        argv = ["--workspace", str(ws), *argv_of(name, sp)]
        assert cli.main(argv) == 0, argv
        assert [k for k, _ in seen[-2:]] == ["handled", "printed"] and seen[-1][1] is seen[-2][1], name
    assert len(seen) == 2 * (len(subcommands()) - len(SKIP))


def test_a_bad_value_is_named_by_its_op(tmp_path, capsys):
    Store(tmp_path)
    assert cli.main(["--workspace", str(tmp_path), "jobs", "logs"]) == 2
    assert "jobs logs needs a job id" in capsys.readouterr().err
    assert cli.main(["--workspace", str(tmp_path), "import-completions", "f.jsonl", "--name", "a/b"]) == 2
    assert "name" in capsys.readouterr().err


def test_placement_is_one_record_embedded_where_work_is_placed():
    names = [f.name for f in fields(ops.Placement)]
    assert names == ["device", "gpus", "ray", "ray_gpus", "ray_cpus"]
    for cls in (ops.Extract, ops.Replay, ops.Sweep):
        assert cls.EMBEDS["placement"] is ops.Placement
        assert set(names) <= {f.name for f in fields(cls)}
    op = ops.Replay(drafter="ck", gpus="0,1")
    assert op.placement == ops.Placement(gpus=["cuda:0", "cuda:1"]) and op.gpus == ["cuda:0", "cuda:1"]
    assert op.devices() == ["cuda:0", "cuda:1"] and ops.Diagnose().placement is None
    with pytest.raises(ops.InputError, match="gpus: it names this host's devices"):
        ops.Sweep(checkpoints="c", gpus="0", ray="auto")
    with pytest.raises(ops.InputError, match="ray_cpus: it sizes a Ray cluster's workers"):
        ops.Extract(target="t", completions="s", layers="1", ray_cpus=2)
    with pytest.raises(TypeError, match="declared by Placement"):
        ops.embeds(ops.Placement, "placement")(type("Twice", (ops.Op,), {"__annotations__": {"gpus": "list[str]"}}))


def test_workers_and_cluster_read_the_placement(tmp_path, monkeypatch):
    from dflash_dash.jobs import cluster, workers

    st = Store(tmp_path)
    op = ops.Replay(drafter="ck", gpus="cpu,cpu")
    placed, run = workers.placed(st, op)
    assert placed is op and callable(run)  # a pool over the placement's two CPU workers
    assert workers.placed(st, ops.Replay(drafter="ck"))[1] is None  # one device: this process

    asked = {}
    monkeypatch.setattr(cluster, "connect", lambda address: asked.setdefault("address", address) and "h:1")
    monkeypatch.setattr(
        cluster,
        "plan",
        lambda address, gpus, cpus: asked.update(gpus=gpus, cpus=cpus) or cluster.Plan(address, "cpu", cpus, {}),
    )
    monkeypatch.setattr(cluster, "probe", lambda ws: None)
    monkeypatch.setattr(cluster, "runner", lambda store, p: ("runner", p.workers))
    op = ops.Sweep(checkpoints="c", ray="10.0.0.1:6379", ray_cpus=3, device="cpu")
    placed, run = workers.placed(st, op)
    assert asked == {"address": "10.0.0.1:6379", "gpus": None, "cpus": 3} and run == ("runner", 3)
    assert placed.device == "cpu" and placed.placement == op.placement


def test_the_stand_in_options_are_the_servers():
    """ops.Serve (the CLI's serve) declares the options of `python -m dflash_dash.server` (server/options.py): the
    same names, defaults and choices, the protocols of server/protocols.py and the faults of server/faults.py."""
    from dflash_dash.server import faults, options, protocols

    p = argparse.ArgumentParser()
    options.serve_args(p)
    options.speculative_args(p)
    theirs = {a.dest: a for a in p._actions if a.dest != "help"}
    ours = {f.name: f for f in fields(ops.Serve)}
    assert set(theirs) == set(ours)
    for name, a in theirs.items():
        f = ours[name]
        assert (f.default if f.default is not MISSING else None) == a.default, name
        assert ops.choices(f) == (tuple(a.choices) if a.choices else None), name
    assert ops.choices(ours["protocol"]) == tuple(protocols.PROTOCOLS)
    assert ops.choices(ours["speculative_bug"]) == tuple(faults.BUGS)
