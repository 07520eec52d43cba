"""Rolling a target's cache back to the accepted prefix after a verify forward, without running the target again.

Contract: `of(model, run)` picks how; `with rb.verify(cache, block):` wraps ONE verify forward over the block's n
tokens; `cache = rb.keep(cache, a, n)` then holds what it would hold had only the block's first `a` tokens run.
  - Full-attention (and sliding) K/V: cropped (`Cache.crop(-(n - a))`).
  - Gated DeltaNet (qwen3_5 / qwen3_5_moe / qwen3_next linear attention), whose recurrent state cannot be cropped:
    the conv state is kept whole during the verify (`Cache.activate_past_recording`) and cropped to the window
    ending at token a; the recurrent state is recomputed from the state before the block over the first a tokens
    of the inputs the layer's kernel got in the verify (query, key, value, g, beta: recorded by wrapping the modeling
    module's `torch_chunk_gated_delta_rule` / `torch_recurrent_gated_delta_rule`, whichever backend is bound there:
    fla on CUDA, torch on CPU). That is the kernel over a <= B tokens per layer: no weight is read again. SGLang
    does the same with the per-token intermediate states its verify kernel stores
    (python/sglang/srt/layers/attention/mamba/mamba.py, fused_recurrent_gated_delta_rule_update's
    intermediate_states_buffer, indexed by the accepted length). The layer's own choice is mirrored: one token
    runs the recurrent kernel, more the chunked one, as a forward over the accepted tokens would.
  - Anything else (a cache layer that can neither be cropped nor recorded): the whole cache is copied before the
    verify and, on rejection, restored and the accepted tokens run again (`Rerun`: correct, one forward slower).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

KERNELS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")  # what the GDN layers call
RECORDABLE = ("GatedDeltaNet",)  # linear-attention module class names (suffix) whose kernels are recorded


def _linear_layers(model) -> list:
    """The model's linear-attention modules (each has `layer_idx`)."""
    return [m for m in model.modules() if type(m).__name__.endswith(RECORDABLE) and hasattr(m, "layer_idx")]


def _stateful(model) -> bool:
    """Whether the model has layers holding a state a crop cannot undo (linear attention, SSMs)."""
    types = getattr(model.config.get_text_config(), "layer_types", None) or []
    return any(t not in ("full_attention", "sliding_attention") for t in types)


@dataclass
class Call:
    layer: int  # the layer's index (its cache slot)
    args: tuple  # query, key, value (the kernel's positional inputs), [1, n, heads, dim]
    kw: dict  # g, beta, use_qk_l2norm_in_kernel, ... as the layer passed them
    start: Any  # the recurrent state before the block (a copy)


@dataclass
class Recorded:
    """Crop K/V and conv states; recompute each Gated DeltaNet recurrent state from the verify's kernel inputs."""

    layers: list  # the linear-attention modules
    calls: list[Call] = field(default_factory=list)  # the last verify's kernel inputs, one per layer
    _layer: int | None = None  # the layer running now (set by a forward pre-hook)
    _orig: dict = field(default_factory=dict)  # (module, name) -> the bound kernel, while a verify is open

    @contextmanager
    def verify(self, cache, block: list[int]):
        cache.activate_past_recording()  # conv states kept whole until `keep` crops them
        self.calls = []
        mods = {sys.modules[type(m).__module__] for m in self.layers}
        hooks = [m.register_forward_pre_hook(self._enter(m.layer_idx)) for m in self.layers]
        for mod in mods:
            for name in KERNELS:
                fn = getattr(mod, name)
                self._orig[(mod, name)] = fn
                setattr(mod, name, self._record(fn))
        try:
            yield
        finally:
            for (mod, name), fn in self._orig.items():
                setattr(mod, name, fn)
            for h in hooks:
                h.remove()
            self._layer = None

    def _enter(self, idx: int) -> Callable:
        def hook(_m, _args):
            self._layer = idx

        return hook

    def _record(self, fn) -> Callable:
        def kernel(*args, initial_state=None, **kw):
            start = None if initial_state is None else initial_state.clone()  # the cache updates it in place after
            self.calls.append(Call(self._layer, args, kw, start))
            return fn(*args, initial_state=initial_state, **kw)

        kernel.__wrapped__ = fn
        return kernel

    def keep(self, cache, a: int, n: int):
        cache.crop(-(n - a))  # K/V: drop the rejected tokens; conv states: the window ending at token a
        if a == n:
            return cache
        by = {name: fn for (_, name), fn in self._orig.items()}
        for c in self.calls:
            fn = by[KERNELS[1] if a == 1 else KERNELS[0]]
            kw = dict(c.kw, output_final_state=True)
            for k in ("g", "beta"):
                kw[k] = kw[k][:, :a]
            _, state = fn(*(x[:, :a] for x in c.args), initial_state=c.start, **kw)
            cache.update_recurrent_state(state, c.layer)
        self.calls = []
        return cache


@dataclass
class Cropped:
    """Only croppable layers (full attention, sliding windows): crop the rejected tokens' K/V."""

    @contextmanager
    def verify(self, cache, block: list[int]):
        cache.activate_past_recording()  # sliding-window layers keep what a crop needs
        yield

    def keep(self, cache, a: int, n: int):
        cache.crop(-(n - a))
        return cache


@dataclass
class Rerun:
    """Copy the cache before the verify; on rejection restore it and run the accepted tokens again."""

    run: Callable  # run(tokens, cache) -> cache: one forward over tokens from cache
    snap: Any = None
    tokens: list[int] = field(default_factory=list)

    @contextmanager
    def verify(self, cache, block: list[int]):
        self.snap, self.tokens = copy.deepcopy(cache), list(block)
        yield

    def keep(self, cache, a: int, n: int):
        if a == n:
            return cache
        return self.run(self.tokens[:a], self.snap)


def of(model, run: Callable) -> Recorded | Cropped | Rerun:
    """The cheapest correct rollback for `model` (`run(tokens, cache) -> cache` for the fallback)."""
    if not _stateful(model):
        return Cropped()
    layers = _linear_layers(model)
    types = model.config.get_text_config().layer_types
    linear = [i for i, t in enumerate(types) if t == "linear_attention"]
    recordable = layers and all(hasattr(sys.modules[type(m).__module__], k) for m in layers for k in KERNELS)
    if (
        recordable
        and sorted(m.layer_idx for m in layers) == linear
        and set(types)
        <= {
            "full_attention",
            "linear_attention",
        }
    ):
        return Recorded(layers)
    return Rerun(run)
