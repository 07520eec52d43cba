"""The feature audit on caches written exactly as the trainers write them, from a tiny target's correct states
(Hugging Face `output_hidden_states`, computed apart from the product's extraction), with faults planted by
transforming that correct capture: layers off by -2..+2 (hidden_states[l+1+o] for layer l), a zeroed layer, NaN
rows, a one-token position shift, a scale change, bf16 storage, a capture computed in bf16.

Formats: SpecForge `scripts/prepare_hidden_states.py` @ a6b6b0230009d15ec2a97a57384e6f53f0f96946
(`_save_tensor_sync`: torch.save of the strategy's OfflineCaptureLayout record, or into gzip.open with --compress;
`_get_file_path`: rows_{g}-{g+2000}/data_{i}.ckpt[.gz]); DeepSpec `deepspec/data/target_cache_dataset.py` @
4351696e059a11466cc4d198b1ef1b773c2ce294 (manifest.json version 2, samples.idx `<QIIQQQQQ`, shard-00000.bin).
"""

from __future__ import annotations

import gzip
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dflash_dash import audit, cli, ops, target as target_mod
from dflash_dash.pipeline.audit import audits
from dflash_dash.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools import tiny  # noqa: E402


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    """A tiny hybrid target and, per sequence, its token ids and HF hidden_states (fp32 and computed in bf16)."""
    from transformers import AutoModelForCausalLM

    tgt = tiny.write_target(tmp_path_factory.mktemp("audit") / "target")
    target_mod.force_torch_kernels()
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(4, 500, (n,), generator=g) for n in (40, 33)]
    out = {"target": tgt, "ids": seqs, "fp32": [], "bf16": [], "last": []}
    for dtype, key in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        m = AutoModelForCausalLM.from_pretrained(tgt, dtype=dtype).eval()
        with torch.no_grad():
            for s in seqs:
                o = m.model(input_ids=s[None], output_hidden_states=True)
                out[key].append([h[0] for h in o.hidden_states])
                if key == "fp32":
                    out["last"].append(o.last_hidden_state[0])
    return out


def specforge(root: Path, states: dict, blocks, last: bool = False, gz: bool = False, key: str = "fp32") -> Path:
    """A SpecForge capture folder: blocks(hs) -> [T, K*H] per sequence, saved as prepare_hidden_states.py does."""
    d = root / "rows_0-2000"
    d.mkdir(parents=True, exist_ok=True)
    for i, (ids, hs) in enumerate(zip(states["ids"], states[key])):
        rec = {"input_ids": ids, "loss_mask": torch.ones_like(ids), "hidden_states": blocks(hs)[None]}
        if last:  # the dspark layout's extra key
            rec["target_last_hidden_states"] = states["last"][i][None]
        if gz:
            with gzip.open(d / f"data_{i}.ckpt.gz", "wb", compresslevel=6) as f:
                torch.save(rec, f)
        else:
            torch.save(rec, d / f"data_{i}.ckpt")
    return root


def deepspec(root: Path, states: dict, layers: list[int], blocks) -> Path:
    """A DeepSpec target cache (version 2) as LocalTargetCacheWriter + finalize + manifest write it, one shard."""
    root.mkdir(parents=True)
    shard, idx = bytearray(), bytearray()
    for i, (ids, hs, last) in enumerate(zip(states["ids"], states["fp32"], states["last"])):
        T = len(ids)
        parts = [
            ids.to(torch.int32).numpy().tobytes(),
            np.ones(T, np.uint8).tobytes(),  # attention_mask
            np.ones(T, np.uint8).tobytes(),  # loss_mask
            blocks(hs).to(torch.bfloat16).contiguous().view(torch.uint16).numpy().tobytes(),
            last.to(torch.bfloat16).contiguous().view(torch.uint16).numpy().tobytes(),
        ]
        offs = []
        for p in parts:
            offs.append(len(shard))
            shard += p
        idx += struct.pack("<QIIQQQQQ", i, 0, T, *offs)
    (root / "shard-00000.bin").write_bytes(bytes(shard))
    (root / "samples.idx").write_bytes(bytes(idx))
    manifest = {
        "version": 2, "num_samples": len(states["ids"]), "num_shards": 1, "target_layer_ids": layers,
        "hidden_dtype": "bfloat16", "token_dtype": "int32", "mask_dtype": "uint8",
        "index_record_size": struct.calcsize("<QIIQQQQQ"), "hidden_size": 64,
        "shards": [{"shard_id": 0, "file_name": "shard-00000.bin"}],
    }  # fmt: skip
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def cat(hs, pick):
    return torch.cat(pick(hs), dim=-1)


def by_layer(out: dict) -> dict:
    return {r["layer"]: r for r in out["rows"]}


def test_clean_specforge_capture_passes(states, tmp_path):
    L = [1, 4]
    d = specforge(tmp_path / "clean", states, lambda hs: cat(hs, lambda h: [h[l + 1] for l in L]))
    out = audit.audit(str(d), str(states["target"]), layers=L)
    assert out["clean"] and out["format"] == "specforge" and out["strategy"] == "dflash"
    assert out["recompute"]["device"] == "cpu" and out["recompute"]["backend"] in ("torch", "n/a")
    for r in out["rows"]:
        assert r["kind"] == "exact" and r["rel_l2"] < 1e-5 and (r["best_offset"], r["best_shift"]) == (0, 0)
    assert out["positions"] == sum(len(i) for i in states["ids"])


def test_offsets_zeros_and_shift_named(states, tmp_path):
    L = [1, 2, 4, 5]
    faults = lambda h: [h[1], h[2 + 2], torch.zeros_like(h[5]), torch.roll(h[6], -1, 0)]  # noqa: E731
    d = specforge(tmp_path / "a", states, lambda hs: cat(hs, faults))
    out = audit.audit(str(d), str(states["target"]), layers=L)
    rows = by_layer(out)
    assert not out["clean"]
    assert (rows[1]["kind"], rows[1]["best_offset"]) == ("offset", -1)
    assert "layer 1's features are layer 0's output (hidden_states[1]): the capture reads hidden_states[l] for " \
           "layer l" in out["verdict"]  # fmt: skip
    assert (rows[2]["kind"], rows[2]["best_offset"]) == ("offset", 1)
    assert rows[4]["kind"] == "zeros" and rows[4]["zero_share"] == 1
    assert (rows[5]["kind"], rows[5]["best_offset"], rows[5]["best_shift"]) == ("shift", 0, 1)
    assert "anchor-visible shortcut" in rows[5]["meaning"]


def test_two_off_nan_scale_and_late_shift_named(states, tmp_path):
    L = [1, 3, 4, 5, 6]

    def faults(h):
        nan = h[5].clone()
        nan[3:6] = float("nan")
        return [h[0], h[6], nan, 1.5 * h[6], torch.roll(h[7], 1, 0)]

    d = specforge(tmp_path / "b", states, lambda hs: cat(hs, faults), gz=True)
    rows = by_layer(audit.audit(str(d), str(states["target"]), layers=L))
    assert (rows[1]["best_offset"], rows[1]["kind"]) == (-2, "offset") and "embedding" in rows[1]["finding"]
    assert (rows[3]["best_offset"], rows[3]["kind"]) == (2, "offset")
    assert rows[4]["kind"].startswith("nonfinite") and rows[4]["nonfinite_share"] == pytest.approx(6 / 73)
    assert rows[5]["kind"] == "scale" and rows[5]["scale"] == pytest.approx(1.5, rel=1e-4)
    assert (rows[6]["kind"], rows[6]["best_shift"]) == ("shift", -1)


def test_bf16_storage_is_clean_and_bf16_compute_is_a_kernel_level(states, tmp_path):
    L = [1, 4]
    pick = lambda h: [h[l + 1] for l in L]  # noqa: E731
    d = specforge(tmp_path / "st", states, lambda hs: cat(hs, pick).bfloat16(), gz=True)
    out = audit.audit(str(d), str(states["target"]), layers=L)
    assert out["clean"] and out["dtype"] == "bfloat16" and {r["kind"] for r in out["rows"]} == {"storage"}
    d = specforge(tmp_path / "bf", states, lambda hs: cat(hs, pick), key="bf16")
    out = audit.audit(str(d), str(states["target"]), layers=L)
    rows = by_layer(out)
    assert rows[4]["kind"] == "backend" and rows[4]["best_offset"] == 0  # not another layer
    assert rows[4]["rel_l2"] < rows[4]["neighbour_rel_l2"] / 2
    assert out["clean"] and "kernel-backend level" in out["verdict"]


def test_dspark_layout_audits_the_last_hidden_state(states, tmp_path):
    d = specforge(tmp_path / "ds", states, lambda hs: cat(hs, lambda h: [h[2], h[5]]), last=True)
    out = audit.audit(str(d), str(states["target"]), layers=[1, 4])
    assert out["strategy"] == "dspark" and out["clean"]
    assert out["last"]["rel_l2"] < 1e-5


def test_deepspec_cache_clean_and_off_by_one(states, tmp_path):
    ok = deepspec(tmp_path / "ok", states, [1, 4], lambda hs: cat(hs, lambda h: [h[2], h[5]]))
    out = audit.audit(str(ok), str(states["target"]))  # layers from the manifest
    assert out["format"] == "deepspec" and out["clean"] and out["layers"] == [1, 4]
    bad = deepspec(tmp_path / "bad", states, [1, 4], lambda hs: cat(hs, lambda h: [h[2], h[4]]))
    rows = by_layer(audit.audit(str(bad), str(states["target"])))
    assert rows[1]["kind"] == "storage" and (rows[4]["kind"], rows[4]["best_offset"]) == ("offset", -1)


def test_bad_caches_named_in_one_line(states, tmp_path):
    t = str(states["target"])
    good = specforge(tmp_path / "g", states, lambda hs: cat(hs, lambda h: [h[2], h[5]]))
    f = good / "rows_0-2000" / "data_1.ckpt"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # a half-written file
    with pytest.raises(audit.FeatureError, match=r"data_1\.ckpt: not a complete torch file"):
        audit.audit(str(good), t, layers=[1, 4])
    (tmp_path / "empty").mkdir()
    with pytest.raises(audit.FeatureError, match="not a feature cache this product reads"):
        audit.audit(str(tmp_path / "empty"), t, layers=[1, 4])
    three = specforge(tmp_path / "w", states, lambda hs: cat(hs, lambda h: [h[2], h[5], h[6]]))
    with pytest.raises(audit.FeatureError, match="the cache holds 3 layers"):
        audit.audit(str(three), t, layers=[1, 4])
    with pytest.raises(audit.FeatureError, match="does not record its target layer ids"):
        audit.audit(str(three), t)
    e3 = tmp_path / "e3" / "rows_0-2000"
    e3.mkdir(parents=True)
    torch.save({"input_ids": states["ids"][0], "loss_mask": states["ids"][0], "aux_hidden_state": states["last"][0],
                "hidden_state": states["last"][0]}, e3 / "data_0.ckpt")  # fmt: skip
    with pytest.raises(audit.FeatureError, match="EAGLE-3 capture"):
        audit.audit(str(e3.parent), t, layers=[1])
    pk = tmp_path / "pk" / "rows_0-2000"
    pk.mkdir(parents=True)
    torch.save({"input_ids": states["ids"][0], "hidden_states": Path("x")}, pk / "data_0.ckpt")
    with pytest.raises(audit.FeatureError, match="pickled objects besides tensors"):
        audit.audit(str(pk.parent), t, layers=[1])
    ds = deepspec(tmp_path / "cut", states, [1, 4], lambda hs: cat(hs, lambda h: [h[2], h[5]]))
    shard = ds / "shard-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(audit.FeatureError, match="a cut shard"):
        audit.audit(str(ds), t)


def test_cli_job_record_and_kept_report(states, tmp_path, capsys):
    d = specforge(tmp_path / "c", states, lambda hs: cat(hs, lambda h: [h[1], h[5]]))
    ws = tmp_path / "ws"
    args = ["--workspace", str(ws), "audit", "--features", str(d), "--target", str(states["target"]), "--layers",
            "1,4", "--samples", "1"]  # fmt: skip
    assert cli.main(args) == 1  # a faulty layer
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == 1 and report["faults"] == ["offset"]
    kept = audits(Store(ws))
    assert kept[0]["id"] == report["id"] and kept[0]["rows"][0]["best_offset"] == -1
    op = ops.of("audit", ops.Audit(features=str(d), target="t", layers="1,4").to_args())
    assert op.layers == [1, 4] and op.samples == 8
    assert cli.main(["--workspace", str(ws), "audit", "--features", str(tmp_path / "nope"), "--target", "t"]) == 2
    assert "no such feature cache folder" in capsys.readouterr().err


def test_diagnostics_section_shows_a_planted_off_by_one(states, tmp_path, monkeypatch):
    from tests.apptest import app, clean

    d = specforge(tmp_path / "p", states, lambda hs: cat(hs, lambda h: [h[1], h[5]]))
    ws = tmp_path / "ws"
    assert cli.main(["--workspace", str(ws), "audit", "--features", str(d), "--target", str(states["target"]),
                     "--layers", "1,4", "--samples", "1"]) == 1  # fmt: skip
    at = app(ws, monkeypatch, "diagnostics", section="audit")
    clean(at)
    assert "Feature audit" in [h.value for h in at.header]
    said = " ".join(w.value for w in at.warning)
    assert "layer 1's features are layer 0's output (hidden_states[1]): the capture reads hidden_states[l]" in said
    table = at.dataframe[0].value
    assert list(table["best layer offset"]) == ["-1", "+0"] and list(table["finding"]) == ["offset", "exact"]
