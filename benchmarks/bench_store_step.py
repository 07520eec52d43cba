"""The parent's side of a sweep checkpoint, on the CPU: a worker's chain-only results for `--prompts`
prompts of 2,560 tokens packed as the worker sends them (`wire.plain`), unpacked as the parent reads them
(`wire.unpacked`), then the parent's store step (`pipeline.store_run`: summary, rows, array file, four kept
analyses; the set's completions read once before, as a sweep's parent does). With one worker the parent does this
while the worker replays the next checkpoint, so a sweep's checkpoints come no faster than this.

Results are planted (`tools.planted.planted_results`, mean 5 accepted drafts) and cut to chain-only shape: -1 /
NaN off the walk's anchors, numpy arrays as `replay.chain_only_results` returns them.

    python benchmarks/bench_store_step.py [--prompts 200]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import report  # (puts the repository root on sys.path)

from dflash_dash import ops, pipeline, store
from dflash_dash.jobs import wire
from dflash_dash.store import Store, new_id
from tools import planted, tiny


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=2560)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--packers", type=int, default=None, help="threads packing the rows (default store.arrays.PACKERS)")
    a = ap.parse_args()
    if a.packers:
        store.arrays.PACKERS = a.packers
    work = Path(tempfile.mkdtemp(prefix="dflash-store-step-"))
    rng = np.random.default_rng(0)
    st = Store(work / "ws")
    st.add_set(planted.SET, "bench")
    for i in range(a.prompts):
        ids = rng.integers(0, 500, a.tokens).tolist()
        st.add_completion(
            planted.SET,
            {
                "id": f"p{i:04d}",
                "idx": i,
                "prompt_ids": ids[: a.prompt_len],
                "output_ids": ids[a.prompt_len :],
                "finish_reason": "length",
            },
        )
    target = tiny.write_target(work / "models" / "target", tiny.TinyTarget())
    ck = tiny.write_drafter(work / "models" / "ck", tiny.TinyDrafter(seed=0, block_size=16))
    ex = new_id("ex")
    st.add_extraction(
        dict(
            id=ex,
            set_name=planted.SET,
            target_path=str(target),
            hidden_size=64,
            device="cpu",
            layer_ids=pipeline.layers_of(str(ck), None),
            dtype="float32",
            backend="torch",
            versions={},
        )
    )
    st.set_status("extractions", ex, "done")
    res = planted.planted_results(st.completions(planted.SET), 0, 16, 0, mean_accepted=5)
    for r in res:  # chain-only shape, numpy fields
        off = np.ones(len(r.accepted_at), bool)
        off[np.asarray(r.round_anchors) - r.prompt_len] = False
        r.accepted_at = np.where(off, -1, np.asarray(r.accepted_at))
        r.drafts = np.where(off[:, None], -1, np.asarray(r.drafts))
        r.draft_logp = np.where(off[:, None], np.nan, np.asarray(r.draft_logp, dtype=np.float32)).astype(np.float32)
        r.round_top_ids, r.round_top_p = np.asarray(r.round_top_ids), np.asarray(r.round_top_p)
    t0 = time.perf_counter()
    lines = [json.dumps({"event": {"checkpoint": 0, "result": r}}, default=wire.plain) for r in res]
    t1 = time.perf_counter()
    back = [wire.unpacked(json.loads(ln)["event"])["result"] for ln in lines]
    comps = {c["prompt_id"]: c for c in st.completions(planted.SET)}  # a sweep's parent reads them once
    t2 = time.perf_counter()
    pipeline.store_run(
        st,
        extraction=st.extraction(ex),
        checkpoint=ops.CheckpointSpec(str(ck)),
        results=back,
        settings=ops.ReplaySettings(tree_budget=0, dtype="bfloat16", anchors="chain"),
        device="cuda",
        comps=comps,
    )
    t3 = time.perf_counter()
    report(
        {
            "store_step_prompts": a.prompts,
            "store_step_pack_s": t1 - t0,
            "store_step_wire_mb": sum(map(len, lines)) / 1e6,
            "store_step_unpack_s": t2 - t1,
            "store_step_store_run_s": t3 - t2,
            "store_step_parent_s": t3 - t1,
        }
    )


if __name__ == "__main__":
    main()
