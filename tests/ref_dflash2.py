"""Test helper (not tests): an independent float64 DFlash2 forward, one anchor at a time, written from
docs/families.md section 5.4 with plain torch ops. It reads only the raw state dict, the config.json dict, the
target's features and its embedding / LM head; nothing from dflash_dash.
"""

from __future__ import annotations

import math

import torch


def _get(cfg: dict, key: str, default=None):
    inner = (cfg.get("dflash_config") or {}).get(key)
    return inner if inner is not None else cfg.get(key, default)


def _norm(x, g, eps):
    return g * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _rope(x, pos, theta):  # x [n, heads, hd], pos [n]: rotate-half RoPE
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = pos.double()[:, None] * inv[None]
    cos, sin = torch.cos(ang)[:, None], torch.sin(ang)[:, None]
    a, b = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


def conv(x, delta, base, group):
    """out[i, c] = sum_t (base[t, c] + delta[i, t, c // group]) * x[i - t, c] (zero before slot 0), by hand.
    x [B, H], delta [B, T, Gn], base [T, H]."""
    B, H = x.shape
    T = base.shape[0]
    out = torch.zeros_like(x)
    for i in range(B):
        for t in range(T):
            if i - t >= 0:
                out[i] += (base[t] + delta[i, t].repeat_interleave(group)) * x[i - t]
    return out


def _attn(f: dict, pre: str, a, ctx, vis, qpos, kpos, cfg: dict):
    """Attention of the block's (convolved) inputs a [B, H] over [context ; block] keys visible in `vis`."""
    B, H, nh, nkv = a.shape[0], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps = cfg.get("head_dim", H // nh), cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
    q = (a @ f[pre + "self_attn.q_proj.weight"].T).view(B, nh, hd)
    kin = torch.cat([ctx, a])
    k = (kin @ f[pre + "self_attn.k_proj.weight"].T).view(-1, nkv, hd)
    v = (kin @ f[pre + "self_attn.v_proj.weight"].T).view(-1, nkv, hd)
    q = _rope(_norm(q, f[pre + "self_attn.q_norm.weight"], eps), qpos, theta)
    k = _rope(_norm(k, f[pre + "self_attn.k_norm.weight"], eps), kpos, theta)
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    s = s.masked_fill(~vis[None], float("-inf"))
    o = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v).reshape(B, nh * hd)
    return o @ f[pre + "self_attn.o_proj.weight"].T


def _mlp(f: dict, pre: str, a):
    g = torch.nn.functional.silu(a @ f[pre + "mlp.gate_proj.weight"].T)
    return (g * (a @ f[pre + "mlp.up_proj.weight"].T)) @ f[pre + "mlp.down_proj.weight"].T


def _wrapped(f: dict, pre: str, part: str, h, a, body, cfg: dict):
    """h + conv(body(conv(a, delta0, base0)), delta1, base1): one sublayer inside its convolution (section 5.4)."""
    B, T, group = a.shape[0], _get(cfg, "conv_kernel_size"), _get(cfg, "conv_group_size")
    delta = (a @ f[pre + part + ".kernel_projection.weight"].T).view(B, 2, T, -1)  # from the sublayer's input
    base = f[pre + part + ".base_kernel"]
    return h + conv(body(conv(a, delta[:, 0], base[0], group)), delta[:, 1], base[1], group)


def block_states(w: dict, cfg: dict, feats, token: int, p: int, embed, causal_sliding: bool):
    """Normed final states [B, H] of the block at anchor p (context = features of positions 0..p-1)."""
    f = {k: v.double() for k, v in w.items()}
    B, eps = _get(cfg, "block_size"), cfg.get("rms_norm_eps", 1e-6)
    scale, window = _get(cfg, "input_embedding_scale", 1.0), cfg.get("sliding_window")
    ctx = _norm(feats[:p].double() @ f["fc.weight"].T, f["hidden_norm.weight"], eps)  # [p, H]
    ids = torch.tensor([token] + [_get(cfg, "mask_token_id")] * (B - 1))
    h = embed.double()[ids] * scale  # [B, H]
    qpos, kpos = torch.arange(p, p + B), torch.arange(p + B)
    for i, kind in enumerate(cfg["layer_types"]):
        pre = f"layers.{i}."
        d = qpos[:, None] - kpos[None, :]  # [B, p+B] q - k
        vis = torch.ones(B, p + B, dtype=torch.bool)
        if kind == "sliding_attention":
            vis = d < window
            if causal_sliding:
                vis &= (kpos[None, :] < p) | (d >= 0)
        a = _norm(h, f[pre + "input_layernorm.weight"], eps)
        h = _wrapped(f, pre, "attention_conv", h, a, lambda x: _attn(f, pre, x, ctx, vis, qpos, kpos, cfg), cfg)  # noqa: B023
        a = _norm(h, f[pre + "post_attention_layernorm.weight"], eps)
        h = _wrapped(f, pre, "mlp_conv", h, a, lambda x: _mlp(f, pre, x), cfg)  # noqa: B023
    return _norm(h, f["norm.weight"], eps)


def walk(w: dict, cfg: dict, states, token: int, lm_head, full: list | None = None):
    """The selector's greedy walk over slots 1..B-1 of normed states [B, H] -> (drafts [B-1], the log-softmax
    over the K scores of each chosen candidate [B-1], the candidates by score [B-1, K]). `full`: each slot's
    (scores [K], candidate ids [K]) appended to it (what a sampling selector samples from)."""
    K, mult = _get(cfg, "selector_top_k"), _get(cfg, "output_multiplier", 1.0)
    cap = _get(cfg, "final_logit_softcapping")
    P = w["candidate_selector.predecessor_codebook"].double()
    S = w["candidate_selector.successor_codebook"].double()
    Wh = w["candidate_selector.hidden_projection.weight"].double()
    prev, drafts, logps, ranked = token, [], [], []
    for hk in states[1:]:
        u = (lm_head.double() @ hk) * mult  # [V]
        if cap:
            u = cap * torch.tanh(u / cap)
        U, C = u.topk(K)
        sigma = Wh @ hk  # [R]
        score = torch.stack([U[j] + (P[prev] * sigma * S[C[j]]).sum() for j in range(K)])
        if full is not None:
            full.append((score, C))
        j = int(score.argmax())
        prev = int(C[j])
        drafts.append(prev)
        logps.append(float(torch.log_softmax(score, 0)[j]))
        ranked.append(C[score.argsort(descending=True)].tolist())
    return drafts, logps, ranked


def unary_argmax(cfg: dict, states, lm_head) -> list[int]:
    """The plain argmax of the unary logits of slots 1..B-1 (what the selector would draft with no transitions)."""
    return (states[1:] @ lm_head.double().T).argmax(-1).tolist()
