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

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open


class CheckpointError(ValueError):
    """A DFlash checkpoint that cannot be used as it is; the message names the field and what was expected."""


# ---------------------------------------------------------------------------
# config


@dataclass
class DrafterConfig:
    hidden_size: int                 # H, must equal the target's hidden size
    intermediate_size: int           # MLP width
    num_hidden_layers: int           # draft layers
    num_attention_heads: int         # query heads
    num_key_value_heads: int         # KV heads (GQA)
    head_dim: int                    # per-head width
    vocab_size: int                  # must equal the target's vocabulary
    block_size: int                  # B: slot 0 is the anchor, slots 1..B-1 are drafted
    target_layer_ids: list[int]      # target layers whose OUTPUTS are concatenated as features
    mask_token_id: int               # id placed in slots 1..B-1
    num_target_layers: int | None    # N of the target the checkpoint was trained against
    layer_types: list[str]           # full_attention | sliding_attention, one per draft layer
    sliding_window: int | None       # key window of sliding_attention layers
    rms_norm_eps: float = 1e-6       # RMSNorm epsilon
    rope_theta: float = 1e6          # RoPE base
    rope_scaling: dict | None = None  # transformers rope_scaling dict (yarn, linear, ...) or None
    max_position_embeddings: int = 32768  # for RoPE scaling
    attention_bias: bool = False     # q/k/v/o biases

    @property
    def K(self) -> int:  # number of feature layers
        return len(self.target_layer_ids)


def default_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Evenly spaced target layer ids (SPEC 2): round(1 + i*(N-4)/(n-1)); one draft layer: N//2."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def _int(raw: dict, key: str, lo: int = 1, default=..., where: str = "config.json") -> int | None:
    """An integer field >= lo; missing -> default (or an error when there is none)."""
    v = raw.get(key)
    if v is None:
        if default is ...:
            raise CheckpointError(f"{where}: missing field '{key}' (expected an integer >= {lo})")
        return default
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise CheckpointError(f"{where}: field '{key}' = {v!r}, expected an integer >= {lo}")
    return v


def _num(raw: dict, key: str, default: float) -> float:
    v = raw.get(key, default)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
        raise CheckpointError(f"config.json: field '{key}' = {v!r}, expected a positive number")
    return float(v)


def parse_config(raw: dict) -> DrafterConfig:
    """Validate a config.json dict into a DrafterConfig; errors name the field and the expected value."""
    if not isinstance(raw, dict):
        raise CheckpointError("config.json: expected a JSON object")
    n = _int(raw, "num_hidden_layers")
    H = _int(raw, "hidden_size")
    nh = _int(raw, "num_attention_heads")
    nkv = _int(raw, "num_key_value_heads")
    if nh % nkv:
        raise CheckpointError(f"config.json: num_attention_heads={nh} must be a multiple of num_key_value_heads={nkv}")
    hd = _int(raw, "head_dim", default=H // nh)
    if hd % 2 or hd < 2:
        raise CheckpointError(f"config.json: head_dim={hd}, expected an even integer (RoPE)")
    dcfg = raw.get("dflash_config")
    if dcfg is None:
        dcfg = {}
    if not isinstance(dcfg, dict):
        raise CheckpointError(f"config.json: dflash_config = {dcfg!r}, expected an object")
    ntl = _int(raw, "num_target_layers", default=None)
    ids = dcfg.get("target_layer_ids")
    if ids is None:
        if ntl is None:
            raise CheckpointError(
                "config.json: missing 'dflash_config.target_layer_ids' and 'num_target_layers' (expected one of them)")
        ids = default_layer_ids(ntl, n)
    if (not isinstance(ids, list) or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
        raise CheckpointError(f"config.json: dflash_config.target_layer_ids = {ids!r}, expected a list of ints >= 0")
    if ntl is not None and max(ids) >= ntl:
        raise CheckpointError(
            f"config.json: dflash_config.target_layer_ids contains {max(ids)}, expected ids < num_target_layers={ntl}")
    V = _int(raw, "vocab_size")
    mask = _int(dcfg, "mask_token_id", lo=0, default=None, where="config.json: dflash_config")
    if mask is None:
        mask = _int(raw, "mask_token_id", lo=0, default=None)
    if mask is None:
        raise CheckpointError("config.json: missing field 'dflash_config.mask_token_id' (expected an integer)")
    if mask >= V:
        raise CheckpointError(f"config.json: dflash_config.mask_token_id={mask}, expected 0 <= id < vocab_size={V}")
    types = raw.get("layer_types") or ["full_attention"] * n
    if (not isinstance(types, list) or len(types) != n
            or any(t not in ("full_attention", "sliding_attention") for t in types)):
        raise CheckpointError(
            f"config.json: layer_types = {types!r}, expected {n} entries of full_attention|sliding_attention")
    window = _int(raw, "sliding_window", default=None) if "sliding_attention" in types else None
    if "sliding_attention" in types and not window:
        raise CheckpointError("config.json: sliding_attention layers need 'sliding_window' (expected a positive int)")
    B = _int(raw, "block_size", lo=2)
    scaling = raw.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise CheckpointError(f"config.json: rope_scaling = {scaling!r}, expected an object or null")
    return DrafterConfig(
        hidden_size=H, intermediate_size=_int(raw, "intermediate_size"), num_hidden_layers=n,
        num_attention_heads=nh, num_key_value_heads=nkv, head_dim=hd, vocab_size=V, block_size=B,
        target_layer_ids=list(ids), mask_token_id=mask, num_target_layers=ntl, layer_types=list(types),
        sliding_window=window, rms_norm_eps=_num(raw, "rms_norm_eps", 1e-6), rope_theta=_num(raw, "rope_theta", 1e6),
        rope_scaling=scaling, max_position_embeddings=_int(raw, "max_position_embeddings", default=32768),
        attention_bias=bool(raw.get("attention_bias", False)),
    )


def read_config(path: str | Path) -> DrafterConfig:
    """Read and validate `path/config.json`."""
    f = Path(path) / "config.json"
    if not f.is_file():
        raise CheckpointError(f"{path}: no config.json (expected a DFlash checkpoint folder)")
    try:
        raw = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{f}: not valid JSON ({e})") from None
    return parse_config(raw)


def shapes(c: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint with config `c` must hold (SPEC 2 names, no prefix)."""
    H, I, hd, nh, nkv = c.hidden_size, c.intermediate_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads
    out = {"fc.weight": (H, c.K * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        out |= {
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (nh * hd, H), p + "self_attn.k_proj.weight": (nkv * hd, H),
            p + "self_attn.v_proj.weight": (nkv * hd, H), p + "self_attn.o_proj.weight": (H, nh * hd),
            p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I),
        }
        if c.attention_bias:
            out |= {p + "self_attn.q_proj.bias": (nh * hd,), p + "self_attn.k_proj.bias": (nkv * hd,),
                    p + "self_attn.v_proj.bias": (nkv * hd,), p + "self_attn.o_proj.bias": (H,)}
    return out


def check_target(c: DrafterConfig, hidden_size: int, vocab_size: int, num_layers: int) -> None:
    """Raise CheckpointError when the drafter cannot run on this target's features and head."""
    if c.hidden_size != hidden_size:
        raise CheckpointError(f"hidden_size={c.hidden_size} does not match the target (expected {hidden_size})")
    if c.vocab_size != vocab_size:
        raise CheckpointError(f"vocab_size={c.vocab_size} does not match the target (expected {vocab_size})")
    if max(c.target_layer_ids) >= num_layers:
        raise CheckpointError(
            f"dflash_config.target_layer_ids contains {max(c.target_layer_ids)}, "
            f"expected ids < {num_layers} (the target's layer count)")


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


class Rope:
    """cos/sin tables for absolute positions, via transformers' RoPE init (handles rope_scaling)."""

    def __init__(self, c: DrafterConfig, device, dtype):
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        qc = Qwen3Config(hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
                         head_dim=c.head_dim, rope_theta=c.rope_theta, rope_scaling=c.rope_scaling,
                         max_position_embeddings=c.max_position_embeddings)
        self.emb = Qwen3RotaryEmbedding(qc).to(device)
        self.dtype = dtype

    def __call__(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # pos [..., T] -> cos, sin [..., T, hd]
        flat = pos.reshape(1, -1)
        dummy = torch.empty(0, dtype=self.dtype, device=pos.device)
        cos, sin = self.emb(dummy, flat)
        return cos.reshape(*pos.shape, -1), sin.reshape(*pos.shape, -1)


# ---------------------------------------------------------------------------
# model


class Drafter:
    """Weights of a DFlash checkpoint plus its two forwards. Differentiable when the weights require grad
    (the demo trains through `blocks`); callers wrap inference in torch.inference_mode()."""

    def __init__(self, c: DrafterConfig, w: dict[str, torch.Tensor], path: str = ""):
        self.c, self.w, self.path = c, w, path
        any_w = w["fc.weight"]
        self.device, self.dtype = any_w.device, any_w.dtype
        self.rope = Rope(c, self.device, self.dtype)

    # -- shared pieces --------------------------------------------------------

    def _lin(self, x, name):
        return F.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    def ctx(self, features: torch.Tensor) -> torch.Tensor:
        """features [T, K*H] -> ctx [T, H] = hidden_norm(fc(features))."""
        x = self._lin(features.to(self.device, self.dtype), "fc")
        return rmsnorm(x, self.w["hidden_norm.weight"], self.c.rms_norm_eps)

    def _kv(self, i: int, x: torch.Tensor, cos, sin):
        """x [..., T, H] -> k [..., nkv, T, hd] (normed, roped), v [..., nkv, T, hd]."""
        c, p = self.c, f"layers.{i}.self_attn."
        k = self._lin(x, p + "k_proj").unflatten(-1, (c.num_key_value_heads, c.head_dim))
        v = self._lin(x, p + "v_proj").unflatten(-1, (c.num_key_value_heads, c.head_dim))
        k = rmsnorm(k, self.w[p + "k_norm.weight"], c.rms_norm_eps).transpose(-2, -3)
        return rotate(k, cos.unsqueeze(-3), sin.unsqueeze(-3)), v.transpose(-2, -3)

    def _q(self, i: int, x: torch.Tensor, cos, sin):
        """x [..., B, H] -> q [..., nh, B, hd] (normed, roped)."""
        c, p = self.c, f"layers.{i}.self_attn."
        q = self._lin(x, p + "q_proj").unflatten(-1, (c.num_attention_heads, c.head_dim))
        q = rmsnorm(q, self.w[p + "q_norm.weight"], c.rms_norm_eps).transpose(-2, -3)
        return rotate(q, cos.unsqueeze(-3), sin.unsqueeze(-3))

    def _mlp(self, i: int, x):
        p = f"layers.{i}.mlp."
        return self._lin(F.silu(self._lin(x, p + "gate_proj")) * self._lin(x, p + "up_proj"), p + "down_proj")

    def _window(self, i: int) -> int | None:
        return self.c.sliding_window if self.c.layer_types[i] == "sliding_attention" else None

    # -- every-anchor path ----------------------------------------------------

    def context_kv(self, features: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (k, v) of the whole sequence's context, each [nkv, T, hd]; computed once per sequence."""
        ctx = self.ctx(features)  # [T, H]
        cos, sin = self.rope(torch.arange(ctx.shape[0], device=self.device))
        return [self._kv(i, ctx, cos, sin) for i in range(self.c.num_hidden_layers)]

    def blocks(self, kv: list[tuple[torch.Tensor, torch.Tensor]], anchors: torch.Tensor,
               emb: torch.Tensor, group: int = 16, max_anchor: int | None = None) -> torch.Tensor:
        """Draft many blocks of one sequence at once.

        kv: context_kv of the sequence; anchors [N] (int, the anchor position of each block);
        emb [N, B, H]: target embeddings of [anchor token, MASK x (B-1)].
        Block n's queries see context keys at positions < anchors[n] plus their own block (bidirectional).
        Returns norm(h) [N, B, H].

        Attention is one fused SDPA call per layer: blocks are taken `group` at a time (S groups), each
        group's queries [g*G*B] attend over [context keys ; the group's block keys] of one KV head, with an
        additive mask that keeps block n to keys < anchors[n] and to its own block. GQA is folded into the
        query rows, so K/V are never repeated per query head; scores never leave the kernel. The context
        length is rounded up to a multiple of 256 (the extra keys are masked) so that few distinct shapes
        reach the attention kernels. `max_anchor` (>= anchors.max(), optional) spares a device sync.
        """
        c = self.c
        N, B, _ = emb.shape
        nkv, g, hd = c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads, c.head_dim
        dev = self.device
        G = max(1, min(group, N))                                  # blocks per attention group
        S = -(-N // G)                                             # groups
        anchors = anchors.to(dev)
        h = emb.to(dev, self.dtype)
        if S * G > N:                                              # pad with copies of the last block
            pad = S * G - N
            anchors = torch.cat([anchors, anchors[-1:].expand(pad)])
            h = torch.cat([h, h[-1:].expand(pad, -1, -1)])
        T = kv[0][0].shape[1]
        top = int(anchors.max()) if max_anchor is None else max_anchor
        L = min(T, -(-top // 256) * 256)                           # context keys any block can see (x256)
        qpos = anchors[:, None] + torch.arange(B, device=dev)      # [N', B]
        cos, sin = self.rope(qpos)                                 # [N', B, hd]
        masks = {w: self._attn_mask(anchors, qpos, L, S, G, g, w) for w in {self._window(i) for i in
                                                                            range(c.num_hidden_layers)}}
        for i in range(c.num_hidden_layers):
            p = f"layers.{i}."
            x = rmsnorm(h, self.w[p + "input_layernorm.weight"], c.rms_norm_eps)
            q = self._q(i, x, cos, sin)                            # [N', nh, B, hd]
            q = q.view(S, G, nkv, g, B, hd).permute(0, 2, 3, 1, 4, 5).reshape(S, nkv, g * G * B, hd)
            kb, vb = (t.view(S, G, nkv, B, hd).transpose(1, 2).reshape(S, nkv, G * B, hd)
                      for t in self._kv(i, x, cos, sin))           # [S, nkv, G*B, hd]
            kc, vc = (t[:, :L].expand(S, nkv, L, hd) for t in kv[i])
            k, v = torch.cat([kc, kb], 2), torch.cat([vc, vb], 2)  # [S, nkv, L+G*B, hd]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[self._window(i)])
            o = o.view(S, nkv, g, G, B, hd).permute(0, 3, 4, 1, 2, 5).reshape(S * G, B, nkv * g * hd)
            h = h + self._lin(o, p + "self_attn.o_proj")
            h = h + self._mlp(i, rmsnorm(h, self.w[p + "post_attention_layernorm.weight"], c.rms_norm_eps))
        return rmsnorm(h, self.w["norm.weight"], c.rms_norm_eps)[:N]

    def _attn_mask(self, anchors, qpos, L: int, S: int, G: int, g: int, window: int | None) -> torch.Tensor:
        """Additive mask [S, 1, g*G*B, L+G*B] (0 or -inf) of the grouped attention in `blocks`."""
        B, dev = qpos.shape[1], qpos.device
        kpos = torch.arange(L, device=dev)
        a, qp = anchors.view(S, G), qpos.view(S, G, B)
        ok_ctx = (kpos < a[:, :, None, None]).expand(S, G, B, L)              # [S, G, B, L]
        ok_blk = torch.eye(G, dtype=torch.bool, device=dev)[None, :, None, :, None].expand(S, G, B, G, B)
        if window:
            ok_ctx = ok_ctx & ((qp[..., None] - kpos) < window)
            ok_blk = ok_blk & ((qp[:, :, :, None, None] - qp[:, None, None, :, :]) < window)
        ok = torch.cat([ok_ctx, ok_blk.reshape(S, G, B, G * B)], -1)          # [S, G, B, L+G*B]
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
            q = self._q(i, x, cos[anchor:], sin[anchor:])           # [nh, B, hd]
            k, v = self._kv(i, torch.cat([ctx, x]), cos, sin)       # [nkv, anchor+B, hd]
            k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
            mask = None
            w = self._window(i)
            if w:
                mask = (pos[anchor:, None] - pos[None, :]) < w      # [B, anchor+B]
            o = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask).to(self.dtype)
            h = h + self._lin(o.transpose(0, 1).flatten(1), p + "self_attn.o_proj")
            h = h + self._mlp(i, rmsnorm(h, self.w[p + "post_attention_layernorm.weight"], c.rms_norm_eps))
        return rmsnorm(h, self.w["norm.weight"], c.rms_norm_eps)


# ---------------------------------------------------------------------------
# loading


def load(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Drafter:
    """Load and validate a checkpoint folder; tensors of the wrong name or shape raise CheckpointError."""
    path = Path(path)
    c = read_config(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors file (expected the drafter weights)")
    want = shapes(c)
    w: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as sf:
            for name in sf.keys():
                key = name.removeprefix("model.")
                if key not in want:
                    continue  # extra tensors (e.g. a copied embed) are ignored
                t = sf.get_tensor(name)
                if tuple(t.shape) != want[key]:
                    raise CheckpointError(f"{f.name}: tensor '{key}' has shape {tuple(t.shape)}, expected {want[key]}")
                w[key] = t.to(device=device, dtype=dtype)
    missing = [k for k in want if k not in w]
    if missing:
        raise CheckpointError(f"{path}: missing tensor '{missing[0]}' (expected shape {want[missing[0]]})"
                              + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    return Drafter(c, w, str(path))


def flops_per_block(c: DrafterConfig, ctx_len: int, vocab: int) -> float:
    """Matmul FLOPs of one block over `ctx_len` context keys, LM head of B-1 slots included (for benchmarks)."""
    H, I, hd, nh, nkv, B = (c.hidden_size, c.intermediate_size, c.head_dim, c.num_attention_heads,
                            c.num_key_value_heads, c.block_size)
    per_layer = 2 * B * (H * nh * hd * 2 + H * nkv * hd * 2 + 3 * H * I)  # q,o ; k,v ; mlp
    per_layer += 2 * 2 * B * nh * hd * (ctx_len + B)                   # scores + weighted values
    return c.num_hidden_layers * per_layer + 2 * (B - 1) * H * vocab

