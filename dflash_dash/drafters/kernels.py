"""The drafter's kernels: RMSNorm, RoPE, the gated MLP's activation, the residual add and DFlash2's block
convolution, eager or fused.

Contract: the element-wise pieces of the batched block forward as plain torch functions (the reference), and
`Kernels`, the set a drafter calls: eager (`EAGER`) or each piece fused into one kernel by torch.compile
(`kernels_for` a CUDA device, one fused set per process; DFLASH_FUSE=0 turns fusing off). The same arithmetic
either way; fused kernels round in another order (bf16: not bit for bit). `Rope` builds the cos/sin tables of a
config's RoPE. `KEY_ALIGN` is the key-length granularity of the batched attention, read at call time by the
forward and by the replay's K/V stacks (a test may patch it here).
"""

from __future__ import annotations

import os
import threading

import torch
import torch.nn.functional as F

from .config import DrafterConfig


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3 RMSNorm: normalise in fp32, cast back, then scale."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply RoPE; cos/sin broadcast against x [..., T, hd]."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


def norm_rope(x: torch.Tensor, w: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Per-head RMSNorm, then RoPE: x [..., T, n, hd] -> [..., n, T, hd]; cos/sin [..., T, hd]."""
    return rotate(rmsnorm(x, w, eps).transpose(-2, -3), cos.unsqueeze(-3), sin.unsqueeze(-3))


def silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return F.silu(g) * u


def add_norm(h: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the next RMSNorm: (h + x, rmsnorm(h + x))."""
    h = h + x
    return h, rmsnorm(h, w, eps)


def conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """DFlash2's block-local dynamic convolution, every tap in one expression (fused by torch.compile into one
    kernel: x read once per tap, no [..., B, H] coefficient or shifted copy in memory; SpecForge's
    specforge/modeling/draft/dflash2_conv_triton.py computes the same sum, in fp32, rounded once):
    out[..., i, c] = sum_{t <= i} (base[t, c] + delta[..., i, t, c // gs]) * x[..., i - t, c].
    x [..., B, H] (B slots of each block), delta [..., B, T, Gn], base [T, H] -> [..., B, H]; gs = H / Gn."""
    B, T, Gn = x.shape[-2], base.shape[0], delta.shape[-1]
    xg, bg = x.unflatten(-1, (Gn, -1)), base.unflatten(-1, (Gn, -1))  # [..., B, Gn, gs], [T, Gn, gs]
    out = xg * (bg[0] + delta[..., 0, :, None])
    for t in range(1, min(T, B)):  # tap t: slot i reads slot i - t of its own block (none before slot 0)
        out = out + F.pad(xg[..., : B - t, :, :], (0, 0, 0, 0, t, 0)) * (bg[t] + delta[..., t, :, None])
    return out.flatten(-2)


KEY_ALIGN = 256  # context (+ block) keys of a batched call rounded up to a multiple of this: few distinct shapes
# reach the attention kernels (their per-shape plans), at most this many keys masked in vain


class Kernels:
    """The element-wise pieces of the batched forward (`DFlash.blocks`, `blocks_in_place`, `context_kv`): eager
    torch, or each piece fused into one kernel by torch.compile (Inductor; CUDA only, compiled on first use, dynamic
    in every dim but the last). The same arithmetic either way; fused kernels round in another order (bf16: not bit
    for bit)."""

    def __init__(self, compiled: bool):
        f = _compiled if compiled else (lambda fn: fn)
        self.rmsnorm, self.norm_rope, self.silu_mul, self.add_norm, self.conv = map(
            f, (rmsnorm, norm_rope, silu_mul, add_norm, conv)
        )


def _compiled(fn):
    """torch.compile(fn) that falls back to `fn` itself, with one warning, if compiling or running it fails."""
    import warnings

    import torch._inductor.config as inductor

    # deterministic: no kernel configs chosen by timing them, so every process fuses with the same reductions and
    # a replay gives the same drafts in any process (a bf16 near tie would otherwise flip between runs)
    opts = {"deterministic": True} if hasattr(inductor, "deterministic") else None
    # every dim dynamic but the last (the hidden or head size, the reductions' length): one compile serves every
    # row count, and the reductions are specialised to their length (with it dynamic too, Inductor reads a row
    # twice in a loop: 19.6 against 9.5 ms a 2,560-token sequence on the H200, bench_chunk.py)
    fused = [torch.compile(fn, dynamic=False, options=opts)]

    def call(*args):
        if fused:
            try:
                for a in args:
                    if isinstance(a, torch.Tensor):
                        for d in range(a.dim() - 1):
                            torch._dynamo.maybe_mark_dynamic(a, d)
                return fused[0](*args)
            except Exception as e:  # noqa: BLE001  (no working Inductor here: eager is the same arithmetic)
                warnings.warn(
                    f"fused {fn.__name__} unavailable ({type(e).__name__}: {str(e)[:200]}); running eager", stacklevel=2
                )
                fused.clear()
        return fn(*args)

    return call


EAGER = Kernels(False)
FUSE_CUDA = os.environ.get("DFLASH_FUSE", "1") != "0"  # CUDA drafters use fused element-wise kernels (`Kernels(True)`,
# one per process); DFLASH_FUSE=0 turns them off
_FUSED: list[Kernels] = []


_FUSING = threading.Lock()  # one Kernels(True) per process, also when two threads build drafters at once


def kernels_for(device: torch.device) -> Kernels:
    """The element-wise kernels a drafter on `device` uses: fused on CUDA when FUSE_CUDA and Triton imports."""
    if device.type != "cuda" or not FUSE_CUDA:
        return EAGER
    with _FUSING:
        if not _FUSED:
            try:
                import triton  # noqa: F401  (Inductor's CUDA kernels are Triton)

                _FUSED.append(Kernels(True))
            except ImportError:
                _FUSED.append(EAGER)
    return _FUSED[0]


class Rope:
    """cos/sin tables for absolute positions. Plain RoPE (no rope_scaling) is computed here exactly as transformers'
    default init and forward compute it (bit for bit, tested); scaled types (yarn, linear, ...) go through
    transformers' RotaryEmbedding, whose import cost 13.6 s in a fresh process on the H200 machine
    (`bench_cold.py --fetch`), so a plain drafter never pays it."""

    def __init__(self, c: DrafterConfig, device, dtype):
        self.dtype, self.emb = dtype, None
        if c.rope_scaling is None:  # inv_freq [hd/2] = 1 / theta^(2i/hd), in float32 as transformers builds it
            self.inv_freq = (
                1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float) / c.head_dim))
            ).to(device)
            return
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        rope = {"rope_type": "default"} | c.rope_scaling | {"rope_theta": c.rope_theta}
        qc = Qwen3Config(
            hidden_size=c.hidden_size,
            num_attention_heads=c.num_attention_heads,
            head_dim=c.head_dim,
            rope_parameters=rope,
            max_position_embeddings=c.max_position_embeddings,
        )
        self.emb = Qwen3RotaryEmbedding(qc).to(device)

    def __call__(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # pos [..., T] -> cos, sin [..., T, hd]
        flat = pos.reshape(1, -1)
        if self.emb is None:
            freqs = flat[..., None].float() * self.inv_freq.to(pos.device)  # [1, T', hd/2]
            ang = torch.cat((freqs, freqs), dim=-1)
            cos, sin = ang.cos().to(self.dtype), ang.sin().to(self.dtype)
        else:
            cos, sin = self.emb(torch.empty(0, dtype=self.dtype, device=pos.device), flat)
        return cos.reshape(*pos.shape, -1), sin.reshape(*pos.shape, -1)


# ---------------------------------------------------------------------------
# model
