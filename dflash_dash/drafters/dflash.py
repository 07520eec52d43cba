"""DFlash, the first drafter family: the block forward over target features, one function per K/V layout.

Contract: `DFlash(c, w)` holds a config and typed `Weights` (any device, any dtype; differentiable when the
weights require grad: the demo trains through `blocks`; callers wrap inference in torch.inference_mode()).
Its forwards (the `base.Drafter` interface) return norm(h) of each block:
  - `blocks`: many blocks of one sequence (or of stacked sequences in lockstep) over shared context K/V,
    [context ; block] keys concatenated per attention group (the every-anchor path);
  - `blocks_in_place`: the same over stacked K/V whose leading spare key slots take the blocks' keys in place,
    attention over a prefix view (the chain-only replay's lockstep steps, the every-anchor replicas);
  - `blocks_run`: blocks at consecutive anchors over one sequence's context K/V, the keys all of them see in one
    unmasked call and the rest masked, merged (the every-anchor path at long contexts);
  - `block`: one block, keys = [ctx; block] concatenated, plain SDPA (the reference the tests trust).
`load(ck, c, ...)` reads a located checkpoint's checked tensors into a DFlash.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import attention as attn, kernels
from .base import Drafter
from .checkpoint import Checkpoint
from .config import DrafterConfig, sliding_semantics
from .kernels import Rope, kernels_for, rmsnorm
from .readout import lm_top, slot_tap
from .weights import Linear, Weights, checked, shapes

__all__ = ["DFlash", "load", "shapes", "flops_per_block"]

ATTN, MLP = "attention_conv", "mlp_conv"  # a layer's two sublayers (DFlash2's convolutions are named after them)


def _lin(x: torch.Tensor, lin: Linear) -> torch.Tensor:
    return F.linear(x, lin.weight, lin.bias)


class DFlash(Drafter):
    """Weights of a DFlash checkpoint plus its forwards."""

    def __init__(self, c: DrafterConfig, w: Weights, path: str = "", sliding_block: str | None = None):
        self.c, self.w, self.path = c, w, path
        self.sliding_block = sliding_semantics(c, sliding_block)  # causal | bidirectional (sliding layers)
        any_w = w.fc.weight
        self.device, self.dtype = any_w.device, any_w.dtype
        self.rope = Rope(c, self.device, self.dtype)
        self.ops = kernels_for(self.device)  # element-wise kernels of the batched forward: eager or fused

    # -- the block's two ends --------------------------------------------------

    def embed_block(self, head, anchor_ids: torch.Tensor) -> torch.Tensor:
        """[anchor, MASK x (B-1)] through the target's embedding -> [N, B, H] in the drafter's dtype."""
        c = self.c
        ids = torch.full((len(anchor_ids), c.block_size), c.mask_token_id, dtype=torch.long, device=head.embed.device)
        ids[:, 0] = anchor_ids.to(ids.device)
        return head.embed[ids].to(self.device, self.dtype)

    def read_out(self, head, h: torch.Tensor, anchor_ids: torch.Tensor, topk: int, slots=None, tap=None):
        """Drafts j = 0..D-1 from block slots first_slot + j through the LM head (argmax, top-k, log-probs);
        `tap(n, j, logits)` hears every drafted row's full logits (`readout.slot_tap`)."""
        lo, hi = slots or (0, self.c.drafts)
        f = self.c.first_slot
        N, S = h.shape[0], hi - lo
        drafts, ids, logp = lm_top(head, h[:, f + lo : f + hi].reshape(N * S, -1), topk, tap=slot_tap(tap, None, S, lo))
        return drafts.view(N, S), ids.view(N, S, topk), logp.view(N, S, topk)

    # -- shared pieces --------------------------------------------------------

    def ctx(self, features: torch.Tensor) -> torch.Tensor:
        """features [T, K*H] -> ctx [T, H] = hidden_norm(fc(features))."""
        x = _lin(features.to(self.device, self.dtype), self.w.fc)
        return self.ops.rmsnorm(x, self.w.hidden_norm, self.c.rms_norm_eps)

    def _kv(self, i: int, x: torch.Tensor, cos, sin):
        """x [..., T, H] -> k [..., nkv, T, hd] (normed, roped), v [..., nkv, T, hd]."""
        c, L = self.c, self.w.layers[i]
        k = _lin(x, L.k_proj).unflatten(-1, (c.num_key_value_heads, c.head_dim))
        v = _lin(x, L.v_proj).unflatten(-1, (c.num_key_value_heads, c.head_dim))
        return self.ops.norm_rope(k, L.k_norm, c.rms_norm_eps, cos, sin), v.transpose(-2, -3)

    def _q(self, i: int, x: torch.Tensor, cos, sin):
        """x [..., B, H] -> q [..., nh, B, hd] (normed, roped)."""
        c, L = self.c, self.w.layers[i]
        q = _lin(x, L.q_proj).unflatten(-1, (c.num_attention_heads, c.head_dim))
        return self.ops.norm_rope(q, L.q_norm, c.rms_norm_eps, cos, sin)

    def _mlp(self, i: int, x):
        L = self.w.layers[i]
        return _lin(self.ops.silu_mul(_lin(x, L.gate_proj), _lin(x, L.up_proj)), L.down_proj)

    def _mix_in(self, i: int, part: str, x: torch.Tensor):
        """Layer i's sublayer `part` (ATTN | MLP) input [..., B, H] as the sublayer reads it, and what its output
        side needs: DFlash reads it as it is (DFlash2 convolves it inside each block)."""
        return x, None

    def _mix_out(self, i: int, part: str, y: torch.Tensor, mix) -> torch.Tensor:
        """Layer i's sublayer `part` output [..., B, H] as it joins the residual stream (DFlash: as it is)."""
        return y

    def _kind(self, i: int) -> tuple[int | None, bool]:
        """(key window, causal inside the block) of layer i: (None, False) for full_attention layers."""
        if self.c.layer_types[i] != "sliding_attention":
            return None, False
        return self.c.sliding_window, self.sliding_block == "causal"

    # -- batched paths --------------------------------------------------------

    def context_kv(self, features: torch.Tensor, start: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (k, v) of the whole sequence's context, each [nkv, T, hd]; computed once per sequence. `start`:
        the position of row 0 (a decoder extending its context K/V by the rows it just committed)."""
        ctx = self.ctx(features)  # [T, H] (or [S, T, H]: stacked sequences, K/V [S, nkv, T, hd])
        cos, sin = self.rope(torch.arange(start, start + ctx.shape[-2], device=self.device))
        return [self._kv(i, ctx, cos, sin) for i in range(self.c.num_hidden_layers)]

    def blocks(
        self,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        anchors: torch.Tensor,
        emb: torch.Tensor,
        group: int = 16,
        max_anchor: int | None = None,
    ) -> torch.Tensor:
        """Draft many blocks at once: of one sequence, or of several sequences in lockstep.

        kv: context_kv of the sequence (per layer k, v [nkv, T, hd]), or of S sequences stacked (per layer
        [S, nkv, T, hd], padded to one T) with N = S*G blocks, G consecutive blocks per sequence;
        anchors [N] (int, the anchor position of each block);
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
        """
        c = self.c
        N = emb.shape[0]
        nkv, hd = c.num_key_value_heads, c.head_dim
        stacked = kv[0][0].dim() == 4  # [S, nkv, T, hd]: one group per sequence
        if stacked and N % kv[0][0].shape[0]:
            raise ValueError(f"{N} blocks do not split evenly over {kv[0][0].shape[0]} stacked sequences")
        G = N // kv[0][0].shape[0] if stacked else max(1, min(group, N))  # blocks per attention group
        S, anchors, h = self._grouped(anchors, emb, G)
        T = kv[0][0].shape[-2]
        top = int(anchors.max()) if max_anchor is None else max_anchor
        L = min(T, -(-top // kernels.KEY_ALIGN) * kernels.KEY_ALIGN)  # context keys any block can see

        def keys(i: int, kb: torch.Tensor, vb: torch.Tensor):
            kc, vc = ((t[:, :, :L] if stacked else t[:, :L].expand(S, nkv, L, hd)) for t in kv[i])
            return torch.cat([kc, kb], 2), torch.cat([vc, vb], 2)  # [S, nkv, L+G*B, hd]

        return self._layers(anchors, h, N, S, G, self._masked(anchors, S, G, L, keys, blocks_first=False))

    def blocks_in_place(
        self,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        anchors: torch.Tensor,
        emb: torch.Tensor,
        max_anchor: int | None = None,
    ) -> torch.Tensor:
        """`blocks` over stacked context K/V with spare key slots (the chain-only replay's lockstep steps).

        kv: per layer k, v [S, nkv, G*B + T, hd] that start with G*B spare key slots, N = S*G blocks, G consecutive
        blocks per sequence. The blocks' keys are written there in place and the attention runs over them and the
        first L context keys, L >= `max_anchor` rounded so that G*B + L is a multiple of KEY_ALIGN (all T without
        `max_anchor`): a prefix view, so no per-call copy of the context K/V is made. Visibility and the result
        are those of `blocks`.
        """
        N, B, _ = emb.shape
        if kv[0][0].dim() != 4:
            raise ValueError("blocks_in_place needs stacked context K/V [S, nkv, G*B + T, hd]")
        if N % kv[0][0].shape[0]:
            raise ValueError(f"{N} blocks do not split evenly over {kv[0][0].shape[0]} stacked sequences")
        G = N // kv[0][0].shape[0]
        S, anchors, h = self._grouped(anchors, emb, G)
        T = kv[0][0].shape[-2] - G * B  # context slots, after the block slots
        top = T if max_anchor is None else max_anchor  # no sync: the caller's bound or every key
        L = min(T, -(-(G * B + top) // kernels.KEY_ALIGN) * kernels.KEY_ALIGN - G * B)

        def keys(i: int, kb: torch.Tensor, vb: torch.Tensor):
            k, v = kv[i]
            k[:, :, : G * B].copy_(kb)  # the blocks' keys into the spare slots
            v[:, :, : G * B].copy_(vb)
            return k[:, :, : G * B + L], v[:, :, : G * B + L]  # [S, nkv, G*B+L, hd] (a view)

        return self._layers(anchors, h, N, S, G, self._masked(anchors, S, G, L, keys, blocks_first=True))

    def _grouped(self, anchors: torch.Tensor, emb: torch.Tensor, G: int):
        """(S groups, anchors, block inputs) on the device, padded with copies of the last block to S*G blocks."""
        N = emb.shape[0]
        S = -(-N // G)  # groups
        anchors = anchors.to(self.device)
        h = emb.to(self.device, self.dtype)
        if S * G > N:  # pad with copies of the last block
            pad = S * G - N
            anchors = torch.cat([anchors, anchors[-1:].expand(pad)])
            h = torch.cat([h, h[-1:].expand(pad, -1, -1)])
        return S, anchors, h

    def _qpos(self, anchors: torch.Tensor, B: int) -> torch.Tensor:
        """Positions [N', B] of each block's slots."""
        return anchors[:, None] + torch.arange(B, device=anchors.device)

    def _masked(self, anchors, S: int, G: int, L: int, keys: Callable, blocks_first: bool) -> Callable:
        """The grouped attention of `blocks` and `blocks_in_place`: layer i's queries [S, nkv, g*G*B, hd] over
        `keys(i, kb, vb)` (context and block keys [S, nkv, L+G*B, hd]) with the additive visibility mask, one SDPA
        call a layer."""
        c = self.c
        qpos, g = self._qpos(anchors, self.c.block_size), c.num_attention_heads // c.num_key_value_heads
        masks = {
            kd: self._attn_mask(anchors, qpos, L, S, G, g, *kd, blocks_first=blocks_first)
            for kd in {self._kind(i) for i in range(c.num_hidden_layers)}
        }
        return lambda i, q, kb, vb: F.scaled_dot_product_attention(q, *keys(i, kb, vb), attn_mask=masks[self._kind(i)])

    def _layers(self, anchors, h, N: int, S: int, G: int, attend: Callable) -> torch.Tensor:
        """The layers of the grouped forward: `attend(i, q, kb, vb)` gives layer i's attention output
        [S, nkv, g*G*B, hd] from its queries [S, nkv, g*G*B, hd] and the groups' block keys and values
        [S, nkv, G*B, hd]."""
        c = self.c
        B = h.shape[1]
        nkv, g, hd = c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads, c.head_dim
        cos, sin = self.rope(self._qpos(anchors, B))  # [N', B, hd]
        ops, eps, layers = self.ops, c.rms_norm_eps, self.w.layers
        x = ops.rmsnorm(h, layers[0].input_layernorm, eps)
        for i in range(c.num_hidden_layers):
            nxt = layers[i + 1].input_layernorm if i + 1 < c.num_hidden_layers else self.w.norm
            x, mix = self._mix_in(i, ATTN, x)  # [N', B, H]
            q = self._q(i, x, cos, sin)  # [N', nh, B, hd]
            q = q.view(S, G, nkv, g, B, hd).permute(0, 2, 3, 1, 4, 5).reshape(S, nkv, g * G * B, hd)
            kb, vb = (
                t.view(S, G, nkv, B, hd).transpose(1, 2).reshape(S, nkv, G * B, hd) for t in self._kv(i, x, cos, sin)
            )  # [S, nkv, G*B, hd]
            o = attend(i, q, kb, vb)
            o = o.view(S, nkv, g, G, B, hd).permute(0, 3, 4, 1, 2, 5).reshape(S * G, B, nkv * g * hd)
            o = self._mix_out(i, ATTN, _lin(o, layers[i].o_proj), mix)
            h, x = ops.add_norm(h, o, layers[i].post_attention_layernorm, eps)
            x, mix = self._mix_in(i, MLP, x)
            h, x = ops.add_norm(h, self._mix_out(i, MLP, self._mlp(i, x), mix), nxt, eps)  # x: the next layer's input
        return x[:N]

    def _visible(
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
        kpos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Visibility [S, 1, g*G*B, L+G*B] (bool) of the grouped attention of `blocks`: keys are the L context keys
        (at positions 0..L-1, or `kpos` [L]) then the G*B block keys, or the other way round (`blocks_first`:
        `blocks_in_place`)."""
        B, dev = qpos.shape[1], qpos.device
        kpos = torch.arange(L, device=dev) if kpos is None else kpos
        a, qp = anchors.view(S, G), qpos.view(S, G, B)
        ok_ctx = (kpos < a[:, :, None, None]).expand(S, G, B, L)  # [S, G, B, L]
        ok_blk = torch.eye(G, dtype=torch.bool, device=dev)[None, :, None, :, None].expand(S, G, B, G, B)
        if window:
            ok_ctx = ok_ctx & ((qp[..., None] - kpos) < window)
            d = qp[:, :, :, None, None] - qp[:, None, None, :, :]  # [S, G, B, G, B] q - k
            ok_blk = ok_blk & (d < window) & ((d >= 0) if causal else True)
        parts = [ok_ctx, ok_blk.reshape(S, G, B, G * B)]
        ok = torch.cat(parts[::-1] if blocks_first else parts, -1)  # [S, G, B, L+G*B]
        return ok.reshape(S, 1, 1, G * B, -1).expand(S, 1, g, G * B, L + G * B).reshape(S, 1, g * G * B, -1)

    def _attn_mask(self, *args, **kw) -> torch.Tensor:
        """`_visible` as the additive mask (0 or -inf, the drafter's dtype) SDPA takes."""
        ok = self._visible(*args, **kw)
        return torch.zeros(ok.shape, dtype=self.dtype, device=ok.device).masked_fill_(~ok, float("-inf"))

    # -- long contexts -------------------------------------------------------

    def blocks_run(
        self, kv: list[tuple[torch.Tensor, torch.Tensor]], start: int, emb: torch.Tensor, group: int = 16
    ) -> torch.Tensor:
        """Blocks at the N consecutive anchors start..start+N-1 of one sequence, over its context K/V as
        `context_kv` returns it (per layer [nkv, T, hd], T >= start+N-1): the every-anchor path at long contexts.

        Same visibility and result as `blocks`, attended in two parts merged by their log-sum-exp
        (`attention.merge`): the context keys every query of the run sees (all keys < start in a full-attention
        layer; in a sliding-window layer those its window still holds for the run's last query) in one unmasked
        call over all N*B queries (a flash kernel: no mask, no copy of the context per group, nothing masked in
        vain); and the rest under the visibility mask, per group of G blocks: the run's own context keys
        start..start+N-2, a sliding window's lower edge, and the group's block keys. Work per block grows with
        the keys it sees and nothing else. Returns norm(h) [N, B, H].
        """
        N = emb.shape[0]
        G = max(1, min(group, N))
        anchors = torch.arange(start, start + N, device=self.device)
        S, anchors, h = self._grouped(anchors, emb, G)
        return self._layers(anchors, h, N, S, G, self._split(kv, start, start + N - 1, anchors, S, G))

    def _split(self, kv, start: int, top: int, anchors, S: int, G: int) -> Callable:
        """The attention of `blocks_run`. Per layer kind, with w its window (unbounded in a full-attention layer):
        the prefix [p, start), every key of which all queries of the run see (p = 0 in full attention, else the
        lowest key the run's last query still sees), unmasked; and the local keys, those some query sees but not
        all, [lo, p) and [start, top), with the blocks' own, masked; merged."""
        c, B = self.c, self.c.block_size
        nkv, g, hd = c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads, c.head_dim
        qpos, dev = self._qpos(anchors, B), anchors.device
        plans = {}
        for window, causal in {self._kind(i) for i in range(c.num_hidden_layers)}:
            lo = max(0, start - window + 1) if window else 0  # the lowest key the run's first query sees
            p = min(max(0, top + B - window), start) if window else 0  # ... and its last query
            kpos = torch.cat([torch.arange(lo, p, device=dev), torch.arange(start, top, device=dev)])
            ok = self._visible(anchors, qpos, len(kpos), S, G, g, window, causal, kpos=kpos)
            plans[window, causal] = lo, p, ok

        def attend(i: int, q: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor) -> torch.Tensor:
            lo, p, ok = plans[self._kind(i)]
            K, V = kv[i]  # [nkv, T, hd]
            n = ok.shape[-1] - kb.shape[2]  # local context keys
            k = torch.cat([K[:, lo:p], K[:, start:top]], 1)[None].expand(S, nkv, n, hd)
            v = torch.cat([V[:, lo:p], V[:, start:top]], 1)[None].expand(S, nkv, n, hd)
            o, lse = attn.attend(q, torch.cat([k, kb], 2), torch.cat([v, vb], 2), ok)  # [S, nkv, R, hd], [S, nkv, R]
            if p == start:
                return o
            R = q.shape[2]
            qa = q.transpose(0, 1).reshape(1, nkv, S * R, hd)  # every query of the run against one copy of the keys
            op, lp = attn.prefix(qa, K[None, :, p:start], V[None, :, p:start])
            op, lp = op.view(nkv, S, R, hd).transpose(0, 1), lp.view(nkv, S, R).transpose(0, 1)
            return attn.merge(o, lse, op, lp)

        return attend

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
            L = self.w.layers[i]
            x, mix = self._mix_in(i, ATTN, rmsnorm(h, L.input_layernorm, c.rms_norm_eps))
            q = self._q(i, x, cos[anchor:], sin[anchor:])  # [nh, B, hd]
            k, v = self._kv(i, torch.cat([ctx, x]), cos, sin)  # [nkv, anchor+B, hd]
            k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
            mask = None
            w, causal = self._kind(i)
            if w:
                d = pos[anchor:, None] - pos[None, :]  # [B, anchor+B] q - k
                mask = (d < w) & (d >= 0) if causal else d < w
            o = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask).to(self.dtype)
            h = h + self._mix_out(i, ATTN, _lin(o.transpose(0, 1).flatten(1), L.o_proj), mix)
            x, mix = self._mix_in(i, MLP, rmsnorm(h, L.post_attention_layernorm, c.rms_norm_eps))
            h = h + self._mix_out(i, MLP, self._mlp(i, x), mix)
        return rmsnorm(h, self.w.norm, c.rms_norm_eps)


# ---------------------------------------------------------------------------
# loading


def load(
    ck: Checkpoint,
    c: DrafterConfig,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    sliding_block: str | None = None,
    place: Callable[[dict], dict] | None = None,
    cls: type[DFlash] | None = None,
) -> DFlash:
    """A DFlash from a located checkpoint with validated config `c`: every tensor checked (`weights.checked`),
    read in `dtype` and moved to `device` as it is read, or, with `place`, all at once by `place` (a loader's
    staged upload, {name: CPU tensor} -> {name: device tensor}). `cls`: the family's subclass of DFlash (the
    families share DFlash's backbone and loading)."""
    sliding_semantics(c, sliding_block)  # validate the choice before reading weights
    if place is None:
        w = checked(ck, c, lambda t: t.to(device=device, dtype=dtype))
    else:
        w = place(checked(ck, c, lambda t: t.to(dtype=dtype)))
    return (cls or DFlash)(c, Weights.from_named(c, w), str(ck.path), sliding_block)


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
