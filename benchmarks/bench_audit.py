"""Feature audit benchmark: audit time per 1,000 positions at the 27B reference shapes (SPEC section 8).

The target is a Qwen3_5TextConfig model of 64 layers (every 4th full attention), hidden 5120, vocab 248320 with
random bf16 weights built on the GPU (`bench_extract.build`: nothing is downloaded; speed does not depend on the
values); its config.json alone is written to a folder (`target_info.describe` reads no weights) and
`target.load` is answered with the built model, so the figure is the audit itself (`audit.audit`: the SpecForge
capture read sample by sample, the recomputation of layers l-2..l+2 of every tapped layer, i.e. the decoder
through layer 63 for ids [1, 16, 31, 46, 61], and the fits over 5 layer offsets x 3 position shifts), not the
model's load. The capture is SpecForge's layout (`scripts/prepare_hidden_states.py`: rows_0-2000/data_i.ckpt of
input_ids, loss_mask, hidden_states [1, T, 5 x 5120] bf16), random values. fla kernels are asserted on CUDA.

    python benchmarks/bench_audit.py            # the GPU figures (one GPU, about 60 GB of memory)
    python benchmarks/bench_audit.py --small    # tiny shapes on the CPU (a smoke test)

Figures: audit_s_per_1k_positions (what the audit costs), forward_s_per_1k_positions (the recomputation's forward
alone, `target.extract` over the same tokens), audit_positions, audit_samples, capture_write_s (making the input).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from _common import note, peak_gib, report, sync
from bench_extract import FULL, LAYER_IDS, SMALL, SMALL_IDS, backend, build

from dflash_dash import audit, target as tg
from dflash_dash.audit import check


def args_():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes on the CPU (smoke test)")
    ap.add_argument("--samples", type=int, default=None, help="captured sequences (default 4; 2 with --small)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per sequence (default 2560; 64 small)")
    ap.add_argument("--work", default=None, help="folder for the capture (default: a temporary folder)")
    return ap.parse_args()


def capture(root: Path, n: int, T: int, width: int, vocab: int) -> Path:
    """A SpecForge capture of n random sequences (prepare_hidden_states.py's file layout)."""
    d = root / "capture" / "rows_0-2000"
    d.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    for i in range(n):
        ids = torch.randint(4, vocab, (1, T), generator=g)
        hidden = torch.randn(1, T, width, generator=g).to(torch.bfloat16)
        torch.save({"input_ids": ids, "loss_mask": torch.ones_like(ids), "hidden_states": hidden}, d / f"data_{i}.ckpt")
    return d.parent


def target_folder(root: Path, model) -> Path:
    """The built model's config.json alone (describe reads no weights)."""
    d = root / "target"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(model.config.to_dict()))
    return d


def main():
    a = args_()
    shp, ids = (SMALL, SMALL_IDS) if a.small else (FULL, LAYER_IDS)
    device = "cpu" if a.small else "cuda:0"
    n, T = a.samples or (2 if a.small else 4), a.tokens or (64 if a.small else 2560)
    if not a.small:
        note(f"device {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    figs: dict = {}
    try:
        model = build(shp, shp["num_hidden_layers"], device, tokens=T)
        bound = backend(device)
        decoder = model.get_decoder()
        with tempfile.TemporaryDirectory(dir=a.work) as tmp:
            root = Path(tmp)
            t = time.perf_counter()
            cap = capture(root, n, T, len(ids) * shp["hidden_size"], shp["vocab_size"])
            figs["capture_write_s"] = time.perf_counter() - t
            tgt = target_folder(root, model)
            check.target_mod.load = lambda *args, **kw: (decoder, bound)  # the built model, not a load from disk
            audit.audit(str(cap), str(tgt), layers=ids, samples=1, device=device, dtype="bfloat16")  # warm-up
            sync(device)
            rep = audit.audit(str(cap), str(tgt), layers=ids, samples=n, device=device, dtype="bfloat16")
            figs["audit_s_per_1k_positions"] = rep["seconds"] * 1000 / rep["positions"]
            figs["audit_positions"] = rep["positions"]
            figs["audit_samples"] = rep["samples"]
            hooked = sorted({x for l in ids for x in range(l - 2, l + 3) if 0 <= x < shp["num_hidden_layers"]})
            seqs = [torch.randint(4, shp["vocab_size"], (T,), device=device) for _ in range(n)]
            sync(device)
            t = time.perf_counter()
            for s in seqs:
                tg.extract(decoder, s, hooked)
            sync(device)
            figs["forward_s_per_1k_positions"] = (time.perf_counter() - t) * 1000 / (n * T)
            figs["audit_backend"] = rep["recompute"]["backend"]
            if not a.small:
                figs["peak_gib"] = peak_gib(device)
    finally:
        report(figs)


if __name__ == "__main__":
    main()
