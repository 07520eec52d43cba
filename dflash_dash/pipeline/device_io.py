"""Device I/O of a replay worker: passes of features sized to memory, checkpoints loaded on a loader thread and
uploaded through pinned staging chunks on a CUDA side stream, and the worker loop that overlaps them with replay;
each checkpoint replays on the columns of its own target layers (an extraction may hold several drafters' union).

Contract: `replay_work(store, spec, ids, progress)` (given an `ops.ReplayWork`) yields {"checkpoint": index,
"result": metrics.Prompt} per checkpoint and prompt, with the same results on every device and schedule: the
overlap (loader thread pool, side stream, pinned chunks) only changes when bytes move, never which. `passes`,
`read_layers`, `own_columns`, `fetch_checkpoint`, `upload_weights` and `adopt` are its parts; benchmarks time them
one by one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from .. import drafters as drafter_mod, ops
from ..store import Extraction, Store
from .base import DTYPES, Progress, tick
from .expected import sampling_of, with_tops
from .features import columns, iter_sequences

PASS_GIB = 32.0  # features held at once by a replay's worker (GiB, 2 bytes a value): a pass, read once
PASS_FREE = 0.4  # on CUDA also at most this share of the device's free memory (the drafter and the replay's
# work need the rest)


def pass_cap(device: str) -> float:
    """Bytes of features one pass may hold on `device`: PASS_GIB, on CUDA at most PASS_FREE of its free memory."""
    cap = PASS_GIB * 2**30
    if device.startswith("cuda"):
        import torch

        cap = min(cap, PASS_FREE * torch.cuda.mem_get_info(torch.device(device))[0])
    return cap


def cut(items: list, nbytes: Callable[[Any], float], cap: float) -> list[list]:
    """`items` in order cut into passes of at most `cap` bytes, `nbytes(item)` each (at least one item a pass)."""
    out: list[list] = [[]]
    size = 0.0
    for it in items:
        b = nbytes(it)
        if out[-1] and size + b > cap:
            out.append([])
            size = 0.0
        out[-1].append(it)
        size += b
    return out


def passes(store: Store, ex: Extraction, ids: list[str], device: str, blocks: int | None = None) -> list[list[str]]:
    """`ids` (in set order) cut into passes of features that fit `pass_cap(device)` (at least one prompt a pass).
    `blocks`: layer blocks of H values held per token (the columns read plus a checkpoint's selection of them,
    `read_layers`); None: the extraction's layer count."""
    tokens = {it.prompt_id: it.tokens for it in store.items(ex.id)}
    width = (blocks or len(ex.layer_ids)) * ex.hidden_size * 2
    return cut(ids, lambda i: tokens[i] * width, pass_cap(device))


STAGE_BYTES = 2**27  # a pinned staging chunk of `upload_weights`: at the 27B shapes (2,560 tokens x 25,600 values) the
# size class the feature read's staging buffers round to (`cache.read_many`), so torch's
# caching host allocator hands those back


def fetch_checkpoint(ck: ops.CheckpointSpec, dtype, device: str, side=None, settings: ops.ReplaySettings | None = None):
    """(checkpoint `ck` loaded onto `device`, seconds it took), on a loader thread of `replay_work`. On CUDA the
    weights go from the mapped file to the device through pinned chunks, copied on the side stream `side`
    (`upload_weights`), beside the replay of the checkpoint before; returns once they are there. Measured on the H200:
    copying from pageable memory stalled the replay's launches (+0.5 s a checkpoint), and pinning a whole
    checkpoint (3.5 GB) cost +1.4 s beside a first walk, or +5.5 s of the first load when done beside it."""
    t = time.perf_counter()
    place = None if side is None else (lambda w: upload_weights(w, device, side))
    s = settings or ops.ReplaySettings()  # how the checkpoint is read: its sliding semantics, its draft config
    d = drafter_mod.load(ck.path, dtype, device, s.sliding_block, s.draft_config, place)
    return d, time.perf_counter() - t


def upload_weights(w: dict, device: str, side) -> dict:
    """CPU tensors `w` copied to `device` on CUDA stream `side` through two pinned chunks of STAGE_BYTES (a chunk
    is refilled once its last copy is done: the host never waits on a pageable copy, nothing big is pinned);
    returns {name: device tensor} once every copy is done."""
    import torch

    slots = [[torch.empty(STAGE_BYTES, dtype=torch.uint8, pin_memory=True), None] for _ in range(2)]
    out, n = {}, 0
    with torch.cuda.stream(side):
        for k, t in w.items():
            dst = torch.empty(t.shape, dtype=t.dtype, device=device)
            src, to = t.contiguous().view(-1).view(torch.uint8), dst.view(-1).view(torch.uint8)
            for o in range(0, src.numel(), STAGE_BYTES):
                slot, m = slots[n % 2], min(STAGE_BYTES, src.numel() - o)
                n += 1
                if slot[1] is not None:
                    slot[1].synchronize()  # its previous copy has left the chunk
                slot[0][:m].copy_(src[o : o + m])
                to[o : o + m].copy_(slot[0][:m], non_blocking=True)
                slot[1] = side.record_event()
            out[k] = dst
    side.synchronize()
    return out


def adopt(d: drafter_mod.Drafter) -> drafter_mod.Drafter:
    """`d`, its CUDA weights (allocated on a loader's side stream) recorded as used by this thread's stream: the
    caching allocator then reuses their memory only once this stream's work on them is done."""
    if d.device.type == "cuda":
        import torch

        cur = torch.cuda.current_stream(d.device)
        for v in d.w.named().values():
            v.record_stream(cur)
    return d


def read_layers(ex: Extraction, needs: list[list[int]]) -> list[int]:
    """The layers a worker reads of extraction `ex` for checkpoints reading `needs`: their one list when they all
    read the same (each then replays on the read features as they are), else every layer any of them reads, in
    the extraction's order (each checkpoint then gathers its own from them: `own_columns`)."""
    if all(n == needs[0] for n in needs):
        return list(needs[0])
    wanted = {x for n in needs for x in n}
    return [x for x in ex.layer_ids if x in wanted]


def own_columns(seqs: list, read: list[int], need: list[int], H: int) -> list:
    """Sequences `seqs` (features of layers `read`) with the features of layers `need` in that order: `seqs` itself
    when `need` is `read`, else a gather of the needed H-blocks on the features' device (`cache.blocks`)."""
    import torch

    from .. import cache

    at = ops.layer_blocks(read, need)
    if at is None:
        return seqs
    index = torch.tensor(at, dtype=torch.long, device=seqs[0].features.device) if seqs else None
    return [replace(s, features=cache.blocks(s.features, index, H)) for s in seqs]


def replay_work(store: Store, a: ops.ReplayWork, ids: list[str], progress: Progress) -> Iterator[dict]:
    """Replay prompts `ids` of extraction a.extraction with every checkpoint of a.checkpoints on
    a.device: yields {"checkpoint": index, "result": metrics.Prompt}.

    Every checkpoint is checked (config, tensor names and shapes: `drafter.check`; its target layers held by the
    extraction: `replay.columns`) before any replay. Each replays on its own layers' columns: the pass reads the
    columns the checkpoints need (`read_layers`: when they all read the same layers, just those, gathered as each
    file lands, or no copy at all when those are the extraction's own), and checkpoints whose layers differ from
    the columns read gather their own on the device (`own_columns`, once for consecutive ones of the same layers).
    The
    prompts are read in passes (`passes`: each feature file once, a pass's features on the device); each
    checkpoint replays a whole pass before the next one, while a loader thread loads the next checkpoint onto the
    device on a side stream (`fetch_checkpoint`; the first one, and the target's head, while the features are read; on
    CUDA the fused kernels' imports start on a third thread at once). With one pass a checkpoint's results are
    complete, and stored by the parent, while the next checkpoint replays. (A warm-up of the first replay's
    kernels with blank weights while the first checkpoint loaded ended the first checkpoint 2.1 s later on the
    H200, so there is none.)"""
    import torch

    from .. import replay as replay_mod, target as target_mod

    ex = store.extraction(a.extraction)
    s = a.settings
    device, dtype, budget = a.device, DTYPES[s.dtype], s.tree_budget
    cks, how = list(a.checkpoints), sampling_of(a)
    n, total, done = len(ids), len(ids) * len(cks), 0
    needs = []
    for i, ck in enumerate(cks):
        tick(progress, 0, total, f"checking drafter {i + 1}/{len(cks)}: {ck.path}")
        needs.append(list(drafter_mod.check(ck.path, s.sliding_block, s.draft_config).target_layer_ids))
        columns(store, ex, needs[-1], f"drafter {ck.path}")  # a layer the extraction lacks: refused before any work
    read, H = read_layers(ex, needs), ex.hidden_size
    gathered = max((len(n) for n in needs if n != read), default=0)  # a checkpoint's own copy beside the pass
    parts = passes(store, ex, ids, device, len(read) + gathered)
    order = [(k, j) for k in range(len(parts)) for j in range(len(cks))]  # (pass, checkpoint), in replay order
    side = torch.cuda.Stream(torch.device(device)) if device.startswith("cuda") else None
    with ThreadPoolExecutor(3) as loader:  # the target's head, one checkpoint at a time, the fused kernels' imports
        heads = loader.submit(target_mod.load_head, ex.target_path, device, dtype)
        if side is not None:  # Triton and Inductor (seconds) beside the feature read and the first upload
            loader.submit(drafter_mod.kernels_for, torch.device(device))
        nxt = loader.submit(fetch_checkpoint, cks[0], dtype, device, side, s)
        for at, (k, j) in enumerate(order):
            part, ck = parts[k], cks[j]
            if j == 0:
                seqs, own = [], None  # the pass before's features (and a checkpoint's gather of them) go first
                own_of: tuple | None = None  # the layers `own` holds
                t0 = (
                    time.perf_counter()
                )  # one read per pass, on CUDA straight to the device, shared by every checkpoint
                seqs = [
                    s for batch in iter_sequences(store, ex, only=set(part), device=device, layers=read) for s in batch
                ]
                if how is not None:  # the expected-acceptance pass: each prompt's stored target top-K
                    seqs = with_tops(store, ex, seqs)
                tick(
                    progress,
                    done,
                    total,
                    f"read the features of {len(seqs)} prompts (pass {k + 1}/{len(parts)}) "
                    f"in {time.perf_counter() - t0:.1f} s",
                )
            tick(progress, done, total, f"loading drafter {j + 1}/{len(cks)}: {ck.path}")
            t0 = time.perf_counter()
            d, fetch_s = nxt.result()
            d = adopt(d)
            head = heads.result()
            if at + 1 < len(order):
                nxt = loader.submit(fetch_checkpoint, cks[order[at + 1][1]], dtype, device, side, s)
            t1 = time.perf_counter()

            def replayed(i: int, m: int, j=j, base=done, part=part) -> None:
                tick(
                    progress,
                    base + i,
                    total,
                    f"checkpoint {j + 1}/{len(cks)}: replayed {i}/{m} prompts"
                    + (f" of this pass ({len(part)} of {n})" if len(part) < n else ""),
                )

            def drafting(i: int, a: int, m: int, j=j, base=done) -> None:  # a long sequence's anchors
                tick(progress, base + i, total, f"checkpoint {j + 1}/{len(cks)}: prompt {i + 1}: {a:,}/{m:,} anchors")

            if own_of != tuple(needs[j]):  # this checkpoint's layers: `seqs` itself unless they differ; a gather
                own = None  # is kept for the next checkpoints of the pass reading the same layers
                own, own_of = own_columns(seqs, read, needs[j], H), tuple(needs[j])
            res = (
                replay_mod.chain_only_results(d, head, own, budget, progress=replayed, sampling=how)
                if s.anchors == "chain"
                else replay_mod.every_anchor_results(d, head, own, budget, s.chunk, replayed, drafting, how)
            )
            del d  # its memory goes to the next checkpoint
            tick(
                progress,
                done + len(seqs),
                total,
                f"checkpoint {j + 1}/{len(cks)}: loaded in {t1 - t0:.1f} s (read "
                f"beside in {fetch_s:.1f} s), {len(seqs)} prompts replayed in {time.perf_counter() - t1:.1f} s",
            )
            for r in res:
                yield {"checkpoint": j, "result": r}
            done += len(seqs)
