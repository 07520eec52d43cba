"""Train the demo's DFlash drafters against the demo target's hidden states (the standard DFlash objective).

Contract:
  - `generate(model, prompts, new)`: greedy continuations of many prompts at once, one token per step for
    every sequence (prompt tokens forced while a sequence is still inside its prompt, so no padding is
    needed). The drafter learns to predict what the target itself writes, as DFlash training does.
  - `train(...)`: random anchors in the completion; the context is the target features of positions
    strictly before the anchor; the block [anchor token, MASK x (B-1)] is embedded with the frozen target
    embedding; the drafter runs bidirectionally inside the block (`Drafter.context_kv` + `Drafter.blocks`,
    the very forward the replay uses); slot i is scored against the token at anchor+i through the frozen
    target LM head with cross-entropy weighted by exp(-(i-1)/gamma). `bug="anchor_visible"` trains the
    known bug: the context includes the anchor's own hidden state (positions shifted by one, so relative
    positions are unchanged and only the leaked state differs from what inference provides).
  - Checkpoints are written in the SPEC 2 format (config.json + bf16 model.safetensors), with the steps,
    seconds and loss curve returned for the manifest.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from ..drafter import Drafter, parse_config, shapes
from ..replay import Head
from ..tiny import TinyDrafter, drafter_config


@dataclass
class DrafterTraining:
    steps: int = 3000                     # optimizer steps
    seqs_per_step: int = 16               # sequences per step (one context per sequence)
    anchors_per_seq: int = 32             # random anchors (blocks) per sequence
    lr: float = 6e-4                      # peak AdamW learning rate (warmup, cosine to 10%)
    warmup: int = 100                     # warmup steps
    weight_decay: float = 0.01            # AdamW weight decay on matrices
    clip: float = 1.0                     # gradient-norm clip
    gamma: float = 7.0                    # position decay: slot i weighs exp(-(i-1)/gamma)
    seed: int = 2                         # init and sampling seed
    bug: str | None = None                # None, or "anchor_visible" (context includes the anchor)
    snapshots: list[int] = field(default_factory=list)  # extra steps at which a checkpoint is kept
    log_every: int = 50                   # loss-curve resolution


# ---------------------------------------------------------------------------
# data: the target's own greedy continuations and its hidden states


@torch.no_grad()
def generate(model, prompts: list[list[int]], new: int, device: str, batch: int = 1024) -> list[list[int]]:
    """Greedy continuations: returns prompt + `new` generated ids per prompt (no early stop)."""
    out = []
    for s in range(0, len(prompts), batch):
        group = prompts[s:s + batch]
        P = torch.tensor([len(p) for p in group], device=device)
        T = int(P.max()) + new
        seq = torch.zeros(len(group), T, dtype=torch.long, device=device)
        for i, p in enumerate(group):
            seq[i, :len(p)] = torch.tensor(p, device=device)
        cache, pos = None, torch.arange(T, device=device)
        for t in range(T - 1):
            o = model(input_ids=seq[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            nxt = o.logits[:, -1].argmax(-1)
            free = (t + 1) >= P                                  # past its prompt: take the argmax
            seq[:, t + 1] = torch.where(free, nxt, seq[:, t + 1])
        del pos
        out += [seq[i, :len(p) + new].tolist() for i, p in enumerate(group)]
    return out


def cut(seq: list[int], prompt_len: int, eos: int) -> list[int]:
    """Cut a continuation after its first eos in the completion (the eos kept)."""
    for i in range(prompt_len, len(seq)):
        if seq[i] == eos:
            return seq[:i + 1]
    return seq


# ---------------------------------------------------------------------------
# drafter weights


def init_weights(c, device: str, seed: int) -> dict[str, torch.Tensor]:
    """Leaf tensors (fp32, requires_grad) for every SPEC 2 weight: norms at 1, matrices N(0, 0.02)."""
    g = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in shapes(c).items():
        t = torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=g) * 0.02
        w[name] = t.to(device).requires_grad_(True)
    return w


def save(out: str | Path, d: TinyDrafter, w: dict[str, torch.Tensor], record: dict) -> Path:
    """Write a SPEC 2 checkpoint folder (bf16 weights) plus the training record beside the config."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = drafter_config(d) | {"torch_dtype": "bfloat16"}
    save_file({k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in w.items()},
              str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "training.json").write_text(json.dumps(record, indent=2))
    return out


# ---------------------------------------------------------------------------
# training


def _lr(step: int, t: DrafterTraining) -> float:
    if step < t.warmup:
        return t.lr * (step + 1) / t.warmup
    frac = (step - t.warmup) / max(1, t.steps - t.warmup)
    return t.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def block_loss(drafter: Drafter, head: Head, feats: torch.Tensor, tokens: torch.Tensor, prompt_len: int,
               n: int, gamma: float, g: torch.Generator, bug: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted CE of `n` random blocks of one sequence; also the slot-1 accuracy (for the log).

    feats [T, K*H] (bf16), tokens [T]; anchors uniform in prompt_len..T-2.
    """
    c, dev = drafter.c, drafter.device
    T, B = len(tokens), drafter.c.block_size
    anchors = torch.randint(prompt_len, T - 1, (n,), generator=g).to(dev)         # [n]
    ids = torch.full((n, B), c.mask_token_id, dtype=torch.long, device=dev)
    ids[:, 0] = tokens[anchors]
    emb = head.embed[ids]                                                          # [n, B, H]
    kv = drafter.context_kv(feats)
    # the bug: context visible up to AND including the anchor (queries moved one position on)
    h = drafter.blocks(kv, anchors + 1 if bug == "anchor_visible" else anchors, emb)  # [n, B, H]
    logits = (h[:, 1:] @ head.lm_head.T).float()                                   # [n, B-1, V]
    pos = anchors[:, None] + torch.arange(1, B, device=dev)                        # [n, B-1]
    valid = pos < T
    labels = torch.where(valid, tokens[pos.clamp(max=T - 1)], torch.full_like(pos, -100))
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="none")
    decay = torch.exp(-torch.arange(B - 1, device=dev, dtype=torch.float32) / gamma)  # slot i: exp(-(i-1)/g)
    wts = (decay[None, :] * valid).flatten()
    loss = (ce * wts).sum() / wts.sum()
    acc1 = (logits[:, 0].argmax(-1) == labels[:, 0]).float().mean()
    return loss, acc1


def train(data: list[tuple[torch.Tensor, torch.Tensor, int]], head: Head, d: TinyDrafter, t: DrafterTraining,
          out: str | Path, name: str, device: str = "cuda", log=print) -> list[dict]:
    """Train one drafter on `data` = [(features [T, K*H], tokens [T], prompt_len)], all on `device`.

    Saves `out/<name>` at the end and `out/<prefix>-step<S>` at each snapshot step (prefix given by the
    caller through `t.snapshots` naming: early-step<S>). Returns one record per saved checkpoint.
    """
    torch.manual_seed(t.seed)
    g = torch.Generator().manual_seed(t.seed)
    c = parse_config(drafter_config(d))
    w = init_weights(c, device, t.seed)
    drafter = Drafter(c, w)
    mats = [v for v in w.values() if v.ndim >= 2]
    vecs = [v for v in w.values() if v.ndim < 2]
    opt = torch.optim.AdamW([{"params": mats, "weight_decay": t.weight_decay}, {"params": vecs, "weight_decay": 0.0}],
                            lr=t.lr, betas=(0.9, 0.95), fused=device.startswith("cuda"))
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda")
           else torch.autocast("cpu", enabled=False))
    curve, records, t0 = [], [], time.perf_counter()
    for step in range(t.steps):
        for grp in opt.param_groups:
            grp["lr"] = _lr(step, t)
        pick = torch.randint(0, len(data), (t.seqs_per_step,), generator=g).tolist()
        opt.zero_grad(set_to_none=True)
        tot, acc = 0.0, 0.0
        for i in pick:
            feats, tokens, P = data[i]
            with amp:
                loss, a1 = block_loss(drafter, head, feats, tokens, P, t.anchors_per_seq, t.gamma, g, t.bug)
            (loss / t.seqs_per_step).backward()
            tot += float(loss.detach()) / t.seqs_per_step if _logged(step, t) else 0.0
            acc += float(a1) / t.seqs_per_step if _logged(step, t) else 0.0
        torch.nn.utils.clip_grad_norm_(list(w.values()), t.clip)
        opt.step()
        if _logged(step, t):
            curve.append([step + 1, round(tot, 4), round(acc, 4)])
            log(f"{name} step {step + 1}/{t.steps} loss {tot:.3f} slot-1 acc {acc:.3f} "
                f"({time.perf_counter() - t0:.0f} s)")
        if step + 1 in t.snapshots or step + 1 == t.steps:
            label = name if step + 1 == t.steps else f"early-step{step + 1}"
            rec = {"name": label, "step": step + 1, "seconds": round(time.perf_counter() - t0, 1),
                   "loss": curve[-1][1] if curve else None, "loss_curve": list(curve), "training": asdict(t),
                   "drafter": asdict(d)}
            save(Path(out) / label, d, w, rec)
            records.append(rec)
    return records


def _logged(step: int, t: DrafterTraining) -> bool:
    return (step + 1) % t.log_every == 0 or step == 0
