"""The `unpack` and `finish` steps of the demo asset build (CPU): the GPU step's tars -> the committed assets
directory, and MANIFEST.json, which records every step's seeds, arguments, versions, timings, losses and sizes.

Contract: `unpack(src, build, assets, command)` replaces `assets` with the untarred target, drafters (renamed to
the checkpoints directory) and fla features, and writes MANIFEST.json from build/prepare.json and src/gpu.json.
`finish(src, assets)` merges src/gpu_runs.json (the device calls) into it and
recounts the sizes. `rebug(src, assets, command)` swaps in the bug runs of a `DEMO_BUGS` rerun (src/bugs.tar and
its gpu.json) for the same bugs' checkpoints and records, keeping every variant either call tried. All return the
manifest.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

from dflash_dash.demo import ASSETS, CHECKPOINTS

from .common import log

TOKENIZER_NOTE = (
    "Byte-level BPE (trained on the synthetic corpus, up to 2048 ids) whose pre-tokenizer splits text as "
    "Qwen2/Qwen3 tokenizers do "
    "(tools/tiny.QWEN2_SPLIT, then byte-level with no regex): a newline is its own pre-token (or ends a "
    "punctuation run, as in '):\\n') and the indentation after it starts the next one. The GPT-2 pattern "
    "does not suit: its \\s+(?!\\S) glues a newline to the indentation that follows ('\\n   ' + ' return'), so a "
    "plain-text coding-10 prompt ending in ':\\n' ends on a lone newline token that training text only ever has "
    "before column-0 text (#, class, def), and no completion starts with the function's indented body. "
    "With the Qwen split every coding-10 prompt tokenises as the prefix of prompt + body."
)


def unpack(src: Path, build: Path, assets: Path = ASSETS, command: str = "") -> dict:
    """Untar the GPU outputs into `assets` and write MANIFEST.json."""
    if assets.exists():
        shutil.rmtree(assets)
    assets.mkdir(parents=True)
    tars = [src / "target.tar", src / "fla.tar"] + sorted(src.glob("healthy*.tar")) + sorted(src.glob("bugs*.tar"))
    for f in tars:
        with tarfile.open(f) as tf:
            tf.extractall(assets if f.stem in ("target", "fla") else assets / CHECKPOINTS, filter="data")
    gpu_rec = json.loads((src / "gpu.json").read_text())
    prep = json.loads((build / "prepare.json").read_text())
    sizes = {str(p.relative_to(assets)): p.stat().st_size for p in sorted(assets.rglob("*")) if p.is_file()}
    manifest = {
        "what": "dflash-dash demo assets: a small hybrid qwen3_5_text target (Gated DeltaNet + full attention) "
        "trained on a synthetic corpus of small Python functions (tools/demo/synth.py)"
        + (
            " mixed with the standard library's functions (tools/demo/stdlib.py, PSF licence)"
            if prep.get("stdlib")
            else ""
        )
        + ", DFlash drafters trained "
        "against its hidden states (a healthy run and one run per training bug), and its coding-10 completions' "
        "hidden states extracted on GPU with fla",
        "commands": {
            "prepare": "python -m tools.demo.make_assets prepare --build .demo-build"
            + (" --free" if prep.get("free_choices") else ""),
            "gpu": "python -m tools.demo.make_assets gpu --build .demo-build --out $OUT  (one H200, "
            "transformers 5.24.0, fla-core/flash-linear-attention 0.6.0)",
            "unpack": "python -m tools.demo.make_assets unpack --src <gpu out> --build .demo-build",
            "gpu_call": command,
        },
        "tokenizer": TOKENIZER_NOTE,
        "prepare": prep,
        "gpu": gpu_rec,
        "checkpoints": listing(gpu_rec["drafters"]),
        "sizes": sizes,
        "total_bytes": sum(sizes.values()),
    }
    (assets / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    log(f"assets in {assets}: {manifest['total_bytes'] / 2**20:.1f} MiB")
    return manifest


def finish(src: Path, assets: Path = ASSETS) -> dict:
    """Merge the device calls' record into MANIFEST.json and recount the asset sizes."""
    man = json.loads((assets / "MANIFEST.json").read_text())
    if (src / "gpu_runs.json").is_file():  # the device calls, as run (commands, wall and device seconds)
        man["commands"]["gpu_runs"] = json.loads((src / "gpu_runs.json").read_text())
    return save(man, assets)


def save(man: dict, assets: Path) -> dict:
    """Recount the asset sizes into `man` and write it as assets/MANIFEST.json."""
    sizes = {
        str(p.relative_to(assets)): p.stat().st_size
        for p in sorted(assets.rglob("*"))
        if p.is_file() and p.name != "MANIFEST.json"
    }
    man["sizes"], man["total_bytes"] = sizes, sum(sizes.values())
    (assets / "MANIFEST.json").write_text(json.dumps(man, indent=1))
    return man


def rebug(src: Path, assets: Path = ASSETS, command: str = "") -> dict:
    """Replace the bug runs that a `DEMO_BUGS` rerun trained again (same target, same data, same stop) in `assets`:
    their checkpoint folders, their records in gpu.drafters and gpu.bug_variants (the earlier call's variants
    first), and a note of the call in gpu.reruns. Sizes are recounted. Refuses (SystemExit, nothing changed) a full
    run, a bug the assets do not hold, a run stopped at another step, and a bugs.tar without the bug's folder."""
    man = json.loads((assets / "MANIFEST.json").read_text())
    new = json.loads((src / "gpu.json").read_text())
    if not new.get("healthy_reused_from_earlier_run"):
        raise SystemExit(f"{src}/gpu.json is not a DEMO_BUGS rerun (no healthy_reused_from_earlier_run): use unpack")
    bugs = [r for r in new["drafters"] if r.get("bug")]
    g = man["gpu"]
    held = {o["bug"]: o for o in g["drafters"] if o.get("bug")}
    with tarfile.open(src / "bugs.tar") as tf:
        packed = {Path(m.name).parts[:2] for m in tf.getmembers()}  # reads it whole: a cut tar fails here
        for r in bugs:  # every check before anything changes
            old = held.get(r["bug"])
            if old is None:
                raise SystemExit(f"{r['bug']}: the assets hold no such bug run ({sorted(held)}): use unpack")
            if old["step"] != r["step"]:
                raise SystemExit(f"{r['bug']}: the rerun stopped at step {r['step']}, the assets' run at {old['step']}")
            if Path(r["name"]).parts not in packed or r["bug"] not in new.get("bug_variants", {}):
                raise SystemExit(f"{r['bug']}: {src} holds no {r['name']}/ in bugs.tar or no variants in gpu.json")
        for r in bugs:
            old = held[r["bug"]]
            shutil.rmtree(assets / CHECKPOINTS / old["name"])
            g["drafters"][g["drafters"].index(old)] = r
            g["bug_variants"][r["bug"]] = g["bug_variants"].get(r["bug"], []) + new["bug_variants"][r["bug"]]
        tf.extractall(assets / CHECKPOINTS, filter="data")
    g.setdefault("reruns", []).append(
        {"bugs": [r["bug"] for r in bugs], "command": command, "device": new["device"], "seconds": new["seconds"]}
    )
    fresh = {e["dir"]: e for e in listing(g["drafters"])}  # in place: the families' entries stay where they are
    man["checkpoints"] = [fresh.get(e["dir"], e) for e in man["checkpoints"]]
    log(f"{[r['name'] for r in bugs]} replaced from {src}")
    return save(man, assets)


def listing(records: list[dict]) -> list[dict]:
    """MANIFEST.json's `checkpoints`: the healthy run's snapshots by step (the first "early", the others "series"),
    one entry per bug run (the anchor-visible shortcut last), then the run's own last checkpoint ("final"); each with
    its folder under checkpoints/, its run name in the demo, and one sentence a newcomer understands. The order is
    the replay order, so Compare's default pair (the newest two runs on one extraction) is the shortcut against the
    final checkpoint."""
    healthy = [r for r in records if not r.get("bug")]
    final = healthy[-1]  # listed last: the run's named checkpoint (where its probe reached the aim)
    out = []
    for i, r in enumerate(sorted(healthy, key=lambda r: r["step"])):
        role = "final" if r is final else "early" if i == 0 else "series"
        what = {
            "final": f"The healthy drafter (step {r['step']}): trained on the target's own greedy generations "
            "with hard cross-entropy on its tokens, and stopped where it drafts as real drafters do on code (tau 3-8 "
            "of 16). The reference the others are measured against.",
            "early": f"The healthy run early in training (step {r['step']}): the same recipe, not yet learned.",
            "series": f"The healthy run at step {r['step']}: one point of its training curve.",
        }[role]
        name = {"final": "final", "early": "early", "series": "healthy"}[role]
        out.append({"dir": r["name"], "name": f"{name}-step{r['step']}", "role": role, "bug": None, "what": what})
    fin = out.pop(next(i for i, e in enumerate(out) if e["role"] == "final"))
    for r in sorted((r for r in records if r.get("bug")), key=lambda r: r["bug"] == "anchor_visible"):
        out.append(
            {
                "dir": r["name"],
                "name": f"bug-{r['bug'].replace('_', '-')}-step{r['step']}",
                "role": "bug",
                "bug": r["bug"],
                "what": f"Trained exactly as the healthy run except for one bug: {r['bug_what']}.",
            }
        )
    return out + [fin]
