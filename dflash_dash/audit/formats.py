"""The trainers' feature caches, read as their own code writes them: one sample at a time, tensors only.

Contract: `open_cache(path)` recognises the folder and returns a `Cache`: its `format`, `strategy`, the layer ids it
records (None where the format keeps none), its hidden width and `samples()`, a lazy iterator of `Sample` (one file
or one index record read per step). Nothing here unpickles code: SpecForge's `.ckpt` files load with
`torch.load(weights_only=True)` (gzip-wrapped ones through `gzip`), DeepSpec's shards are raw bytes read with numpy.
A cut file, an unknown layout or a non-tensor value is a `FeatureError`: one line naming the file and what was
expected.

Formats, each read from its writer's source:
- SpecForge (`sgl-project/SpecForge` at a6b6b0230009d15ec2a97a57384e6f53f0f96946): `scripts/prepare_hidden_states.py`
  (`HiddenStatesGenerator._save_tensor_sync`: `torch.save(dict)`, or into `gzip.open(...)` with `--compress`,
  as `{out}/rows_{g}-{g+2000}/data_{i}.ckpt[.gz]`; records holding a NaN are skipped, never written) with the
  keys of each strategy's `OfflineCaptureLayout` (`specforge/algorithms/{dflash,domino,dspark}/providers.py`):
  dflash and domino `input_ids` [T], `loss_mask` [T], `hidden_states` [1, T, K*H] (the target layers' states
  concatenated, from SGLang's `set_dflash_layers_to_capture`, which captures before layer l+1: the output of layer
  l); dspark adds `target_last_hidden_states` [1, T, H] (the post-norm last hidden state). The reader
  (`specforge/runtime/data_plane/offline_reader.py`, `list_feature_files`) lists `*.ckpt` / `*.ckpt.gz` under the
  folder, sorted by path: that order is the sample order here too. No capture file records the layer ids (they come
  from the draft config, `--draft-model-config`). The snapshot has no DFlash2 strategy of its own: a cache with the
  dflash keys is read as dflash. EAGLE-3's layout (`aux_hidden_state` + `hidden_state`) is not a block drafter's and
  is refused by name.
- DeepSpec (`deepseek-ai/DeepSpec`): `deepspec/data/target_cache_dataset.py` at
  4351696e059a11466cc4d198b1ef1b773c2ce294 (`TARGET_CACHE_VERSION` 2: `manifest.json`, `samples.idx` of
  `<QIIQQQQQ` records, raw `shard-NNNNN.bin` files holding per sample input_ids int32 [T], attention_mask uint8,
  loss_mask uint8, target_hidden_states [T, K*H] and target_last_hidden_states [T, H] in `hidden_dtype`),
  written by `scripts/data/prepare_target_cache.py` with `deepspec/modeling/target_extract.py`
  (1bcc590c89d645357d05ffa13c2881c49a213674: forward hooks on `layers[l]`: the output of layer l; -1 the
  embedding; last = the backbone's normed `last_hidden_state`).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError

SPECFORGE = "specforge"
DEEPSPEC = "deepspec"
SPECFORGE_SOURCE = "sgl-project/SpecForge scripts/prepare_hidden_states.py @ a6b6b0230009"
DEEPSPEC_SOURCE = "deepseek-ai/DeepSpec deepspec/data/target_cache_dataset.py @ 4351696e059a (cache version 2)"
SUFFIXES = (".ckpt", ".ckpt.gz")  # SpecForge's offline feature files (offline_reader._FEATURE_SUFFIXES)
# SpecForge strategy -> (key of the concatenated target-layer states, key of the last hidden state or None)
STRATEGIES = {
    "dflash": ("hidden_states", None),  # also domino and DFlash2 captures: the same keys
    "dspark": ("hidden_states", "target_last_hidden_states"),
}
EAGLE3_KEYS = {"aux_hidden_state", "hidden_state"}
DEEPSPEC_VERSION = 2
DEEPSPEC_RECORD = struct.Struct("<QIIQQQQQ")  # sample_id, shard_id, seq_len, five byte offsets
DEEPSPEC_HIDDEN = {"bfloat16": (torch.bfloat16, 2), "float8_e4m3fn": (torch.float8_e4m3fn, 1)}
DEEPSPEC_HIDDEN["float8_e5m2"] = (torch.float8_e5m2, 1)


class FeatureError(UserError, ValueError):
    """A feature cache this product cannot read as its trainer wrote it; the message names the file and the fix."""


@dataclass
class Sample:
    """One captured sequence as the trainer stored it."""

    name: str  # the file (SpecForge) or sample index (DeepSpec) it came from
    input_ids: torch.Tensor  # [T] int64 token ids
    loss_mask: torch.Tensor  # [T] the trainer's supervision mask
    hidden: torch.Tensor  # [T, K*H] the target layers' states, in the cache's own dtype
    last: torch.Tensor | None  # [T, H] the target's post-norm last hidden state, where kept


@dataclass
class Cache:
    """A recognised feature cache folder."""

    path: Path  # the folder
    format: str  # specforge | deepspec
    strategy: str  # the trainer's strategy whose keys the files hold (dflash, dspark; deepspec)
    source: str  # the writer's source file and version
    layer_ids: list[int] | None  # target layer ids the cache records (DeepSpec's manifest); None: not recorded
    hidden_size: int | None  # H where the cache records it
    files: list[Path]  # SpecForge: the feature files in the trainer's order; DeepSpec: the shards
    count: int  # samples held
    hidden_dtype: str | None = None  # DeepSpec's manifest hidden_dtype (bfloat16, float8_*); SpecForge: per tensor

    def samples(self, limit: int | None = None) -> Iterator[Sample]:
        """The first `limit` samples (all when None), read one at a time."""
        n = self.count if limit is None else min(limit, self.count)
        read = _specforge_sample if self.format == SPECFORGE else _deepspec_reader(self)
        for i in range(n):
            yield read(self, i)


def open_cache(path: str | Path) -> Cache:
    """Recognise a trainer's feature cache folder (DeepSpec by its manifest.json, SpecForge by its .ckpt files)."""
    p = Path(path)
    if not p.exists():
        raise FeatureError(f"{p}: no such feature cache folder")
    if (p / "manifest.json").is_file():
        return _deepspec(p)
    files = _specforge_files(p)
    if not files:
        raise FeatureError(
            f"{p}: not a feature cache this product reads: expected SpecForge's prepare_hidden_states.py output "
            "(rows_*/data_*.ckpt or .ckpt.gz) or a DeepSpec target cache (manifest.json, samples.idx, shard-*.bin)"
        )
    first = load_ckpt(files[0])
    return Cache(p, SPECFORGE, strategy_of(first, files[0]), SPECFORGE_SOURCE, None, None, files, len(files))


# ---------------------------------------------------------------------------
# SpecForge


def _specforge_files(p: Path) -> list[Path]:
    if p.is_file():
        return [p] if p.name.endswith(SUFFIXES) else []
    out = []
    for root, _dirs, names in os.walk(p):  # as offline_reader.list_feature_files: every file, sorted by path
        out += [Path(root, n).resolve() for n in names if n.endswith(SUFFIXES)]
    return sorted(out, key=str)


def load_ckpt(f: Path) -> dict:
    """One SpecForge feature file: tensors only (`weights_only=True`), gzip-wrapped where it ends in .gz."""
    try:
        if f.name.endswith(".gz"):
            with gzip.open(f, "rb") as fh:
                raw = torch.load(io.BytesIO(fh.read()), weights_only=True, map_location="cpu")
        else:
            raw = torch.load(f, weights_only=True, map_location="cpu", mmap=True)
    except (EOFError, gzip.BadGzipFile, RuntimeError, OSError) as e:
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            raise FeatureError(
                f"{f}: holds pickled objects besides tensors; refused (only tensors are loaded)"
            ) from None
        raise FeatureError(
            f"{f}: not a complete torch file ({type(e).__name__}: cut short or still being written?); "
            "capture it again with prepare_hidden_states.py or remove it"
        ) from None
    except Exception as e:  # weights_only's UnpicklingError: a value that is not a tensor or plain data
        raise FeatureError(f"{f}: holds pickled objects besides tensors ({type(e).__name__}); refused") from None
    if not isinstance(raw, dict):
        raise FeatureError(
            f"{f}: expected a dict of tensors as prepare_hidden_states.py saves, found {type(raw).__name__}"
        )
    return raw


def strategy_of(raw: dict, f: Path) -> str:
    """The strategy whose capture layout the record's keys are."""
    keys = set(raw)
    if EAGLE3_KEYS <= keys:
        raise FeatureError(
            f"{f}: an EAGLE-3 capture (aux_hidden_state, hidden_state): another feature layout, not a block "
            "drafter's; audit a DFlash, DSpark, Domino or DFlash2 capture (key hidden_states)"
        )
    missing = [k for k in ("input_ids", "loss_mask", "hidden_states") if k not in keys]
    if missing:
        raise FeatureError(
            f"{f}: missing {', '.join(missing)}; expected the keys SpecForge's DFlash-family capture writes: "
            f"input_ids, loss_mask, hidden_states (dspark also target_last_hidden_states); found {sorted(keys)}"
        )
    return "dspark" if "target_last_hidden_states" in keys else "dflash"


def _rows(t, f, key: str) -> torch.Tensor:
    """[1, T, W] or [T, W] -> [T, W] (as SpecForge's _normalize_hidden_states accepts)."""
    if not isinstance(t, torch.Tensor):
        raise FeatureError(f"{f}: {key} is a {type(t).__name__}, expected a tensor")
    if t.dim() == 3 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 2:
        raise FeatureError(f"{f}: {key} has shape {tuple(t.shape)}, expected [T, width] or [1, T, width]")
    return t


def _specforge_sample(cache: Cache, i: int) -> Sample:
    f = cache.files[i]
    raw = load_ckpt(f)
    strategy_of(raw, f)
    ids = raw["input_ids"].reshape(-1).long()
    hidden = _rows(raw["hidden_states"], f, "hidden_states")
    last = raw.get("target_last_hidden_states")
    last = None if last is None else _rows(last, f, "target_last_hidden_states")
    for key, t in (("hidden_states", hidden), ("target_last_hidden_states", last)):
        if t is not None and t.shape[0] != len(ids):
            raise FeatureError(f"{f}: {key} holds {t.shape[0]} positions, input_ids {len(ids)}; a damaged record")
    return Sample(
        str(f.relative_to(cache.path)) if f.is_relative_to(cache.path) else f.name,
        ids,
        raw["loss_mask"].reshape(-1),
        hidden,
        last,
    )


# ---------------------------------------------------------------------------
# DeepSpec


def _deepspec(p: Path) -> Cache:
    mf = p / "manifest.json"
    try:
        m = json.loads(mf.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise FeatureError(f"{mf}: not readable JSON ({e}); a DeepSpec manifest.json is a JSON object") from None
    need = ["version", "num_samples", "target_layer_ids", "hidden_dtype", "index_record_size", "hidden_size", "shards"]
    missing = [k for k in need if k not in m] if isinstance(m, dict) else need
    if missing:
        raise FeatureError(f"{mf}: missing {', '.join(missing)}; expected a DeepSpec target cache manifest (version 2)")
    if int(m["version"]) != DEEPSPEC_VERSION:
        raise FeatureError(f"{mf}: version {m['version']}, this product reads DeepSpec target cache version 2")
    if m["hidden_dtype"] not in DEEPSPEC_HIDDEN:
        raise FeatureError(f"{mf}: hidden_dtype {m['hidden_dtype']!r}, expected one of {', '.join(DEEPSPEC_HIDDEN)}")
    if int(m["index_record_size"]) != DEEPSPEC_RECORD.size:
        raise FeatureError(f"{mf}: index_record_size {m['index_record_size']}, expected {DEEPSPEC_RECORD.size}")
    shards = [p / s["file_name"] for s in sorted(m["shards"], key=lambda s: int(s["shard_id"]))]
    for s in shards + [p / "samples.idx"]:
        if not s.is_file():
            raise FeatureError(f"{s}: missing from the DeepSpec target cache (named by {mf.name})")
    n = int(m["num_samples"])
    size = (p / "samples.idx").stat().st_size
    if size != n * DEEPSPEC_RECORD.size:
        raise FeatureError(
            f"{p / 'samples.idx'}: {size} bytes, expected {n} records of {DEEPSPEC_RECORD.size} "
            "(manifest num_samples); a half-written cache"
        )
    ids = [int(x) for x in m["target_layer_ids"]]
    return Cache(p, DEEPSPEC, DEEPSPEC, DEEPSPEC_SOURCE, ids, int(m["hidden_size"]), shards, n, m["hidden_dtype"])


def _deepspec_reader(cache: Cache):
    idx = (cache.path / "samples.idx").read_bytes()
    dt, width = DEEPSPEC_HIDDEN[cache.hidden_dtype or "bfloat16"]
    K, H = len(cache.layer_ids or []), cache.hidden_size or 0

    def read(_cache: Cache, i: int) -> Sample:
        sid, shard, T, o_ids, _o_att, o_loss, o_hid, o_last = DEEPSPEC_RECORD.unpack_from(idx, i * DEEPSPEC_RECORD.size)
        f = cache.files[shard] if shard < len(cache.files) else None
        if sid != i or f is None:
            raise FeatureError(
                f"{cache.path / 'samples.idx'}: record {i} names sample {sid} in shard {shard}; a damaged index"
            )
        end = o_last + T * H * width
        if f.stat().st_size < end:
            raise FeatureError(f"{f}: {f.stat().st_size} bytes, sample {i} ends at byte {end}; a cut shard")
        buf = np.memmap(f, dtype=np.uint8, mode="r")

        def take(off, count, np_dtype):
            return torch.from_numpy(np.frombuffer(buf, np_dtype, count, off).copy())

        bits = np.uint16 if width == 2 else np.uint8
        hidden = take(o_hid, T * K * H, bits).view(dt).view(T, K * H)
        last = take(o_last, T * H, bits).view(dt).view(T, H)
        return Sample(f"sample {i}", take(o_ids, T, np.int32).long(), take(o_loss, T, np.uint8), hidden, last)

    return read
