"""Which fault explains the gap: the run's checkpoint replayed under each known engine fault over the run's own
cached features, ranked by how well each reproduces the engine's per-step (or, lacking steps, per-prompt)
numbers (`analysis.steps.rank`), kept in the store for the Conformance page and the CLI.

Contract: torch work, run by the CLI (`conformance --faults`) or a job, never by a page. Each fault's variant
replay walks the chain like a greedy engine (anchor P, then + committed) and gives the committed tokens per round:
  - layer-shift: the drafter's features read from target layers l+o for each of its layer ids l, every offset o
    of OFFSETS a candidate. The features come from the run's extraction, else from another extraction of the same
    completions and target that holds the shifted layers (`source`); an offset whose layers no extraction holds is
    skipped, naming the extract command that adds them; one reaching outside the target's layers is skipped too.
  - sliding-ignored / sliding-bidirectional: the checkpoint's sliding-window layers over the full context (a copy
    of its config with a window wider than any context) / bidirectional inside the block; skipped when the drafter
    has no sliding-window layers (sliding-bidirectional also when the run replayed them bidirectionally).
  - draft-tokens: the replay's own acceptance cut at k drafts a step, every k = 1..D-1 a candidate.
  - context-window: the drafter sees only the last W context positions, every W of `windows` (powers of two
    below the longest prompt) a candidate.
  - prefill-count: the replay's rounds with the prefill counted as a verify step of one token.
  - numerics: the drafter in bf16 when the run replayed in fp32 (else fp32); every other variant uses the run's
    dtype.
Variants run on the CPU (the ranking is a diagnosis of one run's prompts, not a sweep).
Every parameter of a parametric fault is a candidate of `steps.rank` (its "param", `detail` in words): the ranking
lists each fault at its best parameter, names one only with a clear margin over the runner-up (`steps.explained`)
and says "no gap to explain" when the clean replay reproduces the engine.
The result is kept as run analysis `faults:<engine>` (`kept_name`); `faults` reads it back or None.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import drafters as drafter_mod, ops, walks
from ..analysis import steps as steps_mod
from ..ops import InputError
from ..store import Extraction, Store
from .base import DTYPES, Progress, tick
from .features import is_streamed, load_sequences
from .kept import engine_of

OFFSETS = (-2, -1, 1, 2)  # layer-shift: target-layer offsets searched (0: the run's own layers)


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


def windows(ctx: int) -> list[int]:
    """context-window: the visible context positions searched, powers of two from 2 below `ctx` positions."""
    return [1 << k for k in range(1, max(ctx, 2).bit_length()) if 1 << k < ctx]


def source(store: Store, ex: Extraction, layers: list[int], ids: set[str]) -> Extraction | None:
    """The extraction holding target `layers` for prompts `ids`: the run's own `ex`, else (the same dtype first)
    another finished extraction of the same completions and target config with feature files; None when none."""
    same = [
        e
        for e in store.extractions()
        if e.id != ex.id
        and (e.set_name, e.target_path, e.config_hash) == (ex.set_name, ex.target_path, ex.config_hash)
        and e.status == "done"
        and not is_streamed(e)
    ]
    for e in [ex, *sorted(same, key=lambda e: e.dtype != ex.dtype)]:
        if not ops.missing_layers(list(e.layer_ids), layers) and ids <= {it.prompt_id for it in store.items(e.id)}:
            return e
    return None


def shifted(
    store: Store, ex: Extraction, need: list[int], ids: set[str]
) -> tuple[dict[int, tuple[Extraction, list[int]]], dict[int, str], str | None]:
    """layer-shift: ({offset: (the extraction holding layers l + offset, those layers)} for every offset of OFFSETS
    that can be replayed, {offset: why not} for the others (outside the target's layers, or held by no extraction),
    the one extract command that adds every layer no extraction holds or None)."""
    from .. import target_info

    try:
        n = target_info.describe(ex.target_path).num_layers
    except (OSError, ValueError):  # the target folder moved or broke: offsets are bounded below only
        n = None
    found: dict[int, tuple[Extraction, list[int]]] = {}
    why: dict[int, str] = {}
    lack: dict[int, list[int]] = {}
    for o in OFFSETS:
        moved = [l + o for l in need]
        if min(moved) < 0:  # layer 0's input is the embeddings, which no extraction holds
            why[o] = f"layers {moved}: below layer 0"
        elif n is not None and max(moved) >= n:
            why[o] = f"layers {moved}: past the target's last layer ({n - 1})"
        elif (e := source(store, ex, moved, ids)) is None:
            lack[o] = moved
        else:
            found[o] = (e, moved)
    why |= {o: f"layers {m}: no extraction of {ex.set_name!r} holds them" for o, m in lack.items()}
    cmd = extract_command(store, ex, [l for m in lack.values() for l in m]) if lack else None
    return found, dict(sorted(why.items())), cmd


def extract_command(store: Store, ex: Extraction, layers: list[int]) -> str:
    """The extract command that adds `layers` for the completions of `ex` (diagnose then finds that extraction)."""
    import shlex

    return (
        f"python -m dflash_dash --workspace {shlex.quote(str(store.workspace))} extract --target "
        f"{shlex.quote(str(ex.target_path))} --completions {shlex.quote(ex.set_name)} "
        f"--layers {','.join(map(str, sorted(set(layers))))}"
    )


def rank_faults(store: Store, run: str, engine: str | None = None, progress: Progress = None) -> dict:
    """Replay the run's checkpoint under each fault (module docstring), rank them against the engine's numbers
    and keep the result (`kept_name`); returns it with "run" and "engine" added."""
    import torch

    from .. import target as target_mod

    r = store.run_row(run)  # the run and its extraction resolved once, here
    if r.extraction_id is None:
        raise InputError(f"run {r.id}: a model-free baseline (no drafter to replay under faults); give a drafter's run")
    ex = store.extraction(r.extraction_id)
    eng = engine_of(store, ex.set_name, engine)
    erows = engine_rows(store, ex.set_name, eng)
    prompts = {p["prompt_id"]: p for p in store.run_prompts(r.id)}
    if not erows.keys() & prompts.keys():
        raise InputError(f"run {r.id}: engine {eng!r} has stats for none of its prompts; nothing to rank")
    clean = {pid: list(p["rounds"] or []) for pid, p in prompts.items() if pid in erows}
    variants: dict[str, dict | list[dict]] = {steps_mod.CLEAN: {"steps": clean, "detail": "the run's own replay"}}
    skipped: dict[str, str] = {}
    variants["prefill-count"] = {
        "steps": {pid: steps_mod.prefill_step(st) for pid, st in clean.items()},
        "detail": "the prefill counted as a verify step",
    }
    ck, dc, sliding = r.checkpoint, r.config_file, r.sliding_block
    c = drafter_mod.check(ck, sliding, dc)
    cuts: dict[int, dict[str, list[int]]] = {}
    for pid in clean:
        p = prompts[pid]
        acc = np.asarray(p["accepted_at"] if p["accepted_at"] is not None else [])
        if not len(acc):
            break
        T = p["prompt_len"] + len(acc)
        for k in range(1, int(c.block_size) - 1):
            cuts.setdefault(k, {})[pid] = steps_mod.draft_cut(acc, p["prompt_len"], T, k)
    if cuts and all(len(v) == len(clean) for v in cuts.values()):
        variants["draft-tokens"] = [
            {"steps": st, "detail": f"{k} draft(s) verified a step", "param": k} for k, st in cuts.items()
        ]
    else:
        skipped["draft-tokens"] = "the run kept no every-anchor acceptance (replayed with --anchors chain)"
    H, have, need = ex.hidden_size, list(ex.layer_ids), list(c.target_layer_ids)
    tick(progress, 1, 6, "reading the run's features")
    seqs = [s for s in load_sequences(store, ex) if s.id in clean]
    head = target_mod.load_head(ex.target_path, "cpu", torch.float32)
    own = [have.index(l) for l in need]
    # the run's own numerics for every variant but `numerics`
    dtype = DTYPES[r.dtype] if r.dtype in DTYPES else torch.float32
    d = drafter_mod.load(ck, dtype, "cpu", sliding, dc)
    tick(progress, 2, 6, "context-window: the drafter sees the last W positions only")
    ctx = max(p["prompt_len"] for p in prompts.values())
    ws = windows(ctx)
    if ws:
        variants["context-window"] = [
            {"steps": windowed(d, head, seqs, own, H, w), "detail": f"last {w} context positions", "param": w}
            for w in ws
        ]
    else:
        skipped["context-window"] = "every prompt is shorter than the smallest window (2 positions)"
    tick(progress, 3, 6, f"layer-shift: target layers offset by {', '.join(f'{o:+d}' for o in OFFSETS)}")
    found, why, cmd = shifted(store, ex, need, set(clean))
    variants["layer-shift"] = []
    for o, (e, moved) in found.items():
        fs = seqs if e is ex else [s for s in load_sequences(store, e, moved) if s.id in clean]
        cols = [have.index(l) for l in moved] if e is ex else None
        detail = f"layers {moved} instead of {need} (offset {o:+d})" + ("" if e is ex else f", from extraction {e.id}")
        variants["layer-shift"].append({"steps": every(d, head, fs, cols, H), "detail": detail, "param": o})
    add = f"; add the missing layers with {cmd} and diagnose again (it reads them from that extraction)" if cmd else ""
    if not found:
        del variants["layer-shift"]
        skipped["layer-shift"] = "; ".join(f"offset {o:+d}: {w}" for o, w in why.items()) + add
    else:
        skipped |= {f"layer-shift {o:+d}": w + (add if w.endswith("holds them") else "") for o, w in why.items()}
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
    out = {"run": r.id, "engine": eng} | steps_mod.rank(erows, variants, skipped)
    # the evidence: the rounds per prompt of the clean replay and of each fault at its best parameter
    won = {f["fault"]: f["param"] for f in out["faults"]}
    out["steps"] = {
        f: next(c["steps"] for c in steps_mod.candidates(v) if f == steps_mod.CLEAN or c.get("param") == won.get(f))
        for f, v in variants.items()
        if f == steps_mod.CLEAN or f in won
    }
    store.set_analysis(r.id, kept_name(eng), out)
    tick(progress, 6, 6, f"explained by: {out['explained_by'] or out['evidence']}")
    return out
