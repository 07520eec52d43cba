"""The `prepare` step of the demo asset build (CPU): the synthetic corpus (`synth`) -> a byte-level BPE tokenizer
(with <|mask|>), the uint16 token stream the target trains on, the prompts of the drafter's training data, and the
coding-10 prompt ids exactly as `pipeline.fetch` makes them (plain text, no chat template).

Contract: `prepare(build)` writes tokenizer/, tokens.npz, doc_starts.npz, train_prompts.json, coding10.json and
prepare.json (its record for MANIFEST.json) under `build`, deterministically from SEED; returns the record. The
target's documents are drawn with SEED, the drafter's prompts with SEED + 1 (other identifiers and constants, the
same families), so the drafter learns what the target writes for prompts the target did not train on.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np

from dflash_dash.demo import PROMPT_SET

from .common import SEED, SPLIT, VOCAB, log


def prepare(build: Path, n_docs: int = 160_000, n_prompts: int = 8192) -> dict:
    from transformers import AutoTokenizer

    from dflash_dash import prompts

    from .. import tiny
    from . import synth

    t0 = time.perf_counter()
    build.mkdir(parents=True, exist_ok=True)
    docs = [p + b for p, b in synth.corpus(n_docs, SEED)]
    tok_dir = tiny.write_tokenizer(build / "tokenizer", vocab_size=VOCAB, corpus=docs[:20_000], split=SPLIT)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    ids: list[int] = []
    starts = []
    for enc in tok(docs, add_special_tokens=False)["input_ids"]:
        starts.append(len(ids))
        ids.extend(enc)
        ids.append(eot)
    tokens = np.asarray(ids, dtype=np.uint16)
    np.savez_compressed(build / "tokens.npz", tokens=tokens)
    np.savez(build / "doc_starts.npz", commented=np.asarray(starts, dtype=np.int64))
    gen = [tok(p, add_special_tokens=False)["input_ids"] for p, _ in synth.corpus(n_prompts, SEED + 1)]
    (build / "train_prompts.json").write_text(json.dumps(gen))
    # coding-10 exactly as pipeline.fetch tokenises a plain-text prompt
    c10 = [
        {"id": p["id"], "prompt": p["prompt"], "prompt_ids": list(tok(p["prompt"])["input_ids"])}
        for p in prompts.load(PROMPT_SET)
    ]
    (build / "coding10.json").write_text(json.dumps(c10))
    rec = {
        "python": platform.python_version(),
        "corpus": "tools/demo/synth.py: seeded small Python functions (the coding-10 tasks as 10 of "
        f"{len(synth.FAMILIES)} families, each with varied identifiers, constants and wording)",
        "documents": n_docs,
        "distinct_documents": len(set(docs)),
        "vocab_size": len(tok),
        "pre_tokenizer": SPLIT,
        "stream_tokens": int(len(tokens)),
        "train_prompts": len(gen),
        "prompt_set": PROMPT_SET,
        "seed": SEED,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (build / "prepare.json").write_text(json.dumps(rec, indent=2))
    log(f"prepared {build}: {rec}")
    return rec
