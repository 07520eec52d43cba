"""Train the demo's target: a small hybrid `qwen3_5_text` (Gated DeltaNet + full attention) code model.

Contract: `config()` is the transformers config of the demo target; `train(tokens, out, ...)` trains it as
a next-token LM on windows of the uint16 token stream (the last `val_frac` held out): with `starts` (document
start positions by kind, from `corpus.stream(..., starts=True)`), a share of the windows begins at a document's
first token (the prompt/body boundary a prompt without context has), weighted by kind; the rest at random
positions. It saves a
Hugging Face folder in bf16 (tied embeddings) with the tokenizer copied in. Returns the record that goes
into the manifest (steps, seconds, loss curve, validation loss). On CUDA the linear-attention layers run
on fla's kernels (asserted by the caller through `target.use_backend("fla")`); on CPU (tests, smoke runs)
the torch path. Deterministic for a given seed, device and step count.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch


@dataclass
class TargetShape:
    vocab_size: int = 4096  # tokenizer size
    hidden_size: int = 256  # H
    intermediate_size: int = 512  # MLP width
    num_hidden_layers: int = 8  # N: every 4th layer full attention, the rest Gated DeltaNet
    num_attention_heads: int = 4  # full-attention heads
    num_key_value_heads: int = 2  # full-attention KV heads
    head_dim: int = 64  # full-attention head width
    linear_heads: int = 4  # Gated DeltaNet key and value heads
    linear_head_dim: int = 64  # Gated DeltaNet key and value head width
    full_attention_interval: int = 4  # layer i is full attention when (i+1) % interval == 0


@dataclass
class TargetTraining:
    steps: int = 2000  # optimizer steps
    batch: int = 64  # windows per step
    seq: int = 512  # window length in tokens
    lr: float = 2e-3  # peak AdamW learning rate (linear warmup, cosine decay to 10%)
    warmup: int = 100  # warmup steps
    weight_decay: float = 0.1  # AdamW weight decay on matrices
    clip: float = 1.0  # gradient-norm clip
    val_frac: float = 0.02  # tail of the stream held out for the validation loss
    seed: int = 1  # weight init and window sampling
    log_every: int = 50  # loss-curve resolution
    budget_s: float | None = None  # wall-clock budget: after `probe` steps, steps = what fits (<= steps)
    probe: int = 20  # steps timed before the budget fixes the step count (fixed again at 5x)
    doc_start_frac: float = 0.5  # share of windows starting at a document start (with `starts`)
    doc_start_weights: dict = field(default_factory=lambda: {"commented": 0.7, "raw": 0.15, "chat": 0.15})


def config(s: TargetShape = TargetShape()):
    from transformers import AutoConfig

    types = [
        "full_attention" if (i + 1) % s.full_attention_interval == 0 else "linear_attention"
        for i in range(s.num_hidden_layers)
    ]
    return AutoConfig.for_model(
        "qwen3_5_text",
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads,
        head_dim=s.head_dim,
        layer_types=types,
        linear_num_key_heads=s.linear_heads,
        linear_num_value_heads=s.linear_heads,
        linear_key_head_dim=s.linear_head_dim,
        linear_value_head_dim=s.linear_head_dim,
        linear_conv_kernel_dim=4,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=[2, 0],
        pad_token_id=0,
        bos_token_id=None,  # <|im_end|>, <|endoftext|>
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    )


def _lr(step: int, t: TargetTraining) -> float:
    if step < t.warmup:
        return t.lr * (step + 1) / t.warmup
    frac = (step - t.warmup) / max(1, t.steps - t.warmup)
    return t.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _windows(
    data: torch.Tensor,
    n: int,
    seq: int,
    g: torch.Generator,
    starts: list[tuple[torch.Tensor, float]] | None = None,
    frac: float = 0.0,
) -> torch.Tensor:
    """n windows [n, seq+1]: `frac` of them at document starts (kind picked by weight, then a start of that
    kind uniformly), the rest at uniformly random positions."""
    start = torch.randint(0, len(data) - seq - 1, (n,), generator=g, device="cpu")
    if starts and frac > 0:
        k = int(round(n * frac))
        w = torch.tensor([wt for _, wt in starts], dtype=torch.float64)
        kinds = torch.multinomial(w / w.sum(), k, replacement=True, generator=g)
        for j, (pos, _) in enumerate(starts):
            sel = (kinds == j).nonzero().flatten()
            if len(sel):
                start[sel] = pos[torch.randint(0, len(pos), (len(sel),), generator=g)]
    start = start.to(data.device)
    return data[start[:, None] + torch.arange(seq + 1, device=data.device)]  # [n, seq+1]


def train(
    tokens: np.ndarray,
    tokenizer_dir: str | Path,
    out: str | Path,
    shape: TargetShape = TargetShape(),
    t: TargetTraining = TargetTraining(),
    device: str = "cuda",
    log=print,
    starts: dict[str, np.ndarray] | None = None,
) -> dict:
    """Train and save the target to `out`; returns the manifest record."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(t.seed)
    g = torch.Generator().manual_seed(t.seed)
    data = torch.from_numpy(tokens.astype(np.int64)).to(device)
    n_val = int(len(data) * t.val_frac)
    train_data, val_data = data[:-n_val], data[-n_val:]
    doc = None
    if starts:
        lim = len(train_data) - t.seq - 1
        doc = [
            (torch.from_numpy(starts[k][starts[k] < lim]), wt)
            for k, wt in t.doc_start_weights.items()
            if k in starts and (starts[k] < lim).any()
        ]
    model = AutoModelForCausalLM.from_config(config(shape)).to(device).train()
    params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    other = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": t.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=t.lr,
        betas=(0.9, 0.95),
        fused=device.startswith("cuda"),
    )
    amp = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.startswith("cuda")
        else torch.autocast("cpu", enabled=False)
    )
    curve, t0 = [], time.perf_counter()
    step, cap, t_probe = 0, t.steps, 0.0
    while step < t.steps:
        if step == 1:
            t1 = time.perf_counter()
        if t.budget_s and step in (t.probe, 5 * t.probe):  # fix the step count from the step time (first
            if step == 5 * t.probe:  # step left out; again once warm)
                t1 = t_probe
            per = (time.perf_counter() - t1) / (step - (1 if step == t.probe else t.probe))
            t.steps = max(step + 1, min(cap, step + int((t.budget_s - (time.perf_counter() - t0)) / per)))
            log(f"target: {per * 1000:.0f} ms/step -> {t.steps} steps in the {t.budget_s:.0f} s budget")
            t_probe = time.perf_counter()
        for grp in opt.param_groups:
            grp["lr"] = _lr(step, t)
        w = _windows(train_data, t.batch, t.seq, g, doc, t.doc_start_frac)
        with amp:
            loss = _loss(model, w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip)
        opt.step()
        if (step + 1) % t.log_every == 0 or step == 0:
            curve.append([step + 1, round(float(loss.detach()), 4)])
            log(f"target step {step + 1}/{t.steps} loss {float(loss.detach()):.3f} ({time.perf_counter() - t0:.0f} s)")
        step += 1
    seconds = time.perf_counter() - t0
    val = evaluate(model, val_data, t.seq, device)
    out = Path(out)
    model.to(torch.bfloat16).save_pretrained(out)
    for f in Path(tokenizer_dir).iterdir():
        shutil.copy(f, out / f.name)
    return {
        "shape": asdict(shape),
        "training": asdict(t),
        "parameters": params,
        "seconds": round(seconds, 1),
        "loss_curve": curve,
        "final_loss": curve[-1][1],
        "val_loss": round(val, 4),
        "tokens_seen": t.steps * t.batch * t.seq,
        "corpus_tokens": int(len(tokens)),
    }


def _loss(model, w: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of windows w [n, seq+1] (logits in fp32)."""
    logits = model(input_ids=w[:, :-1], use_cache=False).logits.float()
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten())


@torch.no_grad()
def evaluate(model, data: torch.Tensor, seq: int, device: str, max_windows: int = 64) -> float:
    """Mean loss over consecutive held-out windows."""
    model.eval()
    n = min(max_windows, (len(data) - 1) // seq)
    w = torch.stack([data[i * seq : i * seq + seq + 1] for i in range(n)])
    amp = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.startswith("cuda")
        else torch.autocast("cpu", enabled=False)
    )
    losses = []
    for chunk in w.split(16):
        with amp:
            losses.append(float(_loss(model, chunk)))
    model.train()
    return float(np.mean(losses))
