"""The packed per-prompt result arrays of a run: one blob per run_prompts row, in an array file of its run.

Contract: `pack_arrays` turns a row's ARRAYS (lists or numpy, flat or nested, None kept) into one little-endian
blob, `unpack_arrays` reverses it exactly (integers in the narrowest signed type that holds them, REALS as
float32). Large arrays live outside DuckDB so that reading one prompt of one run is a keyed read of scalars plus
one file read. Numpy and the standard library only.
"""

from __future__ import annotations

import json
import os
import struct
import zlib

import numpy as np

from .errors import StoreError

# The per-prompt result arrays of a run_prompts row, in the order rows list them. Integers, except REALS
# (float32, as the REAL[] columns of schema v4-v6 held them).
ARRAYS = (
    "rounds",
    "accepted_at",
    "drafts",
    "tree_at",
    "tree_rounds",
    "draft_logp",
    "round_top_ids",
    "round_top_p",
    "confidence",
    "target_rank",
    "expected_at",
)  # a blob without a later name (written before it existed) reads it back as None
REALS = frozenset({"draft_logp", "round_top_p", "confidence", "expected_at"})
V7_ARRAYS = ARRAYS[:8]  # the LIST columns of schema v6 (the v7 migration reads those)
PACK_MAGIC, PACK_LEVEL = b"DFA1", 1  # blob format tag; zlib level (1: fast, most of the gain)
PACKERS = min(8, os.cpu_count() or 1)  # threads packing a run's rows (`_write_arrays`)
ARRAYS_DIR = "run_arrays"  # under the workspace: {run_id}/{uuid}.arrays, the packed rows of one put_prompts
_INTS = [np.dtype(t) for t in ("<i1", "<i2", "<i4", "<i8")]


def pack_arrays(p: dict) -> bytes:
    """A run_prompts row's arrays (ARRAYS; lists or numpy, flat or nested; None kept as None) as one blob:
    MAGIC, u32 header length, JSON header {name: [dtype, count] | null, "z": bytes of the zlib part}, then
    zlib(the integer arrays' values) and the REALS' raw float32 values (random mantissas: zlib would spend its
    time for a few percent), little-endian, in ARRAYS order. Integers take the narrowest signed type their
    values fit (lossless)."""
    head, ints, reals = {}, [], []
    for k in ARRAYS:
        v = p.get(k)
        if v is None:
            head[k] = None
            continue
        a = np.asarray(v, dtype=np.float32 if k in REALS else np.int64).ravel()
        if k not in REALS:
            lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
            a = a.astype(next(t for t in _INTS if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max))
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        head[k] = [a.dtype.str, int(a.size)]
        (reals if k in REALS else ints).append(a.tobytes())
    z = zlib.compress(b"".join(ints), PACK_LEVEL)
    h = json.dumps(head | {"z": len(z)}).encode()
    return b"".join([PACK_MAGIC, struct.pack("<I", len(h)), h, z, *reals])


def unpack_arrays(blob: bytes) -> dict:
    """`pack_arrays` reversed: {name: list (flat) | None} for every name of ARRAYS."""
    if blob[:4] != PACK_MAGIC:
        raise StoreError("a run_prompts row holds arrays in an unknown format; upgrade dflash-dash")
    n = struct.unpack("<I", blob[4:8])[0]
    head = json.loads(blob[8 : 8 + n])
    ints, reals = zlib.decompress(blob[8 + n : 8 + n + head["z"]]), memoryview(blob)[8 + n + head["z"] :]
    at, out = {False: 0, True: 0}, {}
    for k in ARRAYS:
        spec = head.get(k)
        if spec is None:
            out[k] = None
            continue
        dt, real = np.dtype(spec[0]), k in REALS
        out[k] = np.frombuffer(reals if real else ints, dt, spec[1], at[real]).tolist()
        at[real] += dt.itemsize * spec[1]
    return out
