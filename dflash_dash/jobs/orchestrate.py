"""An extraction's orchestration of the GPU it shares with the SGLang server, as visible job steps: free the
server's memory (memory-release API, or the stop command of `W/config.toml`), check free GPU memory against the
target's weights (naming the processes that hold memory), extract, then restore the server and wait for /health
200 before reporting done.

Contract: `run_extract` restores the server also when the extraction fails or is cancelled (and says so when
restoring fails too); a memory release waits for the server to be idle first and never runs while a fetch job
of this workspace uses the server (`wait_idle`). Before an extraction starts, `check_extract` (torch-free, over
`gpu.devices()`) refuses a device this machine lacks or an unknown dtype and names the existing extractions it
would duplicate; the Extraction page and `extract` on the CLI both call it. The bytes the extraction will write and
the free disk space are the job's first step (`pipeline.disk`), refused before the server is touched when they do
not fit. Shell commands come only from the
workspace config, run without a shell, and are logged before they run.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from .. import config as config_mod, engines, ops, pipeline
from ..errors import UserError
from ..pipeline import disk
from ..store import Store, new_id
from . import gpu
from .lifecycle import STOPS, Cancelled, Reporter, active
from .workers import placed

STOP_TIMEOUT_S = 120.0  # a stop command and the server going down must finish within this
MEMORY_WAIT_S = 30.0  # released GPU memory may take this long to show as free
IDLE_WAIT_S = 120.0  # before a memory release, wait this long for the server's requests to finish


class OrchestrationError(UserError, RuntimeError):
    """The GPU or the server could not be prepared or restored; the message names what and the fix."""


def run_extract(store: Store, op: ops.Extract, rep: Reporter) -> dict:
    """Extract with the GPU orchestrated around it (the module's contract); returns {"extraction": id}."""
    from .. import target as target_mod  # here: the checks before an extraction never import torch

    cfg = config_mod.load(store.workspace)
    layers = pipeline.layers_of(op.drafter, op.layers)
    info = target_mod.describe(op.target)  # fail on a bad target/set before touching the server
    target_mod.check_layers(info, layers)
    if not store.completion_ids(op.completions):
        raise ops.InputError(f"no completions in set {op.completions!r}; fetch or import them first")
    space = disk.plan(store, op.completions, layers, info.path, op.extraction_id, op.target_topk)
    rep.step(space.line())  # both figures on the job's progress line, before the server is touched
    disk.check(space)
    ex_id = op.extraction_id or new_id("ex")
    op = replace(op, target=info.path, layers=layers, drafter=[], extraction_id=ex_id)
    rep.result({"extraction": ex_id})  # known from the start, so a rerun resumes it
    known = {e.id: e.status for e in store.extractions()}
    if known.get(ex_id) not in (None, "done"):
        store.set_status("extractions", ex_id, "running")
    op, runner = placed(store, op)  # devices (or the Ray cluster) checked before the server is touched
    client = engines.for_workspace(cfg, op.server)
    freed = None
    try:
        freed = free_gpu(client, cfg, op.orchestrate, rep)
        for dev in op.local_devices():
            check_memory(info.path, dev, cfg.gpu_memory_margin_gb, rep)
        rep.step(f"loading target {info.path} on {'the Ray cluster ' + op.ray if op.ray else ', '.join(op.devices())}")

        def progress(done: int, total: int, msg: str) -> None:
            rep(done, total, f"extracting {done}/{total}: {msg}" if done else msg)

        ex_id = pipeline.perform(store, op, progress, runner)["extraction"]
    except BaseException as e:
        if any(x.id == ex_id and x.status != "done" for x in store.extractions()):
            cancelled = isinstance(e, Cancelled) or bool(STOPS)  # also a cancel that surfaced as another error
            store.set_status("extractions", ex_id, "cancelled" if cancelled else "failed")
        if freed:
            rep.note(f"extraction stopped ({type(e).__name__}: {e}); restoring the server first")
            try:
                restore(client, cfg, freed, rep)
            except Exception as r:  # noqa: BLE001  (report both failures)
                raise OrchestrationError(f"{e}; restoring the server failed too: {r}") from e
        raise
    if freed:
        restore(client, cfg, freed, rep)
    return {"extraction": ex_id}


def free_gpu(client: engines.EngineClient, cfg: config_mod.WorkspaceConfig, mode: str, rep: Reporter) -> str | None:
    """Free the GPU the server holds: "release" (memory-release API), "command" (stop command) or None."""
    if mode == "none":
        rep.note("orchestrate none: the server is left as it is")
        return None
    cmds = config_mod.describe_commands(cfg)
    rep.note(f"server {client.url}; configured commands: {'; '.join(cmds) if cmds else 'none'}")
    if mode == "release":
        ok, state = client.health()
        if not ok and not state[:1].isdigit():
            raise OrchestrationError(
                f"the server at {client.url} is not reachable ({state}), so its memory "
                "cannot be released; start it, or extract with orchestrate none"
            )
        if cfg.memory_release and client.supports_memory_release():
            wait_idle(client, cfg, rep)
            rep.step("releasing server memory (POST /release_memory_occupation)")
            try:
                client.release_memory()
            except engines.ServerError as e:
                raise OrchestrationError(
                    f"the server at {client.url} did not release its memory: {e}. If a "
                    "request started meanwhile, extract again once it has finished"
                ) from None
            return "release"
        why = "memory_release = false in config.toml" if not cfg.memory_release else client.no_release()
        if not cfg.stop_command:
            raise OrchestrationError(
                f"cannot free the GPU: {why}, and [server] stop_command is not set in "
                f"{config_mod.path_of(rep.store.workspace)}; configure stop_command and "
                "start_command, or extract with orchestrate none"
            )
        rep.note(f"{why}; using the stop command instead")
    if not cfg.stop_command or not cfg.start_command:
        raise OrchestrationError(
            f"orchestrate command needs stop_command and start_command under [server] in "
            f"{config_mod.path_of(rep.store.workspace)}"
        )
    rep.step(f"stopping server: {shlex.join(cfg.stop_command)}")
    try:
        rc = subprocess.run(cfg.stop_command, stdin=subprocess.DEVNULL, timeout=STOP_TIMEOUT_S).returncode
    except FileNotFoundError:
        raise OrchestrationError(
            f"stop command {cfg.stop_command[0]!r} not found; fix [server] stop_command in config.toml"
        ) from None
    except subprocess.TimeoutExpired:
        raise OrchestrationError(f"stop command did not finish within {STOP_TIMEOUT_S:g} s") from None
    if rc != 0:
        raise OrchestrationError(
            f"stop command `{shlex.join(cfg.stop_command)}` exited with {rc}; see the job "
            "log; the server was not stopped"
        )
    rep.step("waiting for the server to stop")
    deadline = time.monotonic() + min(STOP_TIMEOUT_S, cfg.readiness_timeout)
    while True:
        ok, state = client.health()
        if not ok and not state[:1].isdigit() and state != "timeout":  # no connection: the process is gone
            return "command"
        if time.monotonic() > deadline:
            raise OrchestrationError(f"the server at {client.url} still answers ({state}) after the stop command")
        time.sleep(0.2)


def wait_idle(
    client: engines.EngineClient,
    cfg: config_mod.WorkspaceConfig,
    rep: Reporter,
    timeout: float = IDLE_WAIT_S,
    poll: float = 0.25,
) -> None:
    """Before a memory release: SGLang asserts its scheduler is idle, so never release under load. Raises
    OrchestrationError when a fetch job of this workspace runs against the server, or when the server still
    reports running/waiting requests after `timeout` seconds (or cannot report them at all)."""
    url = client.url.rstrip("/")
    fetching = [
        j.id
        for j in active(rep.store)
        if j.kind == "fetch" and ((j.args or {}).get("server") or cfg.server_url).rstrip("/") == url
    ]
    if fetching:
        raise OrchestrationError(
            f"fetch job {', '.join(fetching)} is running against {url}; its memory cannot be "
            "released under load. Wait for the fetch to finish or cancel it (Completions page, "
            "or `jobs cancel ID`), then extract again"
        )
    rep.step("waiting for the server to be idle (GET /v1/loads)")
    t0 = time.monotonic()
    while True:
        try:
            n = client.running_requests()
        except engines.ServerError as e:
            raise OrchestrationError(f"cannot tell whether {url} is idle: {e}") from None
        if n is None:
            raise OrchestrationError(
                f"the server at {url} reports no load (neither GET /v1/loads nor /get_load), "
                "so it is unknown whether requests run, and SGLang may release memory only "
                "when idle; upgrade SGLang, or extract with orchestrate command"
            )
        if n == 0:
            rep.note("server idle: no running or waiting requests")
            return
        waited = time.monotonic() - t0
        if waited >= timeout:
            raise OrchestrationError(
                f"the server at {url} still has {n} running or waiting request(s) after "
                f"{timeout:g} s; SGLang releases memory only when idle, so nothing was "
                "released. Let those requests finish (or stop their client) and extract "
                "again, or use orchestrate command"
            )
        rep(0, 0, f"waiting for the server to be idle: {n} request(s) running or waiting ({waited:.0f} s)")
        time.sleep(min(poll, timeout - waited))


def restore(client: engines.EngineClient, cfg: config_mod.WorkspaceConfig, freed: str, rep: Reporter) -> None:
    """Give the server its GPU back and wait for /health 200 (SIGTERM is ignored meanwhile)."""
    proc = None
    if freed == "command":  # spawned before SIGTERM is ignored: the server must not inherit SIG_IGN
        rep.step(f"restoring server: {shlex.join(cfg.start_command)}")
        try:
            proc = subprocess.Popen(cfg.start_command, stdin=subprocess.DEVNULL, start_new_session=True)
        except FileNotFoundError:
            raise OrchestrationError(
                f"start command {cfg.start_command[0]!r} not found; fix [server] "
                "start_command in config.toml and start the server by hand"
            ) from None
    try:
        old = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:  # not the main thread
        old = None
    try:
        if freed == "release":
            rep.step("restoring server (POST /resume_memory_occupation)")
            client.resume_memory()
        rep.step("waiting for /health")

        def progress(elapsed: float, state: str) -> None:
            rep(0, 0, f"waiting for /health: {state} ({elapsed:.0f} s)")
            if proc is not None and proc.poll() not in (None, 0):
                raise OrchestrationError(
                    f"start command `{shlex.join(cfg.start_command)}` exited with {proc.returncode}; see the job log"
                )

        client.wait_ready(cfg.readiness_timeout, progress=progress)
        rep.step("server ready")
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def weights_bytes(model_dir: str | Path) -> int:
    """Bytes of the target's weight files (safetensors, else .bin)."""
    files = list(Path(model_dir).glob("*.safetensors")) or list(Path(model_dir).glob("*.bin"))
    return sum(f.stat().st_size for f in files)


def check_extract(
    store: Store, target: str, set_name: str, layers: list[int], device: str, dtype: str, resume: str | None = None
) -> list[str]:
    """Check an extraction's device and dtype before anything starts (the Extraction page and `extract` on the
    CLI both call this, so both say the same): raises ops.InputError naming the field and the fix for a
    device this machine lacks (`cuda` without a CUDA GPU) or an unknown dtype. Returns one warning per existing
    extraction (done or running, `resume` excepted) the new one would duplicate: same completion set, target,
    device (so backend) and dtype, holding every one of `layers` (a drafter replays on any extraction holding its
    layers, so a superset serves it too)."""
    ops.check_dtype(dtype)
    ops.check_device(device.strip())
    dev = gpu.normalize(device.strip())
    have = gpu.devices()
    if dev not in have:
        if have == ["cpu"]:
            raise ops.InputError(
                f"device {device!r}: this machine has no CUDA GPU (nvidia-smi shows none); set device to cpu "
                "(extraction then uses the torch path of the linear-attention kernels), or extract on a GPU machine"
            )
        raise ops.InputError(f"device {device!r}: this machine has no such GPU; set device to one of {', '.join(have)}")
    path = str(Path(target).resolve())
    same = [
        e
        for e in store.extractions()
        if e.id != resume
        and e.status in ("done", "running")
        and e.set_name == set_name
        and e.target_path == path
        and not ops.missing_layers(list(e.layer_ids or []), list(layers))
        and gpu.normalize(e.device) == dev
        and e.dtype == dtype
    ]
    return [
        f"extraction {e.id} ({e.status}, backend {e.backend}) already holds set {set_name!r} from this "
        f"target at layers {','.join(map(str, e.layer_ids))} on {e.device} in {e.dtype}: a new one at "
        f"layers {','.join(map(str, layers))} would duplicate it"
        + ("" if list(e.layer_ids) == list(layers) else " (each drafter replays on its own layers of it)")
        for e in same
    ]


def check_memory(model_dir: str, device: str, margin_gb: float, rep: Reporter) -> None:
    """Wait (up to MEMORY_WAIT_S) until the device has the target's weight bytes + margin free; else raise
    OrchestrationError naming the processes that hold memory. Skipped (with a note) off CUDA."""
    rep.step("checking GPU memory")
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        rep.note(f"device {device}: no CUDA device in use, GPU memory check skipped")
        return
    idx = int(device.split(":", 1)[1]) if ":" in device else 0
    need = weights_bytes(model_dir) + int(margin_gb * (1 << 30))
    deadline = time.monotonic() + MEMORY_WAIT_S
    while True:
        free, total = torch.cuda.mem_get_info(idx)
        if free >= need:
            rep.note(
                f"cuda:{idx}: {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB; the target needs "
                f"about {need / 2**30:.1f} GiB (weights + {margin_gb:g} GiB margin)"
            )
            return
        if time.monotonic() > deadline:
            break
        time.sleep(1.0)
    uuid = str(getattr(torch.cuda.get_device_properties(idx), "uuid", "") or "")
    procs = [p for p in gpu.processes() if not uuid or p["gpu_uuid"].removeprefix("GPU-") == uuid.removeprefix("GPU-")]
    held = (
        ", ".join(
            f"pid {p['pid']} {p['name']} ({p['used'] / 2**30:.1f} GiB{', this job' if p['pid'] == os.getpid() else ''})"
            for p in procs
        )
        or "unknown"
    )
    raise OrchestrationError(
        f"cuda:{idx} has {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB, but the target needs about "
        f"{need / 2**30:.1f} GiB (weights + {margin_gb:g} GiB margin); processes holding GPU memory: {held}. "
        "Free the GPU (orchestrate release or command) or stop those processes"
    )
