"""Step `families` (CPU) of the demo asset build: one drafter of each other family (DSpark with its confidence head,
Domino, DFlash2) against the demo target, each the healthy final DFlash checkpoint's backbone with the family's own
head trained briefly on the CPU. Fine-tuned heads on a shared backbone, not drafters trained from scratch: they show
what each family's views look like on a real target, not how the families compare.

Contract: `families(assets, seed)` writes `assets/checkpoints/families/{dspark,domino,dflash2}/`
(config.json, bf16 model.safetensors, training.json) and puts one MANIFEST.json `checkpoints` entry per family
(role "family", before the bug entries, so the replay order still ends with the shortcut and the final checkpoint)
and a `families` record (data, steps, losses, seconds) into MANIFEST.json; returns that record. Run it after
`unpack` (which rewrites the assets) and before `finish` (which recounts the sizes). How:
  - data: the target greedily continues `PROMPTS` synthetic prompts (tools/demo/synth.py, a seed the asset build's
    own prompts do not use) by `NEW` tokens on the CPU (`train_drafter.generate`); its features at the drafter's
    layers (`train_drafter.features`); the frozen backbone's block states at every completion anchor
    (`DFlash.context_kv` + `DFlash.blocks`: the replay's own forward), labels the target's next tokens;
  - every head is trained on those states teacher-forced (a slot's previous token is the target's, what the walk
    sees up to the first rejection), cross-entropy weighted by exp(-(k-1)/GAMMA) as DFlash training weighs depth:
    DSpark: a vanilla Markov head of rank `RANK` (W2 zero at start: DFlash's drafts), drafts from slots 1..B-1
    (`sample_from_anchor` false, DFlash's alignment), then the confidence head, a logistic regression of each
    slot's state on whether its draft is the target's token; Domino: the prefix GRU and the correction
    (embed_proj.2 zero at start), `shift_label` false, the first `PURE` drafts plain; DFlash2: identity
    convolutions (tap 0 of the base kernel 1, no kernel deltas: DFlash's block states unchanged) and the candidate
    selector (codebooks of rank `RANK`, hidden projection) over the LM head's top-`TOPK`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from dflash_dash import demo
from dflash_dash.drafters import load as load_drafter

from .common import log

FOLDER = "families"  # under checkpoints/
PROMPTS = 96  # synthetic prompts the target continues (training data)
NEW = 128  # tokens the target writes after each prompt
SEED = 7  # prompt draw seed (prepare uses SEED + 1 of tools/demo/common; this one it never draws)
STEPS = 15  # optimizer steps per head: a light fine-tune, so each family drafts about as the final checkpoint does
CONF_STEPS = 300  # DSpark's confidence head (it changes no draft, only the acceptance it predicts)
BATCH = 256  # anchors per step
LR = 3e-3  # Adam learning rate
GAMMA = 7.0  # depth decay of the loss weights, as the DFlash runs' training
RANK = 16  # DSpark Markov rank; DFlash2 selector rank
TOPK = 8  # DFlash2 candidates per slot
GRU, EMB, PURE = 64, 64, 1  # Domino: GRU state, correction width, plain drafts before the correction
CONV_TAPS, CONV_GROUP = 2, 64  # DFlash2 convolution taps and channels per dynamic kernel group
WHAT = {
    "dspark": "A DSpark drafter: the healthy final checkpoint's backbone with a Markov head (rank {r}) and a "
    "confidence head fine-tuned on the CPU against the target's own features (not trained from scratch). Its "
    "confidence head is what the Acceptance page's Confidence head section reads.",
    "domino": "A Domino drafter: the healthy final checkpoint's backbone with a prefix-GRU logit correction "
    "fine-tuned on the CPU against the target's own features (not trained from scratch).",
    "dflash2": "A DFlash2 drafter: the healthy final checkpoint's backbone (identity convolutions) with a candidate "
    "selector over the LM head's top-{k} fine-tuned on the CPU against the target's own features (not trained from "
    "scratch).",
}


def _data(assets: Path, final: Path, seed: int) -> dict:
    """States [M, D, H] of the backbone's drafted slots, labels [M, D] (-100: past the sequence), anchor tokens [M]."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash_dash import target as target_mod

    from . import synth
    from .train_drafter import features, generate

    tgt = assets / demo.TARGET
    man = json.loads((assets / "MANIFEST.json").read_text())
    target_mod.force_torch_kernels()  # the CPU: transformers binds fla's Triton kernels at import wherever fla imports
    tok = AutoTokenizer.from_pretrained(str(tgt))
    docs = synth.tagged(PROMPTS, seed, bool(man.get("prepare", {}).get("free_choices")))
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for _, (p, _) in docs]
    model = AutoModelForCausalLM.from_pretrained(str(tgt), dtype=torch.float32).eval()
    seqs = generate(model, prompts, NEW, "cpu", batch=PROMPTS)
    del model
    decoder, _ = target_mod.load(str(tgt), demo.LAYER_IDS, "cpu", torch.float32)
    feats = features(decoder, decoder.layers, seqs, demo.LAYER_IDS, "cpu")
    head = target_mod.load_head(str(tgt), "cpu", torch.float32)
    d = load_drafter(str(final), torch.float32, "cpu")
    B = d.c.block_size
    hs, ys, anchors = [], [], []
    with torch.no_grad():
        for f, s, p in zip(feats, seqs, prompts):
            t = torch.tensor(s)
            a = torch.arange(len(p), len(s) - 1)  # every completion anchor with a next token
            kv = d.context_kv(f.float())
            h = d.blocks(kv, a, d.embed_block(head, t[a]))[:, 1:]  # [n, D, H]: slots 1..B-1
            pos = a[:, None] + torch.arange(1, B)
            ys.append(torch.where(pos < len(s), t[pos.clamp(max=len(s) - 1)], torch.full_like(pos, -100)))
            hs.append(h)
            anchors.append(t[a])
    return {"h": torch.cat(hs), "y": torch.cat(ys), "a": torch.cat(anchors), "head": head, "tokens": len(seqs) * NEW}


def _prev(a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Teacher-forced previous tokens [M, D]: the anchor, then the target's tokens (0 where past the end)."""
    return torch.cat([a[:, None], y[:, :-1].clamp(min=0)], 1)


def _train(params: list[torch.Tensor], loss_of, M: int, seed: int, steps: int = STEPS) -> list[float]:
    """Adam over `params` for `steps` steps of BATCH random anchors; the loss every 50 steps and at the last."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(params, lr=LR)
    curve = []
    for step in range(steps):
        idx = torch.randint(0, M, (BATCH,), generator=g)
        loss = loss_of(idx)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            curve.append([step, round(float(loss), 4)])
    return curve


def _ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """CE of logits [n, D, C] against labels [n, D] (-100 ignored), slot k weighted exp(-(k-1)/GAMMA)."""
    D = y.shape[1]
    w = torch.exp(-torch.arange(D, dtype=torch.float32) / GAMMA)[None].expand_as(y) * (y >= 0)
    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="none")
    return (ce * w.flatten()).sum() / w.sum().clamp(min=1)


def dspark(data: dict, g: torch.Generator, seed: int) -> tuple[dict, dict, dict]:
    h, y, a, lm = data["h"], data["y"], data["a"], data["head"].lm_head
    V, H = lm.shape
    w1 = (torch.randn(V, RANK, generator=g) * 0.1).requires_grad_(True)
    w2 = torch.zeros(V, RANK, requires_grad=True)
    prev = _prev(a, y)

    def logits(idx):
        return h[idx] @ lm.T + w1[prev[idx]] @ w2.T

    curve = _train([w1, w2], lambda i: _ce(logits(i), y[i]), len(h), seed)
    wc, bc = torch.zeros(1, H, requires_grad=True), torch.zeros(1, requires_grad=True)
    with torch.no_grad():
        right = torch.cat([(logits(i).argmax(-1) == y[i]).float() for i in torch.arange(len(h)).split(1024)])

    def bce(idx):
        p = F.linear(h[idx], wc, bc).squeeze(-1)
        ok = y[idx] >= 0
        return F.binary_cross_entropy_with_logits(p[ok], right[idx][ok])

    conf = _train([wc, bc], bce, len(h), seed + 1, CONF_STEPS)
    fields = {"markov_rank": RANK, "markov_head_type": "vanilla", "enable_confidence_head": True}
    fields |= {"confidence_head_with_markov": False, "sample_from_anchor": False}
    w = {"markov_head.markov_w1.weight": w1, "markov_head.markov_w2.weight": w2}
    w |= {"confidence_head.proj.weight": wc, "confidence_head.proj.bias": bc}
    return fields, w, {"loss": curve, "confidence_loss": conf, "accepted_share": round(float(right[y >= 0].mean()), 4)}


def domino(data: dict, g: torch.Generator, seed: int) -> tuple[dict, dict, dict]:
    h, y, a, head = data["h"], data["y"], data["a"], data["head"]
    V, H = head.lm_head.shape
    ih = (torch.randn(3 * GRU, H, generator=g) * 0.05).requires_grad_(True)
    hh = (torch.randn(3 * GRU, GRU, generator=g) * 0.05).requires_grad_(True)
    p0 = (torch.randn(EMB, H + GRU, generator=g) * 0.05).requires_grad_(True)
    p2 = torch.zeros(V, EMB, requires_grad=True)
    prev = _prev(a, y)

    def logits(idx):
        x, q, out = head.embed[prev[idx]], h.new_zeros(len(idx), GRU), []
        for j in range(h.shape[1]):  # the GRU of drafters/domino.py (no biases; reset, update, new)
            ir, iz, i_n = F.linear(x[:, j], ih).chunk(3, -1)
            hr, hz, h_n = F.linear(q, hh).chunk(3, -1)
            r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
            q = (1 - z) * torch.tanh(i_n + r * h_n) + z * q
            u = h[idx, j] @ head.lm_head.T
            if j + 1 > PURE:
                u = u + F.linear(F.silu(F.linear(torch.cat([h[idx, j], q], -1), p0)), p2)
            out.append(u)
        return torch.stack(out, 1)

    curve = _train([ih, hh, p0, p2], lambda i: _ce(logits(i), y[i]), len(h), seed)
    fields = {"emb_dim": EMB, "gru_hidden_dim": GRU, "pure_draft_prefix_len": PURE, "shift_label": False}
    w = {"prefix_gru.weight_ih_l0": ih, "prefix_gru.weight_hh_l0": hh, "embed_proj.0.weight": p0}
    return fields, w | {"embed_proj.2.weight": p2}, {"loss": curve}


def dflash2(data: dict, g: torch.Generator, seed: int, layers: int) -> tuple[dict, dict, dict]:
    h, y, a, lm = data["h"], data["y"], data["a"], data["head"].lm_head
    V, H = lm.shape
    pred = (torch.randn(V, RANK, generator=g) * 0.3).requires_grad_(True)
    succ = torch.zeros(V, RANK, requires_grad=True)
    hp = (torch.randn(RANK, H, generator=g) * 0.05).requires_grad_(True)
    prev = _prev(a, y)

    def loss(idx):
        u, c = (h[idx] @ lm.T).topk(TOPK, -1)  # [n, D, K]
        s = u + (succ[c] @ (pred[prev[idx]] * F.linear(h[idx], hp))[..., None])[..., 0]
        hit = c == y[idx][..., None]
        target = torch.where(hit.any(-1), hit.float().argmax(-1), torch.full_like(y[idx], -100))
        return _ce(s, target)

    curve = _train([pred, succ, hp], loss, len(h), seed)
    groups = H // CONV_GROUP
    base = torch.zeros(2, CONV_TAPS, H)
    base[:, 0] = 1.0  # tap 0 passes the slot through: the convolution is the identity
    w = {
        f"layers.{i}.{conv}.{k}": t
        for i in range(layers)
        for conv in ("attention_conv", "mlp_conv")
        for k, t in (("base_kernel", base), ("kernel_projection.weight", torch.zeros(2 * CONV_TAPS * groups, H)))
    }
    w |= {"candidate_selector.predecessor_codebook": pred, "candidate_selector.successor_codebook": succ}
    w |= {"candidate_selector.hidden_projection.weight": hp}
    fields = {"conv_kernel_size": CONV_TAPS, "conv_group_size": CONV_GROUP, "selector_rank": RANK}
    return fields | {"selector_top_k": TOPK}, w, {"loss": curve}


ARCH = {"dspark": "DSparkDraftModel", "domino": "DominoDraftModel", "dflash2": "DFlash2DraftModel"}


def families(assets: Path = demo.ASSETS, seed: int = SEED) -> dict:
    """Train and write the three family checkpoints and their MANIFEST.json entries (module contract)."""
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    man = json.loads((assets / "MANIFEST.json").read_text())
    cks = demo.checkpoints(assets / demo.CHECKPOINTS, man)
    fin = demo.final(cks)
    data = _data(assets, fin.path, seed)
    log(f"families: {len(data['h'])} anchors from {PROMPTS} target continuations ({time.perf_counter() - t0:.0f} s)")
    cfg = json.loads((fin.path / "config.json").read_text())
    backbone = load_file(str(fin.path / "model.safetensors"))
    rec = {
        "what": "the healthy final checkpoint's backbone (frozen, copied) with each family's head fine-tuned on the "
        "CPU (tools/demo/families.py), teacher-forced on the target's own greedy continuations",
        "backbone": fin.dir,
        "data": {"prompts": PROMPTS, "new_tokens": NEW, "anchors": len(data["h"]), "seed": seed},
        "training": {"steps": STEPS, "confidence_steps": CONF_STEPS, "batch": BATCH, "lr": LR, "gamma": GAMMA},
        "runs": {},
    }
    entries = []
    for i, fam in enumerate(ARCH):
        t1 = time.perf_counter()
        g = torch.Generator().manual_seed(seed + 10 * i)
        if fam == "dflash2":
            fields, w, got = dflash2(data, g, seed + i, cfg["num_hidden_layers"])
        else:
            fields, w, got = {"dspark": dspark, "domino": domino}[fam](data, g, seed + i)
        out = assets / demo.CHECKPOINTS / FOLDER / fam
        out.mkdir(parents=True, exist_ok=True)
        c = dict(cfg, architectures=[ARCH[fam]], dflash_config=cfg["dflash_config"] | fields, torch_dtype="bfloat16")
        state = backbone | {k: v.detach().to(torch.bfloat16).contiguous() for k, v in w.items()}
        save_file(state, str(out / "model.safetensors"))
        (out / "config.json").write_text(json.dumps(c, indent=2))
        got["seconds"] = round(time.perf_counter() - t1, 1)
        (out / "training.json").write_text(json.dumps(rec | {"family": fam} | got, indent=2))
        rec["runs"][fam] = got
        what = WHAT[fam].format(r=RANK, k=TOPK)
        entries.append({"dir": f"{FOLDER}/{fam}", "name": f"{fam}-head", "role": "family", "bug": None, "what": what})
        log(f"families: {fam} in {got['seconds']} s, loss {got['loss'][0][1]} -> {got['loss'][-1][1]}")
    rest = [e for e in man["checkpoints"] if e.get("role") != "family"]
    at = next((i for i, e in enumerate(rest) if e["role"] == "bug"), len(rest) - 1)
    man["checkpoints"] = rest[:at] + entries + rest[at:]
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    man["families"] = rec
    (assets / "MANIFEST.json").write_text(json.dumps(man, indent=1))
    return rec
