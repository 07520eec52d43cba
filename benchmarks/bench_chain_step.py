"""Chain-only lockstep step on the device (issue 12): where one step's time goes, and variants.

27B-shaped drafter (SPEC 8), bf16, 64 planted sequences x 2,560 tokens stacked as `replay._Lockstep` does; one
block per sequence per step. Prints the step's wall and host (launch) time per key alignment and SDPA backend,
the top kernels of three steps (torch.profiler), the drafter and LM-head shares, and the step as one CUDA graph.

    python3 benchmarks/bench_chain_step.py     # CUDA only
"""
import sys
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from _common import Clock, note, report
from bench_replay import FULL, rand_weights
from bench_sweep import plant
from dflash_dash import drafter as dr, replay as rp, target as tg
from tools import tiny
from torch.nn.attention import SDPBackend, sdpa_kernel

dev, dtype = "cuda", torch.bfloat16
cfg = tiny.drafter_config(tiny.TinyDrafter(**FULL)); c = dr.parse_config(cfg)
d = dr.Drafter(c, rand_weights(dr.shapes(c), dev, dtype, 1))
V, H = FULL["vocab_size"], FULL["hidden_size"]
hw = rand_weights({"e": (V, H), "l": (V, H)}, dev, dtype, 2)
head = tg.Head(hw["e"], hw["l"])
S, T, P = 64, 2560, 512
feats = torch.randn(S, T, c.K * H, device=dev, generator=torch.Generator(device=dev).manual_seed(3)).to(dtype)
toks = plant(d, head, feats, P, 5.0, 0)
seqs = [rp.Sequence(f"p{i}", toks[i], P, feats[i]) for i in range(S)]
figs = {}
rp.run_chain(d, head, seqs[:4], 0)
note("warm")

def steps(st, n, sync_each=False):
    anchors = torch.full((len(st.rows),), 1500, device=dev); rec = torch.zeros(len(st.rows), dtype=torch.bool, device=dev)
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n):
        st.step(anchors, rec)
        if sync_each: torch.cuda.synchronize()
    t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
    return (t1 - t0) / n * 1e3, (t2 - t0) / n * 1e3

for align in (16, 256):
    rp.KEY_ALIGN = align
    st = rp._Lockstep(d, head, seqs, 4)
    steps(st, 2)
    host, wall = steps(st, 10)
    figs[f"step64_align{align}_host_ms"], figs[f"step64_align{align}_ms"] = host, wall
    for name, be in [("efficient", SDPBackend.EFFICIENT_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)]:
        try:
            with sdpa_kernel([be]):
                steps(st, 1); figs[f"step64_align{align}_{name}_ms"] = steps(st, 5)[1]
        except Exception as e:
            note(f"{name}: {type(e).__name__}: {str(e)[:100]}")
    del st
report(figs); figs.clear()
rp.KEY_ALIGN = 256
st = rp._Lockstep(d, head, seqs, 4)
anchors = torch.full((S,), 1500, device=dev); rec = torch.zeros(S, dtype=torch.bool, device=dev)
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pr:
    for _ in range(3):
        st.step(anchors, rec)
    torch.cuda.synchronize()
print(pr.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=60), flush=True)
with Clock(dev) as ck:  # blocks only / head only
    for _ in range(5):
        emb = head.embed[torch.full((S, 16), 5, device=dev)]
        h = d.blocks(st.kv, anchors, emb, tail=True)
figs["blocks64_ms"] = ck.s / 5 * 1e3
with Clock(dev) as ck:
    for _ in range(5):
        rp._head(d, head, h, 4)
figs["head64_ms"] = ck.s / 5 * 1e3
try:  # the same step as one CUDA graph (static anchors)
    s_ = torch.cuda.Stream(); s_.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s_):
        for _ in range(2):
            st.step(anchors, rec)
    torch.cuda.current_stream().wait_stream(s_)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = st.step(anchors, rec)
    g.replay(); torch.cuda.synchronize()
    with Clock(dev) as ck:
        for _ in range(10):
            g.replay()
    figs["step64_graph_ms"] = ck.s / 10 * 1e3
    del g, out
except Exception as e:
    note(f"graph: {type(e).__name__}: {str(e)[:300]}")
del st
report(figs); figs.clear()
