"""tools/device_wheels.py and tools/device_install.sh, offline: the parts packed install, call by call, the wheels
packed (base first and whole, the extras once the last part has joined them); a corrupt part fails its checksum;
ray's wheel loses its jars and web build and nothing else."""

from __future__ import annotations

import os
import stat
import subprocess
import tarfile
import zipfile

from tools import device_wheels as dw

INSTALL = dw.ROOT / "tools" / "device_install.sh"


def calls(root, n: int):
    """Run tools/device_install.sh 1..n in `root` as the device would, with a `python3` that lists the wheels pip
    would install (into installed.txt) instead of installing them; the last call's result."""
    bin_ = root / "bin"
    bin_.mkdir(exist_ok=True)
    fake = bin_ / "python3"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in *.whl) echo "$a" >> installed.txt;; esac; done\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = os.environ | {"PATH": f"{bin_}:{os.environ['PATH']}"}
    for k in range(1, n + 1):
        run = subprocess.run(["bash", str(INSTALL), str(k)], cwd=root, env=env, capture_output=True, text=True)
        if run.returncode:
            return run
    return run


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
    assert [line.split("#")[0].split()[-1] for line in text.splitlines() if line.startswith("bash")] == [
        str(k + 1) for k in range(len(folders))
    ]
    run = calls(tmp_path, len(folders))  # the device's calls, one part each, pip replaced by a listing
    assert run.returncode == 0, run.stdout + run.stderr
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
    run = calls(tmp_path, len(folders))
    assert run.returncode == 2 and "FAILED" in run.stdout + run.stderr and "extras did not install" in run.stdout
    assert "duckdb" not in (tmp_path / "installed.txt").read_text()  # the base installed, the extras not


def test_a_call_without_its_part_says_so(tmp_path):
    run = subprocess.run(["bash", str(INSTALL), "2"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 2 and ".whl-device/part1 is not here" in run.stdout


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


def test_each_call_lists_benchmarks_whose_options_parse(tmp_path, monkeypatch):
    """tools/device_session.sh N (DRY=1: the benchmarks are listed as they would run, not run) names, in each call,
    benchmarks that exist, under a timeout that sends SIGINT (they print what they measured), with options their
    parsers accept: a renamed option fails here, not on the device."""
    import importlib
    import shlex
    import shutil
    import sys

    (tmp_path / "tools").mkdir()
    for name in ("device_session.sh", "device_install.sh"):
        shutil.copy(dw.ROOT / "tools" / name, tmp_path / "tools" / name)
    monkeypatch.syspath_prepend(str(dw.ROOT / "benchmarks"))
    (tmp_path / ".whl-device" / "part0").mkdir(parents=True)  # nothing to install (each call installs part0)
    listed = []
    for n in (1, 2):
        env = os.environ | {"DRY": "1"}
        env.pop("OUT", None)
        run = subprocess.run(["bash", "tools/device_session.sh", str(n)], cwd=tmp_path, env=env, capture_output=True)
        assert run.returncode == 0, run.stderr
        log = (tmp_path / "out" / "figures" / f"call{n}.txt").read_text()
        cmds = [shlex.split(x.removeprefix("would run: ")) for x in log.splitlines() if x.startswith("would run: ")]
        assert sum(int(w[5]) + int(w[4]) for w in cmds) <= 560  # timeouts and KILL graces fit a call's 600 s
        listed += cmds
    assert [w[7] for w in listed] == [  # the audit, the baselines, the profile, the expected pass, the live loop
        "benchmarks/bench_audit.py",
        "benchmarks/bench_baselines.py",
        "benchmarks/bench_profile.py",
        "benchmarks/bench_expected.py",
        "benchmarks/bench_live.py",
    ]
    for timeout, signal, sig, kill, _grace, seconds, python, script, *args in listed:
        assert (timeout, signal, sig, kill, python) == ("timeout", "-s", "INT", "-k", "python3") and int(seconds) <= 600
        assert (dw.ROOT / script).is_file()
        mod = importlib.import_module(os.path.basename(script).removesuffix(".py"))
        monkeypatch.setattr(sys, "argv", [script, *args])
        mod.args_()  # exits (SystemExit) on an option the benchmark does not take
