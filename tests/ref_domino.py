"""Test helper (not tests): an independent float64 Domino drafter, one anchor at a time, from a raw state dict.

Written from docs/families.md section 4.4 (SpecForge's greedy walk), with plain torch ops and no product code:
the backbone (fc + hidden_norm context, layers of full attention, bidirectional inside the block, RoPE, q/k
norms) over the target's features of positions < anchor, then the walk as SpecForge runs it: at each step the
whole block row [anchor, d_1 .. d_{k-1}, MASK ..] goes through `torch.nn.GRU` (no biases) over the target's raw
input embeddings, the row's corrected logits are formed for every slot from `suffix_start` on, and draft k is the
argmax of its slot (k-1 with `shift_label`, else k).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _norm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return g * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:  # x [n, heads, hd], pos [n]
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = pos.double()[:, None] * inv[None]
    cos, sin = torch.cos(ang)[:, None], torch.sin(ang)[:, None]
    a, b = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


def backbone(w: dict, cfg: dict, feats: torch.Tensor, anchor: int, anchor_token: int, embed: torch.Tensor):
    """Normed states [B, H] of the block at `anchor` (full-attention layers only)."""
    d = cfg["dflash_config"]
    B, hd = cfg["block_size"], cfg["head_dim"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    assert set(cfg["layer_types"]) == {"full_attention"}
    ctx = _norm(feats[:anchor].double() @ w["fc.weight"].T, w["hidden_norm.weight"])  # [anchor, H]
    ids = torch.tensor([anchor_token] + [d["mask_token_id"]] * (B - 1))
    h = embed.double()[ids]  # [B, H]
    qpos = anchor + torch.arange(B)
    kpos = torch.arange(anchor + B)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        x = _norm(h, w[p + "input_layernorm.weight"])
        kv_in = torch.cat([ctx, x])
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(B, nh, hd)
        k = (kv_in @ w[p + "self_attn.k_proj.weight"].T).view(-1, nkv, hd)
        v = (kv_in @ w[p + "self_attn.v_proj.weight"].T).view(-1, nkv, hd)
        q = _rope(_norm(q, w[p + "self_attn.q_norm.weight"]), qpos, cfg["rope_theta"])
        k = _rope(_norm(k, w[p + "self_attn.k_norm.weight"]), kpos, cfg["rope_theta"])
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / hd**0.5, -1)
        h = h + torch.einsum("hqk,khd->qhd", att, v).reshape(B, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        y = _norm(h, w[p + "post_attention_layernorm.weight"])
        h = (
            h
            + (F.silu(y @ w[p + "mlp.gate_proj.weight"].T) * (y @ w[p + "mlp.up_proj.weight"].T))
            @ w[p + "mlp.down_proj.weight"].T
        )
    return _norm(h, w["norm.weight"])


def domino_drafts(state: dict, cfg: dict, feats, tokens, anchor: int, embed, lm_head, full: list | None = None):
    """(drafts [B-1], their log-probabilities [B-1]) of the block at `anchor`, float64, as SpecForge's walk. `full`:
    each slot's whole logits [V] appended to it."""
    w = {k: v.double() for k, v in state.items()}
    d = cfg["dflash_config"]
    B, H, G = cfg["block_size"], cfg["hidden_size"], d["gru_hidden_dim"]
    P, shift = d.get("pure_draft_prefix_len", 0), d.get("shift_label", False)
    out = backbone(w, cfg, feats, anchor, int(tokens[anchor]), embed)  # [B, H]
    base = out @ lm_head.double().T  # [B, V]
    gru = torch.nn.GRU(H, G, num_layers=1, batch_first=True, bias=False).double()
    with torch.no_grad():
        gru.weight_ih_l0.copy_(w["prefix_gru.weight_ih_l0"])
        gru.weight_hh_l0.copy_(w["prefix_gru.weight_hh_l0"])
    start = P if shift else 1 + P  # first slot whose logits are corrected
    row = [int(tokens[anchor])] + [d["mask_token_id"]] * (B - 1)
    drafts, logps = [], []
    for k in range(1, B):
        emb = embed.double()[torch.tensor(row if shift else row[: B - 1])][None]  # [1, B or B-1, H]
        with torch.no_grad():
            states = gru(emb)[0][0]  # [B or B-1, G]
        prefix = states[start:] if shift else states[start - 1 :]
        z = out[start:]
        corr = F.silu(torch.cat([z, prefix[: len(z)]], -1) @ w["embed_proj.0.weight"].T) @ w["embed_proj.2.weight"].T
        logits = torch.cat([base[:start], base[start:] + corr])  # [B, V]
        slot = k - 1 if shift else k
        lp = torch.log_softmax(logits[slot], -1)
        if full is not None:
            full.append(logits[slot])
        tok = int(lp.argmax())
        drafts.append(tok)
        logps.append(float(lp[tok]))
        row[k] = tok
    return drafts, logps
