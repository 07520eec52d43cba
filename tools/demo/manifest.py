"""The `unpack` and `finish` steps of the demo asset build (CPU): the GPU step's tars -> the committed assets
directory, and MANIFEST.json, which records every step's seeds, arguments, versions, timings, losses and sizes.

Contract: `unpack(src, build, assets, command)` replaces `assets` with the untarred target, drafters (renamed to
the checkpoints directory) and fla features, and writes MANIFEST.json from build/prepare.json and src/gpu.json.
`finish(src, assets)` merges src/cpu-*.json (the `cpu-continue` records) and src/gpu_runs.json into it and
recounts the sizes. Both return the manifest.
The checkpoints directory has the layout `dflash_dash.demo` reads: `healthy/step{NNNN}/` (snapshots of one healthy
run, 3 or more) and `bugs/{name}/` (one per training bug), each with config.json, model.safetensors and
training.json; `checkpoint_list(assets)` writes MANIFEST.json's `checkpoints` list from them (order: the healthy
steps, then the bugs; role early / series / final by step; name and bug from training.json; `what` from WHAT, edit
it by hand where a sentence should say more). `unpack` writes it; `finish` rewrites it (a cpu-continue moves the
final snapshot to its new step), keeping the `what` of every folder it already listed.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

from dflash_dash.demo import ASSETS, CHECKPOINTS, SERIES

from .common import log

TOKENIZER_NOTE = (
    "Byte-level BPE (4096 ids) whose pre-tokenizer splits text as Qwen2/Qwen3 tokenizers do "
    "(tools/tiny.QWEN2_SPLIT, then byte-level with no regex): a newline is its own pre-token (or ends a "
    "punctuation run, as in '):\\n') and the indentation after it starts the next one. The GPT-2 pattern "
    "does not suit: its \\s+(?!\\S) glues a newline to the indentation that follows ('\\n   ' + ' return'), so a "
    "plain-text coding-10 prompt ending in ':\\n' ends on a lone newline token that training text only ever has "
    "before column-0 text (#, class, def), and no completion starts with the function's indented body. "
    "With the Qwen split every coding-10 prompt tokenises as the prefix of prompt + body."
)


BUGS_DIR = "bugs"  # the bug checkpoints' folder under CHECKPOINTS
WHAT = {  # MANIFEST.json `what` of each checkpoint: one sentence a newcomer understands ({step}: its training step)
    "early": "the healthy run after {step} training steps: it has barely started to learn, so its drafts are rarely "
    "accepted",
    "series": "the healthy run after {step} training steps, one point of its training curve",
    "final": "the same healthy run after {step} steps (its lowest held-out loss): the drafter as it should be served",
    "noisy_labels": "trained like the final one except that diffusion noise corrupted the target logits used as "
    "its labels",
    "anchor_visible": "trained with the anchor's own hidden state in its context, which inference never gives it, so "
    "its drafts lag one position behind",
    "soft_kl": "trained like the final one except with a soft KL loss against the target's distribution instead of "
    "hard cross-entropy on the target's tokens",
}


def checkpoint_list(assets: Path = ASSETS) -> list[dict]:
    """MANIFEST.json's `checkpoints` list from the folders under assets/checkpoints (see the module docstring)."""
    root = assets / CHECKPOINTS
    steps = sorted((root / SERIES).glob("step*"), key=lambda p: int(p.name.removeprefix("step")))
    if len(steps) < 3:
        raise SystemExit(f"{root / SERIES}: {len(steps)} step folders; the healthy series needs 3 or more")
    out = []
    for i, d in enumerate(steps):
        t = json.loads((d / "training.json").read_text())
        role = "early" if i == 0 else "final" if i == len(steps) - 1 else "series"
        out.append(_entry(root, d, t, role, None, WHAT[role].format(step=f"{t.get('step', int(d.name[4:])):,}")))
    for d in sorted(p for p in (root / BUGS_DIR).iterdir() if p.is_dir()):
        t = json.loads((d / "training.json").read_text())
        bug = (t.get("training") or {}).get("bug") or d.name.replace("-", "_")
        out.append(_entry(root, d, t, "bug", bug, WHAT.get(bug, f"trained with the {bug} bug")))
    return out


def _entry(root: Path, d: Path, t: dict, role: str, bug: str | None, what: str) -> dict:
    name = t.get("name") or d.relative_to(root).as_posix().replace("/", "-")
    return {"dir": d.relative_to(root).as_posix(), "name": name, "role": role, "bug": bug, "what": what}


def unpack(src: Path, build: Path, assets: Path = ASSETS, command: str = "") -> dict:
    """Untar the GPU outputs into `assets` and write MANIFEST.json."""
    if assets.exists():
        shutil.rmtree(assets)
    assets.mkdir(parents=True)
    for name in ("target", "drafters", "fla"):
        with tarfile.open(src / f"{name}.tar") as tf:
            tf.extractall(assets, filter="data")
    (assets / "drafters").rename(assets / CHECKPOINTS)
    gpu_rec = json.loads((src / "gpu.json").read_text())
    sizes = {str(p.relative_to(assets)): p.stat().st_size for p in sorted(assets.rglob("*")) if p.is_file()}
    manifest = {
        "what": "dflash-dash demo assets: a small hybrid qwen3_5_text target (Gated DeltaNet + full attention) "
        "trained on the Python standard library, DFlash drafters trained against its hidden states, "
        "and its coding-10 completions' hidden states extracted on GPU with fla",
        "commands": {
            "prepare": "python -m tools.demo.make_assets prepare --build .demo-build",
            "gpu": "python -m tools.demo.make_assets gpu --build .demo-build --out $OUT  (one H200, "
            "transformers 5.24.0, fla-core/flash-linear-attention 0.6.0)",
            "unpack": "python -m tools.demo.make_assets unpack --src <gpu out> --build .demo-build",
            "gpu_call": command,
        },
        "tokenizer": TOKENIZER_NOTE,
        "prepare": json.loads((build / "prepare.json").read_text()),
        "gpu": gpu_rec,
        "checkpoints": checkpoint_list(assets),
        "sizes": sizes,
        "total_bytes": sum(sizes.values()),
    }
    (assets / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    log(f"assets in {assets}: {manifest['total_bytes'] / 2**20:.1f} MiB")
    return manifest


def finish(src: Path, assets: Path = ASSETS) -> dict:
    """Merge the CPU continuation records into MANIFEST.json and recount the asset sizes."""
    man = json.loads((assets / "MANIFEST.json").read_text())
    cont = {f.stem.removeprefix("cpu-"): json.loads(f.read_text()) for f in sorted(src.glob("cpu-*.json"))}
    if cont:
        man["cpu_continuation"] = cont
    if (src / "gpu_runs.json").is_file():  # the device calls, as run (commands, wall and device seconds)
        man["commands"]["gpu_runs"] = json.loads((src / "gpu_runs.json").read_text())
    said = {e["dir"]: e["what"] for e in man.get("checkpoints", [])}  # sentences edited by hand stay
    man["checkpoints"] = [e | {"what": said.get(e["dir"], e["what"])} for e in checkpoint_list(assets)]
    sizes = {
        str(p.relative_to(assets)): p.stat().st_size
        for p in sorted(assets.rglob("*"))
        if p.is_file() and p.name != "MANIFEST.json"
    }
    man["sizes"], man["total_bytes"] = sizes, sum(sizes.values())
    (assets / "MANIFEST.json").write_text(json.dumps(man, indent=1))
    return man
