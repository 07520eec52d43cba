"""One extraction serves every drafter family: `extract --drafter A --drafter B` holds the union of their target
layers, each drafter replays on its own columns of it (bit-identical to a replay on an extraction of exactly its
layers: replay, sweep of mixed layers, CPU workers, attribution), and a drafter needing a layer the extraction lacks
is refused before any work, naming the layers and the command that adds them."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from prepared import drafted_set

from dflash_dash import cache, cli, ops, pipeline
from dflash_dash.store import Store

# A: DFlash; B: DSpark; C: DFlash2 on A's layers in another order; D: DFlash on layers no extraction here holds
A_LAYERS, B_LAYERS, C_LAYERS, D_LAYERS = [1, 4], [2, 6], [4, 1], [3, 5]


@dataclass
class Union:
    ws: Path
    target: Path
    ck: dict[str, Path]  # name -> checkpoint folder: a, b, c (layers held by `union`), d (layers it lacks)
    union: str  # extraction made with --drafter a --drafter b
    own: dict[str, str]  # name -> extraction made with exactly that drafter's layers


def run(ws: Path, *args: str) -> tuple[int, str, str]:
    """The CLI's (exit code, stdout, stderr), captured here."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["--workspace", str(ws), *args])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def union(tmp_path_factory) -> Union:
    from tools import tiny

    base = tmp_path_factory.mktemp("layers")
    target = tiny.write_target(base / "target", tiny.TinyTarget())
    dspark = dict(  # a DSpark drafter (Markov and confidence heads) at the tiny scale
        architecture="DSparkDraftModel",
        family_fields=dict(
            projector_type="dspark",
            markov_rank=4,
            markov_head_type="vanilla",
            enable_confidence_head=True,
            confidence_head_with_markov=True,
        ),
    )
    dflash2 = dict(  # a DFlash2 drafter (block-local convolutions, candidate selector, sliding layers)
        architecture="DFlash2DraftModel",
        block_size=8,
        layer_types=["sliding_attention"] * 2,
        sliding_window=16,
        family_fields=dict(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4),
    )
    ck = {
        name: tiny.write_drafter(base / "ck" / name, tiny.TinyDrafter(seed=seed, target_layer_ids=layers, **family))
        for name, seed, layers, family in (
            ("a", 1, A_LAYERS, {}),
            ("b", 2, B_LAYERS, dspark),
            ("c", 3, C_LAYERS, dflash2),
            ("d", 4, D_LAYERS, {}),
        )
    }
    jsonl = drafted_set(target, ck["a"], base / "c.jsonl")
    ws = base / "ws"
    assert run(ws, "import-completions", str(jsonl), "--name", "s")[0] == 0
    ext = ["extract", "--target", str(target), "--completions", "s"]
    rc, out, err = run(ws, *ext, "--drafter", str(ck["a"]), "--drafter", str(ck["b"]))
    assert rc == 0, err
    own = {}
    for name in ("a", "b", "c"):
        rc, o, err = run(ws, *ext, "--drafter", str(ck[name]))
        assert rc == 0, err
        own[name] = o.strip()
    return Union(ws, target, ck, out.strip(), own)


def bitwise(a, b) -> bool:
    """`a` and `b` (arrays, lists, numbers, text) equal value for value, NaN where the other has NaN."""
    if isinstance(a, (np.ndarray, list, float)):
        x, y = np.asarray(a), np.asarray(b)
        return x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f")
    return a == b


def same_runs(st: Store, run_a: str, run_b: str) -> None:
    """Every per-prompt row of two runs equal, bit for bit (every array, every number), and their summaries but
    for the extraction they name."""
    rows_a, rows_b = st.run_prompts(run_a), st.run_prompts(run_b)
    assert [r["prompt_id"] for r in rows_a] == [r["prompt_id"] for r in rows_b] and len(rows_a) == 3
    for ra, rb in zip(rows_a, rows_b):
        assert set(ra) == set(rb)
        for key in ra:
            if key == "run_id":
                continue
            assert bitwise(ra[key], rb[key]), (ra["prompt_id"], key)
    sa, sb = st.run_row(run_a)["summary"], st.run_row(run_b)["summary"]
    assert {k: v for k, v in sa.items() if k != "extraction"} == {k: v for k, v in sb.items() if k != "extraction"}


# ---------------------------------------------------------------------------
# extract: the union


def test_two_drafters_extract_the_sorted_union_of_their_layers(union):
    st = Store(union.ws)
    assert st.extraction(union.union)["layer_ids"] == sorted(set(A_LAYERS + B_LAYERS)) == [1, 2, 4, 6]
    assert st.extraction(union.own["c"])["layer_ids"] == C_LAYERS  # one drafter: its layers as it lists them
    # the union's columns of layer 2 are the ones an extraction of B's layers holds, bit for bit
    H = st.extraction(union.union)["hidden_size"]
    for it in st.items(union.union):
        pid, T = it["prompt_id"], it["tokens"]
        u = cache.read(pipeline.features_root(st), union.union, pid, T, 4 * H)
        b = cache.read(pipeline.features_root(st), union.own["b"], pid, T, 2 * H)
        assert torch.equal(u[:, H : 2 * H], b[:, :H]) and torch.equal(u[:, 3 * H :], b[:, H:])


def test_extract_op_takes_several_drafters_or_one_as_before(capsys):
    op = ops.Extract(target="/t", completions="s", drafter=["/a", "/b"])
    assert op.drafter == ["/a", "/b"]
    assert ops.Extract(target="/t", completions="s", drafter="/a").drafter == ["/a"]  # a single path, as before
    old = ops.of("extract", {"target": "/t", "completions": "s", "drafter": "/ck"})  # a job record of before
    assert old.drafter == ["/ck"] and ops.of("extract", json.loads(json.dumps(op.to_args()))) == op
    with pytest.raises(ops.InputError, match="layers: give a drafter checkpoint"):
        ops.Extract(target="/t", completions="s", drafter=[])
    with pytest.raises(ops.InputError, match="drafter .*expected checkpoint folders"):
        ops.Extract(target="/t", completions="s", drafter=[1])
    a = cli.parser().parse_args(
        ["extract", "--target", "/t", "--completions", "s", "--drafter", "/a", "--drafter", "/b"]
    )
    assert cli.op_of(ops.Extract, a).drafter == ["/a", "/b"]
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["extract", "--help"])
    assert "repeat it for several drafters" in " ".join(capsys.readouterr().out.split())


def test_layers_of_and_blocks(union):
    assert pipeline.layers_of([str(union.ck["b"]), str(union.ck["a"]), str(union.ck["c"])], None) == [1, 2, 4, 6]
    assert pipeline.layers_of(str(union.ck["c"]), None) == C_LAYERS
    assert pipeline.layers_of([str(union.ck["a"])], "3,5") == [3, 5]  # explicit layers win, as before
    assert ops.missing_layers([1, 2, 4, 6], [4, 1]) == [] and ops.missing_layers([1, 4], [3, 4, 5]) == [3, 5]
    assert ops.layer_blocks([1, 4], [1, 4]) is None and ops.layer_blocks([1, 2, 4, 6], [4, 1]) == [2, 0]
    t = torch.arange(2 * 3 * 4, dtype=torch.bfloat16).view(2, 12)  # 2 tokens, 3 blocks of 4
    assert cache.blocks(t, None, 4) is t
    got = cache.blocks(t, torch.tensor([2, 0]), 4)
    assert torch.equal(got, torch.cat([t[:, 8:12], t[:, 0:4]], 1)) and got.is_contiguous()


# ---------------------------------------------------------------------------
# replay: each drafter on its own columns, bit-identical


@pytest.mark.parametrize("name", ["a", "b", "c"])
def test_replay_on_the_union_equals_replay_on_its_own_layers(union, name):
    st = Store(union.ws)
    on_union = pipeline.replay(st, ops.Replay(drafter=str(union.ck[name]), extraction=union.union, tree_budget=4))
    on_own = pipeline.replay(st, ops.Replay(drafter=str(union.ck[name]), extraction=union.own[name], tree_budget=4))
    assert on_union["summary"]["extraction"] == union.union
    same_runs(st, on_union["id"], on_own["id"])


def test_sequences_read_a_drafters_columns_in_its_order(union):
    st = Store(union.ws)
    from dflash_dash.pipeline.features import load_sequences

    mine = load_sequences(st, st.extraction(union.union), C_LAYERS)
    ref = load_sequences(st, st.extraction(union.own["c"]))
    assert [s.id for s in mine] == [s.id for s in ref]
    assert all(torch.equal(s.features, r.features) for s, r in zip(mine, ref))
    whole = load_sequences(st, st.extraction(union.union), [1, 2, 4, 6])  # its own layers: read as stored
    assert all(s.features.shape[1] == 4 * 64 for s in whole)


def test_sweep_of_mixed_layers_on_the_union_equals_own_replays(union, tmp_path):
    st = Store(union.ws)
    train = tmp_path / "train"  # checkpoints of different layers (two alike in a row: one gather), one sweep
    order = ("a", "a", "c", "b")
    for step, name in enumerate(order):
        shutil.copytree(union.ck[name], train / f"epoch_0_step_{100 * (step + 1)}")
    rc, out, err = run(union.ws, "sweep", "--checkpoints", str(train), "--extraction", union.union)
    assert rc == 0, err
    runs = out.split()
    assert len(runs) == len(order)
    for rid, name in zip(runs, order):
        own = pipeline.replay(st, ops.Replay(drafter=str(union.ck[name]), extraction=union.own[name], anchors="chain"))
        same_runs(st, rid, own["id"])


def test_cpu_workers_replay_their_columns_of_the_union(union, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # inherited by the worker processes (2 shared cores)
    st = Store(union.ws)
    rc, out, err = run(
        union.ws, "replay", "--drafter", str(union.ck["b"]), "--extraction", union.union, "--gpus", "cpu,cpu"
    )
    assert rc == 0, err
    assert "[worker 1, cpu]" in err and "[worker 2, cpu]" in err
    own = pipeline.replay(st, ops.Replay(drafter=str(union.ck["b"]), extraction=union.own["b"]))
    same_runs(st, json.loads(out)["id"], own["id"])  # replay's stdout is one JSON document


def test_attribution_on_the_union_ablates_the_drafters_own_taps(union):
    st = Store(union.ws)
    on_union = pipeline.replay(st, ops.Replay(drafter=str(union.ck["c"]), extraction=union.union, tree_budget=0))
    on_own = pipeline.replay(st, ops.Replay(drafter=str(union.ck["c"]), extraction=union.own["c"], tree_budget=0))
    a = pipeline.attribute(st, ops.Attribute(run=on_union["id"]))
    b = pipeline.attribute(st, ops.Attribute(run=on_own["id"]))
    assert [t["layer_id"] for t in a["taps"]] == C_LAYERS
    assert a["taps"] == b["taps"] and a["base_tau_macro"] == b["base_tau_macro"]


def test_parity_compares_the_layers_both_extractions_hold(union):
    from dflash_dash import parity

    st = Store(union.ws)
    out = parity.compare(st, union.union, union.own["c"])  # layers [1, 2, 4, 6] against [4, 1]
    assert [r["layer"] for r in out["layers"]] == [1, 4] and out["prompts"] == 3
    assert all(r["rel_l2"] == 0.0 and r["max_abs"] == 0.0 for r in out["layers"])  # the same states, bit for bit
    with pytest.raises(ValueError, match=r"\[4, 1\].*\[2, 6\].*none in common"):
        parity.compare(st, union.own["c"], union.own["b"])


# ---------------------------------------------------------------------------
# refused before any work


def test_a_drafter_needing_missing_layers_is_refused_naming_them_and_the_command(union, tmp_path):
    st = Store(union.ws)
    before = len(st.runs())
    ex = st.extraction(union.own["a"])
    rc, out, err = run(union.ws, "replay", "--drafter", str(union.ck["d"]), "--extraction", union.own["a"])
    assert rc == 2 and out == ""
    msg = err.strip().splitlines()[-1]
    assert "reads target layers [3, 5]" in msg and f"extraction {ex['id']} holds layers [1, 4]" in msg
    assert "(missing [3, 5])" in msg
    want = (
        f"python -m dflash_dash --workspace {union.ws} extract --target {ex['target_path']} --completions s "
        "--layers 1,3,4,5"
    )
    assert want in msg and "--drafter CKPT once per drafter" in msg
    with pytest.raises(pipeline.LayersMissing, match=r"missing \[3, 5\]"):
        pipeline.replay(st, ops.Replay(drafter=str(union.ck["d"]), extraction=union.union))
    # a sweep with one such checkpoint stops before the first replay: nothing stored
    train = tmp_path / "train"
    shutil.copytree(union.ck["a"], train / "epoch_0_step_100")
    shutil.copytree(union.ck["d"], train / "epoch_0_step_200")
    rc, out, err = run(union.ws, "sweep", "--checkpoints", str(train), "--extraction", union.union)
    assert rc == 2 and "reads target layers [3, 5]" in err and out == ""
    assert len(st.runs()) == before
    # the command it names makes an extraction the drafter replays on
    rc, out, err = run(union.ws, *want.split()[5:])
    assert rc == 0, err
    assert st.extraction(out.strip())["layer_ids"] == [1, 3, 4, 5]


def test_consistency_accepts_a_superset_extraction(union):
    from dflash_dash import drafters, target_info
    from dflash_dash.analysis.checks import consistency

    st = Store(union.ws)
    ex = st.extraction(union.union)
    info = target_info.describe(ex["target_path"])
    rows = {r["check"]: r for r in consistency(drafters.read_config(union.ck["c"]), ex, info)}
    assert rows["target layer ids"]["ok"] == "✓" and rows["target layer ids"]["extraction / target"] == "[1, 2, 4, 6]"
    bad = {r["check"]: r for r in consistency(drafters.read_config(union.ck["d"]), ex, info)}["target layer ids"]
    assert bad["ok"] == "✗" and "missing [3, 5]" in bad["problem"] and "repeat --drafter" in bad["problem"]


def test_an_extraction_holding_the_layers_is_a_duplicate(union):
    from dflash_dash.jobs import orchestrate

    st = Store(union.ws)
    ex = st.extraction(union.union)
    warns = orchestrate.check_extract(st, ex["target_path"], "s", A_LAYERS, ex["device"], ex["dtype"])
    assert any(w.startswith(f"extraction {union.union} ") and "at layers 1,2,4,6" in w for w in warns)
    warns = orchestrate.check_extract(st, ex["target_path"], "s", [0, 1], ex["device"], ex["dtype"])
    assert warns == []  # layer 0 is in none of them


# ---------------------------------------------------------------------------
# the dashboard's extract form


def test_extract_form_takes_several_drafters_and_extracts_their_union(prepared, workspace_copy, monkeypatch):
    from apptest import app, by_label, clean
    from waiting import wait_job

    from tools import tiny

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # this machine's defaults: cpu, float32
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # inherited by the job process (2 shared cores)
    other = tiny.write_drafter(workspace_copy.parent / "other", tiny.TinyDrafter(target_layer_ids=[5, 2]))
    at = app(workspace_copy, monkeypatch, "extraction")
    clean(at)
    at.text_area(key="extract_drafters").input(f"{prepared.drafters[0]}\n\n{other}\n")  # sent with the form
    by_label(at.button, "Extract").click().run()
    assert not [w.value for w in at.warning if "duplicate" in w.value]  # no extraction holds 2 and 5
    clean(at)
    job = wait_job(workspace_copy, "extract")
    assert job["status"] == "done", job
    assert job["args"]["drafter"] == [str(prepared.drafters[0]), str(other)]  # one folder a line, blanks dropped
    ex = Store(workspace_copy).extraction(job["result"]["extraction"])
    assert ex["layer_ids"] == [1, 2, 4, 5] and ex["status"] == "done"
