"""The cost table measured: the target's verify forward and the drafter's block, timed on one device.

Contract: tensors in, a `costs.CostTable` out; no store, no files besides the model folders. `profile(...)`:
  - Target: the whole causal LM (LM head included: a verify forward computes the logits of every token it
    checks), its linear-attention kernels bound as an extraction binds them (`target.use_backend(pick_backend)`:
    fla on CUDA where it imports, the torch path forced otherwise) and that backend recorded. For each context
    length c the context is built ONCE by a prefill of c tokens with the cache on (transformers' cache: the
    full-attention layers' K/V and, for the hybrid Qwen3.5 family, the Gated DeltaNet layers' recurrent and
    convolution states), then for each size q (the sizes asked for, plus 1..B with a drafter of block B: every
    verify size of a k-draft setting, and b + 1 with a tree) a forward of q new tokens after it is timed: warm-up
    first, then `repeats` timed forwards, each on a fresh copy of the c-token cache (the copy is not timed; a forward
    appends to its cache), the median kept. On CUDA the timed region is bracketed by `torch.cuda.synchronize()`.
    This is the serving loop's verify (server/specdec.py: `run(block, cache)` after the prefill).
  - Drafter: the family's own every-anchor path for one block at anchor c (`context_kv` of the c context
    features computed once, as engines keep the drafter's context K/V cached; then the timed part:
    `embed_block`, `blocks` over the c context keys, `replay.head.read_out` through the target's LM head and the
    family's heads: what one round drafts). The features are seeded random values of the drafter's shape (K*H per
    token): a dense forward's time does not depend on the values.
  - Tree budget b (optional): the drafter's block read out with top-b candidates per slot plus the DDTree built
    from them on the host (`walks.tree_accept`), and the target's forward of b + 1 tokens (the tree's nodes and
    its root) as a causal forward: a tree-attention mask costs the same matmuls, recorded as an approximation.
The device name is torch's (`torch.cuda.get_device_name`) or "cpu" (the table says CPU costs then).
"""

from __future__ import annotations

import copy
import inspect
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from .. import costs, drafters, target as tg
from ..target_info import describe, has_linear_attention
from ..walks import tree_accept
from .head import read_out

SIZES = (1, 2, 4, 8, 16, 32, 64)  # new tokens q per timed target forward (the verify sizes a table answers)
CONTEXTS = (512, 2048, 8192)  # context lengths c the default profile measures
WARMUP = 2  # untimed forwards before each timed series (kernel selection, allocator, caches)


def device_name(device: str) -> str:
    """torch's name of the device ('NVIDIA H100 80GB HBM3'), or 'cpu'."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"


def timed(fn: Callable, repeats: int, dev: torch.device, prepare: Callable[[], object] | None = None) -> float:
    """Median seconds of `fn()` (`fn(prepare())`: `prepare`, untimed, builds its input) over `repeats` runs after
    WARMUP."""
    cuda = dev.type == "cuda"
    out = []
    for i in range(WARMUP + repeats):
        args = () if prepare is None else (prepare(),)
        if cuda:
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        fn(*args)
        if cuda:
            torch.cuda.synchronize(dev)
        if i >= WARMUP:
            out.append(time.perf_counter() - t0)
    return statistics.median(out)


def load_target(path: str | Path, device: str, dtype: torch.dtype):
    """The whole causal LM on `device` in `dtype`, its kernels bound -> (model, backend as recorded)."""
    from transformers import AutoModelForCausalLM

    info = describe(path)
    backend = tg.use_backend(tg.pick_backend(device))
    if not has_linear_attention(info, info.num_layers):
        backend = tg.NO_LINEAR
    model = AutoModelForCausalLM.from_pretrained(info.path, dtype=dtype).to(device).eval()
    return model, backend


@torch.inference_mode()
def target_times(model, contexts, sizes, repeats: int, vocab: int, progress=None) -> list[tuple[int, int, float]]:
    """(c, q, median seconds) of a forward of q new tokens after a cached context of c tokens."""
    dev = model.device
    gen = torch.Generator().manual_seed(0)
    rows = []
    for i, c in enumerate(contexts):
        ids = torch.randint(10, vocab, (1, c + max(sizes)), generator=gen).to(dev)
        rows += context_times(model, ids, c, sizes, repeats)
        if progress:
            progress(i + 1, len(contexts), f"target: q = {', '.join(map(str, sizes))} after {c} tokens")
    return rows


def context_times(model, ids: torch.Tensor, c: int, sizes, repeats: int) -> list[tuple[int, int, float]]:
    """The rows of one context: the prefill of ids[:c] once, then each size's timed forwards on copies of it."""
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    res = model(input_ids=ids[:, :c], use_cache=True, logits_to_keep=1)
    cache = getattr(res, "cache", None)
    cache = res.past_key_values if cache is None else cache
    out = []
    for q in sizes:
        new = ids[:, c : c + q]
        fwd = partial(lambda x, kv: model(input_ids=x, use_cache=True, **{kw: kv}), new)
        out.append((c, q, timed(fwd, repeats, model.device, partial(copy.deepcopy, cache))))
    return out


@torch.inference_mode()
def draft_times(drafter, head, contexts, repeats: int, budget: int = 0) -> tuple[list, list]:
    """([(c, seconds per block)], [(b, c, seconds per tree of budget b)]) at anchor c after c context tokens."""
    gen = torch.Generator().manual_seed(0)
    K = len(drafter.c.target_layer_ids) * drafter.c.hidden_size
    blocks, trees = [], []
    for c in contexts:
        kv = drafter.context_kv(torch.randn(c, K, generator=gen).to(drafter.device, drafter.dtype))  # not timed
        one = partial(block, drafter, head, kv, c)
        blocks.append((c, timed(partial(one, 1), repeats, drafter.device)))
        if budget:
            trees.append((budget, c, timed(partial(tree, one, budget), repeats, drafter.device)))
    return blocks, trees


def block(drafter, head, kv, c: int, topk: int):
    """One round's drafting at anchor c over cached context K/V: block inputs, block forward, read-out."""
    first = torch.tensor([int(head.embed.shape[0]) // 2])
    emb = drafter.embed_block(head, first)
    h = drafter.blocks(kv, torch.tensor([c], device=drafter.device), emb, max_anchor=c)
    return read_out(drafter, head, h, first, topk)


def tree(one: Callable[[int], tuple], budget: int) -> int:
    """A DDTree of `budget` nodes: the block read out with top-`budget` per slot, the tree built on the host."""
    _, ids, logp = one(budget)
    ids, logp = ids[0].cpu().numpy(), logp[0].float().cpu().numpy()
    return tree_accept(ids, logp, ids[:, 0], budget)


def profile(
    target: str | Path,
    drafter: str | Path | None,
    device: str = "cpu",
    dtype: str = "float32",
    contexts: tuple[int, ...] = CONTEXTS,
    sizes: tuple[int, ...] = SIZES,
    repeats: int = 5,
    tree_budget: int = 0,
    draft_config: str | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> costs.CostTable:
    """The cost table of `target` (and `drafter`) on `device` (module docstring)."""
    dt = getattr(torch, dtype)
    d = drafters.load(drafter, dt, device, draft_config=draft_config) if drafter else None
    every = set(range(1, d.width + 1)) if d else set()  # each verify size a k-draft setting needs (k + 1 <= B)
    sizes = tuple(sorted(set(sizes) | every | ({tree_budget + 1} if tree_budget else set())))
    contexts = tuple(sorted(set(contexts)))
    model, backend = load_target(target, device, dt)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    rows = target_times(model, contexts, sizes, repeats, vocab, progress)
    draft, trees, meta = [], [], {}
    if d is not None:
        head = tg.Head(model.get_input_embeddings().weight, model.get_output_embeddings().weight)
        if progress:
            progress(len(rows), len(rows), "drafter blocks")
        draft, trees = draft_times(d, head, contexts, repeats, tree_budget)
        meta |= {"drafter": str(drafter), "family": d.c.family, "block_size": d.width}
    del model
    return costs.CostTable(
        device=device_name(device),
        backend=backend,
        target=tuple(rows),
        draft=tuple(draft),
        tree=tuple(trees),
        meta=meta
        | {
            "target": str(target),
            "dtype": dtype,
            "repeats": repeats,
            "warmup": WARMUP,
            "versions": tg.versions(),
            "tree_verify": "a causal forward of b + 1 tokens (a tree mask costs the same matmuls)",
        },
    )
