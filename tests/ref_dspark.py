"""Test helper (not tests): an independent float64 DSpark forward, one anchor at a time, from a raw state dict.

Plain torch ops only (no product code): the DFlash backbone of one block over the context features of positions
before the anchor (full-attention layers, bidirectional inside the block, GQA, q/k RMSNorm, RoPE), then
SpecForge's DSpark heads as docs/families.md 3.4 states them: the Markov walk over the drafting slots seeded with
the anchor token and fed its own drafts, and the confidence head with the walk's previous tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class Spec:
    """What the reference needs from a config (read by the test from its own TinyDrafter and fields)."""

    block_size: int  # B
    heads: int  # query heads
    kv_heads: int  # key/value heads
    head_dim: int
    layers: int
    mask_id: int
    rope_theta: float
    rank: int  # markov_rank
    kind: str  # vanilla | gated | rnn
    confidence: bool
    with_markov: bool
    from_anchor: bool  # sample_from_anchor


def _norm(x, g):
    return g * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)


def _rope(x, pos, hd, theta):  # x [n, heads, hd], pos [n]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = pos.double()[:, None] * inv[None]
    cos, sin = torch.cos(ang)[:, None], torch.sin(ang)[:, None]
    a, b = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


def backbone(w: dict, s: Spec, feats, anchor_token: int, p: int, embed) -> torch.Tensor:
    """Normed states [B, H] of the block at anchor p (context = features of positions 0..p-1)."""
    B, nh, nkv, hd = s.block_size, s.heads, s.kv_heads, s.head_dim
    ctx = _norm(feats[:p].double() @ w["fc.weight"].T, w["hidden_norm.weight"])  # [p, H]
    ids = torch.tensor([anchor_token] + [s.mask_id] * (B - 1))
    h = embed.double()[ids]  # [B, H]
    qpos, kpos = torch.arange(p, p + B), torch.arange(p + B)
    for i in range(s.layers):
        L = f"layers.{i}."
        x = _norm(h, w[L + "input_layernorm.weight"])
        q = (x @ w[L + "self_attn.q_proj.weight"].T).view(B, nh, hd)
        kv_in = torch.cat([ctx, x])
        k = (kv_in @ w[L + "self_attn.k_proj.weight"].T).view(-1, nkv, hd)
        v = (kv_in @ w[L + "self_attn.v_proj.weight"].T).view(-1, nkv, hd)
        q = _rope(_norm(q, w[L + "self_attn.q_norm.weight"]), qpos, hd, s.rope_theta)
        k = _rope(_norm(k, w[L + "self_attn.k_norm.weight"]), kpos, hd, s.rope_theta)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd), -1)
        o = torch.einsum("hqk,khd->qhd", att, v).reshape(B, nh * hd)
        h = h + o @ w[L + "self_attn.o_proj.weight"].T
        y = _norm(h, w[L + "post_attention_layernorm.weight"])
        gate, up = y @ w[L + "mlp.gate_proj.weight"].T, y @ w[L + "mlp.up_proj.weight"].T
        h = h + (gate * torch.sigmoid(gate) * up) @ w[L + "mlp.down_proj.weight"].T
    return _norm(h, w["norm.weight"])


def walk(w: dict, s: Spec, hb: torch.Tensor, anchor_token: int, lm_head, full: list | None = None):
    """The drafting slots of one block's states hb [B, H]: drafts [D], top-1 log-probs [D], confidence [D] (or
    None). One slot at a time, its previous token the one before it (the anchor first). `full`: each slot's whole
    logits [V] appended to it (what a sampling drafter samples from)."""
    slots = range(0 if s.from_anchor else 1, s.block_size)
    prev, u = anchor_token, torch.zeros(s.rank, dtype=torch.float64)
    drafts, logp, conf = [], [], []
    for j in slots:
        hs = hb[j]
        logits = lm_head.double() @ hs  # [V]
        e = w["markov_head.markov_w1.weight"][prev] if s.rank else None  # [r]
        if s.rank:
            if s.kind == "vanilla":
                z = e
            elif s.kind == "gated":
                g = torch.sigmoid(
                    w["markov_head.gate_proj.weight"] @ torch.cat([hs, e]) + w["markov_head.gate_proj.bias"]
                )
                z = g * e
            else:
                y = w["markov_head.joint_proj.weight"] @ torch.cat([u, e, hs]) + w["markov_head.joint_proj.bias"]
                a, c, o = y[: s.rank], y[s.rank : 2 * s.rank], y[2 * s.rank :]
                u = torch.sigmoid(a) * u + (1 - torch.sigmoid(a)) * torch.tanh(c)
                z = torch.tanh(o)
            logits = logits + w["markov_head.markov_w2.weight"] @ z
        if s.confidence:
            f = torch.cat([hs, e]) if s.with_markov else hs
            raw = w["confidence_head.proj.weight"][0] @ f + w["confidence_head.proj.bias"][0]
            conf.append(torch.sigmoid(raw))
        lp = torch.log_softmax(logits, -1)
        if full is not None:
            full.append(logits)
        d = int(lp.argmax())
        drafts.append(d)
        logp.append(lp[d])
        prev = d
    return torch.tensor(drafts), torch.stack(logp), torch.stack(conf) if s.confidence else None


def drafts_at_every_anchor(w: dict, s: Spec, feats, tokens, P: int, embed, lm_head):
    """Reference drafts [A, D], top-1 log-probs [A, D] and confidence [A, D] (or None) at anchors P..T-1."""
    w = {k: v.double() for k, v in w.items()}
    out = [
        walk(w, s, backbone(w, s, feats, int(tokens[p]), p, embed), int(tokens[p]), lm_head)
        for p in range(P, len(tokens))
    ]
    conf = torch.stack([o[2] for o in out]) if s.confidence else None
    return torch.stack([o[0] for o in out]), torch.stack([o[1] for o in out]), conf
