"""Wheels the GPU machine lacks, packed to travel with the working tree (a development script).

The device machine (`.library/device`) has Python 3.12, torch and CUDA but no network, and a call carries at most
64 MiB with the tree (about 30 MB of it). This downloads the wheels the benchmarks need there, at the versions of
constraints.txt, for CPython 3.12 on manylinux x86_64: fla and transformers always, duckdb and ray on request
(bench_stream and bench_ray). Ray's wheel is stripped of its Java jars and its dashboard's web build (neither runs
with `include_dashboard=False`). OUT/part0 (OUT is git-ignored) holds fla and transformers as one tar,
installable in the first call; duckdb and ray go into a second tar split over part0's room and OUT/part1, ...
(at most --part-mib each), joined and checked by its SHA-256 in the last call. The device's calls
(tools/device_install.sh N) are printed at the end and written to OUT/INSTALL.txt.

    python tools/device_wheels.py                         # fla + transformers: one part, about 15 MB
    python tools/device_wheels.py --with duckdb,ray       # and duckdb + slim ray: three parts of 30 MB
"""

from __future__ import annotations

import argparse
import hashlib
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GROUPS = {  # what each benchmark needs beyond the device image
    "base": ["fla-core", "flash-linear-attention", "transformers"],
    "duckdb": ["duckdb"],
    "ray": ["ray", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "attrs"],
}
TAGS = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--only-binary=:all:"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any"]
RAY_UNUSED = re.compile(r"^ray/(jars/|dashboard/client/build/)")  # Java workers, the dashboard's web app


def pinned(names: list[str]) -> list[str]:
    """name==version for each name, from constraints.txt (names compared case- and dash-insensitively)."""
    norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()  # noqa: E731
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, ver = line.split("#")[0].strip().split("==")
            pins[norm(name)] = ver
    missing = [n for n in names if norm(n) not in pins]
    if missing:
        raise SystemExit(f"error: constraints.txt pins no version of {', '.join(missing)}; add them there first")
    return [f"{n}=={pins[norm(n)]}" for n in names]


def download(reqs: list[str], dest: Path) -> None:
    plats = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *TAGS, *plats, "-d", str(dest), *reqs]
    subprocess.run(cmd, check=True)


def slim(wheel: Path) -> int:
    """Rewrite a ray wheel without RAY_UNUSED members (and their RECORD lines); returns the bytes saved."""
    before = wheel.stat().st_size
    tmp = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if RAY_UNUSED.match(info.filename):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                data = ("\n".join(x for x in lines if not RAY_UNUSED.match(x)) + "\n").encode()
            dst.writestr(info, data)
    tmp.replace(wheel)
    return before - wheel.stat().st_size


def tar_of(wheels: list[Path]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for w in wheels:
            tar.add(w, arcname=w.name)
    return buf.getvalue()


def pack(base: list[Path], extra: list[Path], out: Path, part_bytes: int) -> tuple[list[Path], str | None]:
    """OUT/part0 holds base.tar (fla, transformers: installable in the first call) and the first slice of the
    extras' tar; OUT/partK the next slices (extra.partKK). Returns (the part folders, sha256 of the extras' tar)."""
    (out / "part0").mkdir(parents=True)
    head = tar_of(base)
    (out / "part0" / "base.tar").write_bytes(head)
    if not extra:
        return [out / "part0"], None
    blob = tar_of(extra)
    cuts = [0, max(0, part_bytes - len(head))]
    while cuts[-1] < len(blob):
        cuts.append(cuts[-1] + part_bytes)
    folders = []
    for k, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
        (out / f"part{k}").mkdir(exist_ok=True)
        (out / f"part{k}" / f"extra.part{k:02d}").write_bytes(blob[lo:hi])
        folders.append(out / f"part{k}")
    sha = hashlib.sha256(blob).hexdigest()
    (folders[-1] / "extra.sha256").write_text(f"{sha}  out/extra.tar\n")  # for `sha256sum -c` in the last call
    return folders, sha


def install_text(folders: list[Path], sha: str | None) -> str:
    """The device's calls, one per part folder: what each carries and the command that installs it."""
    rel = [f.relative_to(ROOT) for f in folders]
    lines = [
        "# on the device, one call per part folder, back to back on one warm machine (out/ is git-ignored and kept",
        "# while it is warm); tools/device_install.sh N installs what part N-1 completes into out/site, and",
        "# tools/device_session.sh N installs it and runs call N's benchmarks.",
        "# Then: export PYTHONPATH=$PWD/out/site:$PWD",
    ]
    for k, f in enumerate(rel):
        what = "fla and transformers" if k == 0 else "a slice of the extras"
        if sha and k == len(rel) - 1:
            what += f"; joins the extras' tar, checks SHA-256 {sha[:12]}..., installs them"
        lines.append(f"bash tools/device_install.sh {k + 1}    # carry {f}: {what}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--with", dest="extra", default="", help="extra groups, comma-separated: duckdb, ray")
    ap.add_argument("--out", type=Path, default=ROOT / ".whl-device", help="folder of the parts (git-ignored)")
    ap.add_argument("--part-mib", type=float, default=30.0, help="largest part, MiB (a call carries 64 with the tree)")
    a = ap.parse_args(argv)
    groups = ["base", *[g for g in a.extra.split(",") if g]]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise SystemExit(f"error: --with {','.join(unknown)}: unknown group; choose among duckdb, ray")
    shutil.rmtree(a.out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp)
        download(pinned([n for g in groups for n in GROUPS[g]]), dest)
        wheels = sorted(dest.glob("*.whl"))
        for w in wheels:
            if w.name.startswith("ray-"):
                print(f"{w.name}: {slim(w) / 2**20:.1f} MiB of jars and web build removed")
        first = {re.sub(r"[-_.]+", "_", n).lower() for n in GROUPS["base"]}
        base = [w for w in wheels if w.name.split("-")[0].lower() in first]
        folders, sha = pack(base, [w for w in wheels if w not in base], a.out, int(a.part_mib * 2**20))
    for w in wheels:
        print(f"  {w.name}{'  (base)' if w in base else ''}")
    text = install_text(folders, sha)
    (a.out / "INSTALL.txt").write_text(text)
    sizes = [sum(f.stat().st_size for f in d.iterdir()) / 2**20 for d in folders]
    print(f"{len(wheels)} wheels in {len(folders)} part(s) of {', '.join(f'{x:.1f}' for x in sizes)} MiB under {a.out}")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
