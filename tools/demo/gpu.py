"""The `gpu` step of the demo asset build (CUDA): train the target, make the drafter's training data with it,
train the drafters, and extract the coding-10 completions' hidden states with fla.

The target's Gated DeltaNet backward runs on the torch path (fla 0.6.0 refuses its gated chunk backward on Hopper
with Triton < 3.7.1); every forward after it runs on fla. The drafter's training data is the target's own greedy
continuations and their hidden states; the drafters are one healthy run (snapshots early, mid and final under
checkpoints/healthy/) and, trained identically but for one bug each, one per `train_drafter.BUGS`
(checkpoints/bugs/). The healthy run is probed every PROBE_EVERY steps (`train_drafter.probe`: its greedy chain tau
on the GPU's greedy coding-10 completions) and ends at the first probe that reaches TAU_AIM (real drafters reach 3-8
on code; a time cap ends it at its best probe otherwise); its snapshots are the probe checkpoints at SNAPSHOTS of that
step. Every bug run has the same planned schedule and stops at the same step; soft KL is tried at the temperatures of
SOFT_TS in order, and the first that costs what the bug costs (COST of the final's probe tau) kept (every variant
recorded).
Coding-10 is completed greedily on the torch path on the CPU (as the local server does) and
its completions extracted with fla in the feature-cache format.

Contract: `gpu(build, out, device, smoke)` reads `prepare`'s outputs from `build` and writes target.tar,
healthy*.tar, bugs.tar, fla.tar, preview.txt and gpu.json to `out`, each stage as soon as it is done
(DEMO_REUSE=<earlier out> reuses a trained target; the other DEMO_* variables size the run). `device="cpu",
smoke=True` runs every step at toy size on the torch path (development). Returns the record (gpu.json).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tarfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from dflash_dash.demo import FLA, LAYER_IDS, MAX_NEW_TOKENS, TARGET

from .common import EOS, SEED, log


def gpu(build: Path, out: Path, device: str = "cuda", smoke: bool = False) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from dflash_dash import cache, server, target as target_mod

    from ..tiny import TinyDrafter
    from . import train_drafter as td, train_target as tt

    t_all = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("DEMO_WORK", "/tmp/demo-work"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rec: dict = {
        "device": device,
        "smoke": smoke,
        "versions": target_mod.versions(),
        "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None,
    }
    fla = device.startswith("cuda")
    backend = target_mod.use_backend("fla" if fla else "torch")
    assert backend == ("fla" if fla else "torch"), backend
    log(f"backend {backend}; versions {rec['versions']}")
    reuse = Path(os.environ["DEMO_REUSE"]) if os.environ.get("DEMO_REUSE") else None  # earlier partial outputs

    def save_rec() -> None:
        (out / "gpu.json").write_text(json.dumps(rec, indent=2))

    def pack(name: str, src: Path, part: int = 14 * 2**20) -> None:
        """src as out/name.tar, or, when larger than `part` bytes, its subfolders in out/name-K.tar of at most
        about `part` each (a device call returns files of at most 16 MiB)."""
        size = lambda q: sum(f.stat().st_size for f in q.rglob("*") if f.is_file())  # noqa: E731
        if size(src) <= part:
            with tarfile.open(out / f"{name}.tar", "w") as tf:
                tf.add(src, arcname=src.name)
            return
        groups, cur = [[]], 0
        for sub in sorted(src.iterdir()):
            if cur + size(sub) > part and groups[-1]:
                groups.append([])
                cur = 0
            groups[-1].append(sub)
            cur += size(sub)
        for k, grp in enumerate(groups):
            with tarfile.open(out / f"{name}-{k}.tar", "w") as tf:
                for sub in grp:
                    tf.add(sub, arcname=f"{src.name}/{sub.name}")

    # -- target: the Gated DeltaNet backward runs on the torch path (fla 0.6.0 refuses its gated chunk backward
    #    on Hopper with Triton < 3.7.1: wrong gradients, fla issue #640); every forward after it runs on fla
    from transformers import AutoTokenizer

    vocab = -(-len(AutoTokenizer.from_pretrained(str(build / "tokenizer"))) // 64) * 64  # a multiple of 64
    shape = (
        tt.TargetShape(vocab_size=vocab, num_hidden_layers=6, full_attention_interval=3)
        if not smoke
        else tt.TargetShape(vocab, hidden_size=64, intermediate_size=128, head_dim=16, linear_head_dim=16)
    )
    t_cfg = (
        tt.TargetTraining(steps=100_000, budget_s=float(os.environ.get("DEMO_TARGET_BUDGET", 170)))
        if not smoke
        else tt.TargetTraining(steps=20, batch=4, seq=128, log_every=5)
    )
    if os.environ.get("DEMO_TARGET_STEPS"):
        t_cfg.steps, t_cfg.budget_s = int(os.environ["DEMO_TARGET_STEPS"]), None
    tgt = work / TARGET
    if reuse and (reuse / "target.tar").is_file():
        with tarfile.open(reuse / "target.tar") as tf:
            tf.extractall(work, filter="data")
        prev = json.loads((reuse / "gpu.json").read_text())
        rec["target"] = prev["target"]
        rec["target_training_backend"] = prev.get("target_training_backend")
        rec["target_reused_from_earlier_run"] = True
        log(f"target reused from {reuse}")
    else:
        rec["target_training_backend"] = target_mod.use_backend("torch")
        tokens = np.load(build / "tokens.npz")["tokens"]
        starts = dict(np.load(build / "doc_starts.npz")) if (build / "doc_starts.npz").is_file() else None
        rec["target"] = tt.train(tokens, build / "tokenizer", tgt, shape, t_cfg, device, log, starts=starts)
        rec["target"]["gated_deltanet_backward"] = (
            "torch reference path: fla 0.6.0 refuses its gated chunk backward on Hopper with Triton < 3.7.1 "
            "(wrong gradients, fla issue #640)"
            if fla
            else "torch"
        )
        assert target_mod.use_backend("fla" if fla else "torch") == backend
        log(f"target trained: {rec['target']['seconds']} s, val loss {rec['target']['val_loss']}")
    save_rec()
    pack("target", tgt)
    prev = json.loads((reuse / "gpu.json").read_text()) if reuse and (reuse / "gpu.json").is_file() else {}
    if os.environ.get("DEMO_PREVIEW"):
        rec["preview"] = prev.get("preview") or preview(tgt, build, out, device, smoke)
    save_rec()
    if os.environ.get("DEMO_STOP_AFTER_TARGET"):
        rec["seconds"] = round(time.perf_counter() - t_all, 1)
        save_rec()
        log(f"stopped after the target (DEMO_STOP_AFTER_TARGET) in {rec['seconds']} s")
        return rec

    # -- drafter training data: the target's own greedy continuations and their fla hidden states
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(tgt), dtype=torch.float32).to(device).eval()
    prompts = json.loads((build / "train_prompts.json").read_text())
    gfile = build / "train_groups.json"
    groups = json.loads(gfile.read_text()) if gfile.is_file() else ["generic"] * len(prompts)
    if smoke:
        prompts, groups = prompts[:8] + prompts[-8:], groups[:8] + groups[-8:]
    if os.environ.get("DEMO_TRAIN_PROMPTS"):  # calibration runs: fewer sequences
        k = int(os.environ["DEMO_TRAIN_PROMPTS"]) // 2
        prompts, groups = prompts[:k] + prompts[-k:], groups[:k] + groups[-k:]
    new = int(os.environ.get("DEMO_NEW_TOKENS", MAX_NEW_TOKENS if not smoke else 32))
    c10 = json.loads((build / "coding10.json").read_text())
    c10_ids = [c["prompt_ids"] for c in c10]
    seqs = td.generate(model, prompts + c10_ids, new, device, batch=4096)
    probe_seqs = [td.cut(s, len(p), EOS) for s, p in zip(seqs[len(prompts) :], c10_ids)]  # coding-10, GPU greedy
    seqs = seqs[: len(prompts)]
    tok = AutoTokenizer.from_pretrained(str(tgt))
    (out / "preview.txt").write_text("\n".join(f"===== {c['id']}\n{tok.decode(s)}\n" for c, s in zip(c10, probe_seqs)))
    log("coding-10 preview (GPU greedy):\n" + "\n".join(tok.decode(s)[:600] for s in probe_seqs[:4]))
    rec["preview"] = {
        "completion_tokens": [len(s) - len(p) for s, p in zip(probe_seqs, c10_ids)],
        "distinct_completions": len({tuple(s[len(p) :]) for s, p in zip(probe_seqs, c10_ids)}),
    }
    # not cut at <|endoftext|>: past it the target goes on with a new document of its own (comment, def line,
    # body), still its own behaviour to learn
    seqs = [td.cut(s, len(p), eos=2) for s, p in zip(seqs, prompts)]
    keep = [i for i, (s, p) in enumerate(zip(seqs, prompts)) if len(s) >= len(p) + 2]  # >= 1 anchor
    t_gen = time.perf_counter() - t0
    labels = bug_labels(model, [seqs[i] for i in keep], [len(prompts[i]) for i in keep], device)
    del model
    decoder, be = target_mod.load(str(tgt), LAYER_IDS, device, torch.float32)
    assert be == backend, be
    head = target_mod.load_head(str(tgt), device, torch.float32)
    feats = td.features(decoder, decoder.layers, [seqs[i] for i in keep], LAYER_IDS, device, fixed=fla)
    data = [(f, torch.tensor(seqs[i], device=device), len(prompts[i])) for f, i in zip(feats, keep)]
    pfeats = td.features(decoder, decoder.layers, probe_seqs, LAYER_IDS, device, fixed=False)
    probe_data = ([torch.tensor(x, device=device) for x in probe_seqs], pfeats, [len(p) for p in c10_ids])
    kept_groups = [groups[i] for i in keep]
    # spot check: the batched features equal target.extract's for one sequence
    ref = target_mod.extract(decoder, data[-1][1], LAYER_IDS).to(torch.bfloat16)
    spot = float((ref.float() - data[-1][0].float()).abs().max())
    del decoder, feats
    rec["drafter_data"] = {
        "sequences": len(data),
        "prompts": len(prompts),
        "new_tokens": new,
        "tokens": int(sum(len(seqs[i]) for i in keep)),
        "completion_tokens": int(sum(len(seqs[i]) - len(prompts[i]) for i in keep)),
        "generate_seconds": round(t_gen, 1),
        "seconds": round(time.perf_counter() - t0, 1),
        "features_backend": backend,
        "features_dtype": "bfloat16 (extracted in float32)",
        "batched_vs_extract_max_abs": spot,
    }
    log(f"drafter data: {rec['drafter_data']}")

    # -- drafters
    info = target_mod.describe(tgt)
    H = info.hidden_size
    d = TinyDrafter(
        hidden_size=H,
        intermediate_size=2 * H,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=H // 4,
        vocab_size=info.vocab_size,
        block_size=16,
        num_target_layers=info.num_layers,
        target_layer_ids=list(LAYER_IDS),
        mask_token_id=3,
        rope_theta=10000.0,
        seed=SEED,
    )
    dk = work / "drafters"
    # batched: 32 sequences x 64 anchors = 2048 blocks a step in one stacked blocks call (the GPU is otherwise
    # idle on a Python loop over a few sequences); 64 held-out sequences give the validation loss of the curve
    kw = dict(
        steps=100_000,
        seqs_per_step=32,
        anchors_per_seq=64,
        lr=2e-3,
        warmup=60,
        val_seqs=64,
        log_every=50,
    )
    # one schedule for every run: the healthy run ends at the first probe (every PROBE_EVERY steps) where its
    # coding-10 tau reaches TAU_AIM (or CAP_S seconds have passed: then at its best probe); every bug run is the
    # healthy run with its bug, stopped at the same step
    plan = dict(kw, steps=PLAN_STEPS, keep_best=False, probe_every=PROBE_EVERY)
    good = td.DrafterTraining(**plan)
    if os.environ.get("DEMO_DRAFTER_STEPS"):
        good.steps = int(os.environ["DEMO_DRAFTER_STEPS"])
    if smoke:
        toy = dict(steps=24, log_every=4, seqs_per_step=4, anchors_per_seq=16, val_seqs=4, warmup=3, probe_every=4)
        good = td.DrafterTraining(**(plan | toy))
    order = list(range(len(data)))
    random.Random(SEED + 3).shuffle(order)  # the held-out (last) sequences: a seeded mix of every family
    pad = td.Padded([data[i] for i in order])
    pad.noisy, pad.top_ids, pad.top_lp = (stack([labels[k][i] for i in order], pad.T) for k in range(3))
    del data, labels
    gr = [kept_groups[i] for i in order][: len(pad) - good.val_seqs]
    rec["drafter_data"]["groups"] = {x: gr.count(x) for x in sorted(set(gr))}
    only = os.environ.get("DEMO_BUGS")  # comma list: train only these bug runs, stopped where the earlier call's
    # healthy run stopped (DEMO_REUSE: same target, same data)
    if only:
        stop = prev["healthy_stop"]["step"]
        fin = next(r for r in prev["drafters"] if not r.get("bug") and r["step"] == stop)
        rec["drafters"], rec["healthy_reused_from_earlier_run"] = [], True
    else:
        probes: list[dict] = []
        t_h = time.perf_counter()

        def until(path: Path, step: int, r: dict) -> bool:
            r["probe"] = td.probe(path, head, *probe_data)
            probes.append(r)
            late = time.perf_counter() - t_h > (CAP_S if not smoke else 5)
            return (r["probe"]["tau_macro"] >= TAU_AIM and step >= (MIN_STOP if not smoke else 0)) or late

        recs = td.train(pad, head, d, good, dk, "healthy/step{step:04d}", device, log, until=until)
        fin = recs[-1]
        if fin["step"] == probes[-1]["step"] and probes[-1]["probe"]["tau_macro"] < TAU_AIM:  # capped: the best probe
            best = max(probes, key=lambda r: r["probe"]["tau_macro"])
            if best["step"] != fin["step"]:
                shutil.rmtree(dk / fin["name"])
                fin = best | {"name": f"healthy/step{best['step']:04d}", "capped": True}
                shutil.copytree(dk / best["name"], dk / fin["name"])
        fin["probe"] = next(r["probe"] for r in probes if r["step"] == fin["step"])
        stop = fin["step"]
        recs = [snap | {"name": f"healthy/step{snap['step']:04d}"} for snap in pick(probes, stop)] + [fin]
        for r in recs[:-1]:
            shutil.copytree(dk / f"probe/step{r['step']}", dk / r["name"])
        rec["drafters"] = recs
        rec["healthy_probes"] = [[r["step"], r["probe"]["tau_macro"]] for r in probes]
        rec["healthy_stop"] = {
            "step": stop,
            "aim": TAU_AIM,
            "probe": fin["probe"],
            "seconds": round(time.perf_counter() - t_h, 1),
        }
        log(f"healthy: stopped at step {stop}, coding-10 probe {fin['probe']}; snapshots {[r['step'] for r in recs]}")
        save_rec()
        shutil.rmtree(dk / "probe")
        pack("healthy", dk / "healthy")
    soft_ts = [float(x) for x in os.environ["DEMO_SOFT_TS"].split(",")] if os.environ.get("DEMO_SOFT_TS") else SOFT_TS
    variants: dict[str, list] = {}
    for bug in only.split(",") if only else td.BUGS:
        temps = soft_ts if bug == "soft_kl" else [1.0]
        for temp in temps if not smoke else temps[:1]:
            t = td.DrafterTraining(**(asdict(good) | dict(bug=bug, stop_at=stop, probe_every=0, soft_t=temp)))
            vdir = work / f"{bug}-{temp}"
            br = td.train(pad, head, d, t, vdir, "bugs/" + bug.replace("_", "-") + "-step{step}", device, log)
            br[-1]["probe"] = td.probe(vdir / br[-1]["name"], head, *probe_data)
            log(f"{bug} (T {temp}): coding-10 probe {br[-1]['probe']}")
            variants.setdefault(bug, []).append((vdir, br[-1]))
            if br[-1]["probe"]["tau_macro"] <= COST * fin["probe"]["tau_macro"]:
                break
        vdir, br = variants[bug][-1]  # the first that costs COST, else the last tried
        shutil.copytree(vdir / br["name"], dk / br["name"])
        rec["drafters"].append(br)
        rec.setdefault("bug_variants", {})[bug] = [
            {"soft_t": v[1]["training"]["soft_t"], "probe": v[1]["probe"]} for v in variants[bug]
        ]
        save_rec()
    pack("bugs", dk / "bugs")
    del pad

    # -- coding-10: reference completions on the torch path (CPU, as the local server), fla on the GPU
    if reuse and (reuse / "fla.tar").is_file() and prev.get("coding10"):  # same target: same completions
        rec["coding10"] = prev["coding10"] | {"reused_from_earlier_run": True}
        shutil.copy(reuse / "fla.tar", out / "fla.tar")
        rec["seconds"] = round(time.perf_counter() - t_all, 1)
        save_rec()
        log(f"coding-10 reused from {reuse}; done in {rec['seconds']} s")
        return rec
    c10 = json.loads((build / "coding10.json").read_text())
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the demo build runs the local server: one thread
    cpu_eng = server.Engine(model_dir=tgt.resolve(), device="cpu")
    cpu_eng.load()
    comps = []
    for p in c10:
        ids, _, fin = cpu_eng.greedy(p["prompt_ids"], MAX_NEW_TOKENS, cpu_eng.eos_ids, [])
        comps.append({"id": p["id"], "prompt_ids": p["prompt_ids"], "output_ids": ids, "finish_reason": fin})
    cpu_backend = cpu_eng.backend
    del cpu_eng
    torch.set_num_threads(threads)
    t_ref = time.perf_counter() - t0
    decoder, be = target_mod.load(str(tgt), LAYER_IDS, device, torch.float32)
    assert be == backend, be
    meta = dict(
        extraction="demo-fla",
        target=TARGET,
        config_hash=info.config_hash,
        layer_ids=LAYER_IDS,
        device=device,
        dtype="float32",
        backend=be,
        **target_mod.versions(),
    )
    fla_dir = work / FLA
    for c in comps:
        feats = target_mod.extract(decoder, torch.tensor(c["prompt_ids"] + c["output_ids"]), LAYER_IDS)
        cache.write(fla_dir, "features", c["id"], feats, meta)
    with open(fla_dir / "completions.jsonl", "w") as f:
        for c in comps:
            f.write(json.dumps(c) + "\n")
    rec["coding10"] = {
        "reference_backend": cpu_backend,
        "features_backend": be,
        "features_meta": meta,
        "tokens": int(sum(len(c["prompt_ids"]) + len(c["output_ids"]) for c in comps)),
        "reference_seconds": round(t_ref, 1),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    log(f"coding-10: {rec['coding10']}")
    for c in comps[:3]:
        log(f"--- {c['id']}\n" + head_text(tgt, c))

    rec["seconds"] = round(time.perf_counter() - t_all, 1)
    save_rec()
    pack("fla", fla_dir)
    log(f"done in {rec['seconds']} s; wrote {sorted(p.name for p in out.iterdir())}")
    return rec


def preview(tgt: Path, build: Path, out: Path, device: str, smoke: bool) -> dict:
    """The target's greedy coding-10 completions (on `device`, batched: a look at the model before the
    drafters are trained on it) -> out/preview.txt; returns lengths and how many start with an indented line."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import train_drafter as td

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(tgt), dtype=torch.float32).to(device).eval()
    tok = AutoTokenizer.from_pretrained(str(tgt))
    c10 = json.loads((build / "coding10.json").read_text())
    prompts = [c["prompt_ids"] for c in c10]
    seqs = td.generate(model, prompts, MAX_NEW_TOKENS if not smoke else 16, device, batch=len(prompts))
    texts, indented, lens, stopped = [], 0, [], 0
    for c, s, p in zip(c10, seqs, prompts):
        s = td.cut(s, len(p), EOS)
        body = tok.decode(s[len(p) :])
        lens.append(len(s) - len(p))
        stopped += s[-1] in EOS
        indented += body.startswith((" ", "\t"))
        texts.append(f"===== {c['id']} ({len(s) - len(p)} tokens)\n{c['prompt']}{body}\n")
    (out / "preview.txt").write_text("\n".join(texts))
    log("coding-10 preview (target, greedy, " + device + "):\n" + "\n".join(t[:700] for t in texts))
    del model
    return {
        "completion_tokens": lens,
        "stopped_at_eos": stopped,
        "indented_first_line": indented,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def head_text(tgt: Path, c: dict) -> str:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tgt))
    return tok.decode(c["prompt_ids"] + c["output_ids"])


SNAPSHOTS = [0.05, 0.1, 0.17, 0.25, 0.35, 0.47, 0.6, 0.75, 0.88]  # the healthy run's snapshots (fractions of
# its final step, on the probe grid)
PLAN_STEPS = 3000  # every drafter run's schedule (warmup, cosine to 10 %) is planned for this many steps
PROBE_EVERY = 5  # the healthy run's probe interval (steps)
MIN_STOP = 60  # the healthy run ends no earlier than this step (its snapshots need a curve before it)
TAU_AIM = 5.0  # the healthy run ends at its first probe with a coding-10 tau (GPU greedy) this high: real drafters
# reach 3-8 on code
CAP_S = 150.0  # ... or after this many seconds, at its best probe
SOFT_TS = [2.0, 4.0, 6.0, 8.0, 10.0, 16.0]  # soft_kl: the target's temperatures tried in order (the first that
# costs COST is kept)
COST = 0.5  # a bug run's probe tau at most this share of the healthy final's (the demo's relation is 0.6)


def pick(probes: list[dict], stop: int) -> list[dict]:
    """The healthy run's snapshots: the probe checkpoints nearest SNAPSHOTS of the final step `stop`, distinct,
    before it, in step order."""
    steps = sorted({r["step"] for r in probes if r["step"] < stop})
    got = {min(steps, key=lambda s: abs(s - f * stop)) for f in SNAPSHOTS} if steps else set()
    return [r for r in probes if r["step"] in got]


NOISE = 0.5  # noisy_labels: share of completion tokens masked before the target labels the sequence
TOP_K = 32  # soft_kl: the target's top-K kept per position


def bug_labels(model, seqs: list[list[int]], prompt_lens: list[int], device: str, batch: int = 256):
    """Per sequence, what the label bugs train on (index t = the label of the token at t; index 0 unused):
    noisy [T] (the target's argmax after masking `NOISE` of the completion's tokens with <|mask|>, seeded),
    top_ids [T, K] int16 and top_lp [T, K] bf16 (the target's top-K next-token log-probs on the clean sequence).
    Returns three lists aligned with `seqs`."""
    import torch

    mask_id = 3  # <|mask|> (tools/tiny.write_tokenizer's special tokens), the drafters' mask_token_id
    g = torch.Generator().manual_seed(SEED + 7)
    noisy, tids, tlp = [], [], []
    for s in range(0, len(seqs), batch):
        grp = seqs[s : s + batch]
        T = max(len(q) for q in grp)
        x = torch.zeros(len(grp), T, dtype=torch.long)
        done = torch.zeros(len(grp), T, dtype=torch.bool)
        for j, q in enumerate(grp):
            x[j, : len(q)] = torch.tensor(q)
            done[j, prompt_lens[s + j] : len(q)] = True
        hit = (torch.rand(x.shape, generator=g) < NOISE) & done
        x, xn = x.to(device), torch.where(hit, mask_id, x).to(device)
        with torch.no_grad():
            lp = model(input_ids=x, use_cache=False).logits.float().log_softmax(-1)  # [b, T, V]
            top = lp.topk(TOP_K, dim=-1)
            nz = model(input_ids=xn, use_cache=False).logits.argmax(-1)  # [b, T]
        for j, q in enumerate(grp):
            noisy.append(_shift(nz[j], len(q)))
            tids.append(_shift(top.indices[j].to(torch.int16), len(q)))
            tlp.append(_shift(top.values[j].to(torch.bfloat16), len(q)))
    return noisy, tids, tlp


def _shift(v, n: int):
    """v [T, ...] of predictions at positions 0..n-1 -> [n, ...] with the label of token t at index t."""
    import torch

    return torch.cat([torch.zeros_like(v[:1]), v[: n - 1]])


def stack(rows: list, T: int):
    """Right-pad a list of [n, ...] tensors to [N, T, ...]."""
    import torch

    out = torch.zeros((len(rows), T, *rows[0].shape[1:]), dtype=rows[0].dtype, device=rows[0].device)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out
