"""What a target model folder is, read from its config.json alone: no weights, no torch.

Contract: `describe(path)` returns a `TargetInfo` (model type, hidden size, vocabulary, layer count and kinds, a
hash of config.json) or raises `TargetError` naming the missing file or field. The pages and the consistency
checks describe targets with it, so a dashboard process never imports torch to read a config; `target` (torch)
loads and runs the model. `check_safetensors(f, error)` reads a weights file's header only and refuses a file cut
short or damaged (a partial copy or download) in one line naming it, before a library meets it (the target's and
a drafter's weights).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import UserError


class TargetError(UserError, ValueError):
    """A target folder that cannot be used; the message names the problem and the fix."""


@dataclass
class TargetInfo:
    path: str  # absolute folder path
    model_type: str  # e.g. qwen3_5_text
    hidden_size: int  # H
    vocab_size: int  # V
    num_layers: int  # N decoder layers
    config_hash: str  # sha256 of config.json bytes, first 16 hex
    layer_types: list[str] | None  # per-layer kind (hybrid models)


def describe(path: str | Path) -> TargetInfo:
    """Read the target's config.json (no weights)."""
    path = Path(path).resolve()
    f = path / "config.json"
    if not f.is_file():
        raise TargetError(f"{path}: no config.json (expected a Hugging Face causal LM folder)")
    raw = f.read_bytes()
    cfg = read_json(f, raw, TargetError)
    text = cfg.get("text_config") or cfg
    for key in ("hidden_size", "vocab_size", "num_hidden_layers"):
        if key not in text:
            raise TargetError(f"{f}: missing field '{key}'")
    return TargetInfo(
        str(path),
        cfg.get("model_type", "?"),
        text["hidden_size"],
        text["vocab_size"],
        text["num_hidden_layers"],
        hashlib.sha256(raw).hexdigest()[:16],
        text.get("layer_types"),
    )


def has_linear_attention(info: TargetInfo, keep: int | None = None) -> bool:
    """Whether the target's first `keep` layers (all by default) include linear-attention (Gated DeltaNet)."""
    return "linear_attention" in (info.layer_types or [])[:keep]


def read_json(f: Path, raw: bytes, error: type[Exception]) -> dict:
    """The JSON object of file `f` (its bytes `raw`); `error` names the file and where the JSON breaks."""
    try:
        out = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{f}: not valid JSON ({e}); the file is damaged or cut short: copy it again") from None
    if not isinstance(out, dict):
        raise error(f"{f}: expected a JSON object, found {type(out).__name__}; copy the model's own config.json")
    return out


def check_safetensors(f: Path, error: type[Exception] = TargetError) -> None:
    """Refuse a safetensors file whose header is unreadable or whose tensors end past the file's end (a copy or
    download cut short): the layout is a u64 header length, a JSON header of {name: {data_offsets: [begin, end]}},
    then the payload (safetensors' own format, https://github.com/huggingface/safetensors#format)."""
    fix = "copy or download the file again (a partial copy is the usual cause)"
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = int.from_bytes(fh.read(8), "little") if size >= 8 else -1
        try:
            meta = json.loads(fh.read(head)) if 0 < head <= size - 8 else None
            end = max((v["data_offsets"][1] for k, v in meta.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            meta = None
    if meta is None:
        raise error(f"{f}: not a readable safetensors file ({size} bytes, no valid header); {fix}")
    if size < 8 + head + end:
        raise error(f"{f}: truncated safetensors file ({size} bytes, its header needs {8 + head + end}); {fix}")
