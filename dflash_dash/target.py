"""The target model: loading, feature extraction at the drafter's layers, kernel backend, embedding/LM head.

Contract:
  - `extract(model, ids, layer_ids)` returns features [T, K*H]: the OUTPUT of decoder layer l for each l
    (Hugging Face `output_hidden_states[l+1]`), concatenated in listed order. The model is loaded cut
    after the last needed layer (`load(..., layer_ids)`), and no LM head is ever applied.
    `extract_stream` does the same for many sequences, overlapping device work with copies and writes.
  - `extract_top` also keeps the target's top-K log-probabilities (and tail mass) of the completion's positions
    through the LM head chunked over positions (`top_k`), never full-vocabulary logits of the whole sequence at
    once: SPEC section 5's one exception, for the expected acceptance at temperature T (whole decoder needed).
  - Kernel backend (`backend.py`, re-exported here): fla kernels when CUDA is used and fla imports, otherwise the
    torch reference path is FORCED; `use_backend` returns what is really bound, recorded with every extraction.
  - On CUDA a decoder's first long forward is preceded by a short one (`WARM_TOKENS`), and fla's length-bucketed
    norm autotuners then keep the config they chose (`pin_buckets`): a new length does not re-tune them.
  - `load_head` reads only the embedding and LM head tensors from the target's safetensors.
Knows nothing of the store, files other than the model folder, or HTTP.
"""

from __future__ import annotations

import json
import sys
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from .backend import (  # the kernel backend, re-exported: callers ask the target for it
    CONV_FUNCS as CONV_FUNCS,
    HYBRID_MODULES as HYBRID_MODULES,
    KERNEL_FUNCS as KERNEL_FUNCS,
    NO_LINEAR as NO_LINEAR,
    bindings as bindings,
    fla_conv1d as fla_conv1d,
    fla_version as fla_version,
    force_torch_kernels as force_torch_kernels,
    kernel_of as kernel_of,
    pick_backend as pick_backend,
    restore_import_bindings as restore_import_bindings,
    use_backend as use_backend,
)
from .target_info import TargetError, TargetInfo, check_safetensors, describe, has_linear_attention

# ---------------------------------------------------------------------------
# describing and loading


def check_layers(info: TargetInfo, layer_ids: list[int]) -> None:
    if not layer_ids:
        raise TargetError("no target layer ids given (pass --drafter CKPT or --layers 1,16,31)")
    bad = [i for i in layer_ids if not 0 <= i < info.num_layers]
    if bad:
        raise TargetError(
            f"target layer id {bad[0]} is out of range: {info.path} has {info.num_layers} "
            f"layers (ids 0..{info.num_layers - 1})"
        )


def load(path: str | Path, layer_ids: list[int], device: str = "cpu", dtype: torch.dtype = torch.float32, whole=False):
    """Load the target's decoder cut after max(layer_ids) (`whole`: all), backend bound. Returns (decoder, backend)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    info = describe(path)
    check_layers(info, layer_ids)
    keep = info.num_layers if whole else max(layer_ids) + 1
    backend = use_backend(pick_backend(device))
    if not has_linear_attention(info, keep):  # no linear-attention kernel runs: no backend to record or warn of
        backend = NO_LINEAR
    for f in sorted(Path(info.path).glob("*.safetensors")):  # a cut copy is named here, not deep in transformers
        check_safetensors(f)
    cfg = AutoConfig.from_pretrained(info.path)
    text = cfg.get_text_config()
    text.num_hidden_layers = keep
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:keep]
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the dropped layers' weights are "unexpected": expected here
    try:
        model = AutoModelForCausalLM.from_pretrained(info.path, config=cfg, dtype=dtype)
    finally:
        hf_logging.set_verbosity(verbosity)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    decoder = decoder.to(device).eval()
    del model.lm_head
    return decoder, backend


def _layers(decoder) -> torch.nn.ModuleList:
    for attr in ("layers", "language_model.layers"):
        obj = decoder
        for part in attr.split("."):
            obj = getattr(obj, part, None)
        if obj is not None:
            return obj
    raise TargetError(f"cannot find the decoder layers of {type(decoder).__name__}")


WARM_TOKENS = 2048  # a CUDA decoder's first forward longer than twice this is preceded by one over this many of its
# tokens: fla's Triton kernels compile and pick their configs on a short input, where each candidate config's trial
# is cheap, not on the long one (a 131,072-token first call paid its tuning at full length). Their autotune keys
# hold no length, except the norms' row bucket, which `pin_buckets` pins after the warm-up
_WARM: weakref.WeakSet = weakref.WeakSet()  # decoders whose kernels have run once in this process


def _warm(decoder, ids: torch.Tensor, layer_ids: list[int], dev: torch.device) -> None:
    """Run the short warm-up forward before a CUDA decoder's first long one (`WARM_TOKENS`), then pin fla's
    length-bucketed autotuners to what they chose (`pin_buckets`)."""
    if dev.type != "cuda":
        return
    if decoder not in _WARM:
        _WARM.add(decoder)
        if len(ids) > 2 * WARM_TOKENS:
            extract(decoder, ids[:WARM_TOKENS], layer_ids)
    pin_buckets()


BUCKET = "NB"  # the autotune key by which fla's row-wise norms (l2norm, gated RMSNorm) bucket their row count
_PINNED: set[int] = set()  # id() of the autotuners pinned in this process
_TUNERS: list = []  # the bucketed autotuners found, once any is


def _bucketed() -> list:
    """fla's autotuners whose key holds the row-count bucket, among the fla modules imported (found once)."""
    if _TUNERS:
        return _TUNERS
    try:
        from triton.runtime.autotuner import Autotuner
    except Exception:
        return []
    found = {}
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith("fla."):
            continue
        for obj in vars(mod).values():
            for _ in range(4):  # under `triton.heuristics` wrappers
                if isinstance(obj, Autotuner) or not hasattr(obj, "fn"):
                    break
                obj = obj.fn
            if isinstance(obj, Autotuner) and BUCKET in getattr(obj, "keys", ()):
                found[id(obj)] = obj
    _TUNERS.extend(found.values())
    return _TUNERS


def pin_buckets() -> int:
    """Pin each of fla's length-bucketed autotuners to the one config it chose; returns how many were pinned.

    fla's norms key their autotuning (and compile) on a bucket of the row count (`NB` = rows / 65,536, a
    constexpr), so every new bucket of sequence length re-compiles and re-times every candidate config: a
    131,072-token sequence is a new bucket after the short warm-up, and long traces of varied lengths hit dozens.
    A tuner is pinned once it has chosen for exactly one setting of its other key fields (then the configs differ
    only in rows per program and warps, each valid for every row count): later buckets compile that one config and
    time none. A tuner that saw several settings, or none yet, is left to tune.
    """
    pinned = 0
    tuners = _bucketed()
    if len(_PINNED) == len(tuners):
        return 0
    for tuner in tuners:
        if id(tuner) in _PINNED:
            continue
        try:
            cache = dict(getattr(tuner, "cache", {}))
            at = [k for k in tuner.keys if k in tuner.arg_names].index(BUCKET)  # as Triton builds its keys
            others = {tuple(v for i, v in enumerate(key) if i != at) for key in cache}
            if len(others) != 1 or len(tuner.configs) < 2:
                continue
            best = cache[max(cache, key=lambda key: key[at])]  # the largest bucket tuned: nearest a long one
            tuner.configs = [best]
        except Exception as exc:  # a changed fla or Triton leaves its tuner to tune: slower, never wrong
            warnings.warn(f"could not pin fla's autotuner {tuner!r}: {exc}", stacklevel=2)
            _PINNED.add(id(tuner))
            continue
        _PINNED.add(id(tuner))
        pinned += 1
    return pinned


@contextmanager
def outputs(layers, layer_ids: Iterable[int]) -> Iterator[dict[int, torch.Tensor]]:
    """While open: {layer id: that layer's output [B, T, H] in the last forward} for `layer_ids` of `layers` (a
    decoder's layer list), kept by forward hooks as references (no copy); the hooks go when it closes."""
    got: dict[int, torch.Tensor] = {}

    def grab(l):
        return lambda _m, _i, out: got.__setitem__(l, out[0] if isinstance(out, tuple) else out)

    hooks = [layers[l].register_forward_hook(grab(l)) for l in sorted(set(layer_ids))]
    try:
        yield got
    finally:
        for h in hooks:
            h.remove()


@torch.inference_mode()
def extract(decoder, ids: torch.Tensor, layer_ids: list[int]) -> torch.Tensor:
    """ids [T] -> features [T, K*H]: outputs of decoder layers `layer_ids`, concatenated in order."""
    dev = next(decoder.parameters()).device
    _warm(decoder, ids, layer_ids, dev)
    with outputs(_layers(decoder), layer_ids) as got:
        decoder(input_ids=ids.to(dev)[None], use_cache=False)
    return torch.cat([got[l][0] for l in layer_ids], dim=-1)


TOP_VALUES = 1 << 26  # logits of the LM head held at once by `top_k` (fp32: 256 MiB; 270 positions at V=248,320)


@dataclass
class TopHead:  # what the target's top-K needs past its decoder
    weight: torch.Tensor  # [V, H] the LM head, on the decoder's device and dtype
    k: int  # log-probabilities kept per position
    softcap: float | None = None  # the config's final_logit_softcapping, when it has one


def top_head(path: str | Path, k: int, device: str = "cpu", dtype: torch.dtype = torch.float32, lm_head=None):
    cfg = json.loads((Path(path) / "config.json").read_text())
    cap = cfg.get("final_logit_softcapping", (cfg.get("text_config") or {}).get("final_logit_softcapping"))
    return TopHead(load_head(path, device, dtype).lm_head if lm_head is None else lm_head, k, cap)


def top_k(x: torch.Tensor, top: TopHead) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Last states [N, H] -> top-K ids [N, K] (int32), log-probs at T=1 [N, K], mass outside them [N] (from lse)."""
    k, rows = min(top.k, top.weight.shape[0]), max(1, TOP_VALUES // top.weight.shape[0])
    out = [(x.new_zeros(0, k, dtype=torch.int32), x.new_zeros(0, k, dtype=torch.float32), x.new_zeros(0))]
    for r in range(0, x.shape[0], rows):
        logits = (x[r : r + rows] @ top.weight.T).float()
        if top.softcap:
            logits = torch.tanh(logits / top.softcap) * top.softcap
        lse = torch.logsumexp(logits, -1, keepdim=True)
        v, i = logits.topk(k, dim=-1)
        rest = torch.logsumexp(logits.scatter_(1, i, float("-inf")), -1, keepdim=True)
        out.append((i.int(), v - lse, torch.exp(rest - lse)[:, 0].float()))
    return tuple(torch.cat([o[j] for o in out]) for j in range(3))


@torch.inference_mode()
def extract_top(decoder, ids: torch.Tensor, layer_ids: list[int], top: TopHead, start: int):
    """`extract`'s features and the target's top-K (`top_k`) of positions start..T-1 (row r: position start + r)."""
    if start < 1:
        raise TargetError("the target's top-K needs a prompt of at least one token (position 0 has no prediction)")
    _warm(decoder, ids, layer_ids, next(decoder.parameters()).device)
    with outputs(_layers(decoder), layer_ids) as got:
        out = decoder(input_ids=ids.to(next(decoder.parameters()).device)[None], use_cache=False)
    return (torch.cat([got[l][0] for l in layer_ids], dim=-1), *top_k(out.last_hidden_state[0, start - 1 : -1], top))


def extract_stream(
    decoder,
    items: Iterable[tuple[Any, torch.Tensor]],
    layer_ids: list[int],
    write: Callable[[Any, torch.Tensor], Any],
    depth: int = 2,
    forward: Callable[[Any, torch.Tensor], Any] | None = None,
) -> Iterator[tuple[Any, Any]]:
    """Extract many sequences, overlapping the device's forwards with host copies and file writes.

    items: (key, ids [T]) pairs; for each, `extract` runs on the device, its features are copied into
    pinned host memory on a side CUDA stream, and `write(key, feats [T, K*H] on the CPU)` runs on a writer
    thread while the device computes the next sequences. Yields (key, write's result) in input order,
    with at most `depth` writes in flight. Features equal `extract`'s. An error raised while pulling the
    next item comes after every earlier item has been yielded. `forward(key, ids)`: `extract_top`'s tuple, say.
    """
    dev = next(decoder.parameters()).device
    side = torch.cuda.Stream(dev) if dev.type == "cuda" else None
    pending: deque = deque()
    with ThreadPoolExecutor(depth) as pool:
        it = iter(items)
        while True:
            try:
                key, ids = next(it)
            except StopIteration:
                break
            except BaseException:
                while pending:
                    k, fut = pending.popleft()
                    yield k, fut.result()
                raise
            feats = extract(decoder, ids, layer_ids) if forward is None else forward(key, ids)
            if side is not None:  # async D2H into pinned memory; the writer waits on the copy's event
                parts = feats if (many := isinstance(feats, tuple)) else (feats,)
                host = tuple(torch.empty(f.shape, dtype=f.dtype, pin_memory=True) for f in parts)
                side.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(side):
                    for h, f in zip(host, parts):
                        h.copy_(f, non_blocking=True)
                    copied = torch.cuda.Event()
                    copied.record(side)
                for f in parts:
                    f.record_stream(side)
                job = partial(_write_after, copied, write, key, host if many else host[0])
            else:
                job = partial(write, key, feats)
            pending.append((key, pool.submit(job)))
            if len(pending) >= depth:
                k, fut = pending.popleft()
                yield k, fut.result()
        while pending:
            k, fut = pending.popleft()
            yield k, fut.result()


def _write_after(event, write, key, host):
    event.synchronize()
    return write(key, host)


def versions() -> dict:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "fla": fla_version()}


# ---------------------------------------------------------------------------
# embedding and LM head only


def _weight_files(path: Path) -> dict[str, Path]:
    """tensor name -> safetensors file holding it (from the index when there is one)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return {k: path / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        check_safetensors(f)
        with safe_open(str(f), framework="pt") as sf:
            out |= {k: f for k in sf.keys()}
    if not out:
        raise TargetError(f"{path}: no *.safetensors weights found")
    return out


@dataclass
class Head:
    """The target's input embedding and LM head: what a drafter borrows (it has neither)."""

    embed: torch.Tensor  # [V, H] target input embedding
    lm_head: torch.Tensor  # [V, H] target LM head


def load_head(path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Head:
    """Read only the input embedding and LM head (tied embeddings reuse the embedding)."""
    path = Path(path)
    files = _weight_files(path)
    emb = [k for k in files if k.endswith("embed_tokens.weight") and "visual" not in k and "mtp" not in k]
    if not emb:
        raise TargetError(f"{path}: no '*embed_tokens.weight' tensor in the safetensors files")
    heads = [k for k in files if k.endswith("lm_head.weight") and "mtp" not in k]

    def get(name):
        check_safetensors(files[name])
        with safe_open(str(files[name]), framework="pt") as sf:
            return sf.get_tensor(name).to(device=device, dtype=dtype)

    e = get(sorted(emb, key=len)[0])
    cfg = json.loads((path / "config.json").read_text())
    tied = cfg.get("tie_word_embeddings", (cfg.get("text_config") or {}).get("tie_word_embeddings", False))
    if heads:
        h = get(sorted(heads, key=len)[0])
    elif tied:
        h = e
    else:
        raise TargetError(f"{path}: no 'lm_head.weight' tensor and tie_word_embeddings is false")
    return Head(e, h)
