"""The target's kernel backend: which linear-attention kernels transformers' hybrid models run (fla's Triton kernels or
the torch reference path), forced and recorded.

Contract: transformers binds fla's gated delta rule kernels at import whenever fla imports, also on a CPU machine,
where they fail. `pick_backend(device)` says what a device should run (fla when it is CUDA and fla imports, else
torch); `use_backend(name)` binds it in every hybrid modeling module (with fla also fla's Triton short causal
convolution in place of torch's conv1d) and returns what is really bound, which is recorded with every extraction;
`force_torch_kernels()` is any CPU run's call; `bindings()` and `kernel_of(fn)` say what is bound;
`restore_import_bindings()` puts back what transformers bound at import. Knows nothing of models or files.
"""

from __future__ import annotations

import importlib
import warnings

import torch

from .target_info import TargetError

# fla warns at import on a machine where Triton cannot run ("roll back to CPU"): the backend is forced and recorded
# here (`use_backend`), so the library's line would only break a progress bar and mislead
warnings.filterwarnings("ignore", message="Triton is not supported on current platform", category=UserWarning)

# modeling modules whose linear-attention kernels transformers binds to fla at import
HYBRID_MODULES = [
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
    "transformers.models.qwen3_next.modeling_qwen3_next",
]
KERNEL_FUNCS = [
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
]
CONV_FUNCS = ["causal_conv1d_fn"]  # the short causal convolution: torch conv1d unless `causal_conv1d` is installed
_BOUND: dict[tuple[str, str], object] = {}  # (module, name) -> the function transformers bound at import


# ---------------------------------------------------------------------------
# kernel backend


def _impl(fn) -> object:
    """The implementation a transformers kernel wrapper dispatches to (itself when not a wrapper)."""
    code = getattr(fn, "__code__", None)
    if code is not None and fn.__closure__ and "implementation" in code.co_freevars:
        return fn.__closure__[code.co_freevars.index("implementation")].cell_contents
    return fn


def fla_version() -> str | None:
    """fla's version when its gated delta rule kernels import (they need Triton), else None."""
    try:
        importlib.import_module("fla.ops.gated_delta_rule")
        from importlib.metadata import version

        for dist in ("fla-core", "flash-linear-attention"):
            try:
                return version(dist)
            except Exception:
                continue
        return "unknown"
    except Exception:
        return None


def _modules():
    """(name, module) of every hybrid modeling module this transformers has."""
    for mod_name in HYBRID_MODULES:
        try:
            yield mod_name, importlib.import_module(mod_name)
        except Exception:
            continue


def use_backend(backend: str) -> str:
    """Bind the linear-attention kernels of every hybrid modeling module to `backend` ('fla' or 'torch').

    Returns 'fla' or 'torch': what the bound functions really dispatch to (checked, not assumed).
    """
    seen = set()
    for mod_name, mod in _modules():
        for name in KERNEL_FUNCS:
            fn = getattr(mod, name, None)
            if fn is None:
                continue
            orig = _BOUND.setdefault((mod_name, name), fn)
            new = getattr(orig, "__wrapped__", orig) if backend == "torch" else orig
            setattr(mod, name, new)
            seen.add(kernel_of(new))
        for name in CONV_FUNCS:  # with fla, its Triton causal conv (fused SiLU) replaces torch's conv1d
            fn = getattr(mod, name, None)
            if fn is not None:
                orig = _BOUND.setdefault((mod_name, name), fn)
                torch_fn = getattr(orig, "__wrapped__", orig) if backend == "torch" else orig
                setattr(mod, name, fla_conv1d if backend == "fla" and seen == {"fla"} else torch_fn)
    if backend == "fla" and seen != {"fla"}:
        raise TargetError(
            "fla kernels were asked for but transformers did not bind them "
            f"(bound: {sorted(seen) or 'none'}); install fla-core and triton on a CUDA machine"
        )
    return "fla" if seen == {"fla"} else "torch"


def kernel_of(fn) -> str:
    """'fla' or 'torch': the implementation a transformers kernel function dispatches to."""
    return "fla" if getattr(_impl(fn), "__module__", "").startswith("fla") else "torch"


def bindings(at_import: bool = False) -> dict[str, str]:
    """'module.function' -> 'fla' | 'torch' for every linear-attention kernel of the hybrid modeling modules:
    as bound now, or (`at_import`) as transformers bound them when it imported (before `use_backend`)."""
    out = {}
    for mod_name, mod in _modules():
        for name in KERNEL_FUNCS:
            fn = getattr(mod, name, None)
            if fn is not None:
                out[f"{mod_name}.{name}"] = kernel_of(_BOUND.get((mod_name, name), fn) if at_import else fn)
    return out


def restore_import_bindings() -> None:
    """Rebind every kernel as transformers bound it at import (undoes `use_backend`; for benchmarks)."""
    for (mod_name, name), fn in _BOUND.items():
        setattr(importlib.import_module(mod_name), name, fn)


def fla_conv1d(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    **_,
) -> torch.Tensor:
    """transformers' `causal_conv1d_fn` ([B, D, T] in and out, weight [D, W]) computed by fla's Triton kernel
    (which reads [B, T, D]: the transposes are views of the projection output, no copies)."""
    from fla.modules.causal_conv1d import causal_conv1d

    y, _ = causal_conv1d(hidden_states.transpose(1, 2), weight, bias, activation=activation, backend="triton")
    return y.transpose(1, 2)


def force_torch_kernels() -> str:
    """Force the torch reference path of the linear-attention kernels (any CPU run)."""
    return use_backend("torch")


NO_LINEAR = "n/a"  # the backend recorded for a target without linear-attention layers (nothing to choose)


def pick_backend(device: str) -> str:
    """fla when the device is CUDA and fla imports, else torch."""
    return "fla" if device.startswith("cuda") and torch.cuda.is_available() and fla_version() else "torch"
