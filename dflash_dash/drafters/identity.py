"""A drafter checkpoint's identity: what conformance compares with what a serving engine says it served.

Contract: `identity(path)` (torch-free) returns {"path", "name", "family", "block_size", "width",
"target_layer_ids", "config_hash", "weights_hash", "fingerprint"}:
- config_hash: sha256 over the validated config (`parse_config`: every field the replay reads, none of the
  bookkeeping keys such as transformers_version or _name_or_path), as sorted JSON.
- weights_hash: sha256 over every tensor's bare name (no `model.`/`draft_model.` prefix), dtype, shape and bytes,
  in name order, the copies of the target's embedding and LM head left out (`checkpoint.COPIES`): the same
  weights give the same hash however they are sharded, ordered or prefixed. Read from the safetensors headers
  and data directly (no torch). A SpecForge runtime checkpoint (training_state.pt) has None: its file holds
  optimizer state beside the weights, so its bytes say nothing of an export's.
- fingerprint: the first 16 hex digits of sha256(config_hash + weights_hash), None without a weights hash.
A file that cannot be read raises CheckpointError naming it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict
from pathlib import Path

from .checkpoint import COPIES, _bare, config_of, locate
from .config import CheckpointError

CHUNK = 1 << 22  # bytes hashed per read (4 MiB)


def _header(f, path: Path) -> tuple[dict, int]:
    """The safetensors header of an open file and where its data starts."""
    head = f.read(8)
    if len(head) != 8:
        raise CheckpointError(f"{path}: truncated safetensors file (no header length)")
    (n,) = struct.unpack("<Q", head)
    try:
        meta = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a safetensors file (header: {e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: not a safetensors file (header is not an object)")
    return meta, 8 + n


def weights_hash(files: list[Path]) -> str:
    """sha256 over the tensors of safetensors `files` by bare name (see the module contract)."""
    entries = []  # (bare name, file, dtype, shape, start, end)
    for path in files:
        with open(path, "rb") as f:
            meta, base = _header(f, path)
        for name, t in meta.items():
            if name == "__metadata__" or _bare(name) in COPIES:
                continue
            try:
                start, end = t["data_offsets"]
                entries.append((_bare(name), path, str(t["dtype"]), list(t["shape"]), base + start, base + end))
            except (KeyError, TypeError, ValueError):
                raise CheckpointError(f"{path}: tensor {name!r} has no valid dtype/shape/data_offsets") from None
    h = hashlib.sha256()
    for name, path, dtype, shape, start, end in sorted(entries, key=lambda e: e[0]):
        h.update(json.dumps([name, dtype, shape]).encode())
        with open(path, "rb") as f:
            f.seek(start)
            left = end - start
            while left > 0:
                got = f.read(min(CHUNK, left))
                if not got:
                    raise CheckpointError(f"{path}: truncated (tensor {name!r} ends past the end of the file)")
                h.update(got)
                left -= len(got)
    return h.hexdigest()


def identity(path: str | Path, draft_config: str | Path | None = None) -> dict:
    """The identity of the checkpoint at `path` (see the module contract)."""
    ck = locate(path, draft_config)
    cfg = config_of(ck)
    config_hash = hashlib.sha256(json.dumps(asdict(cfg), sort_keys=True).encode()).hexdigest()
    weights = weights_hash(ck.weights) if ck.kind == "hf" else None
    return {
        "path": str(ck.path),
        "name": ck.path.name,
        "family": cfg.family,
        "block_size": cfg.block_size,
        "width": cfg.width,
        "target_layer_ids": list(cfg.target_layer_ids),
        "config_hash": config_hash,
        "weights_hash": weights,
        "fingerprint": hashlib.sha256((config_hash + weights).encode()).hexdigest()[:16] if weights else None,
    }
