"""Make the demo's committed assets, reproducibly: `python -m tools.demo.make_assets STEP ...` (from the repository
root; development tooling, never imported by the app or the CLI).

Steps (each records seeds, arguments, versions, timings and losses for MANIFEST.json):
  prepare       (CPU)  stdlib corpus -> byte-level BPE tokenizer (with <|mask|>), uint16 token stream, the
                       prompts of the drafter's training data, and the coding-10 prompt ids exactly as
                       `pipeline.fetch` makes them (plain text, no chat template).
  gpu           (CUDA) train the target (its Gated DeltaNet backward on the torch path: fla 0.6.0 refuses
                       its gated chunk backward on Hopper with Triton < 3.7.1); generate the drafter's training
                       data with it (its own greedy continuations) and extract their hidden states with fla;
                       train the drafters (final with an early snapshot, and the anchor-visible bug); complete
                       coding-10 greedily on the torch path on the CPU (as the local server does) and extract
                       those completions with fla in the feature-cache format. Writes target.tar,
                       drafters.tar, fla.tar, train_seqs.json and gpu.json to --out (each stage as soon as it
                       is done; DEMO_REUSE=<earlier out> reuses a trained target). `--device cpu --smoke`
                       runs every step at toy size on the torch path (development).
  unpack        (CPU)  the tars -> dflash_dash/demo/assets/, plus MANIFEST.json with every record and sizes.
  cpu-continue  (CPU)  continue a drafter's training on the CPU (torch-path features of the same training
                       sequences), when the GPU time ran out before the drafters were trained enough.
  finish        (CPU)  merge the cpu-continue records into MANIFEST.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

from dflash_dash.demo import ASSETS, CHECKPOINTS, FLA, LAYER_IDS, MAX_NEW_TOKENS, PROMPT_SET, TARGET

VOCAB = 4096
SEED = 0
SPLIT = "qwen"  # the tokenizer's pre-tokenizer (tools/tiny.write_tokenizer): newlines split from indentation
EOS = {2, 0}  # <|im_end|>, <|endoftext|>: the target's eos ids (its config), as Qwen's generation config


def log(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------
# prepare (CPU)


def prepare(build: Path, n_raw: int = 3072, n_chat: int = 1024, n_comment: int = 4096) -> dict:
    from transformers import AutoTokenizer

    from dflash_dash import prompts

    from .. import tiny
    from . import corpus

    t0 = time.perf_counter()
    build.mkdir(parents=True, exist_ok=True)
    files = corpus.files()
    commented, pairs = corpus.samples(files, SEED)
    tok_dir = tiny.write_tokenizer(
        build / "tokenizer", vocab_size=VOCAB, corpus=[corpus.read(p) for p in files], split=SPLIT
    )
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    tokens, starts = corpus.stream(tok, files, commented, pairs, repeat=2, seed=SEED, starts=True)
    np.save(build / "tokens.npy", tokens)
    np.savez(build / "doc_starts.npz", **starts)
    # prompts of the drafter's training data: raw code windows, comment-prompted function heads, chat asks
    rng = random.Random(SEED + 1)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    gen = []
    for _ in range(n_raw):
        s = rng.randrange(0, len(tokens) - 64)
        gen.append([int(t) for t in tokens[s : s + rng.randrange(16, 64)] if t != eot] or [int(tokens[s])])
    for d in commented[:n_comment]:
        lines = d.splitlines(keepends=True)
        head = [ln for ln in lines if ln.startswith("#")]
        gen.append(tok("".join(head + lines[len(head) : len(head) + 1]))["input_ids"])
    for ask, _ in pairs[:n_chat]:
        gen.append(
            tok.apply_chat_template(
                [{"role": "user", "content": ask}], add_generation_prompt=True, tokenize=False, enable_thinking=False
            )
        )
        gen[-1] = tok(gen[-1], add_special_tokens=False)["input_ids"]
    gen = [g[-96:] for g in gen]
    (build / "train_prompts.json").write_text(json.dumps(gen))
    # coding-10 exactly as pipeline.fetch tokenises a plain-text prompt
    c10 = [
        {"id": p["id"], "prompt": p["prompt"], "prompt_ids": list(tok(p["prompt"])["input_ids"])}
        for p in prompts.load(PROMPT_SET)
    ]
    (build / "coding10.json").write_text(json.dumps(c10))
    rec = {
        "python": platform.python_version(),
        "stdlib_files": len(files),
        "stdlib_bytes": sum(p.stat().st_size for p in files),
        "stdlib_fingerprint": corpus.fingerprint(files),
        "comment_prompted_functions": len(commented),
        "chat_samples": len(pairs),
        "sample_repeat": 2,
        "vocab_size": len(tok),
        "pre_tokenizer": SPLIT,
        "stream_tokens": int(len(tokens)),
        "documents": {k: int(len(v)) for k, v in starts.items()},
        "license_headers_stripped": sum(corpus.strip_header(corpus.read(p)) != corpus.read(p) for p in files),
        "train_prompts": len(gen),
        "train_prompt_kinds": {
            "raw": n_raw,
            "comment": min(n_comment, len(commented)),
            "chat": min(n_chat, len(pairs)),
        },
        "prompt_set": PROMPT_SET,
        "seed": SEED,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (build / "prepare.json").write_text(json.dumps(rec, indent=2))
    log(f"prepared {build}: {rec}")
    return rec


# ---------------------------------------------------------------------------
# gpu


def gpu(build: Path, out: Path, device: str = "cuda", smoke: bool = False) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from dflash_dash import cache, server
    from dflash_dash import target as target_mod

    from ..tiny import TinyDrafter
    from . import train_drafter as td
    from . import train_target as tt

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

    def pack(name: str, src: Path) -> None:
        with tarfile.open(out / f"{name}.tar", "w") as tf:
            tf.add(src, arcname=src.name)

    # -- target: the Gated DeltaNet backward runs on the torch path (fla 0.6.0 refuses its gated chunk backward
    #    on Hopper with Triton < 3.7.1: wrong gradients, fla issue #640); every forward after it runs on fla
    shape = (
        tt.TargetShape()
        if not smoke
        else tt.TargetShape(hidden_size=64, intermediate_size=128, head_dim=16, linear_head_dim=16)
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
        tokens = np.load(build / "tokens.npy")
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
    prompts = prompts[::2] if not os.environ.get("DEMO_ALL_PROMPTS") else prompts  # 2048 of 4096
    if smoke:
        prompts = prompts[:8] + prompts[-8:]
    if os.environ.get("DEMO_TRAIN_PROMPTS"):  # calibration runs: fewer sequences
        k = int(os.environ["DEMO_TRAIN_PROMPTS"]) // 2
        prompts = prompts[:k] + prompts[-k:]
    new = int(os.environ.get("DEMO_NEW_TOKENS", 192 if not smoke else 32))
    seqs = td.generate(model, prompts, new, device, batch=4096)
    # cut at <|im_end|> only (the chat answers' end): past an <|endoftext|> the target goes on with a new
    # document of its own, still its own behaviour to learn, and 3x the tokens of cutting there too
    seqs = [td.cut(s, len(p), eos=2) for s, p in zip(seqs, prompts)]
    keep = [i for i, (s, p) in enumerate(zip(seqs, prompts)) if len(s) >= len(p) + 2]  # >= 1 anchor
    t_gen = time.perf_counter() - t0
    del model
    decoder, be = target_mod.load(str(tgt), LAYER_IDS, device, torch.float32)
    assert be == backend, be
    head = target_mod.load_head(str(tgt), device, torch.float32)
    feats = td.features(decoder, decoder.layers, [seqs[i] for i in keep], LAYER_IDS, device, fixed=fla)
    data = [(f, torch.tensor(seqs[i], device=device), len(prompts[i])) for f, i in zip(feats, keep)]
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
    (out / "train_seqs.json").write_text(
        json.dumps({"prompt_lens": [len(prompts[i]) for i in keep], "seqs": [seqs[i] for i in keep]})
    )

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
    budget = float(os.environ.get("DEMO_DRAFTER_BUDGET", 120))  # final; the buggy one gets half
    # batched: 32 sequences x 64 anchors = 2048 blocks a step in one stacked blocks call (the GPU is otherwise
    # idle on a Python loop over a few sequences); the early snapshot at 2% of the steps
    # the lowest validation loss (64 held-out sequences) is kept: with ~0.3M completion tokens the drafter
    # memorises its data within a few thousand steps (an earlier run: val loss 5.5 at step 400, 15 at 7300)
    kw = dict(
        steps=100_000,
        batched=True,
        seqs_per_step=32,
        anchors_per_seq=64,
        lr=2e-3,
        warmup=60,
        val_seqs=64,
        keep_best=True,
        log_every=50,
    )
    good = td.DrafterTraining(budget_s=budget, snapshot_fracs=[0.02], **kw)
    bad = td.DrafterTraining(budget_s=budget / 2, bug="anchor_visible", seed=3, **kw)
    if os.environ.get("DEMO_DRAFTER_STEPS"):
        good.steps, good.budget_s = int(os.environ["DEMO_DRAFTER_STEPS"]), None
        bad.steps, bad.budget_s = max(1, good.steps // 2), None
    if smoke:
        for t in (good, bad):
            t.steps, t.budget_s, t.log_every, t.seqs_per_step, t.anchors_per_seq = 12, None, 4, 4, 16
            t.val_seqs, t.warmup, t.snapshot_fracs = 4, 3, [0.25] if t.snapshot_fracs else []
    random.Random(SEED + 3).shuffle(data)  # the held-out (last) sequences: a seeded mix of every prompt kind
    pad = td.Padded(data)
    del data
    rec["drafters"] = td.train(pad, head, d, good, dk, "final-step{step}", device, log)
    rec["drafters"] += td.train(pad, head, d, bad, dk, "buggy-anchor-visible-step{step}", device, log)
    save_rec()
    pack("drafters", dk)
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


# ---------------------------------------------------------------------------
# unpack (CPU)


TOKENIZER_NOTE = (
    "Byte-level BPE (4096 ids) whose pre-tokenizer splits text as Qwen2/Qwen3 tokenizers do "
    "(tools/tiny.QWEN2_SPLIT, then byte-level with no regex): a newline is its own pre-token (or ends a "
    "punctuation run, as in '):\\n') and the indentation after it starts the next one. The assets before issue 14 "
    "used the GPT-2 pattern, whose \\s+(?!\\S) glues a newline to the indentation that follows ('\\n   ' + ' return'): "
    "a plain-text coding-10 prompt ending in ':\\n' then ends on a lone newline token that training text only ever "
    "has before column-0 text (#, class, def), so no completion started with the function's indented body. "
    "With the Qwen split every coding-10 prompt tokenises as the prefix of prompt + body."
)


def unpack(src: Path, build: Path, assets: Path = ASSETS, command: str = "") -> dict:
    """Untar the GPU outputs into `assets` and write MANIFEST.json."""
    if assets.exists():
        shutil.rmtree(assets)
    assets.mkdir(parents=True)
    for name in ("target", "drafters", "fla"):
        with tarfile.open(src / f"{name}.tar") as tf:
            tf.extractall(assets, filter="data")
    (assets / "drafters").rename(assets / CHECKPOINTS)
    gpu_rec = json.loads((src / "gpu.json").read_text())
    sizes = {str(p.relative_to(assets)): p.stat().st_size for p in sorted(assets.rglob("*")) if p.is_file()}
    manifest = {
        "what": "dflash-dash demo assets: a small hybrid qwen3_5_text target (Gated DeltaNet + full attention) "
        "trained on the Python standard library, DFlash drafters trained against its hidden states, "
        "and its coding-10 completions' hidden states extracted on GPU with fla",
        "commands": {
            "prepare": "python -m tools.demo.make_assets prepare --build .demo-build",
            "gpu": "python -m tools.demo.make_assets gpu --build .demo-build --out $OUT  (one H200, "
            "transformers 5.24.0, fla-core/flash-linear-attention 0.6.0)",
            "unpack": "python -m tools.demo.make_assets unpack --src <gpu out> --build .demo-build",
            "gpu_call": command,
        },
        "tokenizer": TOKENIZER_NOTE,
        "prepare": json.loads((build / "prepare.json").read_text()),
        "gpu": gpu_rec,
        "sizes": sizes,
        "total_bytes": sum(sizes.values()),
    }
    (assets / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    log(f"assets in {assets}: {manifest['total_bytes'] / 2**20:.1f} MiB")
    return manifest


# ---------------------------------------------------------------------------
# cpu-continue (CPU, here)


def cpu_continue(
    src: Path,
    which: str = "final",
    assets: Path = ASSETS,
    minutes: float = 20.0,
    chunk_minutes: float = 5.0,
    n_seqs: int = 1024,
) -> dict:
    """Continue training the `which` drafter (final or buggy-) on the CPU, on torch-path features of the
    same training sequences (the buggy one with its bug), in chunks of `chunk_minutes`, each followed by a
    coding-10 replay on a torch extraction (progress only: coding-10 is never trained on). Replaces the
    checkpoint in `assets` and writes the record to `src/cpu-<which>.json` (merged by `finish`)."""
    import torch

    from dflash_dash import replay
    from dflash_dash import target as target_mod
    from dflash_dash.drafters import load

    from ..tiny import TinyDrafter
    from . import train_drafter as td

    t_all = time.perf_counter()
    target_mod.use_backend("torch")
    tgt = assets / TARGET
    old = next(p for p in (assets / CHECKPOINTS).iterdir() if p.name.startswith(which))
    prev = json.loads((old / "training.json").read_text())
    d = TinyDrafter(**prev["drafter"])
    bug = prev["training"].get("bug")
    ts = json.loads((src / "train_seqs.json").read_text())
    order = list(range(len(ts["seqs"])))
    random.Random(SEED + 2).shuffle(order)
    order = order[:n_seqs]
    decoder, _ = target_mod.load(str(tgt), LAYER_IDS, "cpu", torch.float32)
    head = target_mod.load_head(str(tgt))
    t0 = time.perf_counter()
    feats = td.features(decoder, decoder.layers, [ts["seqs"][i] for i in order], LAYER_IDS, "cpu", batch=32)
    data = [(f, torch.tensor(ts["seqs"][i]), ts["prompt_lens"][i]) for f, i in zip(feats, order)]
    t_feat = time.perf_counter() - t0
    log(f"{which}: cpu features of {len(data)} sequences in {t_feat:.0f} s")
    c10 = [json.loads(line) for line in (assets / FLA / "completions.jsonl").read_text().splitlines() if line]
    evals = []
    for c in c10:
        ids = torch.tensor(c["prompt_ids"] + c["output_ids"])
        evals.append(
            replay.Sequence(
                c["id"], ids, len(c["prompt_ids"]), target_mod.extract(decoder, ids, LAYER_IDS).to(torch.bfloat16)
            )
        )
    del decoder
    name = old.name.rsplit("-step", 1)[0] + "-step{step}"
    step0, init, chunks, k = prev["step"], old, [], 0
    work = Path(os.environ.get("DEMO_WORK", "/tmp/demo-cpu")) / which
    while time.perf_counter() - t_all < minutes * 60:
        t = td.DrafterTraining(
            steps=100_000,
            budget_s=chunk_minutes * 60,
            lr=5e-4,
            warmup=10,
            probe=5,
            seqs_per_step=4,
            anchors_per_seq=48,
            seed=10 + k,
            log_every=20,
            bug=bug,
        )
        rec = td.train(data, head, d, t, work / f"chunk{k}", name, "cpu", log, init=init, step0=step0)[-1]
        init, step0 = work / f"chunk{k}" / rec["name"], rec["step"]
        _, summ = replay.every_anchor(load(init), head, evals, budget=0)
        rec["coding10_tau_macro_torch"] = summ["tau_macro"]
        rec["coding10_tau_pooled_torch"] = summ["tau_pooled"]
        chunks.append(rec)
        log(
            f"{which} chunk {k}: {rec['name']} coding-10 tau macro {summ['tau_macro']:.3f} "
            f"pooled {summ['tau_pooled']:.3f}"
        )
        k += 1
    shutil.rmtree(old)
    shutil.copytree(init, assets / CHECKPOINTS / init.name)
    out = {
        "what": f"training continued on the CPU from the GPU checkpoint {old.name}, on torch-path features of "
        f"{len(data)} of the same training sequences (a fresh AdamW per chunk)",
        "from": old.name,
        "to": init.name,
        "feature_seconds": round(t_feat, 1),
        "seconds": round(time.perf_counter() - t_all, 1),
        "torch_threads": torch.get_num_threads(),
        "chunks": [
            {
                k2: c[k2]
                for k2 in (
                    "name",
                    "step",
                    "seconds",
                    "loss",
                    "coding10_tau_macro_torch",
                    "coding10_tau_pooled_torch",
                    "training",
                    "loss_curve",
                )
            }
            for c in chunks
        ],
        "command": f"OMP_NUM_THREADS=1 python -m tools.demo.make_assets cpu-continue --src <gpu out> "
        f"--which {which} --minutes {minutes} --chunk-minutes {chunk_minutes} --seqs {n_seqs}",
    }
    (src / f"cpu-{which}.json").write_text(json.dumps(out, indent=1))
    return out


def finish(src: Path, assets: Path = ASSETS) -> dict:
    """Merge the CPU continuation records into MANIFEST.json and recount the asset sizes."""
    man = json.loads((assets / "MANIFEST.json").read_text())
    cont = {f.stem.removeprefix("cpu-"): json.loads(f.read_text()) for f in sorted(src.glob("cpu-*.json"))}
    if cont:
        man["cpu_continuation"] = cont
    if (src / "gpu_runs.json").is_file():  # the device calls, as run (commands, wall and device seconds)
        man["commands"]["gpu_runs"] = json.loads((src / "gpu_runs.json").read_text())
    sizes = {
        str(p.relative_to(assets)): p.stat().st_size
        for p in sorted(assets.rglob("*"))
        if p.is_file() and p.name != "MANIFEST.json"
    }
    man["sizes"], man["total_bytes"] = sizes, sum(sizes.values())
    (assets / "MANIFEST.json").write_text(json.dumps(man, indent=1))
    return man


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.demo.make_assets", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="step", required=True)
    s = sub.add_parser("prepare")
    s.add_argument("--build", default=".demo-build")
    s = sub.add_parser("gpu")
    s.add_argument("--build", default=".demo-build")
    s.add_argument("--out", required=True)
    s.add_argument("--device", default="cuda")
    s.add_argument("--smoke", action="store_true")
    s = sub.add_parser("unpack")
    s.add_argument("--src", required=True)
    s.add_argument("--build", default=".demo-build")
    s.add_argument("--assets", default=str(ASSETS))
    s.add_argument("--command", default="")
    s = sub.add_parser("cpu-continue")
    s.add_argument("--src", required=True)
    s.add_argument("--which", default="final", choices=["final", "buggy-"])
    s.add_argument("--assets", default=str(ASSETS))
    s.add_argument("--minutes", type=float, default=20.0)
    s.add_argument("--chunk-minutes", type=float, default=5.0)
    s.add_argument("--seqs", type=int, default=1024)
    s = sub.add_parser("finish")
    s.add_argument("--src", required=True)
    s.add_argument("--assets", default=str(ASSETS))
    a = p.parse_args(argv)
    if a.step == "prepare":
        prepare(Path(a.build))
    elif a.step == "gpu":
        gpu(Path(a.build), Path(a.out), a.device, a.smoke)
    elif a.step == "cpu-continue":
        cpu_continue(Path(a.src), a.which, Path(a.assets), a.minutes, a.chunk_minutes, a.seqs)
    elif a.step == "finish":
        finish(Path(a.src), Path(a.assets))
    else:
        unpack(Path(a.src), Path(a.build), Path(a.assets), a.command)


if __name__ == "__main__":
    sys.exit(main())
