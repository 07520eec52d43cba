"""Which fault explains the gap: the run's checkpoint replayed under each known engine fault over the run's own
cached features, ranked by how well each reproduces the engine's per-step (or, lacking steps, per-prompt)
numbers (`analysis.steps.rank`), kept in the store for the Conformance page and the CLI.

Contract: torch work, run by the CLI (`conformance --faults`) or a job, never by a page. Each fault's variant
replay walks the chain like a greedy engine (anchor P, then + committed) and gives the committed tokens per round:
  - layer-shift: the drafter's features read from target layers l+1 (and l-1; the better one is kept), when the
    run's extraction holds them; else skipped, naming the extract command's --layers.
  - sliding-ignored / sliding-bidirectional: the checkpoint's sliding-window layers over the full context (a copy
    of its config with a window wider than any context) / bidirectional inside the block; skipped when the drafter
    has no sliding-window layers (sliding-bidirectional also when the run replayed them bidirectionally).
  - draft-tokens: the replay's own acceptance cut at k drafts a step, k = 1..D-1 (the best k kept).
  - context-window: the drafter sees only the last W context positions (W in WINDOWS, shorter than the context).
  - prefill-count: the replay's rounds with the prefill counted as a verify step of one token.
  - numerics: the drafter in bf16 when the run replayed in fp32 (else fp32); every other variant uses the run's
    dtype.
Variants run on the CPU (the ranking is a diagnosis of one run's prompts, not a sweep).
Parametric faults keep the parameter that reproduces the engine best (`detail` names it).
The result is kept as run analysis `faults:<engine>` (`kept_name`); `faults` reads it back or None.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import drafters as drafter_mod, walks
from ..analysis import steps as steps_mod
from ..ops import InputError
from ..store import Store
from .base import DTYPES, Progress, tick

WINDOWS = (4, 16, 64)  # context-window: the drafter's visible context positions tried


def kept_name(engine: str) -> str:
    return f"faults:{engine}"


def faults(store: Store, run_id: str, engine: str) -> dict | None:
    """The kept ranking of run `run_id` against engine `engine`, or None when it was never computed."""
    return store.analysis(run_id, kept_name(engine))


def engine_rows(store: Store, set_name: str, engine: str) -> dict[str, dict]:
    return {s["prompt_id"]: s for s in store.engine_stats(set_name, engine)}


def chain(draft, tokens: np.ndarray, prompt_len: int) -> list[int]:
    """Committed tokens per round of a greedy chain walk that drafts with `draft(anchor)` -> D draft ids."""
    T, p, out = len(tokens), prompt_len, []
    while p < T - 1:
        acc = walks.accepted(np.asarray([draft(p)]), tokens[:T], p)[0]  # leading drafts equal to the completion
        c = int(min(acc + 1, T - 1 - p))
        out.append(c)
        p += c
    return out


def every(d, head, seqs, cols: list[int] | None, H: int) -> dict[str, list[int]]:
    """Chain rounds of drafter `d` from every-anchor drafts over `seqs` (features of column blocks `cols`)."""
    import torch

    from .. import replay as replay_mod

    out = {}
    for s in seqs:
        f = s.features if cols is None else torch.cat([s.features[:, b * H : (b + 1) * H] for b in cols], 1)
        dr = replay_mod.draft_all(d, head, f, s.tokens, s.prompt_len)
        toks = s.tokens.numpy()
        acc = walks.accepted(dr.tokens.numpy(), toks, s.prompt_len)
        out[s.id] = [c for _, _, c in walks.chain_walk(acc, s.prompt_len, len(toks))]
    return out


def windowed(d, head, seqs, cols: list[int] | None, H: int, w: int) -> dict[str, list[int]]:
    """Chain rounds when the drafter sees only the last `w` context positions (re-positioned from 0)."""
    import torch

    from .. import replay as replay_mod

    out = {}
    for s in seqs:
        f = s.features if cols is None else torch.cat([s.features[:, b * H : (b + 1) * H] for b in cols], 1)
        toks = s.tokens.numpy()

        def draft(p, f=f, toks=toks):
            k = min(p, w)
            return replay_mod.draft_one(d, head, f[p - k : p], k, int(toks[p]))

        out[s.id] = chain(draft, toks, s.prompt_len)
    return out


def best(engine: dict[str, dict], options: dict[str, dict[str, list[int]]]) -> dict | None:
    """Of several parameter choices {detail: steps}, the one that reproduces the engine best."""
    got = [(steps_mod.score(engine, st) or 0.0, det, st) for det, st in options.items()]
    if not got:
        return None
    sc, det, st = max(got, key=lambda g: g[0])
    return {"steps": st, "detail": det}


def rank_faults(store: Store, run: str, engine: str | None = None, progress: Progress = None) -> dict:
    """Replay the run's checkpoint under each fault (module docstring), rank them against the engine's numbers
    and keep the result (`kept_name`); returns it with "run" and "engine" added."""
    import torch

    from .. import target as target_mod
    from .kept import engine_of
    from .replay import load_sequences

    r = store.run_row(run)
    ex = store.extraction(r["extraction_id"])
    eng = engine_of(store, ex["set_name"], engine)
    erows = engine_rows(store, ex["set_name"], eng)
    prompts = {p["prompt_id"]: p for p in store.run_prompts(r["id"])}
    if not erows.keys() & prompts.keys():
        raise InputError(f"run {r['id']}: engine {eng!r} has stats for none of its prompts; nothing to rank")
    clean = {pid: list(p["rounds"] or []) for pid, p in prompts.items() if pid in erows}
    variants: dict[str, dict] = {steps_mod.CLEAN: {"steps": clean, "detail": "the run's own replay"}}
    skipped: dict[str, str] = {}
    variants["prefill-count"] = {
        "steps": {pid: steps_mod.prefill_step(st) for pid, st in clean.items()},
        "detail": "the prefill counted as a verify step",
    }
    ck, dc, sliding = r["checkpoint"], r.get("config_file"), r.get("sliding_block")
    c = drafter_mod.check(ck, sliding, dc)
    D = None
    cuts = {}
    for pid in clean:
        p = prompts[pid]
        acc = np.asarray(p["accepted_at"] if p["accepted_at"] is not None else [])
        if not len(acc):
            break
        T = p["prompt_len"] + len(acc)
        D = D or int(c.block_size) - 1
        for k in range(1, D):
            cuts.setdefault(f"{k} draft(s) verified a step", {})[pid] = steps_mod.draft_cut(acc, p["prompt_len"], T, k)
    if cuts and all(len(v) == len(clean) for v in cuts.values()):
        variants["draft-tokens"] = best(erows, cuts)
    else:
        skipped["draft-tokens"] = "the run kept no every-anchor acceptance (replayed with --anchors chain)"
    H, have, need = ex["hidden_size"], list(ex["layer_ids"]), list(c.target_layer_ids)
    tick(progress, 1, 6, "reading the run's features")
    seqs = [s for s in load_sequences(store, ex) if s.id in clean]
    head = target_mod.load_head(ex["target_path"], "cpu", torch.float32)
    own = [have.index(l) for l in need]
    # the run's own numerics for every variant but `numerics`
    dtype = DTYPES[r["dtype"]] if r.get("dtype") in DTYPES else torch.float32
    d = drafter_mod.load(ck, dtype, "cpu", sliding, dc)
    tick(progress, 2, 6, "context-window: the drafter sees the last W positions only")
    ctx = max(p["prompt_len"] for p in prompts.values())
    windows = {f"last {w} context positions": windowed(d, head, seqs, own, H, w) for w in WINDOWS if w < ctx}
    if windows:
        variants["context-window"] = best(erows, windows)
    else:
        skipped["context-window"] = f"every prompt is shorter than the smallest window ({WINDOWS[0]} positions)"
    tick(progress, 3, 6, "layer-shift: features of the neighbouring target layers")
    shifts = {}
    for delta in (1, -1):
        moved = [l + delta for l in need]
        if all(l in have for l in moved):
            shifts[f"layers {moved} instead of {need}"] = every(d, head, seqs, [have.index(l) for l in moved], H)
    if shifts:
        variants["layer-shift"] = best(erows, shifts)
    else:
        want = sorted(set(need) | {l + 1 for l in need} | {l - 1 for l in need if l > 0})
        skipped["layer-shift"] = (
            f"extraction {ex['id']} holds layers {have}, not the neighbours of {need}; extract with --layers "
            f"{','.join(map(str, want))} and replay on it to test this fault"
        )
    tick(progress, 4, 6, "sliding-window faults")
    if "sliding_attention" in c.layer_types:
        if drafter_mod.sliding_semantics(c, sliding) == "bidirectional":
            skipped["sliding-bidirectional"] = "the run replayed its sliding-window layers bidirectionally already"
        else:
            bi = drafter_mod.load(ck, dtype, "cpu", "bidirectional", dc)
            variants["sliding-bidirectional"] = {"steps": every(bi, head, seqs, own, H), "detail": "bidirectional"}
        full = drafter_mod.load(ck, dtype, "cpu", sliding, dc)
        full.c = dataclasses.replace(full.c, sliding_window=1 << 30)  # the window wider than any context
        variants["sliding-ignored"] = {"steps": every(full, head, seqs, own, H), "detail": "full context"}
    else:
        for f in ("sliding-ignored", "sliding-bidirectional"):
            skipped[f] = "the drafter has no sliding-window layers, so this fault changes nothing"
    other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16  # the numerics the run did not use
    name = str(other).removeprefix("torch.")
    tick(progress, 5, 6, f"numerics: the drafter in {name}")
    alt = drafter_mod.load(ck, other, "cpu", sliding, dc)
    variants["numerics"] = {"steps": every(alt, head, seqs, own, H), "detail": f"the drafter in {name}"}
    out = {"run": r["id"], "engine": eng} | steps_mod.rank(erows, variants, skipped)
    out["steps"] = {f: v["steps"] for f, v in variants.items()}  # the evidence: each variant's rounds per prompt
    store.set_analysis(r["id"], kept_name(eng), out)
    tick(progress, 6, 6, f"explained by: {out['explained_by'] or 'no known fault'}")
    return out
