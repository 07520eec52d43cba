"""The machine's devices and GPU memory, torch-free: what pages import to list GPUs and what the worker pool
and the extraction checks take as the list of devices this machine has.

Contract: `gpu_memory()` gives per GPU its index, name, total and free bytes and the processes holding memory;
`devices()` the devices an extraction can use (cuda:0..N-1 as CUDA_VISIBLE_DEVICES lets through, then cpu);
`processes()` the compute processes nvidia-smi lists. Everything reads nvidia-smi (or the driver's /proc entry),
which creates no CUDA context, so the app can call it. Neither importing nor calling this module imports torch
or the pipeline: the pages list GPUs in a torch-free process.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def _smi(query: str, what: str) -> list[list[str]]:
    """Rows of `nvidia-smi --query-<what>=<query> --format=csv,noheader,nounits`; [] when unavailable."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-{what}={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def processes() -> list[dict]:
    """The compute processes on the GPUs: gpu_uuid, pid, name, used (bytes); [] without nvidia-smi."""
    procs = []
    for row in _smi("gpu_uuid,pid,process_name,used_memory", "compute-apps"):
        if len(row) >= 4:
            try:
                procs.append({"gpu_uuid": row[0], "pid": int(row[1]), "name": row[2], "used": int(row[3]) << 20})
            except ValueError:
                continue
    return procs


def gpu_memory() -> list[dict]:
    """Per GPU: index, name, total, free (bytes), processes [{pid, name, used}]; [] without CUDA.

    Reads nvidia-smi when present (creates no CUDA context, so the app can call it); else the driver's /proc
    entries (names only: total and free are None)."""
    gpus = []
    for row in _smi("index,name,memory.total,memory.free,uuid", "gpu"):
        try:
            gpus.append(
                {
                    "index": int(row[0]),
                    "name": row[1],
                    "total": int(row[2]) << 20,
                    "free": int(row[3]) << 20,
                    "uuid": row[4],
                }
            )
        except (ValueError, IndexError):
            continue
    if not gpus:  # no nvidia-smi: the driver's /proc entries name the GPUs (memory unknown without a CUDA context)
        gpus = [{"index": i, "name": name, "total": None, "free": None, "uuid": None} for i, name in _proc_gpus()]
    procs = processes()
    for g in gpus:
        g["processes"] = [
            {k: p[k] for k in ("pid", "name", "used")}
            for p in procs
            if p["gpu_uuid"] == g["uuid"] or (g["uuid"] is None and len(gpus) == 1)
        ]
    return gpus


def _proc_gpus() -> list[tuple[int, str]]:
    """(index, model name) per GPU the NVIDIA driver lists under /proc/driver/nvidia/gpus (bus order)."""
    proc = Path("/proc/driver/nvidia/gpus")
    out = []
    for i, d in enumerate(sorted(proc.iterdir()) if proc.is_dir() else []):
        try:
            info = (d / "information").read_text()
        except OSError:
            info = ""
        name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("Model:")), "GPU")
        out.append((i, name))
    return out


def devices() -> list[str]:
    """The devices an extraction can use on this machine, the default first: cuda:0..N-1 for the GPUs nvidia-smi
    (else the driver's /proc entry) shows, as many as CUDA_VISIBLE_DEVICES lets through, then cpu. Torch-free: no
    CUDA context, so the app can call it."""
    n = len(_smi("index", "gpu"))
    if not n:
        proc = Path("/proc/driver/nvidia/gpus")
        n = len(list(proc.iterdir())) if proc.is_dir() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # CUDA stops at the first empty or invalid entry ("" or "-1" hide every GPU)
        shown = 0
        for x in visible.split(","):
            if not x.strip() or x.strip().startswith("-"):
                break
            shown += 1
        n = min(n, shown)
    return [f"cuda:{i}" for i in range(n)] + ["cpu"]


def normalize(device: str) -> str:
    """`cuda` as the device it means, cuda:0; any other name as it is."""
    return "cuda:0" if device == "cuda" else device
