"""Test helpers (not tests): the parts of the prepared workspace (tests/conftest.py builds it) that tests also
use directly: the `Prepared` record, the completion texts (one hostile: `<script>` and HTML, one code) and
`drafted`, a completion made of a drafter's own blocks so that a replay sees partial acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

SCRIPT_TEXT = (
    'Here is the page:\n<script>window.__pwned = 1; alert(1)</script>\n<b>bold</b> & <img src=x '
    'onerror="window.__pwned = 2">\n\tdone = "yes"\n'
)
CODE_TEXT = 'def add(a, b):\n    """Return a + b."""\n    return a + b\n\nprint(add(1, 2))\n'


@dataclass
class Prepared:
    workspace: Path  # the workspace folder (do not mutate: copy it for tests that write)
    models: Path  # folder holding target/ and train/
    target: Path  # tiny target + tokenizer
    train: Path  # training output folder with two checkpoints
    drafters: list[Path]  # [A, B] checkpoint folders
    extraction: str  # extraction id
    runs: list[str]  # run ids [A, B]
    set_name: str  # completion set name
    script_id: str  # id of the completion holding <script>


def drafted(target: Path, drafter: Path, prompt: list[int], n: int, seed: int) -> list[int]:
    """A completion built from the drafter's own blocks: each round keeps k of its drafts (k random) and then
    a different token, so the replay sees a mix of full and partial acceptance."""
    from dflash_dash import drafters as dr, replay as rp, target as tg

    m = dr.load(drafter)
    cfg = m.c
    head = tg.load_head(target)
    dec, _ = tg.load(target, cfg.target_layer_ids, "cpu", torch.float32)
    rng = np.random.default_rng(seed)
    toks = list(prompt) + [int(rng.integers(10, 400))]
    while len(toks) - len(prompt) < n:
        ids = torch.tensor(toks)
        feats = tg.extract(dec, ids, cfg.target_layer_ids).to(torch.bfloat16).float()
        p = len(toks) - 1
        d = rp.draft_all(m, head, feats, ids, p, chunk=1).tokens[0].tolist()  # drafts at anchor p
        k = int(rng.integers(0, len(d) + 1))
        toks += d[:k]
        other = int(rng.integers(10, 400))
        toks.append(other if k == len(d) or other != d[k] else (other + 1) % 400 + 10)
    return toks[len(prompt) :][:n]


def drafted_set(target: Path, drafter: Path, out: Path) -> Path:
    """A completions JSONL of three prompts (p0, p1: completions of `drafter`'s own blocks, partial acceptance;
    p2: random tokens), written to `out`."""
    import json

    rng = np.random.default_rng(0)
    recs = []
    for i, own in enumerate((True, True, False)):
        prompt = [int(x) for x in rng.integers(10, 400, 6 + i)]
        ids = drafted(target, drafter, prompt, 24, seed=i) if own else [int(x) for x in rng.integers(10, 400, 20)]
        recs.append({"id": f"p{i}", "prompt_ids": prompt, "output_ids": ids})
    out.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return out
