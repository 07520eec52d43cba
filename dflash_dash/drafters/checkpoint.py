"""Checkpoint layouts: where a drafter's config and weights are, and reading its tensors.

Contract: `locate(path)` finds an HF folder (config.json + *.safetensors) or a SpecForge runtime folder
(`training_state.pt`, its config beside, above, or passed as --draft-config) and returns a `Checkpoint`;
`read_config`/`config_of` validate its config; `tensors(ck)` yields its weights by bare name. A runtime file is
read with torch.load(weights_only=True) only: a file that needs arbitrary unpickling is refused, so its code never
runs. Torch and safetensors are imported inside `tensors` only: locating and reading configs stay torch-free. A
damaged or cut config or weights file (JSON that breaks, a safetensors file shorter than its header says, a
runtime file that is no complete zip archive) is refused in one line naming the file.

Per process, a checkpoint is located and its config file read once: `locate` and `raw_config` keep what they found
in two explicit caches keyed by the paths and their (mtime, size), so a rewritten folder or config is looked at
again; `forget()` empties both. A job reads its drafter's config.json once however many steps ask for it.
"""

from __future__ import annotations

import copy
import pickle
import re
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

from ..target_info import check_safetensors, read_json
from . import registry
from .config import CheckpointError, DrafterConfig, parse_config

RUNTIME_FILE = "training_state.pt"  # SpecForge runtime checkpoint: {run_id}-step{N}/training_state.pt
_STEPS = [
    re.compile(p)
    for p in (r"epoch_(\d+)_step_(\d+)$", r"(?:^|[-_])step[-_]?(\d+)$", r"^checkpoint-(\d+)$", r"^step(\d+)$")
]


def step_of(name: str) -> int | None:
    """Training step of a checkpoint folder name: `epoch_E_step_S`, `{run_id}-step{N}`, `checkpoint-N`,
    `step_N`, `stepN`; None for other names (e.g. `{run_id}-latest`)."""
    for rx in _STEPS:
        m = rx.search(Path(name).name)
        if m:
            return int(m.groups()[-1])
    return None


@dataclass
class Checkpoint:
    path: Path  # the checkpoint folder (resolved)
    config_file: Path  # the JSON the config is read from (beside, above, or --draft-config)
    weights: list[Path]  # *.safetensors files, or [training_state.pt]
    kind: str  # "hf" (safetensors folder) or "runtime" (SpecForge training_state.pt)


_LOCATED: dict[tuple, Checkpoint] = {}  # (folder, draft config, their (mtime, size)) -> the located checkpoint
_CONFIGS: dict[tuple, dict] = {}  # (config file, its (mtime, size)) -> its JSON as read


def forget() -> None:
    """Empty this process's caches of located checkpoints and read configs."""
    _LOCATED.clear()
    _CONFIGS.clear()


def _stamp(p: Path) -> tuple[int, int]:
    st = p.stat()
    return st.st_mtime_ns, st.st_size


def _read(f: Path) -> bytes:
    """The bytes of config file `f` (the one place a drafter config is read)."""
    return f.read_bytes()


def locate(path: str | Path, draft_config: str | Path | None = None) -> Checkpoint:
    """Find a checkpoint's weights and config: an HF folder (config.json + *.safetensors) or a SpecForge
    runtime folder `{run_id}-step{N}/` (training_state.pt, config from `draft_config` or a config.json beside
    or up to two folders above). Raises CheckpointError naming what is missing and the fix. Once per process
    while the folder (and `draft_config`) are unchanged."""
    p = Path(path)
    if p.is_file() and p.name == RUNTIME_FILE:
        p = p.parent
    if not p.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    p = p.resolve()
    extra = Path(draft_config) if draft_config else None
    key = (p, extra, _stamp(p), _stamp(extra) if extra and extra.is_file() else None)
    if key not in _LOCATED:
        _LOCATED[key] = _located(p, path, draft_config)
    got = _LOCATED[key]
    return replace(got, weights=list(got.weights))


def _located(p: Path, path: str | Path, draft_config: str | Path | None) -> Checkpoint:
    files = sorted(p.glob("*.safetensors"))
    kind = "hf" if files else "runtime" if (p / RUNTIME_FILE).is_file() else None
    if kind is None:
        what = "a target model folder, not a drafter" if list(p.glob("*.bin")) else "no drafter weights"
        raise CheckpointError(f"{p}: {what} (expected config.json + *.safetensors, or a SpecForge {RUNTIME_FILE})")
    if draft_config:
        cfg = Path(draft_config)
        if not cfg.is_file():
            raise CheckpointError(
                f"--draft-config {draft_config}: no such file (expected the training's draft config JSON)"
            )
    else:
        near = [p] + (list(p.parents)[:2] if kind == "runtime" else [])
        cfg = next((d / "config.json" for d in near if (d / "config.json").is_file()), None)
        if cfg is None:
            raise CheckpointError(
                f"{p}: no config.json beside the weights"
                + (
                    " or above them; a SpecForge runtime checkpoint holds no "
                    "config: pass --draft-config FILE (the training's --draft-config JSON)"
                    if kind == "runtime"
                    else " (expected a DFlash checkpoint folder)"
                )
            )
    return Checkpoint(p, cfg.resolve(), files or [p / RUNTIME_FILE], kind)


def raw_config(ck: Checkpoint) -> dict:
    """The config's JSON object; a damaged or cut file is refused naming it and where its JSON breaks. Read once
    per process while the file is unchanged (a copy of what was read is returned)."""
    try:
        key = (ck.config_file, _stamp(ck.config_file))
        if key not in _CONFIGS:
            _CONFIGS[key] = read_json(ck.config_file, _read(ck.config_file), CheckpointError)
    except OSError as e:
        raise CheckpointError(f"{ck.config_file}: not readable ({e.strerror})") from None
    return copy.deepcopy(_CONFIGS[key])


def read_config(path: str | Path, draft_config: str | Path | None = None) -> DrafterConfig:
    """Locate, read and validate a checkpoint's config; errors name the file they came from."""
    return config_of(locate(path, draft_config))


def config_of(ck: Checkpoint) -> DrafterConfig:
    """The validated config of a located checkpoint; errors name the file they came from."""
    raw = raw_config(ck)  # its errors name the file already
    try:
        return parse_config(raw)
    except CheckpointError as e:  # parse_config's errors start "config.json: ...": name the file read instead
        msg = str(e)
        raise CheckpointError(
            f"{ck.config_file}{msg.removeprefix('config.json')}" if msg.startswith("config.json:") else msg
        ) from None


def check_files(ck: Checkpoint) -> None:
    """Refuse weights files cut short or damaged, reading headers only (torch-free): a safetensors file shorter than
    its header says, a runtime file that is no complete zip archive (torch.save's format; a cut copy loses the
    archive's directory, at its end)."""
    for f in ck.weights:
        if ck.kind == "hf":
            check_safetensors(f, CheckpointError)
        elif not zipfile.is_zipfile(f):
            raise CheckpointError(
                f"{f}: truncated or not a torch checkpoint ({f.stat().st_size} bytes, no complete zip archive); copy "
                "it again from the training machine"
            )


COPIES = ("embed_tokens.weight", "lm_head.weight")  # copies of the target's embedding / LM head: ignored


def tensors(ck: Checkpoint, family: str | None = None):
    """(file name, tensor name, shape, getter) of a checkpoint's weights, names without `model.`/`draft_model.`
    prefixes; the shape is read without the tensor's data.

    A runtime `training_state.pt` is read with torch.load(weights_only=True) only: a file that needs arbitrary
    unpickling is refused (its code never runs). Its training `strategy`, when known, must train `family` (the
    config's): a DSpark run read with a Domino config is refused naming both."""
    import torch
    from safetensors import safe_open

    check_files(ck)  # a cut copy named here, not by safetensors' or torch's own error
    if ck.kind == "hf":
        for f in ck.weights:
            with safe_open(str(f), framework="pt", device="cpu") as sf:
                for name in sf.keys():
                    yield (
                        f.name,
                        _bare(name),
                        tuple(sf.get_slice(name).get_shape()),
                        lambda sf=sf, name=name: sf.get_tensor(name),
                    )
        return
    f = ck.weights[0]
    try:
        state = torch.load(str(f), map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{f}: needs arbitrary unpickling ({str(e).splitlines()[0][:160]}), which dflash-dash refuses because it "
            "can run code; export the checkpoint with `specforge export --to hf` and replay the exported folder"
        ) from None
    except (RuntimeError, OSError, EOFError) as e:
        raise CheckpointError(f"{f}: not a readable torch checkpoint ({type(e).__name__}: {e})") from None
    sd = state.get("draft_state_dict") if isinstance(state, dict) else None
    if not isinstance(sd, dict):
        keys = sorted(state)[:8] if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{f}: no 'draft_state_dict' (found {keys}); expected a SpecForge runtime checkpoint")
    strategy = state.get("strategy")
    known = {s for spec in registry.specs() for s in spec.strategies}  # strategies some family is trained by
    if family and strategy in known and strategy not in registry.spec_of(family).strategies:
        raise CheckpointError(
            f"{f}: trained with strategy '{strategy}' but its config ({ck.config_file}) describes a {family} drafter; "
            "pass the training's own draft config (--draft-config)"
        )
    for name, t in sd.items():
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{f}: draft_state_dict['{name}'] is {type(t).__name__}, expected a tensor")
        yield f.name, _bare(name), tuple(t.shape), lambda t=t: t


def _bare(name: str) -> str:
    for prefix in ("draft_model.", "model."):
        name = name.removeprefix(prefix)
    return name
