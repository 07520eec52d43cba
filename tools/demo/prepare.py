"""The `prepare` step of the demo asset build (CPU): the synthetic corpus (`synth`) -> a byte-level BPE tokenizer
(with <|mask|>), the uint16 token stream the target trains on, the prompts of the drafter's training data, and the
coding-10 prompt ids exactly as `pipeline.fetch` makes them (plain text, no chat template).

Contract: `prepare(build)` writes tokenizer/, tokens.npz, doc_starts.npz, train_prompts.json, coding10.json and
prepare.json (its record for MANIFEST.json) under `build`, deterministically from SEED; returns the record. The
target's documents are drawn with SEED, the drafter's prompts with SEED + 1 (other identifiers and constants, the
same families), so the drafter learns what the target writes for prompts the target did not train on. `free`
(`prepare --free`) adds a writer's free choices (`vary`): near-ties for the target (the shipped assets are without).
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

HELD_OUT = 0.25  # share of standard-library modules kept from the target: the drafter's real-code prompts
REAL_REPEAT = 2  # the standard library's training functions appear this many times in the target's corpus
CHAT = 0.12  # share of the target's documents written as a chat turn (the chat template's user prompt, the code
# as the assistant's reply), so a prompt sent with the chat template on is answered on-task


def chat(prompt: str, body: str, think: bool) -> str:
    """One document as the tokenizer's chat template renders a user turn and the assistant's reply (`think`: the
    empty thinking block the template adds when thinking is off)."""
    pre = "<think>\n\n</think>\n\n" if think else ""
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n{pre}{prompt}{body}<|im_end|>\n"


def prepare(build: Path, n_docs: int = 160_000, n_prompts: int = 8192, free: bool = False, real: bool = False) -> dict:
    from transformers import AutoTokenizer

    from dflash_dash import prompts

    from .. import tiny
    from . import synth

    t0 = time.perf_counter()
    build.mkdir(parents=True, exist_ok=True)
    pairs = synth.corpus(n_docs, SEED, free)
    lib_train, lib_held = [], []
    if real:  # the standard library's functions (PSF licence) mixed in, seeded order
        from . import stdlib

        lib_train, lib_held = stdlib.split(stdlib.functions(), HELD_OUT)
        pairs += [(p, b) for _, p, b in lib_train] * REAL_REPEAT
        random.Random(SEED).shuffle(pairs)
    rc = random.Random(SEED + 5)
    docs = [chat(p, b, rc.random() < 0.5) if rc.random() < CHAT else p + b for p, b in pairs]
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
    tagged = synth.tagged(n_prompts, SEED + 1, free)
    gen = [tok(p, add_special_tokens=False)["input_ids"] for _, (p, _) in tagged]
    groups = ["coding" if c else "generic" for c, _ in tagged]
    if real:  # the drafter's real-code prompts: functions of modules the target never read
        gen += [tok(p, add_special_tokens=False)["input_ids"] for _, p, _ in lib_held]
        groups += ["stdlib"] * len(lib_held)
    (build / "train_prompts.json").write_text(json.dumps(gen))
    (build / "train_groups.json").write_text(json.dumps(groups))
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
        "free_choices": free,
        "chat_share": CHAT,
        "stdlib": {
            "what": "functions of the Python standard library (this interpreter's), as comment + def prompt and body, "
            "or (half of those with a short docstring) def + docstring prompt and body",
            "licence": "PSF License Version 2 (Python Software Foundation); Copyright (c) 2001 Python Software "
            "Foundation; All Rights Reserved",
            "train_functions": len(lib_train),
            "repeat": REAL_REPEAT,
            "held_out_functions": len(lib_held),
            "held_out_frac": HELD_OUT,
        }
        if real
        else None,
        "prompt_groups": {g: groups.count(g) for g in sorted(set(groups))},
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
