"""tools/device_wheels.py, offline: the parts it packs join (by its own printed commands) into tars whose wheels
are the ones packed, base first and whole; ray's wheel loses its jars and web build and nothing else."""

from __future__ import annotations

import os
import subprocess
import tarfile
import zipfile

from tools import device_wheels as dw


def wheel(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def test_parts_join_into_the_wheels_packed(tmp_path, monkeypatch):
    monkeypatch.setattr(dw, "ROOT", tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    base = [wheel(src / "fla_core-0.6.0-py3-none-any.whl", {"fla/a.py": os.urandom(3000)})]
    extra = [wheel(src / f"x{i}-1.0-py3-none-any.whl", {f"x{i}/a.py": os.urandom(9000)}) for i in range(3)]
    folders, sha = dw.pack(base, extra, tmp_path / ".whl-device", part_bytes=12_000)
    assert len(folders) >= 3 and all(sum(f.stat().st_size for f in d.iterdir()) <= 12_000 for d in folders[1:])
    text = dw.install_text(folders, sha)
    # run the device's lines here, with `pip install` replaced by a listing of what it would install
    script = text.replace(dw.PIP, "ls >> installed.txt")
    subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, check=True, capture_output=True)
    got = [p.rsplit("/", 1)[-1] for p in (tmp_path / "installed.txt").read_text().split()]
    assert got == sorted(w.name for w in base) + sorted(w.name for w in extra)
    for w in base + extra:  # byte for byte
        where = "wheels" if w in base else "extra"
        assert (tmp_path / "out" / where / w.name).read_bytes() == w.read_bytes()
    with tarfile.open(tmp_path / "out" / "extra.tar") as t:
        assert sorted(t.getnames()) == sorted(w.name for w in extra)
    # the last part carries the checksum for tools/device_session.sh
    assert (folders[-1] / "extra.sha256").read_text() == f"{sha}  out/extra.tar\n"
    assert not any((f / "extra.sha256").exists() for f in folders[:-1])


def test_a_corrupt_part_fails_the_checksum(tmp_path, monkeypatch):
    monkeypatch.setattr(dw, "ROOT", tmp_path)
    base = [wheel(tmp_path / "transformers-5-py3-none-any.whl", {"t.py": b"x"})]
    extra = [wheel(tmp_path / "duckdb-2-py3-none-any.whl", {"d.py": os.urandom(5000)})]
    folders, sha = dw.pack(base, extra, tmp_path / ".whl-device", part_bytes=4_000)
    part = next(folders[-1].glob("extra.part*"))
    part.write_bytes(part.read_bytes()[:-1] + b"!")
    script = dw.install_text(folders, sha).replace(dw.PIP, "true")
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode != 0 and "FAILED" in run.stdout + run.stderr


def test_slim_drops_only_rays_jars_and_web_build(tmp_path):
    w = wheel(
        tmp_path / "ray-2-cp312-cp312-manylinux2014_x86_64.whl",
        {
            "ray/__init__.py": b"core",
            "ray/jars/ray_dist.jar": os.urandom(20000),
            "ray/dashboard/client/build/index.html": os.urandom(20000),
            "ray/dashboard/modules/x.py": b"kept",
            "ray-2.dist-info/RECORD": b"ray/__init__.py,,\nray/jars/ray_dist.jar,,\nray/dashboard/modules/x.py,,\n",
        },
    )
    assert dw.slim(w) > 30000
    with zipfile.ZipFile(w) as z:
        assert sorted(z.namelist()) == ["ray-2.dist-info/RECORD", "ray/__init__.py", "ray/dashboard/modules/x.py"]
        record = z.read("ray-2.dist-info/RECORD").decode().split()
        assert record == ["ray/__init__.py,,", "ray/dashboard/modules/x.py,,"]
