"""Live-loop benchmark: the product's speculative decoder against plain decoding of a 27B-shaped hybrid target, at
T = 0 and T = 0.7, beside the speedup `costs.speedup` predicts from a cost table profiled in the same run.

Random bf16 weights at the reference shapes (SPEC section 8; the target built as benchmarks/bench_extract.py builds
it, fla kernels bound on CUDA; the drafter like the 27B DFlash, written to a temporary checkpoint and loaded by
`drafters.load`). A random drafter is never right, so the drafts are an ORACLE's: the drafter runs its real block
forward every step (its time is paid) and its tokens are then replaced by the plain decoder's own completion for
that seed, each slot kept with probability --alpha and the run cut at the first slot not kept (a geometric
acceptance, tau about 1 + sum_k alpha^k). The verify is the product's: the target decides, the tokens equal plain
decoding's for the same seed (checked), only the acceptance is planted. At T = 0.7 the target-sample rule, the
draws seeded per position on the device.

Per temperature: plain and speculative tokens/s (after the first token), the measured speedup, the predicted one
(`costs.speedup` over the very rounds the live loop ran: context length and committed tokens of each round, verify
of B tokens) from a cost table taken here (`replay.profile.target_times` / `draft_times`: the target's forward of q
= 1 and q = B tokens after c cached tokens, the drafter's block after c), their gap, and the measured per-step and
per-token overheads the cost table does not hold (speculative seconds per round - (t_draft + t_target(B)); plain
seconds per token - t_target(1)).

    python benchmarks/bench_live.py              # one GPU, 27B shapes
    python benchmarks/bench_live.py --small      # tiny shapes on the CPU (a smoke test)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from _common import note, report, sync
from bench_extract import FULL as TARGET_FULL, SMALL as TARGET_SMALL, backend, build
from bench_replay import FULL as DRAFT_FULL, rand_weights
from safetensors.torch import save_file

from dflash_dash import costs, drafters as dr, target as tg
from dflash_dash.replay import profile as prof
from dflash_dash.server import live, specdec
from dflash_dash.server.sampler import Sampling
from tools import tiny

DRAFT_SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    block_size=16,
    num_target_layers=8,
    target_layer_ids=[1, 3, 5],
    mask_token_id=3,
)


def args_():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes on the CPU (smoke test)")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per temperature (default 3; 2 small)")
    ap.add_argument("--prompt-tokens", type=int, default=None, help="prompt length (default 2048; 32 small)")
    ap.add_argument("--new", type=int, default=None, help="new tokens per prompt (default 256; 48 small)")
    ap.add_argument("--alpha", type=float, default=0.85, help="the oracle's per-slot keep probability")
    ap.add_argument("--temps", default="0,0.7", help="temperatures, comma-separated")
    ap.add_argument("--repeats", type=int, default=5, help="timed forwards per cost-table point")
    return ap.parse_args()


def write_drafter(work: Path, shp: dict, device, dtype) -> Path:
    """A random DFlash checkpoint of shapes `shp` (bf16 safetensors + config.json)."""
    cfg = tiny.drafter_config(tiny.TinyDrafter(**shp))
    cfg["torch_dtype"] = "bfloat16"
    c = dr.parse_config(cfg)
    ck = work / "drafter"
    ck.mkdir(parents=True)
    w = rand_weights(dr.shapes(c), device, dtype, 1)
    save_file({k: v.cpu().contiguous() for k, v in w.items()}, str(ck / "model.safetensors"))
    (ck / "config.json").write_text(json.dumps(cfg))
    return ck


class Oracle(specdec.Speculator):
    """The product's decoder whose drafts, after the drafter's real forward, are the known completion's tokens kept
    slot by slot with probability `alpha` (module docstring)."""

    completion: list[int] = []
    prompt_len: int = 0
    alpha: float = 0.85
    gen: torch.Generator | None = None

    def propose(self, model, head, seq, total, kv=None, tap=None):
        drafts = super().propose(model, head, seq, total, kv, tap)
        done = len(seq) - self.prompt_len
        ref = self.completion[done : done + len(drafts)]
        out = []
        for j in range(len(drafts)):
            if j < len(ref) and float(torch.rand(1, generator=self.gen)) <= self.alpha:
                out.append(ref[j])
                continue
            out.append((ref[j] + 1) % int(head.embed.shape[0]) if j < len(ref) else drafts[j])  # rejected for sure
            break
        return out + drafts[len(out) :]


def rounds_of(prompt_len: int, accepted: list[int], n: int) -> list[tuple[int, int]]:
    """(context length, committed tokens) of each round: the anchor's context grows by what each round commits."""
    ctx, left, out = prompt_len + 1, n - 1, []
    for a in accepted:
        c = min(a + 1, left)
        if c <= 0:
            break
        out.append((ctx, c))
        ctx, left = ctx + c, left - c
    return out


def main():
    figs: dict = {}
    try:
        measure(args_(), figs)
    finally:
        report(figs)  # what was measured, also when stopped (SIGINT at tools/device_session.sh's timeout)


def measure(a, figs: dict) -> None:
    dev = "cpu" if a.small else "cuda"
    dtype = torch.float32 if a.small else torch.bfloat16
    tshape, dshape = (TARGET_SMALL, DRAFT_SMALL) if a.small else (TARGET_FULL, DRAFT_FULL)
    layers = 8 if a.small else 64
    n_prompts = a.prompts or (2 if a.small else 3)
    P, N = a.prompt_tokens or (32 if a.small else 2048), a.new or (48 if a.small else 256)
    if a.small:
        torch.set_num_threads(1)
    figs |= {"target_layers": layers, "prompt_tokens": P, "new_tokens": N, "oracle_alpha": a.alpha}
    bound = backend(dev)
    model = build(tshape, layers, dev, dtype, P + N + 64)
    figs["kernel_backend"] = bound
    with tempfile.TemporaryDirectory() as tmp:
        ck = write_drafter(Path(tmp), dshape | {"num_target_layers": layers}, dev, dtype)
        spec = Oracle(str(ck), dev, dtype=dtype, live=True)
        spec.load(model)
    B = spec.block_size
    head = tg.Head(model.get_input_embeddings().weight, model.get_output_embeddings().weight)
    V = int(head.embed.shape[0])
    contexts = sorted({P, P + N // 2, P + N})
    t0 = time.perf_counter()
    table = costs.CostTable(
        device=prof.device_name(dev),
        backend=bound,
        target=tuple(prof.target_times(model, contexts, [1, B], a.repeats, V)),
        draft=tuple(prof.draft_times(spec.drafter, head, contexts, a.repeats)[0]),
    )
    figs["profile_s"] = time.perf_counter() - t0
    for c in contexts:
        figs[f"t_target_q1_c{c}_ms"] = table.t_target(1, c) * 1e3
        figs[f"t_target_q{B}_c{c}_ms"] = table.t_target(B, c) * 1e3
        figs[f"t_draft_c{c}_ms"] = table.t_draft(c) * 1e3
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, V, (P,), generator=gen).tolist() for _ in range(n_prompts)]
    for temp in [float(t) for t in a.temps.split(",")]:
        name = f"T{temp:g}"
        plain_s = spec_s = 0.0
        plain_n = spec_n = steps = 0
        rounds: list[tuple[int, int]] = []
        same = True
        for i, ids in enumerate(prompts):
            s = Sampling(temp, seed=i) if temp > 0 else None
            live.plain(model, ids, 4, lambda o: False, s)  # warm-up
            sync(dev)
            p_out, p_first = live.plain(model, ids, N, lambda o: False, s)
            sync(dev)
            plain_s += time.perf_counter() - p_first
            plain_n += len(p_out) - 1
            spec.completion, spec.prompt_len, spec.alpha = p_out, len(ids), a.alpha
            spec.gen = torch.Generator().manual_seed(100 + i)
            out, _, counters = spec.decode(model, ids, N, lambda o: None, s)
            sync(dev)
            spec_s += time.perf_counter() - counters.first_at
            spec_n += len(out) - 1
            steps += counters.verify_ct
            same &= out == p_out
            rounds += rounds_of(len(ids), counters.accepted, len(out))
        plain_tps, spec_tps = plain_n / plain_s, spec_n / spec_s
        measured = spec_tps / plain_tps
        predicted = costs.speedup(table, rounds, B)
        per_round = sum(table.t_draft(c) + table.t_target(B, c) for c, _ in rounds) / len(rounds)
        per_token = sum(table.t_target(1, c) for c, _ in rounds) / len(rounds)
        figs |= {
            f"same_tokens_{name}": int(same),
            f"tau_{name}": spec_n / steps,
            f"plain_tokens_s_{name}": plain_tps,
            f"spec_tokens_s_{name}": spec_tps,
            f"live_speedup_{name}": measured,
            f"predicted_speedup_{name}": predicted,
            f"prediction_error_{name}": predicted / measured - 1,
            f"overhead_ms_per_round_{name}": (spec_s / steps - per_round) * 1e3,
            f"overhead_ms_per_plain_token_{name}": (plain_s / plain_n - per_token) * 1e3,
        }
        if not same:
            note(f"{name}: speculative tokens differ from plain's (a decoder bug)")
    note(f"cost table on {table.device} ({table.backend}); oracle drafts, alpha {a.alpha}; B = {B}")


if __name__ == "__main__":
    main()
