"""The built-in demo workspace: a small trained hybrid target, DFlash checkpoints and a shipped fla extraction.

Contract: `build(workspace, progress)` makes `workspace` hold the demo, through the same operations a user runs: the
committed assets (`assets/`, described by `assets/MANIFEST.json`) are copied to `<workspace>/demo/`; the local SGLang
stand-in serves the target in a subprocess, decoding speculatively with the final checkpoint (`server_argv`: the same
greedy tokens, with SGLang's per-step counters), while `pipeline.fetch` stores the greedy completions of `coding-10` and
those counters (engine `sglang`, for the Conformance page); `pipeline.extract` extracts them on the CPU (torch path);
the coding-10 features that were extracted on a GPU with fla kernels are imported as a second extraction (backend `fla`)
for the completions whose token ids equal the shipped ones (any that differ are left out and named in
`<workspace>/demo/BUILD.json` and the log); then every checkpoint of MANIFEST.json's `checkpoints` list (`checkpoints`:
`healthy/step{NNNN}/` snapshots of one healthy run, roles early / series / final, and `bugs/{name}/`, role bug) is
replayed on the torch extraction under its listed name, in the listed order, and the final one on the fla extraction too
(name + FLA_SUFFIX); the extras (`extras`) add, among others, coding-10 sampled at a temperature (`extras.SAMPLED_SET`,
fetched beside the greedy sets and extracted on the CPU with the target's top-K, before the greedy set) and the final
checkpoint's replay on it at that temperature (name + `extras.SAMPLED_SUFFIX`, after the plan's replays). Idempotent and
resumable: what the store already holds is not redone, and a workspace that has all the demo runs is left as it is (the
demo's extractions are the oldest of their kind: one the user adds later, e.g. by Re-extract, gets no demo runs). No
network beyond the local server on 127.0.0.1. `configure(workspace)` (called by `build`, also on a built workspace)
writes `<workspace>/config.toml` when there is none, pointing `[server] url` at `SERVER_URL`: the port where `make run`
(`dflash_dash.launch`) serves the demo target beside the dashboard, so that fetching and re-extracting with
orchestration work from the pages. An existing config.toml is never touched. `story(workspace, runs)` is what the
Overview of a demo workspace tells (the checkpoints' `what` sentences and the runs that reveal each); `series_folder` is
where the sweep chart opens; `served_drafter` is the checkpoint the demo server decodes with. The assets were made by
`python -m tools.demo.make_assets` (development tooling in `tools/demo/`, outside this package).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError
from . import extras
from .local import (
    MAX_NEW_TOKENS as MAX_NEW_TOKENS,
    PROMPT_SET as PROMPT_SET,
    SET_NAME,
    server_argv as server_argv,  # server_argv: what launch runs
)

if TYPE_CHECKING:
    from ..store import Extraction, Run

ASSETS = Path(__file__).parent / "assets"  # committed assets (MANIFEST.json describes them)
TARGET = "target"  # target folder name (weights + tokenizer)
CHECKPOINTS = (
    "checkpoints"  # drafter checkpoints: healthy/step{NNNN}/ (one run), bugs/{name}/ (MANIFEST.json lists them)
)
SERIES = "healthy"  # the healthy run's snapshots, under CHECKPOINTS: the sweep chart's folder
ROLES = ("early", "series", "final", "bug", "family")  # a checkpoint's role in MANIFEST.json (family: another
# drafter family's checkpoint, checkpoints/families/{family}/)
FLA = "fla"  # shipped fla extraction of coding-10 (features/ + completions.jsonl)
LAYER_IDS = [1, 3, 5]  # target layers the demo drafters read
TREE_BUDGET = 8  # DDTree-8 in every demo run
FLA_SUFFIX = " @fla"  # run-name suffix of the replay on the fla extraction
SERVER_URL = "http://127.0.0.1:30100"  # where `make run` serves the demo target (not SGLang's 30000)

Progress = Callable[[int, int, str], None] | None


class DemoError(UserError, RuntimeError):
    """The demo cannot be built; the message names the problem and the fix."""


# ---------------------------------------------------------------------------
# what the demo holds


@dataclass(frozen=True)
class Checkpoint:
    """One demo checkpoint, as MANIFEST.json's `checkpoints` list describes it."""

    path: Path  # the checkpoint folder (resolved)
    dir: str  # its folder under checkpoints/ (healthy/step0038, bugs/anchor-visible)
    name: str  # the run name its replays get (the fla replay: name + FLA_SUFFIX)
    role: str  # early, series, final (the healthy run's snapshots) or bug
    bug: str | None  # the training bug (noisy_labels, anchor_visible, soft_kl) of a bug checkpoint
    what: str  # one sentence a newcomer understands


def checkpoints(root: Path, man: dict | None = None) -> list[Checkpoint]:
    """The demo checkpoints under `root` (a `checkpoints/` folder) in the order MANIFEST.json lists them (`man`, or
    the manifest beside `root`). The list must hold one `final` checkpoint, every role one of ROLES, a bug name on
    each bug checkpoint and every folder present: anything else is a DemoError naming the entry."""
    root = Path(root)
    man = manifest(root.parent) if man is None else man
    where = f"{root.parent / 'MANIFEST.json'}"
    listed = man.get("checkpoints")
    if not isinstance(listed, list) or not listed:
        raise DemoError(f"{where} has no `checkpoints` list; remake the demo assets (python -m tools.demo.make_assets)")
    out = []
    for i, e in enumerate(listed):
        if not isinstance(e, dict) or e.get("role") not in ROLES or not e.get("dir") or not e.get("name"):
            raise DemoError(
                f"{where}: checkpoints[{i}] = {e!r}: give dir, name, role ({', '.join(ROLES)}), bug and what"
            )
        if (e["role"] == "bug") != bool(e.get("bug")):
            raise DemoError(f"{where}: checkpoints[{i}] ({e['dir']}): a bug name goes with role bug, and only there")
        path = (root / e["dir"]).resolve()
        if not (path / "config.json").is_file():
            raise DemoError(f"{where}: checkpoints[{i}]: {path} holds no config.json; restore the demo assets")
        out.append(Checkpoint(path, e["dir"], e["name"], e["role"], e.get("bug"), e.get("what") or ""))
    if sum(c.role == "final" for c in out) != 1 or len({c.name for c in out}) != len(out):
        raise DemoError(f"{where}: the checkpoints list needs exactly one entry with role final, and distinct names")
    return out


def final(cks: list[Checkpoint]) -> Checkpoint:
    """The healthy run's final checkpoint (the one the demo server serves)."""
    return next(c for c in cks if c.role == "final")


def series_folder(workspace: str | Path) -> str | None:
    """The healthy run's snapshots folder of a demo workspace (resolved, as runs record checkpoints), where the
    sweep chart opens: one true training curve, the bug checkpoints left out. None outside a demo workspace."""
    d = Path(workspace) / "demo" / CHECKPOINTS / SERIES
    return str(d.resolve()) if d.is_dir() else None


def story(workspace: str | Path, runs: list[Run]) -> dict | None:
    """What the Overview of a demo workspace tells (None elsewhere): {"final": entry, "series": [entries of the
    healthy run, by step], "folder": series_folder, "bugs": [entries]}, each entry {"name", "what", "step" (the
    healthy ones), "run": its run id or None} from MANIFEST.json's checkpoints list and `runs` (Store.runs rows,
    oldest first). The final's run is the one on a serving-matching extraction when there is one (what Acceptance
    opens on); each bug's entry adds "ref": the final checkpoint's run on the bug run's extraction. Also
    "families": the other families' entries, "engine": {"run": the final's run on a CPU extraction, "engine":
    extras.FAULT_ENGINE, "fault"} (Conformance's non-conforming engine; None until the build kept its counters)
    and "baseline": {"run", "name"} or None; "sampled": {"run", "name", "set", "temperature"} of the final's replay at
    a temperature on the sampled set (`extras.SAMPLED_SET`), or None; that run is none of the entries above."""
    from ..analysis.compare import SERVING_BACKENDS
    from ..drafters import step_of

    try:
        cks = checkpoints(Path(workspace) / "demo" / CHECKPOINTS)
    except (DemoError, OSError, ValueError):
        return None

    def run_of(ck: Checkpoint, extraction: str | None = None) -> Run | None:
        mine = [r for r in runs if r.checkpoint == str(ck.path)]
        mine = [r for r in mine if extraction is None or r.extraction_id == extraction]
        return max(mine, key=lambda r: (r.backend in SERVING_BACKENDS, runs.index(r)), default=None)

    def entry(ck: Checkpoint, run: Run | None) -> dict:
        return {"name": ck.name, "what": ck.what, "step": step_of(ck.dir), "run": run and run.id}

    fin = final(cks)
    hot = extras.sampled_run(runs, fin.path)
    runs = [r for r in runs if r.set_name != extras.SAMPLED_SET]  # the greedy entries' runs
    fams = [entry(c, run_of(c)) for c in cks if c.role == "family"]
    plain = [r for r in runs if r.checkpoint == str(fin.path) and r.backend not in SERVING_BACKENDS]
    base = next((r for r in runs if r.baseline), None)
    engine = {"run": plain[0].id if plain else None, "engine": extras.FAULT_ENGINE, "fault": extras.FAULT}
    engine = engine if (Path(workspace) / "demo" / extras.STATS).is_file() else None  # kept by the build
    more = {"families": fams, "engine": engine, "baseline": base and {"run": base.id, "name": base.name}}
    more["sampled"] = hot and {
        "run": hot.id,
        "name": hot.name,
        "set": extras.SAMPLED_SET,
        "temperature": extras.SAMPLED_T,
    }
    bugs = []
    for ck in (c for c in cks if c.role == "bug"):
        r = run_of(ck)
        ref = run_of(fin, r.extraction_id) if r else None
        bugs.append(entry(ck, r) | {"ref": ref and ref.id})
    series = [entry(c, run_of(c)) for c in cks if c.role in ("early", "series", "final")]
    out = {"final": entry(fin, run_of(fin)), "series": series, "folder": series_folder(workspace), "bugs": bugs}
    return out | more


def manifest(assets: Path = ASSETS) -> dict:
    f = assets / "MANIFEST.json"
    if not f.is_file():
        raise DemoError(
            f"{f} is missing: the demo assets are not in this checkout (restore dflash_dash/demo/assets "
            "from git, or remake them with python -m tools.demo.make_assets)"
        )
    return json.loads(f.read_text())


def _say(progress: Progress, step: int, steps: int, what: str, log: list[str]) -> Progress:
    """A progress callback that prefixes each message with the build step."""

    def tick(done: int, total: int, msg: str) -> None:
        if progress:
            progress(done, total, f"[{step}/{steps} {what}] {msg}")

    log.append(f"{time.strftime('%H:%M:%S')} step {step}/{steps}: {what}")
    tick(0, 1, "...")
    return tick


def _find_extraction(store, target: Path, backend: str, set_name: str = SET_NAME) -> Extraction | None:
    """The demo's own extraction with this backend: the OLDEST finished one of `set_name`, target and layers. A
    later one with the same settings (a Re-extract from the dashboard) is the user's, never the demo's: taking the
    newest would make the next `make run` replay every demo checkpoint onto it."""
    for e in store.extractions():  # oldest first
        if (
            e.set_name == set_name
            and e.target_path == str(target)
            and e.backend == backend
            and e.layer_ids == LAYER_IDS
            and e.status == "done"
        ):
            return e
    return None


def _extract(store, target: Path, set_name: str, progress: Progress) -> Extraction:
    """The demo's CPU (torch) extraction of `set_name`, with the target's top-K (for the expected acceptance at a
    temperature): the finished one, else a pending one resumed, else a new one."""
    from .. import ops, pipeline

    done = _find_extraction(store, target, "torch", set_name)
    if done is not None:
        return done
    pending = [
        e
        for e in store.extractions()
        if e.set_name == set_name and e.target_path == str(target) and e.backend == "torch" and e.status != "done"
    ]
    op = ops.Extract(
        target=str(target),
        completions=set_name,
        layers=LAYER_IDS,
        device="cpu",
        dtype="float32",
        extraction_id=pending[-1].id if pending else None,
        target_topk=ops.TARGET_TOPK,
    )
    return store.extraction(pipeline.extract(store, op, progress))


def _replayed(store) -> set[tuple[str, str]]:
    """(checkpoint, extraction id) of every run the store holds: one read for the whole plan."""
    return {(r.checkpoint, r.extraction_id) for r in store.runs()}


def _plan(cks: list[Checkpoint], torch_ex: Extraction, fla_ex: Extraction) -> list[tuple[Checkpoint, Extraction, str]]:
    """The demo's replays: every checkpoint on the torch extraction under its listed name, in the listed order,
    then the final one on the fla extraction (name + FLA_SUFFIX)."""
    fin = final(cks)
    return [(c, torch_ex, c.name) for c in cks] + [(fin, fla_ex, fin.name + FLA_SUFFIX)]


def built(workspace: str | Path, assets: Path = ASSETS) -> bool:
    """True when the workspace holds every demo run of these assets (the build would do nothing)."""
    from ..store import Store

    ws = Path(workspace)
    root = ws / "demo"
    if not (root / CHECKPOINTS).is_dir() or not (ws / "dflash.duckdb").is_file():
        return False
    mine, theirs = root / "MANIFEST.json", assets / "MANIFEST.json"
    if not mine.is_file() or not theirs.is_file() or mine.read_bytes() != theirs.read_bytes():
        return False
    store = Store(ws)
    target = (root / TARGET).resolve()
    torch_ex, fla_ex = _find_extraction(store, target, "torch"), _find_extraction(store, target, "fla")
    if torch_ex is None or fla_ex is None:
        return False
    done = _replayed(store)
    plan = _plan(checkpoints(root / CHECKPOINTS), torch_ex, fla_ex)
    return all((str(c.path), ex.id) in done for c, ex, _ in plan) and extras.done(store, SET_NAME)


def configure(workspace: str | Path) -> Path | None:
    """Write `<workspace>/config.toml` pointing at the demo server when the workspace has none; returns the file
    written, or None when one was already there (a user's configuration is never overwritten)."""
    from ..config import path_of

    f = path_of(workspace)
    if f.exists():
        return None
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(
        "# Written by the demo build. `make run` (python -m dflash_dash.launch) serves demo/target on this url beside\n"
        "# the dashboard and stops it with the dashboard; point url at another SGLang server to use that instead.\n"
        "[server]\n"
        f'url = "{SERVER_URL}"\n'
        "readiness_timeout = 120\n"
        "memory_release = true   # the stand-in frees the target with /release_memory_occupation during extraction\n"
    )
    return f


# ---------------------------------------------------------------------------
# local server


def served_drafter(workspace: str | Path) -> Path | None:
    """The checkpoint the demo server decodes with: the final one of the workspace's demo (None: no demo, or its
    checkpoints folder is incomplete)."""
    root = Path(workspace) / "demo"
    try:
        return final(checkpoints(root / CHECKPOINTS)).path
    except (DemoError, OSError, ValueError):
        return None


# ---------------------------------------------------------------------------
# the build


def _copy_assets(store, assets: Path, root: Path) -> None:
    """Copy target and checkpoints into the workspace, unless the same manifest is already there. A workspace
    whose demo was built from other assets is refused (its completions and features belong to another
    target), never silently mixed."""
    mine = root / "MANIFEST.json"
    if mine.is_file() and mine.read_bytes() == (assets / "MANIFEST.json").read_bytes():
        return
    if mine.is_file() and store.completion_ids(SET_NAME):
        raise DemoError(
            f"{store.workspace} holds a demo built from other demo assets; build the demo in a fresh "
            f"workspace (--workspace NEW), or delete {store.workspace} first"
        )
    for name in (TARGET, CHECKPOINTS):
        shutil.rmtree(root / name, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(assets / TARGET, root / TARGET)
    shutil.copytree(assets / CHECKPOINTS, root / CHECKPOINTS)
    shutil.copy(assets / "MANIFEST.json", mine)


def import_fla(store, assets: Path, target: Path, man: dict, progress: Progress = None) -> tuple[str, list[str]]:
    """Import the shipped fla features of coding-10 as an extraction with backend `fla`.

    Only completions whose prompt and output ids equal the shipped ones are imported (the features belong
    to those ids); the ids of the others are returned. Returns (extraction id, mismatched prompt ids)."""
    from .. import pipeline

    shipped = [json.loads(line) for line in (assets / FLA / "completions.jsonl").read_text().splitlines() if line]
    meta = dict(man["gpu"]["coding10"]["features_meta"])
    versions = {k: meta.get(k) for k in ("torch", "transformers", "fla")} | {
        "fla_bound": True,
        "imported_from": "dflash_dash/demo/assets/fla (extracted with fla kernels on "
        f"{man['gpu'].get('gpu') or meta.get('device')})",
    }
    try:
        return pipeline.import_features(
            store, SET_NAME, target, LAYER_IDS, assets / FLA, shipped, meta | {"backend": "fla"}, versions, progress
        )
    except pipeline.InputError as e:
        raise DemoError(f"the shipped fla features cannot be imported: {e}; remake the demo assets") from None


def _run_of(store, ck: Checkpoint, ex: Extraction) -> str:
    """The id of checkpoint `ck`'s run on extraction `ex` (the oldest)."""
    return next(r.id for r in store.runs() if r.checkpoint == str(ck.path) and r.extraction_id == ex.id)


def build(workspace: str | Path, progress: Progress = None, assets: Path = ASSETS) -> dict:
    """Build the demo workspace (see the module docstring); returns what BUILD.json records."""
    from .. import ops, pipeline
    from ..store import Store

    ws = Path(workspace)
    root = ws / "demo"
    configure(ws)
    if built(ws, assets):
        if progress:
            progress(1, 1, f"demo already built, nothing to do: {ws}")
        return json.loads((root / "BUILD.json").read_text()) if (root / "BUILD.json").is_file() else {}
    man = manifest(assets)
    t0 = time.perf_counter()
    log: list[str] = []
    steps = 6
    store = Store(ws)
    root.mkdir(parents=True, exist_ok=True)

    tick = _say(progress, 1, steps, "assets", log)
    _copy_assets(store, assets, root)
    target = (root / TARGET).resolve()
    cks = checkpoints(root / CHECKPOINTS)
    tick(1, 1, f"target and {len(cks)} checkpoints in {root}")

    tick = _say(progress, 2, steps, f"fetch from the local servers (speculative, {final(cks).name})", log)
    extras.fetch_all(store, target, root, final(cks).path, tick)

    tick = _say(progress, 3, steps, "CPU extraction (torch path)", log)
    # the sampled set first: the greedy set's torch extraction stays the newest of its backend, as before it
    hot_ex = _extract(store, target, extras.SAMPLED_SET, lambda d, n, m: tick(d, n, f"{extras.SAMPLED_SET}: {m}"))
    torch_ex = _extract(store, target, SET_NAME, tick)

    tick = _say(progress, 4, steps, "import the shipped fla extraction", log)
    fla_ex = _find_extraction(store, target, "fla")
    mismatched: list[str] = []
    if fla_ex is None:
        ex_id, mismatched = import_fla(store, assets, target, man, tick)
        fla_ex = store.extraction(ex_id)
        for pid in mismatched:
            msg = (
                f"prompt {pid}: this machine's CPU completion differs from the shipped one; its fla features "
                "are left out of the fla extraction"
            )
            log.append(msg)
            tick(0, 1, msg)

    tick = _say(progress, 5, steps, "replay", log)
    plan = _plan(cks, torch_ex, fla_ex)
    runs, done = {}, _replayed(store)
    for i, (ck, ex, name) in enumerate(plan):
        if (str(ck.path), ex.id) in done:
            continue
        tick(i, len(plan), f"replaying {name} on {ex.backend} extraction {ex.id}")
        out = pipeline.replay(
            store,
            ops.Replay(
                drafter=str(ck.path),
                extraction=ex.id,
                tree_budget=TREE_BUDGET,
                device="cpu",
                dtype="float32",
                name=name,
            ),
            lambda d, n, m, name=name: tick(d, n, f"{name}: {m}"),
        )
        runs[name] = {"id": out["id"], "tau_macro": out["summary"]["tau_macro"]}
        log.append(f"replayed {name}: tau macro {out['summary']['tau_macro']:.3f}")
    name = final(cks).name + extras.SAMPLED_SUFFIX  # after the plan's runs: their order stays as it was
    tick(len(plan), len(plan) + 1, f"replaying {name} on {extras.SAMPLED_SET} (extraction {hot_ex.id})")
    out = extras.replay_sampled(
        store, final(cks).path, hot_ex.id, name, TREE_BUDGET, lambda d, n, m: tick(d, n, f"{name}: {m}")
    )
    if not out.get("reused"):
        hot = out["summary"]
        runs[name] = {"id": out["id"], "tau_macro": hot["tau_macro"], "tau_expected": hot.get("tau_expected")}
        log.append(f"replayed {name}: tau macro {hot['tau_macro']:.3f}, expected tau {hot.get('tau_expected')}")
    tick(len(plan) + 1, len(plan) + 1, f"{len(runs)} runs replayed")

    tick = _say(
        progress, 6, steps, f"engine fault ({extras.FAULT}): its counters and fault ranking; n-gram baseline", log
    )
    if extras.FAULT_ENGINE not in store.engines(SET_NAME):
        for pid in extras.keep_fault_stats(store, SET_NAME, root):
            log.append(f"prompt {pid}: the faulty server's completion differs; its counters are left out")
    fin_run = _run_of(store, final(cks), torch_ex)
    ranked = extras.diagnose(store, fin_run, tick)
    log.append(f"fault ranking of {final(cks).name} against {extras.FAULT_ENGINE}: {ranked.get('explained_by')}")
    extras.baseline(store, torch_ex.id, tick)
    tick = _say(progress, 6, steps, "a cost table of the target and the final drafter on this CPU", log)
    log.append(f"cost table {extras.costs(store, target, final(cks).path, TREE_BUDGET, tick)} (CPU costs)")

    rec = {
        "workspace": str(ws.resolve()),
        "target": str(target),
        "torch_extraction": torch_ex.id,
        "fla_extraction": fla_ex.id,
        "sampled_extraction": hot_ex.id,
        "mismatched_completions": mismatched,
        "runs": runs,
        "seconds": round(time.perf_counter() - t0, 1),
        "log": log,
    }
    (root / "BUILD.json").write_text(json.dumps(rec, indent=2))
    return rec
