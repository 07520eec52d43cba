"""What a target model folder is, read from its config.json alone: no weights, no torch.

Contract: `describe(path)` returns a `TargetInfo` (model type, hidden size, vocabulary, layer count and kinds, a
hash of config.json) or raises `TargetError` naming the missing file or field. The pages and the consistency
checks describe targets with it, so a dashboard process never imports torch to read a config; `target` (torch)
loads and runs the model.
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
    cfg = json.loads(raw)
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
