"""`make_assets rebug` (tools/demo/manifest.rebug): a `DEMO_BUGS` rerun's bug checkpoint and record replace the
same bug's in the assets, in place, keeping every other checkpoint, the families' entries and the earlier variants.

The rerun is built from the shipped assets by a transformation the tool does not make: the soft-KL record
re-labelled with another temperature and another run's weights (the noisy-labels run's) tarred as the soft-KL
folder, as `tools/demo/gpu.py`'s `pack("bugs", ...)` writes it (`bugs/<name>/`).
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from dflash_dash import demo
from tools.demo.manifest import rebug

pytestmark = pytest.mark.skipif(
    not (demo.ASSETS / "MANIFEST.json").is_file(), reason="demo assets are not in this checkout"
)


def assets_copy(tmp: Path) -> Path:
    """The manifest and the bug checkpoints of the shipped assets (the healthy and family folders are not read)."""
    a = tmp / "assets"
    (a / demo.CHECKPOINTS).mkdir(parents=True)
    shutil.copy(demo.ASSETS / "MANIFEST.json", a / "MANIFEST.json")
    shutil.copytree(demo.ASSETS / demo.CHECKPOINTS / "bugs", a / demo.CHECKPOINTS / "bugs")
    return a


def rerun(
    tmp: Path, man: dict, step_shift: int = 0, reused: bool = True, bug: str = "soft_kl", folder: str = ""
) -> Path:
    """A rerun's outputs: gpu.json with the soft-KL record at temperature 9 and bugs.tar holding the noisy-labels
    weights under the soft-KL folder's name (or under `folder`: a tar that does not match its record)."""
    src = tmp / "src"
    src.mkdir(exist_ok=True)
    old = next(r for r in man["gpu"]["drafters"] if r.get("bug") == "soft_kl")
    name = old["name"]
    new = dict(old, bug=bug, step=old["step"] + step_shift, training=dict(old["training"], soft_t=9.0))
    rec = {
        "device": "cuda",
        "seconds": 12.5,
        "drafters": [new],
        "bug_variants": {bug: [{"soft_t": 9.0, "probe": {"tau_macro": 1.5, "tau_every_anchor": 1.4}}]},
    }
    if reused:
        rec["healthy_reused_from_earlier_run"] = True
    (src / "gpu.json").write_text(json.dumps(rec))
    shutil.rmtree(tmp / "stage", ignore_errors=True)
    stage = tmp / "stage" / "bugs" / (folder or Path(name).name)
    shutil.copytree(demo.ASSETS / demo.CHECKPOINTS / "bugs" / "noisy-labels-step110", stage, dirs_exist_ok=True)
    with tarfile.open(src / "bugs.tar", "w") as tf:
        tf.add(tmp / "stage" / "bugs", arcname="bugs")
    return src


def test_rebug_swaps_the_bug_in_place(tmp_path):
    a = assets_copy(tmp_path)
    before = json.loads((a / "MANIFEST.json").read_text())
    old_variants = before["gpu"]["bug_variants"]["soft_kl"]
    src = rerun(tmp_path, before)
    man = rebug(src, a, command="DEMO_BUGS=soft_kl ...")
    soft = a / demo.CHECKPOINTS / next(r["name"] for r in man["gpu"]["drafters"] if r.get("bug") == "soft_kl")
    noisy = demo.ASSETS / demo.CHECKPOINTS / "bugs" / "noisy-labels-step110" / "model.safetensors"
    assert (soft / "model.safetensors").read_bytes() == noisy.read_bytes()
    rec = next(r for r in man["gpu"]["drafters"] if r.get("bug") == "soft_kl")
    assert rec["training"]["soft_t"] == 9.0
    assert [r["name"] for r in man["gpu"]["drafters"]] == [r["name"] for r in before["gpu"]["drafters"]]
    assert man["gpu"]["bug_variants"]["soft_kl"] == old_variants + [
        {"soft_t": 9.0, "probe": {"tau_macro": 1.5, "tau_every_anchor": 1.4}}
    ]
    assert man["gpu"]["reruns"][-1] == {
        "bugs": ["soft_kl"],
        "command": "DEMO_BUGS=soft_kl ...",
        "device": "cuda",
        "seconds": 12.5,
    }
    assert [e["dir"] for e in man["checkpoints"]] == [e["dir"] for e in before["checkpoints"]]  # families kept
    assert man["sizes"]["checkpoints/" + rec["name"] + "/model.safetensors"] == noisy.stat().st_size
    assert json.loads((a / "MANIFEST.json").read_text()) == man


def test_rebug_refuses_another_step_another_bug_a_mismatched_tar_and_a_full_run(tmp_path):
    a = assets_copy(tmp_path)
    man = json.loads((a / "MANIFEST.json").read_text())
    with pytest.raises(SystemExit, match="stopped at step 111, the assets' run at 110"):
        rebug(rerun(tmp_path, man, step_shift=1), a)
    with pytest.raises(SystemExit, match="stopped at step 100, the assets' run at 110"):
        rebug(rerun(tmp_path, man, step_shift=-10), a)
    with pytest.raises(SystemExit, match="label_smoothing: the assets hold no such bug run"):
        rebug(rerun(tmp_path, man, bug="label_smoothing"), a)
    with pytest.raises(SystemExit, match="holds no bugs/soft-kl-step110/ in bugs.tar"):
        rebug(rerun(tmp_path, man, folder="soft-kl-step100"), a)  # the tar's folder is another step's
    with pytest.raises(SystemExit, match="not a DEMO_BUGS rerun"):
        rebug(rerun(tmp_path, man, reused=False), a)
    assert json.loads((a / "MANIFEST.json").read_text()) == man  # nothing written
    held = demo.ASSETS / demo.CHECKPOINTS / "bugs"
    mine = a / demo.CHECKPOINTS / "bugs"
    assert {str(f.relative_to(mine)): f.read_bytes() for f in mine.rglob("*") if f.is_file()} == {
        str(f.relative_to(held)): f.read_bytes() for f in held.rglob("*") if f.is_file()
    }  # nor any checkpoint
