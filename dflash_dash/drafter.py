"""The DFlash drafter: checkpoint loading and validation, and the block forward (SPEC 2).

Contract: `load(path)` reads a z-lab / SpecForge checkpoint folder (config.json + *.safetensors) and
returns a `Drafter`; a wrong checkpoint raises `CheckpointError` naming the field and the expected value.
The drafter has no embedding and no LM head: callers pass block embeddings in and get normed hidden
states out. Two forwards exist on purpose:
  - `blocks`: many blocks of one sequence at once over shared context K/V (the every-anchor path);
  - `block`:  one block, keys = [ctx; block] concatenated, plain SDPA (the reference the tests trust).
Knows nothing of files other than the checkpoint, nor of HTTP or the store.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

# the torch-free halves (the pages read configs and run the checks without torch); the names not used here are
# re-exported only until the drafters package (drafters/config.py) takes these two modules over
from .drafter_checks import Check, check_target, checks  # noqa: F401
from .drafter_config import (  # torch-free: the pages read checkpoint configs without torch
    Checkpoint,
    CheckpointError,
    config_of,
    default_layer_ids,  # noqa: F401
    DrafterConfig,
    FAMILIES,  # noqa: F401
    FOREIGN_FIELDS,  # noqa: F401
    locate,
    parse_config,  # noqa: F401
    raw_config,  # noqa: F401
    read_config,  # noqa: F401
    refuse_family,  # noqa: F401
    ROPE_TYPES,  # noqa: F401
    RUNTIME_FILE,  # noqa: F401
    shapes,
    SLIDING_BLOCKS,  # noqa: F401
    sliding_semantics,
    step_of,  # noqa: F401
)


# ---------------------------------------------------------------------------
# math helpers


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


KEY_ALIGN = 256  # context (+ block) keys of a batched call rounded up to a multiple of this: few distinct shapes
# reach the attention kernels (their per-shape plans), at most this many keys masked in vain


class Ops:
    """The element-wise pieces of the batched forward (`Drafter.blocks`, `context_kv`): eager torch, or each piece
    fused into one kernel by torch.compile (Inductor; CUDA only, compiled on first use, dynamic in every dim but the
    last). The same arithmetic either way; fused kernels round in another order (bf16: not bit for bit)."""

    def __init__(self, compiled: bool):
        f = _compiled if compiled else (lambda fn: fn)
        self.rmsnorm, self.norm_rope, self.silu_mul, self.add_norm = map(f, (rmsnorm, norm_rope, silu_mul, add_norm))


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
                warnings.warn(f"fused {fn.__name__} unavailable ({type(e).__name__}: {str(e)[:200]}); running eager")
                fused.clear()
        return fn(*args)

    return call


EAGER = Ops(False)
FUSE_CUDA = os.environ.get("DFLASH_FUSE", "1") != "0"  # CUDA drafters use fused element-wise kernels (`Ops(True)`,
# one per process); DFLASH_FUSE=0 turns them off
_FUSED: list[Ops] = []


_FUSING = threading.Lock()  # one Ops(True) per process, also when two threads build drafters at once


def ops_for(device: torch.device) -> Ops:
    """The element-wise kernels a drafter on `device` uses: fused on CUDA when FUSE_CUDA and Triton imports."""
    if device.type != "cuda" or not FUSE_CUDA:
        return EAGER
    with _FUSING:
        if not _FUSED:
            try:
                import triton  # noqa: F401  (Inductor's CUDA kernels are Triton)

                _FUSED.append(Ops(True))
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


class Drafter:
    """Weights of a DFlash checkpoint plus its two forwards. Differentiable when the weights require grad
    (the demo trains through `blocks`); callers wrap inference in torch.inference_mode()."""

    def __init__(self, c: DrafterConfig, w: dict[str, torch.Tensor], path: str = "", sliding_block: str | None = None):
        self.c, self.w, self.path = c, w, path
        self.sliding_block = sliding_semantics(c, sliding_block)  # causal | bidirectional (sliding layers)
        any_w = w["fc.weight"]
        self.device, self.dtype = any_w.device, any_w.dtype
        self.rope = Rope(c, self.device, self.dtype)
        self.ops = ops_for(self.device)  # element-wise kernels of the batched forward: eager or fused

    # -- shared pieces --------------------------------------------------------

    def _lin(self, x, name):
        return F.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    def ctx(self, features: torch.Tensor) -> torch.Tensor:
        """features [T, K*H] -> ctx [T, H] = hidden_norm(fc(features))."""
        x = self._lin(features.to(self.device, self.dtype), "fc")
        return self.ops.rmsnorm(x, self.w["hidden_norm.weight"], self.c.rms_norm_eps)

    def _kv(self, i: int, x: torch.Tensor, cos, sin):
        """x [..., T, H] -> k [..., nkv, T, hd] (normed, roped), v [..., nkv, T, hd]."""
        c, p = self.c, f"layers.{i}.self_attn."
        k = self._lin(x, p + "k_proj").unflatten(-1, (c.num_key_value_heads, c.head_dim))
        v = self._lin(x, p + "v_proj").unflatten(-1, (c.num_key_value_heads, c.head_dim))
        return self.ops.norm_rope(k, self.w[p + "k_norm.weight"], c.rms_norm_eps, cos, sin), v.transpose(-2, -3)

    def _q(self, i: int, x: torch.Tensor, cos, sin):
        """x [..., B, H] -> q [..., nh, B, hd] (normed, roped)."""
        c, p = self.c, f"layers.{i}.self_attn."
        q = self._lin(x, p + "q_proj").unflatten(-1, (c.num_attention_heads, c.head_dim))
        return self.ops.norm_rope(q, self.w[p + "q_norm.weight"], c.rms_norm_eps, cos, sin)

    def _mlp(self, i: int, x):
        p = f"layers.{i}.mlp."
        return self._lin(self.ops.silu_mul(self._lin(x, p + "gate_proj"), self._lin(x, p + "up_proj")), p + "down_proj")

    def _kind(self, i: int) -> tuple[int | None, bool]:
        """(key window, causal inside the block) of layer i: (None, False) for full_attention layers."""
        if self.c.layer_types[i] != "sliding_attention":
            return None, False
        return self.c.sliding_window, self.sliding_block == "causal"

    # -- every-anchor path ----------------------------------------------------

    def context_kv(self, features: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (k, v) of the whole sequence's context, each [nkv, T, hd]; computed once per sequence."""
        ctx = self.ctx(features)  # [T, H] (or [S, T, H]: stacked sequences, K/V [S, nkv, T, hd])
        cos, sin = self.rope(torch.arange(ctx.shape[-2], device=self.device))
        return [self._kv(i, ctx, cos, sin) for i in range(self.c.num_hidden_layers)]

    def blocks(
        self,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        anchors: torch.Tensor,
        emb: torch.Tensor,
        group: int = 16,
        max_anchor: int | None = None,
        tail: bool = False,
    ) -> torch.Tensor:
        """Draft many blocks at once: of one sequence, or of several sequences in lockstep.

        kv: context_kv of the sequence (per layer k, v [nkv, T, hd]), or of S sequences stacked (per layer
        [S, nkv, T, hd], padded to one T) with N = S*G blocks, G consecutive blocks per sequence (the
        chain-only replay); anchors [N] (int, the anchor position of each block);
        emb [N, B, H]: target embeddings of [anchor token, MASK x (B-1)].
        Block n's queries see context keys at positions < anchors[n] plus their own block: bidirectional in
        full_attention layers; in sliding_attention layers keys with q - k < window, and only block slots
        0..i from slot i when `sliding_block` is causal (SpecForge training, SGLang serving).
        Returns norm(h) [N, B, H].

        Attention is one fused SDPA call per layer: blocks are taken `group` at a time (S groups), each
        group's queries [g*G*B] attend over [context keys ; the group's block keys] of one KV head, with an
        additive mask that keeps block n to keys < anchors[n] and to its own block. GQA is folded into the
        query rows, so K/V are never repeated per query head; scores never leave the kernel. The context
        length is rounded up to a multiple of KEY_ALIGN (the extra keys are masked) so that few distinct shapes
        reach the attention kernels. `max_anchor` (>= anchors.max(), optional) spares a device sync.
        `tail` (stacked kv only): each layer's k, v [S, nkv, G*B + T, hd] start with G*B spare key slots; the
        blocks' keys are written there in place and the attention runs over them and the first L context keys,
        L >= `max_anchor` rounded so that G*B + L is a multiple of KEY_ALIGN (all T without `max_anchor`): a
        prefix view, so no per-call copy of the context K/V is made (the chain-only replay's lockstep steps).
        """
        c = self.c
        N, B, _ = emb.shape
        nkv, g, hd = c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads, c.head_dim
        dev = self.device
        stacked = kv[0][0].dim() == 4  # [S, nkv, T, hd]: one group per sequence
        if stacked and N % kv[0][0].shape[0]:
            raise ValueError(f"{N} blocks do not split evenly over {kv[0][0].shape[0]} stacked sequences")
        G = N // kv[0][0].shape[0] if stacked else max(1, min(group, N))  # blocks per attention group
        S = -(-N // G)  # groups
        anchors = anchors.to(dev)
        h = emb.to(dev, self.dtype)
        if S * G > N:  # pad with copies of the last block
            pad = S * G - N
            anchors = torch.cat([anchors, anchors[-1:].expand(pad)])
            h = torch.cat([h, h[-1:].expand(pad, -1, -1)])
        T = kv[0][0].shape[-2]
        if tail:
            if not stacked:
                raise ValueError("tail=True needs stacked context K/V [S, nkv, G*B + T, hd]")
            T -= G * B  # context slots, after the block slots
            top = T if max_anchor is None else max_anchor  # no sync: the caller's bound or every key
            L = min(T, -(-(G * B + top) // KEY_ALIGN) * KEY_ALIGN - G * B)
        else:
            top = int(anchors.max()) if max_anchor is None else max_anchor
            L = min(T, -(-top // KEY_ALIGN) * KEY_ALIGN)  # context keys any block can see
        qpos = anchors[:, None] + torch.arange(B, device=dev)  # [N', B]
        cos, sin = self.rope(qpos)  # [N', B, hd]
        masks = {
            kd: self._attn_mask(anchors, qpos, L, S, G, g, *kd, blocks_first=tail)
            for kd in {self._kind(i) for i in range(c.num_hidden_layers)}
        }
        ops, eps = self.ops, c.rms_norm_eps
        x = ops.rmsnorm(h, self.w["layers.0.input_layernorm.weight"], eps)
        for i in range(c.num_hidden_layers):
            p = f"layers.{i}."
            nxt = f"layers.{i + 1}.input_layernorm.weight" if i + 1 < c.num_hidden_layers else "norm.weight"
            q = self._q(i, x, cos, sin)  # [N', nh, B, hd]
            q = q.view(S, G, nkv, g, B, hd).permute(0, 2, 3, 1, 4, 5).reshape(S, nkv, g * G * B, hd)
            kb, vb = (
                t.view(S, G, nkv, B, hd).transpose(1, 2).reshape(S, nkv, G * B, hd) for t in self._kv(i, x, cos, sin)
            )  # [S, nkv, G*B, hd]
            if tail:  # the blocks' keys into the spare slots
                k, v = kv[i]
                k[:, :, : G * B].copy_(kb)
                v[:, :, : G * B].copy_(vb)
                k, v = k[:, :, : G * B + L], v[:, :, : G * B + L]  # [S, nkv, G*B+L, hd] (a view)
            else:
                kc, vc = ((t[:, :, :L] if stacked else t[:, :L].expand(S, nkv, L, hd)) for t in kv[i])
                k, v = torch.cat([kc, kb], 2), torch.cat([vc, vb], 2)  # [S, nkv, L+G*B, hd]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[self._kind(i)])
            o = o.view(S, nkv, g, G, B, hd).permute(0, 3, 4, 1, 2, 5).reshape(S * G, B, nkv * g * hd)
            o = self._lin(o, p + "self_attn.o_proj")
            h, x = ops.add_norm(h, o, self.w[p + "post_attention_layernorm.weight"], eps)
            h, x = ops.add_norm(h, self._mlp(i, x), self.w[nxt], eps)  # x: the next layer's input (or the output)
        return x[:N]

    def _attn_mask(
        self,
        anchors,
        qpos,
        L: int,
        S: int,
        G: int,
        g: int,
        window: int | None,
        causal: bool,
        blocks_first: bool = False,
    ) -> torch.Tensor:
        """Additive mask [S, 1, g*G*B, L+G*B] (0 or -inf) of the grouped attention in `blocks`: keys are the L
        context keys then the G*B block keys, or the other way round (`blocks_first`, the `tail` layout)."""
        B, dev = qpos.shape[1], qpos.device
        kpos = torch.arange(L, device=dev)
        a, qp = anchors.view(S, G), qpos.view(S, G, B)
        ok_ctx = (kpos < a[:, :, None, None]).expand(S, G, B, L)  # [S, G, B, L]
        ok_blk = torch.eye(G, dtype=torch.bool, device=dev)[None, :, None, :, None].expand(S, G, B, G, B)
        if window:
            ok_ctx = ok_ctx & ((qp[..., None] - kpos) < window)
            d = qp[:, :, :, None, None] - qp[:, None, None, :, :]  # [S, G, B, G, B] q - k
            ok_blk = ok_blk & (d < window) & ((d >= 0) if causal else True)
        parts = [ok_ctx, ok_blk.reshape(S, G, B, G * B)]
        ok = torch.cat(parts[::-1] if blocks_first else parts, -1)  # [S, G, B, L+G*B]
        ok = ok.reshape(S, 1, 1, G * B, -1).expand(S, 1, g, G * B, L + G * B).reshape(S, 1, g * G * B, -1)
        return torch.zeros(ok.shape, dtype=self.dtype, device=dev).masked_fill_(~ok, float("-inf"))

    # -- reference path -------------------------------------------------------

    def block(self, features: torch.Tensor, anchor: int, emb: torch.Tensor) -> torch.Tensor:
        """Draft ONE block the plain way: features [anchor, K*H] of positions 0..anchor-1, emb [B, H].

        Keys/values are [proj(ctx); proj(block)] concatenated, positions 0..anchor+B-1, plain SDPA.
        Returns norm(h) [B, H]. Slow on purpose: it recomputes the context for every block.
        """
        c = self.c
        B = emb.shape[0]
        ctx = self.ctx(features[:anchor])
        pos = torch.arange(anchor + B, device=self.device)
        cos, sin = self.rope(pos)
        h = emb.to(self.device, self.dtype)
        g = c.num_attention_heads // c.num_key_value_heads
        for i in range(c.num_hidden_layers):
            p = f"layers.{i}."
            x = rmsnorm(h, self.w[p + "input_layernorm.weight"], c.rms_norm_eps)
            q = self._q(i, x, cos[anchor:], sin[anchor:])  # [nh, B, hd]
            k, v = self._kv(i, torch.cat([ctx, x]), cos, sin)  # [nkv, anchor+B, hd]
            k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
            mask = None
            w, causal = self._kind(i)
            if w:
                d = pos[anchor:, None] - pos[None, :]  # [B, anchor+B] q - k
                mask = (d < w) & (d >= 0) if causal else d < w
            o = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask).to(self.dtype)
            h = h + self._lin(o.transpose(0, 1).flatten(1), p + "self_attn.o_proj")
            h = h + self._mlp(i, rmsnorm(h, self.w[p + "post_attention_layernorm.weight"], c.rms_norm_eps))
        return rmsnorm(h, self.w["norm.weight"], c.rms_norm_eps)


# ---------------------------------------------------------------------------
# loading


COPIES = ("embed_tokens.weight", "lm_head.weight")  # copies of the target's embedding / LM head: ignored


def tensors(ck: Checkpoint):
    """(file name, tensor name, shape, getter) of a checkpoint's weights, names without `model.`/`draft_model.`
    prefixes; the shape is read without the tensor's data.

    A runtime `training_state.pt` is read with torch.load(weights_only=True) only: a file that needs arbitrary
    unpickling is refused (its code never runs)."""
    if ck.kind == "hf":
        for f in ck.weights:
            with safe_open(str(f), framework="pt", device="cpu") as sf:
                for name in sf.keys():
                    yield (
                        f.name,
                        _bare(name),
                        tuple(sf.get_slice(name).get_shape()),
                        lambda sf=sf, name=name: sf.get_tensor(name),
                    )
        return
    f = ck.weights[0]
    try:
        state = torch.load(str(f), map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{f}: needs arbitrary unpickling ({str(e).splitlines()[0][:160]}), which dflash-dash refuses because it "
            "can run code; export the checkpoint with `specforge export --to hf` and replay the exported folder"
        ) from None
    except (RuntimeError, OSError, EOFError) as e:
        raise CheckpointError(f"{f}: not a readable torch checkpoint ({type(e).__name__}: {e})") from None
    sd = state.get("draft_state_dict") if isinstance(state, dict) else None
    if not isinstance(sd, dict):
        keys = sorted(state)[:8] if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{f}: no 'draft_state_dict' (found {keys}); expected a SpecForge runtime checkpoint")
    for name, t in sd.items():
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{f}: draft_state_dict['{name}'] is {type(t).__name__}, expected a tensor")
        yield f.name, _bare(name), tuple(t.shape), lambda t=t: t


def _bare(name: str) -> str:
    for prefix in ("draft_model.", "model."):
        name = name.removeprefix(prefix)
    return name


def _weights(ck: Checkpoint, c: DrafterConfig, read: Callable[[torch.Tensor], torch.Tensor] | None) -> dict:
    """Every tensor of `ck` checked against `c` (name, shape, none missing): {name: read(tensor)}, or {name: None}
    without `read` (nothing but the files' headers is read)."""
    want = shapes(c)
    w: dict[str, torch.Tensor | None] = {}
    for fname, key, shape, get in tensors(ck):
        if key not in want:
            if key in COPIES or key.endswith("rotary_emb.inv_freq"):
                continue
            raise CheckpointError(
                f"{ck.path / fname}: unknown tensor '{key}': not part of a DFlash drafter with "
                f"this config (another drafter family, or a config that does not match the weights)"
            )
        if shape != want[key]:
            raise CheckpointError(f"{fname}: tensor '{key}' has shape {shape}, expected {want[key]}")
        w[key] = read(get()) if read else None
    missing = [k for k in want if k not in w]
    if missing:
        raise CheckpointError(
            f"{ck.path}: missing tensor '{missing[0]}' (expected shape {want[missing[0]]})"
            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
        )
    return w


def check(path: str | Path, sliding_block: str | None = None, draft_config: str | Path | None = None) -> DrafterConfig:
    """Validate a checkpoint as `load` does (config, sliding semantics, every tensor's name and shape) without
    reading its weights; returns its config. A sweep checks every checkpoint so before loading the first."""
    ck = locate(path, draft_config)
    c = config_of(ck)
    sliding_semantics(c, sliding_block)
    _weights(ck, c, None)
    return c


def load(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    sliding_block: str | None = None,
    draft_config: str | Path | None = None,
    place: Callable[[dict], dict] | None = None,
) -> Drafter:
    """Load and validate a checkpoint (HF folder or SpecForge runtime folder, see `locate`). A tensor of the
    wrong shape, a missing one or an unknown one (other than a copy of the target's embedding or LM head)
    raises CheckpointError naming it. `place`: moves the checked weights (CPU, `dtype`) to `device` all at once
    (a loader's staged upload); by default each tensor is moved as it is read."""
    ck = locate(path, draft_config)
    c = config_of(ck)
    sliding_semantics(c, sliding_block)  # validate the choice before reading weights
    if place is None:
        w = _weights(ck, c, lambda t: t.to(device=device, dtype=dtype))
    else:
        w = place(_weights(ck, c, lambda t: t.to(dtype=dtype)))
    return Drafter(c, w, str(ck.path), sliding_block)


def flops_per_block(c: DrafterConfig, ctx_len: int, vocab: int) -> float:
    """Matmul FLOPs of one block over `ctx_len` context keys, LM head of B-1 slots included (for benchmarks)."""
    H, I, hd, nh, nkv, B = (
        c.hidden_size,
        c.intermediate_size,
        c.head_dim,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.block_size,
    )
    per_layer = 2 * B * (H * nh * hd * 2 + H * nkv * hd * 2 + 3 * H * I)  # q,o ; k,v ; mlp
    per_layer += 2 * 2 * B * nh * hd * (ctx_len + B)  # scores + weighted values
    return c.num_hidden_layers * per_layer + 2 * (B - 1) * H * vocab
