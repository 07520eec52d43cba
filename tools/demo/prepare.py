"""The `prepare` step of the demo asset build (CPU): the stdlib corpus -> a byte-level BPE tokenizer (with
<|mask|>), the uint16 token stream the target trains on, the prompts of the drafter's training data, and the
coding-10 prompt ids exactly as `pipeline.fetch` makes them (plain text, no chat template).

Contract: `prepare(build)` writes tokenizer/, tokens.npy, doc_starts.npz, train_prompts.json, coding10.json and
prepare.json (its record for MANIFEST.json) under `build`, deterministically from SEED; returns the record.
"""

from __future__ import annotations

import json
import platform
import random
import time
from pathlib import Path

import numpy as np

from dflash_dash.demo import PROMPT_SET

from .common import SEED, SPLIT, VOCAB, log


def prepare(build: Path, n_raw: int = 3072, n_chat: int = 1024, n_comment: int = 4096) -> dict:
    from transformers import AutoTokenizer

    from dflash_dash import prompts

    from .. import tiny
    from . import corpus

    t0 = time.perf_counter()
    build.mkdir(parents=True, exist_ok=True)
    files = corpus.files()
    commented, pairs = corpus.samples(files, SEED)
    tok_dir = tiny.write_tokenizer(
        build / "tokenizer", vocab_size=VOCAB, corpus=[corpus.read(p) for p in files], split=SPLIT
    )
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    tokens, starts = corpus.stream(tok, files, commented, pairs, repeat=2, seed=SEED, starts=True)
    np.save(build / "tokens.npy", tokens)
    np.savez(build / "doc_starts.npz", **starts)
    # prompts of the drafter's training data: raw code windows, comment-prompted function heads, chat asks
    rng = random.Random(SEED + 1)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    gen = []
    for _ in range(n_raw):
        s = rng.randrange(0, len(tokens) - 64)
        gen.append([int(t) for t in tokens[s : s + rng.randrange(16, 64)] if t != eot] or [int(tokens[s])])
    for d in commented[:n_comment]:
        lines = d.splitlines(keepends=True)
        head = [ln for ln in lines if ln.startswith("#")]
        gen.append(tok("".join(head + lines[len(head) : len(head) + 1]))["input_ids"])
    for ask, _ in pairs[:n_chat]:
        gen.append(
            tok.apply_chat_template(
                [{"role": "user", "content": ask}], add_generation_prompt=True, tokenize=False, enable_thinking=False
            )
        )
        gen[-1] = tok(gen[-1], add_special_tokens=False)["input_ids"]
    gen = [g[-96:] for g in gen]
    (build / "train_prompts.json").write_text(json.dumps(gen))
    # coding-10 exactly as pipeline.fetch tokenises a plain-text prompt
    c10 = [
        {"id": p["id"], "prompt": p["prompt"], "prompt_ids": list(tok(p["prompt"])["input_ids"])}
        for p in prompts.load(PROMPT_SET)
    ]
    (build / "coding10.json").write_text(json.dumps(c10))
    rec = {
        "python": platform.python_version(),
        "stdlib_files": len(files),
        "stdlib_bytes": sum(p.stat().st_size for p in files),
        "stdlib_fingerprint": corpus.fingerprint(files),
        "comment_prompted_functions": len(commented),
        "chat_samples": len(pairs),
        "sample_repeat": 2,
        "vocab_size": len(tok),
        "pre_tokenizer": SPLIT,
        "stream_tokens": int(len(tokens)),
        "documents": {k: int(len(v)) for k, v in starts.items()},
        "license_headers_stripped": sum(corpus.strip_header(corpus.read(p)) != corpus.read(p) for p in files),
        "train_prompts": len(gen),
        "train_prompt_kinds": {
            "raw": n_raw,
            "comment": min(n_comment, len(commented)),
            "chat": min(n_chat, len(pairs)),
        },
        "prompt_set": PROMPT_SET,
        "seed": SEED,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (build / "prepare.json").write_text(json.dumps(rec, indent=2))
    log(f"prepared {build}: {rec}")
    return rec
