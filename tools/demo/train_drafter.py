"""Train the demo's DFlash drafters against the demo target's hidden states (the standard DFlash objective).

Contract:
  - `generate(model, prompts, new)`: greedy continuations of many prompts at once, one token per step for
    every sequence (prompt tokens forced while a sequence is still inside its prompt, so no padding is
    needed). The drafter learns to predict what the target itself writes, as DFlash training does.
  - `train(...)`: random anchors in the completion; the context is the target features of positions
    strictly before the anchor; the block [anchor token, MASK x (B-1)] is embedded with the frozen target
    embedding; the drafter runs bidirectionally inside the block (`DFlash.context_kv` + `DFlash.blocks`,
    the very forward the replay uses); slot i is scored against the token at anchor+i through the frozen
    target LM head with cross-entropy weighted by exp(-(i-1)/gamma). Every step takes `seqs_per_step`
    sequences stacked (right-padded to one length) with `anchors_per_seq` random completion anchors each, in one
    `DFlash.blocks` call over the stacked context (`batch_loss`); a few held-out sequences give a validation loss.
  - `bug` trains one of the seeds' training bugs (`BUGS`), everything else unchanged: `anchor_visible` (the
    context includes the anchor's own hidden state: positions shifted by one, so relative positions are unchanged
    and only the leaked state differs from what inference provides), `noisy_labels` (labels from `Padded.noisy`),
    `soft_kl` (KL against `Padded.top_lp` at temperature `soft_t` instead of cross-entropy on the tokens).
  - `until(path, step, record)` (with `probe_every`): the run's weights every `probe_every` steps are saved under
    `out/probe/step{N}` and the run ends at the first step where `until` answers True (that step is the final
    checkpoint); `stop_at` ends a run at a given step (the bug runs stop where the healthy run stopped).
  - Checkpoints are written in the DFlash checkpoint format (config.json + bf16 model.safetensors), with the steps,
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

from dflash_dash.drafters import Weights, parse_config, shapes
from dflash_dash.drafters.dflash import DFlash
from dflash_dash.target import Head, outputs

from ..tiny import TinyDrafter, drafter_config


@dataclass
class DrafterTraining:
    steps: int = 3000  # optimizer steps
    seqs_per_step: int = 4  # sequences per step (one context per sequence)
    anchors_per_seq: int = 256  # blocks per sequence: every completion anchor, or this many at random
    lr: float = 1e-3  # peak AdamW learning rate (warmup, cosine to 10%)
    warmup: int = 30  # warmup steps
    weight_decay: float = 0.01  # AdamW weight decay on matrices
    clip: float = 1.0  # gradient-norm clip
    gamma: float = 7.0  # position decay: slot i weighs exp(-(i-1)/gamma)
    seed: int = 2  # init and sampling seed
    bug: str | None = None  # None or one of BUGS: the training bug this run reproduces
    snapshot_fracs: list[float] = field(default_factory=list)  # extra checkpoints at these fractions of steps
    snapshot_name: str = "early-step{step}"  # folder name of a snapshot ({step}: its step)
    log_every: int = 50  # loss-curve resolution
    budget_s: float | None = None  # wall-clock budget: after `probe` steps, steps = what fits (<= steps)
    probe: int = 10  # steps timed before the budget fixes the step count (fixed again at 5x)
    val_seqs: int = 0  # sequences held out for the validation loss (last ones)
    keep_best: bool = False  # with val_seqs: the named checkpoint holds the weights of the
    # lowest validation loss seen at a log step (early stopping)
    stop_at: int | None = None  # end the run at this step (the schedule still planned for `steps`)
    probe_every: int = 0  # with `train(until=...)`: every this many steps the weights are saved and `until` asked
    # whether the run ends there
    soft_t: float = 1.0  # soft_kl: the temperature applied to the target's log-probs (above 1 spreads them)


# ---------------------------------------------------------------------------
# data: the target's own greedy continuations and its hidden states


@torch.no_grad()
def generate(model, prompts: list[list[int]], new: int, device: str, batch: int = 1024) -> list[list[int]]:
    """Greedy continuations: returns prompt + `new` generated ids per prompt (no early stop)."""
    out = []
    for s in range(0, len(prompts), batch):
        group = prompts[s : s + batch]
        P = torch.tensor([len(p) for p in group], device=device)
        T = int(P.max()) + new
        seq = torch.zeros(len(group), T, dtype=torch.long, device=device)
        for i, p in enumerate(group):
            seq[i, : len(p)] = torch.tensor(p, device=device)
        cache = None
        for t in range(T - 1):
            o = model(input_ids=seq[:, t : t + 1], past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            nxt = o.logits[:, -1].argmax(-1)
            free = (t + 1) >= P  # past its prompt: take the argmax
            seq[:, t + 1] = torch.where(free, nxt, seq[:, t + 1])
        out += [seq[i, : len(p) + new].tolist() for i, p in enumerate(group)]
    return out


@torch.no_grad()
def features(
    decoder, layers, seqs: list[list[int]], layer_ids: list[int], device: str, batch: int = 256, fixed: bool = False
) -> list[torch.Tensor]:
    """Hidden states (outputs of decoder layers `layer_ids`, concatenated, bf16) of many sequences, in
    right-padded batches: the model is causal, so a position never sees the padding after it. The same
    hooks as `target.extract` (`target.outputs`), batched (the demo's training data is thousands of sequences)."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    res: dict[int, torch.Tensor] = {}
    with outputs(layers, layer_ids) as got:
        for s in range(0, len(order), batch):
            idx = order[s : s + batch]
            T = max(len(seqs[i]) for i in (order if fixed else idx))  # fixed: one shape (one kernel autotune)
            x = torch.zeros(len(idx), T, dtype=torch.long, device=device)
            for j, i in enumerate(idx):
                x[j, : len(seqs[i])] = torch.tensor(seqs[i], device=device)
            decoder(input_ids=x, use_cache=False)
            f = torch.cat([got[l] for l in layer_ids], dim=-1).to(torch.bfloat16)  # [b, T, K*H]
            for j, i in enumerate(idx):
                res[i] = f[j, : len(seqs[i])].clone()
    return [res[i] for i in range(len(seqs))]


def cut(seq: list[int], prompt_len: int, eos: int | set[int]) -> list[int]:
    """Cut a continuation after its first eos (one id or a set) in the completion (the eos kept)."""
    eos = {eos} if isinstance(eos, int) else set(eos)
    for i in range(prompt_len, len(seq)):
        if seq[i] in eos:
            return seq[: i + 1]
    return seq


# ---------------------------------------------------------------------------
# drafter weights


def init_weights(c, device: str, seed: int) -> dict[str, torch.Tensor]:
    """Leaf tensors (fp32, requires_grad) for every DFlash checkpoint weight: norms at 1, matrices N(0, 0.02)."""
    g = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in shapes(c).items():
        t = torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=g) * 0.02
        w[name] = t.to(device).requires_grad_(True)
    return w


def save(out: str | Path, d: TinyDrafter, w: dict[str, torch.Tensor], record: dict) -> Path:
    """Write a DFlash checkpoint folder (bf16 weights) plus the training record beside the config."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = drafter_config(d) | {"torch_dtype": "bfloat16"}
    save_file(
        {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in w.items()}, str(out / "model.safetensors")
    )
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


BUGS = {
    "anchor_visible": "the context includes the anchor's own hidden state (the shortcut: the target layer that "
    "gives the answer away is fed to fc in training, and is absent at inference)",
    "noisy_labels": "labels are the target's argmax on a diffusion-noised copy of the sequence (completion tokens "
    "masked at random) instead of its clean greedy tokens",
    "soft_kl": "soft KL against the target's distribution (its top-K, renormalised) instead of hard cross-entropy "
    "on the target's tokens",
}


class Padded:
    """The training data stacked on its device: feats [N, T, K*H] (bf16), tokens [N, T], prompt and sequence
    lengths [N] (right padding: a causal model's features never see it, and no anchor or label reaches it).
    For the label bugs: `noisy` [N, T] (the noisy_labels bug's label at each position) and `top_ids`, `top_lp`
    [N, T, K] (the target's top-K ids and log-probs for the token at each position, for soft_kl); None unless set.
    """

    noisy: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    top_lp: torch.Tensor | None = None

    def __init__(self, data: list[tuple[torch.Tensor, torch.Tensor, int]]):
        dev = data[0][0].device
        T = max(len(tok) for _, tok, _ in data)
        self.T = T
        self.feats = torch.zeros(len(data), T, data[0][0].shape[-1], dtype=data[0][0].dtype, device=dev)
        self.tokens = torch.zeros(len(data), T, dtype=torch.long, device=dev)
        for i, (f, tok, _) in enumerate(data):
            self.feats[i, : len(tok)] = f
            self.tokens[i, : len(tok)] = tok.to(dev)
        self.P = torch.tensor([p for _, _, p in data], device=dev)
        self.len = torch.tensor([len(tok) for _, tok, _ in data], device=dev)

    def __len__(self) -> int:
        return len(self.P)


def batch_loss(
    drafter: DFlash,
    head: Head,
    pad: Padded,
    idx: torch.Tensor,
    n: int,
    gamma: float,
    g: torch.Generator,
    bug: str | None = None,
    soft_t: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted CE of `n` random blocks of each sequence `idx` [S] (anchors drawn uniformly, with
    replacement, in prompt_len..len-2), all in one stacked `blocks` call; also the slot-1 accuracy."""
    c, dev = drafter.c, drafter.device
    B, T, S = c.block_size, pad.T, len(idx)
    P, L = pad.P[idx], pad.len[idx]  # [S]
    u = torch.rand(S, n, generator=g).to(dev)
    anchors = (P[:, None] + (u * (L - 1 - P)[:, None]).long()).flatten()  # [S*n], seq-major
    seq = torch.arange(S, device=dev).repeat_interleave(n)
    tokens = pad.tokens[idx]  # [S, T]
    ids = torch.full((S * n, B), c.mask_token_id, dtype=torch.long, device=dev)
    ids[:, 0] = tokens[seq, anchors]
    emb = head.embed[ids]  # [S*n, B, H]
    kv = drafter.context_kv(pad.feats[idx])  # per layer [S, nkv, T, hd]
    h = drafter.blocks(kv, anchors + 1 if bug == "anchor_visible" else anchors, emb, max_anchor=T - 1)
    logits = (h[:, 1:] @ head.lm_head.T).float()  # [S*n, B-1, V]
    pos = anchors[:, None] + torch.arange(1, B, device=dev)  # [S*n, B-1]
    valid = pos < L[seq][:, None]
    at = (seq[:, None], pos.clamp(max=T - 1))
    src = pad.noisy[idx] if bug == "noisy_labels" else tokens  # [S, T]
    labels = torch.where(valid, src[at], torch.full_like(pos, -100))
    if bug == "soft_kl":  # KL(p || q) over the target's top-K at temperature soft_t, renormalised
        p = (pad.top_lp[idx][at].float() / soft_t).softmax(-1)  # [S*n, B-1, K]
        lq = logits.log_softmax(-1).gather(-1, pad.top_ids[idx][at].long())
        ce = (p * (p.clamp_min(1e-12).log() - lq)).sum(-1).flatten()
    else:
        ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="none")
    decay = torch.exp(-torch.arange(B - 1, device=dev, dtype=torch.float32) / gamma)
    wts = (decay[None, :] * valid).flatten()
    loss = (ce * wts).sum() / wts.sum()
    acc1 = (logits[:, 0].argmax(-1) == labels[:, 0]).float().mean()
    return loss, acc1


def train(
    data: list[tuple[torch.Tensor, torch.Tensor, int]],
    head: Head,
    d: TinyDrafter,
    t: DrafterTraining,
    out: str | Path,
    name: str,
    device: str = "cuda",
    log=print,
    init: str | Path | None = None,
    step0: int = 0,
    pool: torch.Tensor | None = None,
    until=None,
) -> list[dict]:
    """Train one drafter on `data` = [(features [T, K*H], tokens [T], prompt_len)], all on `device`.

    Saves `out/<name>` (a format string; `{step}` is the last step) at the end and `out/<t.snapshot_name>` at
    each snapshot step. Returns one record per saved checkpoint. `init`: continue from that checkpoint's
    weights (a fresh optimizer and schedule), with step numbers in names counted on from `step0`.
    """
    torch.manual_seed(t.seed)
    g = torch.Generator().manual_seed(t.seed)
    c = parse_config(drafter_config(d))
    w = init_weights(c, device, t.seed)
    if init is not None:
        from dflash_dash.drafters import load

        w = {k: v.to(device, torch.float32).requires_grad_(True) for k, v in load(init).w.named().items()}
    drafter = DFlash(c, Weights.from_named(c, w))
    mats = [v for v in w.values() if v.ndim >= 2]
    vecs = [v for v in w.values() if v.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": mats, "weight_decay": t.weight_decay}, {"params": vecs, "weight_decay": 0.0}],
        lr=t.lr,
        betas=(0.9, 0.95),
        fused=device.startswith("cuda"),
    )
    amp = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.startswith("cuda")
        else torch.autocast("cpu", enabled=False)
    )
    curve, records, t0 = [], [], time.perf_counter()
    snaps = {max(1, int(f * t.steps)) for f in t.snapshot_fracs}
    pad = data if isinstance(data, Padded) else Padded(data)
    n_train = len(pad) - t.val_seqs
    val = torch.arange(n_train, len(pad), device=pad.P.device) if t.val_seqs else None
    gv = torch.Generator().manual_seed(t.seed + 100)
    step, cap, t_probe = 0, t.steps, 0.0
    best = (float("inf"), 0, None, None)  # (val loss, step, weights, curve) of keep_best
    while step < t.steps:
        if step == 1:
            t1 = time.perf_counter()
        if t.budget_s and step in (t.probe, 5 * t.probe):  # fix the step count from the step time (first
            if step == 5 * t.probe:  # step left out; again once warm)
                t1 = t_probe
            per = (time.perf_counter() - t1) / (step - (1 if step == t.probe else t.probe))
            t.steps = max(step + 1, min(cap, step + int((t.budget_s - (time.perf_counter() - t0)) / per)))
            snaps = {max(t.probe + 1, int(f * t.steps)) for f in t.snapshot_fracs} if step == t.probe else snaps
            log(
                f"{name}: {per * 1000:.0f} ms/step -> {t.steps} steps in the {t.budget_s:.0f} s budget, "
                f"snapshots at {sorted(snaps)}"
            )
            t_probe = time.perf_counter()
        for grp in opt.param_groups:
            grp["lr"] = _lr(step, t)
        opt.zero_grad(set_to_none=True)
        tot, acc = 0.0, 0.0
        idx = torch.randint(0, n_train, (t.seqs_per_step,), generator=g)
        idx = (idx if pool is None else pool[torch.randint(0, len(pool), (t.seqs_per_step,), generator=g)]).to(
            pad.P.device
        )
        with amp:
            loss, a1 = batch_loss(drafter, head, pad, idx, t.anchors_per_seq, t.gamma, g, t.bug, t.soft_t)
        loss.backward()
        if _logged(step, t):
            tot, acc = float(loss.detach()), float(a1)
        torch.nn.utils.clip_grad_norm_(list(w.values()), t.clip)
        opt.step()
        if _logged(step, t):
            curve.append([step + 1, round(tot, 4), round(acc, 4)])
            msg = ""
            if val is not None:
                with torch.no_grad(), amp:
                    vl, va = batch_loss(drafter, head, pad, val, t.anchors_per_seq, t.gamma, gv, t.bug, t.soft_t)
                curve[-1] += [round(float(vl), 4), round(float(va), 4)]
                msg = f"; val loss {float(vl):.3f} acc {float(va):.3f}"
                if t.keep_best and float(vl) < best[0]:
                    best = (float(vl), step + 1, {k: v.detach().clone() for k, v in w.items()}, list(curve))
            log(
                f"{name} step {step + 1}/{t.steps} loss {tot:.3f} slot-1 acc {acc:.3f}{msg} "
                f"({time.perf_counter() - t0:.0f} s)"
            )
        stop = step + 1 == t.steps or step + 1 == t.stop_at
        if until is not None and t.probe_every and (step + 1) % t.probe_every == 0:
            at = step + 1
            rec = {
                "name": f"probe/step{step0 + at}",
                "step": step0 + at,
                "bug": t.bug,
                "seconds": round(time.perf_counter() - t0, 1),
                "loss": curve[-1][1] if curve else None,
                "loss_curve": list(curve),
                "training": asdict(t),
                "drafter": asdict(d),
            }
            stop = stop or bool(until(save(Path(out) / rec["name"], d, w, rec), step0 + at, rec))
        if step + 1 in snaps or stop:
            last = stop
            at, ww, cv = step + 1, w, curve
            if last and t.keep_best and best[2] is not None:  # early stopping: the best validation loss
                _, at, ww, _ = best
            label = (name if last else t.snapshot_name).format(step=step0 + at)
            rec = {
                "name": label,
                "step": step0 + at,
                "bug": t.bug,
                "bug_what": BUGS.get(t.bug),
                "init": str(init) if init else None,
                "seconds": round(time.perf_counter() - t0, 1),
                "loss": next((c[1] for c in cv if c[0] == at), cv[-1][1] if cv else None),
                "loss_curve": list(cv),
                "training": asdict(t),
                "drafter": asdict(d),
            }
            if last and t.keep_best and best[2] is not None:
                rec |= {
                    "best_val_loss": round(best[0], 4),
                    "trained_steps": step0 + step + 1,
                    "kept": f"the weights of step {step0 + at} (lowest validation loss of the loss curve)",
                }
            save(Path(out) / label, d, ww, rec)
            records.append(rec)
        if stop:
            break
        step += 1
    return records


@torch.no_grad()
def probe(ck: str | Path, head: Head, seqs: list[torch.Tensor], feats: list[torch.Tensor], plens: list[int]) -> dict:
    """Greedy chain acceptance of checkpoint `ck` on completions (tokens [T], features [T, K*H], prompt length):
    at each completion anchor the block's drafts (argmax of slots 1..B-1) against the next tokens; the chain walk
    from the prompt's end takes accepted + 1 tokens a step. Returns tau macro (mean over completions of tokens /
    steps) and every-anchor tau (mean of accepted + 1). The demo's quick look before its CPU replay."""
    from dflash_dash.drafters import load

    dev = head.embed.device
    d = load(str(ck), torch.float32, str(dev))
    c = d.c
    B = c.block_size
    macro, every = [], []
    for tok, f, P in zip(seqs, feats, plens):
        T = len(tok)
        if T - P < 2:
            continue
        anchors = torch.arange(P, T - 1, device=dev)
        ids = torch.full((len(anchors), B), c.mask_token_id, dtype=torch.long, device=dev)
        ids[:, 0] = tok[anchors]
        kv = d.context_kv(f.float())
        h = d.blocks(kv, anchors, head.embed[ids], max_anchor=T - 1)
        drafts = (h[:, 1:].float() @ head.lm_head.float().T).argmax(-1)  # [A, B-1]
        pos = anchors[:, None] + torch.arange(1, B, device=dev)
        ok = (pos < T) & (drafts == tok[pos.clamp(max=T - 1)])
        acc = ok.long().cumprod(-1).sum(-1).tolist()
        every.append(sum(a + 1 for a in acc) / len(acc))
        q, steps = P, 0
        while q < T - 1:
            q += acc[q - P] + 1
            steps += 1
        macro.append((T - 1 - P) / steps)
    n = max(1, len(macro))
    return {"tau_macro": round(sum(macro) / n, 3), "tau_every_anchor": round(sum(every) / n, 3)}


def _logged(step: int, t: DrafterTraining) -> bool:
    return (step + 1) % t.log_every == 0 or step == 0
