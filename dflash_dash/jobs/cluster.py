"""Ray as the engine across machines: the per-prompt work of an operation (extract, replay, sweep, --stream) run by
one worker per GPU on every host of a Ray cluster (`--ray auto|HOST:PORT`; `pip install 'dflash-dash[ray]'`).

Contract:
- `placed(store, op)` is what the CLI and the job process call for an op with `ray`: it connects to the cluster
  (`connect`), sizes the workers (`plan`) and checks that every host sees the workspace (`probe`), all before any
  work, and returns (the op with `device` set to the workers' kind, its Runner). Bad input raises a ClusterError
  (a UserError naming the problem and the fix): ray not installed, an address that does not answer, a host that
  does not see the workspace path, a GPU count (`ray_gpus`) that is not the cluster's, a CPU-only cluster without
  `ray_cpus`.
- Token authentication (Ray 2.52+; on by default for a cluster `ray.init()` starts, and for `ray start --head` where
  a token exists): Ray's `ray.init(address=HOST:PORT)` never turns it on for an explicit address (ray/_private/
  worker.py: "an explicit address ... never does"), so the GCS refuses the driver and ray.init retries for ~20 s,
  then says only "Failed to connect". `connect` asks the GCS first (one `GcsClient`, as ray/_private/node.py does)
  with the token Ray would send (RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token:
  Ray's own precedence), turning this process's token mode on where a token exists (a cluster without
  authentication ignores it); a refusal says it is the token's, which source it came from, and the fix.
- Workers: on a cluster with GPUs, one Ray task per GPU (`num_gpus=1`; Ray hands each its device, `cuda:0` inside
  it), every GPU of every host; on a cluster without GPUs, `ray_cpus` tasks of one CPU slot each (one thread each:
  Ray sets OMP_NUM_THREADS). The prompt ids are dealt round-robin, as the one-host pool deals them
  (`jobs.workers`): task i runs `pipeline.work` on ids[i::n] with the op's worker spec, sent as `wire.encode_spec`.
- Each task is a Ray streaming generator (`shard`): it yields its events as the pool's JSON lines (`wire.plain`
  packing), in the work's own deterministic order, and the driver (this process) reads them back with
  `wire.unpacked`. The driver alone writes the store: the workers read it and write feature files under the
  shared workspace. A worker lost mid-job (its process or its host) is re-run by Ray (`RETRIES`): its generator
  starts again and Ray hands the driver only the events it has not had yet (the driver also drops any event it
  has seen: an item, a checkpoint's prompt), so the job ends complete, with the results of one run; an extraction
  rewrites the lost worker's files atomically, byte for byte. Out of retries, or a worker's user error: the job
  fails naming the worker (`WorkerError`), what finished is kept and a rerun resumes, as with the pool.
- Progress travels beside the events (a `Board` actor the workers tick, polled by the driver), so a retry never
  reorders the events; the driver reports the workers' sum. Leaving early (an error, a cancel from the pages:
  SIGTERM to the job) cancels every task (`ray.cancel(force=True)`), so no worker outlives its job.
Ray is imported inside the functions: without the extra nothing here is loaded.
"""

from __future__ import annotations

import io
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from .. import ops, pipeline
from ..errors import UserError
from ..store import Store
from . import wire
from .failure import WorkerError

RETRIES = 3  # times Ray re-runs a worker lost mid-job (its process or its host) before the job fails
PROBE_S = 5.0  # seconds a cluster address (and each host's workspace check) may take to answer
TICK_S = 0.25  # a worker sends its progress at most this often
PROBE_FILE = ".ray-probe"  # the name's start of the token file the driver writes in the workspace (`probe`)
TOKEN_FILE = Path("~/.ray/auth_token")  # Ray's default token file (authentication_token_setup.py)
FIX_TOKEN = (
    "copy the cluster's token (`ray get-auth-token` on its head prints it) into ~/.ray/auth_token on this host, or "
    "set RAY_AUTH_TOKEN_PATH to a file holding it, in the environment of the CLI or of the dashboard's server (its "
    "jobs inherit it)"
)


class ClusterError(UserError, RuntimeError):
    """The Ray cluster cannot run this job as asked; the message names the problem and the fix."""


@dataclass(frozen=True)
class Plan:
    """The workers of one job on one cluster, decided before any work."""

    address: str  # the cluster's GCS address (HOST:PORT)
    device: str  # the workers' kind: cuda (one per GPU) or cpu (one CPU slot each)
    workers: int  # how many tasks the prompts are dealt to
    hosts: dict[str, int]  # host -> its GPUs (cuda) or CPUs (cpu), for the messages


def _ray():
    try:
        import ray
    except ImportError:
        raise ClusterError(
            "ray: the ray package is not installed here; install the extra (pip install 'dflash-dash[ray]'), "
            "or run without --ray"
        ) from None
    return ray


def connect(address: str) -> str:
    """Connect this process to the cluster at `address` (auto: the one this host runs, or RAY_ADDRESS; HOST:PORT:
    that one, which must answer within PROBE_S); returns its GCS address. A process already connected keeps its
    connection when `address` is auto or that cluster's."""
    ray = _ray()
    have = ray.get_runtime_context().gcs_address if ray.is_initialized() else None
    if have and address in ("auto", have):
        return have
    if address != "auto":
        host, port = address.rsplit(":", 1)
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_S).close()
        except OSError as e:
            raise ClusterError(
                f"ray {address}: nothing answers at that address ({e.strerror or e}); start the cluster "
                "(`ray start --head` prints its address) or give the address it printed; --ray auto uses the "
                "cluster this host runs"
            ) from None
        _authenticate(address)
    if have:
        raise ClusterError(f"ray {address}: this process is already connected to the cluster at {have}; give that")
    kept = _handlers()
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
        _restore(kept)  # Ray's own SIGTERM handler would end a job without its cancel (lifecycle: Cancelled)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
        where = "no Ray cluster runs on this host and RAY_ADDRESS is unset" if address == "auto" else str(e)
        raise ClusterError(
            f"ray {address}: could not connect ({where.splitlines()[0]}); start one with `ray start --head` (or "
            "give the address of a running cluster as HOST:PORT)"
        ) from None
    return ray.get_runtime_context().gcs_address


def _token() -> tuple[str, str] | None:
    """(where Ray would read this process's authentication token from, the fix where it is not the cluster's), in
    Ray's precedence: RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH names, ~/.ray/auth_token; None where there is
    none. A RAY_AUTH_TOKEN_PATH that cannot be read is refused (Ray aborts on it)."""
    got = "the cluster's token (`ray get-auth-token` on its head prints it)"
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN", f"set RAY_AUTH_TOKEN to {got}"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        try:
            ok = Path(path).expanduser().read_text().strip() != ""
        except OSError as e:
            raise ClusterError(
                f"ray: RAY_AUTH_TOKEN_PATH {path}: cannot read the token file ({e.strerror or e}); point it at the "
                "file holding the cluster's token, or unset it"
            ) from None
        if not ok:
            raise ClusterError(f"ray: RAY_AUTH_TOKEN_PATH {path}: the token file is empty; {FIX_TOKEN}")
        return f"RAY_AUTH_TOKEN_PATH ({path})", f"write {got} into {path}"
    if TOKEN_FILE.expanduser().is_file():
        return f"{TOKEN_FILE} ({TOKEN_FILE.expanduser()})", f"write {got} into it, or set RAY_AUTH_TOKEN_PATH to a file"
    return None


def _authenticate(address: str) -> None:
    """Make this process speak the authentication of the cluster at `address` before `ray.init`, or refuse in one
    line naming the token's source and the fix (the module's contract)."""
    try:
        from ray._raylet import Config, GcsClient
        from ray.exceptions import AuthenticationError
    except ImportError:  # a Ray without token authentication (before 2.52): nothing to send
        return
    mode = os.environ.get("RAY_AUTH_MODE", "").lower()
    source = _token()
    if source and mode == "":
        os.environ["RAY_AUTH_MODE"] = "token"  # as Ray's `_enable_token_auth` (authentication_token_setup.py)
        Config.initialize("")  # so this process's RayConfig reads the mode again
        mode = "token"
    try:
        with _quiet():
            GcsClient(address=address)
    except AuthenticationError:
        if mode == "disabled":
            raise ClusterError(
                f"ray {address}: the cluster requires Ray's token authentication and RAY_AUTH_MODE is disabled in "
                f"this environment; unset it, and {FIX_TOKEN}"
            ) from None
        if source is None:
            raise ClusterError(
                f"ray {address}: the cluster requires Ray's token authentication and this host has no token (none in "
                f"RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or {TOKEN_FILE}); {FIX_TOKEN}"
            ) from None
        raise ClusterError(
            f"ray {address}: the cluster refused the authentication token from {source[0]}: it is not the cluster's "
            f"token; {source[1]}"
        ) from None
    except Exception:  # noqa: BLE001  (anything else: ray.init meets it and names it, as before)
        return


@contextmanager
def _quiet():
    """Stderr (fd 2) closed for a moment: Ray's C++ client logs a refused attempt there itself, and the refusal
    says it in one line instead."""
    sys.stderr.flush()
    kept = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(kept, 2)
        os.close(kept)


def _handlers() -> dict:
    """This process's SIGTERM and SIGINT handlers (the job's cancel), to put back after `ray.init` replaced them."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}


def _restore(kept: dict) -> None:
    for s, h in kept.items():
        if h is not None:
            signal.signal(s, h)


def plan(address: str, ray_gpus: int | None, ray_cpus: int | None, nodes: list[dict] | None = None) -> Plan:
    """The workers on the connected cluster (see the module's contract; `nodes`: its `ray.nodes()`, read when
    None), refused when the counts asked for are not the cluster's."""
    nodes = [n for n in (_ray().nodes() if nodes is None else nodes) if n.get("Alive")]
    gpus = {n["NodeManagerAddress"]: int(n["Resources"].get("GPU", 0)) for n in nodes}
    cpus = {n["NodeManagerAddress"]: int(n["Resources"].get("CPU", 0)) for n in nodes}
    total = sum(gpus.values())

    def listed(d: dict[str, int]) -> str:
        return ", ".join(f"{h}: {c}" for h, c in d.items())

    if total:
        if ray_cpus is not None:
            raise ClusterError(
                f"ray_cpus {ray_cpus}: the cluster at {address} has {total} GPUs ({listed(gpus)}), one worker each; "
                "drop --ray-cpus"
            )
        if ray_gpus is not None and ray_gpus != total:
            raise ClusterError(
                f"ray_gpus {ray_gpus}: the cluster at {address} has {total} GPUs ({listed(gpus)}); give "
                f"--ray-gpus {total}, or leave it out to use every GPU the cluster has"
            )
        return Plan(address, "cuda", total, {h: c for h, c in gpus.items() if c})
    if ray_gpus is not None:
        raise ClusterError(
            f"ray_gpus {ray_gpus}: the cluster at {address} has no GPUs (CPUs: {listed(cpus)}); give --ray-cpus N "
            "for N CPU workers, or connect to a cluster with GPUs"
        )
    if ray_cpus is None:
        raise ClusterError(
            f"ray_cpus: the cluster at {address} has no GPUs; give --ray-cpus N to run N CPU workers (it has "
            f"{sum(cpus.values())} CPUs: {listed(cpus)})"
        )
    if ray_cpus > sum(cpus.values()):
        raise ClusterError(
            f"ray_cpus {ray_cpus}: the cluster at {address} has {sum(cpus.values())} CPUs ({listed(cpus)}); give "
            "at most that many CPU workers"
        )
    return Plan(address, "cpu", ray_cpus, cpus)


def _sees(path: str, token: str) -> tuple[str, bool]:
    """(this host's name, whether `path` holds `token`): a host's view of the shared workspace."""
    try:
        return socket.gethostname(), Path(path).read_text() == token
    except OSError:
        return socket.gethostname(), False


def probe(workspace: Path, sees: Callable[[str, str], tuple[str, bool]] = _sees) -> None:
    """Refuse a cluster whose hosts do not all see `workspace` at the same path (features are written there and
    the workers read the completions from it): a token file written here must read back the same on every host
    (`sees`, run once on each host: `_sees`; a test stands in a host that does not)."""
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    token = uuid.uuid4().hex
    path = workspace.resolve() / f"{PROBE_FILE}-{token[:12]}"  # one per check: jobs may start side by side
    path.write_text(token)
    task = ray.remote(num_cpus=0, max_retries=0)(sees)
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        refs = {
            n["NodeManagerAddress"]: task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote(str(path), token)
            for n in nodes
        }
        blind = []
        for addr, ref in refs.items():
            try:
                host, ok = ray.get(ref, timeout=60 * PROBE_S)
            except Exception as e:  # noqa: BLE001  (a host that cannot run the check: named with its reason)
                raise ClusterError(
                    f"ray: host {addr} could not run the workspace check ({type(e).__name__}: "
                    f"{str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}); install dflash-dash with its "
                    "ray extra on every host of the cluster"
                ) from None
            if not ok:
                blind.append(f"{host} ({addr})")
        if blind:
            raise ClusterError(
                f"ray: the workspace {workspace.resolve()} is not shared with host(s) {', '.join(blind)} (they do not "
                "see this workspace at that path); mount it at the same path on every host of the cluster (the "
                "features are written there), or run without --ray"
            )
    finally:
        path.unlink(missing_ok=True)


def placed(store: Store, op: ops.Op, where: ops.Placement) -> tuple[ops.Op, pipeline.Runner]:
    """(op with `device` set to its workers' kind, the Runner over the cluster's workers): the cluster of placement
    `where` (the op's, with `ray`) connected, sized and probed before any work (see the module's contract)."""
    assert where.ray is not None
    address = connect(where.ray)
    p = plan(address, where.ray_gpus, where.ray_cpus)
    probe(store.workspace)
    return replace(op, device=p.device), runner(store, p)


class Board:
    """The progress of a job's workers (a Ray actor): each worker's latest (done, total, message)."""

    def __init__(self):
        self.latest: dict[int, tuple[int, int, str]] = {}

    def tick(self, i: int, done: int, total: int, msg: str) -> None:
        self.latest[i] = (done, total, msg)

    def read(self) -> dict[int, tuple[int, int, str]]:
        return dict(self.latest)


def shard(workspace: str, spec: bytes, i: int, board=None) -> Iterator[str]:
    """One worker's task (a Ray streaming generator): run `pipeline.work` on the shard of `spec` (`wire.encode_spec`)
    and yield its events as JSON text ({"event": ...} packed by `wire.plain`), or {"error": message} for a user
    error; its progress goes to `board` (at most every TICK_S)."""
    spec, prompts = wire.decode_spec(io.BytesIO(spec))
    last = [0.0]
    where = f"{socket.gethostname()} pid {os.getpid()}"

    def progress(done: int, total: int, msg: str) -> None:
        now = time.monotonic()
        if board is not None and (now - last[0] >= TICK_S or (total and done >= total)):
            last[0] = now
            board.tick.remote(i, done, total, f"{msg} [worker {i + 1}, {where}]")

    progress(0, len(prompts), f"started on {spec.device}")
    try:
        for ev in pipeline.work(Store(workspace), spec, prompts, progress):
            yield json.dumps({"event": ev}, default=wire.plain)
    except UserError as e:
        yield json.dumps({"error": str(e)})


def _key(ev: dict):
    """What identifies a worker's event, so one a retried worker sends again is dropped; None: always passed on (a
    target's backend, which the handlers check for agreement)."""
    if "item" in ev:
        return ("item", ev["item"])
    if "result" in ev:
        return ("result", ev["checkpoint"], ev["result"]["id"])
    return None


def runner(store: Store, p: Plan, body: Callable = shard) -> pipeline.Runner:
    """A pipeline Runner over plan `p`'s workers (the module's contract). `body` is the task run on each shard
    (`shard`; a test wraps it to lose a worker)."""
    ray = _ray()
    workspace = str(store.workspace.resolve())
    res = {"num_gpus": 1, "num_cpus": 0} if p.device == "cuda" else {"num_cpus": 1}
    dev = "cuda:0" if p.device == "cuda" else "cpu"  # inside a GPU task Ray makes its GPU the only one visible
    task = ray.remote(max_retries=RETRIES, retry_exceptions=False, **res)(body)

    def run(spec: ops.Work, ids: list, progress: pipeline.Progress) -> Iterator[dict]:
        shards = [(i, ids[i :: p.workers]) for i in range(p.workers)]
        shards = [(i, s) for i, s in shards if s]
        board = ray.remote(num_cpus=0)(Board).remote()
        gens = {i: task.remote(workspace, wire.encode_spec(replace(spec, device=dev), s), i, board) for i, s in shards}
        state = {i: (0, len(s)) for i, s in shards}
        q: queue.Queue = queue.Queue()
        for i, g in gens.items():
            threading.Thread(target=_pump, args=(ray, i, g, q), daemon=True).start()
        seen: set = set()
        live = set(gens)
        shown: dict = {}
        polled = 0.0
        try:
            if progress:
                progress(0, len(ids), f"started {len(gens)} {p.device} workers on the Ray cluster at {p.address}")
            while live:
                try:
                    i, msg = q.get(timeout=0.5)
                except queue.Empty:
                    i = msg = None
                if i is not None and msg is None:
                    live.discard(i)
                elif isinstance(msg, BaseException):
                    raise WorkerError(_failed(i, p, msg, state[i])) from None
                elif msg is not None:
                    got = json.loads(msg)
                    if "error" in got:
                        raise WorkerError(f"worker {i + 1} of {p.workers} ({p.device}): {got['error']}")
                    key = _key(got["event"])
                    if key is None or key not in seen:
                        seen.add(key)
                        yield wire.unpacked(got["event"])
                if progress and (not live or time.monotonic() - polled >= TICK_S):
                    polled = time.monotonic()
                    _show(progress, ray.get(board.read.remote()), shown, state)
        finally:
            for i in live:
                ray.cancel(gens[i], force=True)
            ray.kill(board)

    return run


def _show(progress: Callable, latest: dict, shown: dict, state: dict) -> None:
    """Each worker's new tick (from the `Board`) as a progress line: the workers' sums, that worker's message (a
    retried worker starts its count again)."""
    for j, (d, t, m) in sorted(latest.items()):
        state[j] = (d, t or state[j][1])
        if shown.get(j) != (d, t, m):
            shown[j] = (d, t, m)
            progress(sum(x for x, _ in state.values()), sum(x for _, x in state.values()), m)


def _pump(ray, i: int, gen, q: queue.Queue) -> None:
    """Forward a worker's yielded texts to the queue, then None at its end (or the exception that ended it)."""
    try:
        for ref in gen:
            q.put((i, ray.get(ref)))
        q.put((i, None))
    except BaseException as e:  # noqa: BLE001  (handed to the driver's loop)
        q.put((i, e))


def _failed(i: int, p: Plan, e: BaseException, state: tuple[int, int]) -> str:
    """The job's error for worker i's end: an exception its work raised (not retried: the same input would raise it
    again), or its process or host lost more often than Ray retries."""
    from ray.exceptions import RayTaskError

    text = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    last = (text[-1] if text else type(e).__name__)[:400]
    who = f"worker {i + 1} of {p.workers} ({p.device}) on the Ray cluster at {p.address}"
    if isinstance(e, RayTaskError):
        return f"{who} raised after {state[0]} of {state[1]} prompts: {last}. What finished is kept: rerun to continue"
    return (
        f"{who} was lost after {state[0]} of {state[1]} prompts, {RETRIES} retries spent ({type(e).__name__}: "
        f"{last}). What finished is kept: rerun to continue"
    )
