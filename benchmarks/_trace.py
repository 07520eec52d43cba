"""Step traces of the chain-only walk (`replay.lockstep.walk_device`), for benchmarks: where a process's first walk
loses time against the same walk again.

Contract: `install()` patches `replay` in this process (no device synchronisation is added: each step's host
start time, row count and key bound are recorded, plus the staged LM head's row counts) and returns the list
that each finished walk is appended to; with `path` each walk is also appended there as one JSON line (a worker
process: `trace_site/sitecustomize.py`). `excess(first, again)` compares two walks that ran the same steps.
"""

from __future__ import annotations

import json
import time


def install(path: str | None = None) -> list[dict]:
    from dflash_dash import replay as rp
    from dflash_dash.drafters import kernels

    walks: list[dict] = []
    cur: dict = {}
    ls = rp.lockstep
    step0, head0, walk0, init0, chain0 = (
        ls.Lockstep.step,
        ls.read_out,
        ls.walk_device,
        ls.Lockstep.__init__,
        rp.chain_only_results,
    )

    def init(self, drafter, *a, **k):
        t = time.perf_counter()
        init0(self, drafter, *a, **k)
        cur["ctx_host_s"] = time.perf_counter() - t

    def step(self, anchors, record, top):
        cur.setdefault("trace", []).append(
            (time.perf_counter(), len(anchors), -(-(self.d.c.block_size + top) // kernels.KEY_ALIGN))
        )
        return step0(self, anchors, record, top)

    def head(drafter, hd, h, k, slots=None):
        cur.setdefault("heads", []).append((len(cur.get("trace", [])) - 1, h.shape[0]))
        return head0(drafter, hd, h, k, slots)

    def walk(st):
        cur.update(trace=[], heads=[])
        t = time.perf_counter()
        walk0(st)
        w = dict(cur, start=t, end=time.perf_counter())
        w["trace"] = w["trace"] + [(w["end"], 0, 0)]
        walks.append(w)
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(w) + "\n")
        cur.clear()

    def chain(*a, **k):
        t = time.perf_counter()
        out = chain0(*a, **k)
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"chain_s": time.perf_counter() - t, "start": t}) + "\n")
        return out

    ls.Lockstep.__init__, ls.Lockstep.step, ls.read_out, ls.walk_device = init, step, head, walk
    rp.chain_only_results = ls.chain_only_results = chain  # the product's call (pipeline) and `chain_only`'s
    return walks


def excess(w1: dict, w2: dict, key_align: int) -> tuple[dict, list[str]]:
    """Step i of walk `w1` against step i of `w2` (the same steps), summed by kind of step: the first three, a new
    row count, a new key length, a new staged-head row count, other. Returns (figures, note lines)."""
    same = [tuple(x[1:]) for x in w1["trace"]] == [tuple(x[1:]) for x in w2["trace"]]
    figs = {
        "walks_same_steps": int(same),
        "walk_first_s": w1["end"] - w1["start"],
        "walk_again_s": w2["end"] - w2["start"],
        "walk_steps": len(w1["trace"]) - 1,
    }
    if not same:
        return figs, []
    dt = lambda w: [b[0] - a[0] for a, b in zip(w["trace"], w["trace"][1:])]  # noqa: E731
    ex = [x - y for x, y in zip(dt(w1), dt(w2))]
    head_rows: dict = {}
    for i, r in w1["heads"]:
        head_rows.setdefault(i, []).append(r)
    seen_r, seen_k, seen_h, kinds, top = set(), set(), set(), {}, []
    for i, (_, r, kb) in enumerate(w1["trace"][:-1]):
        hr = set(head_rows.get(i, [])) - seen_h
        kind = (
            "first"
            if i < 3
            else "new_rows"
            if r not in seen_r
            else "new_keys"
            if kb not in seen_k
            else "new_head_rows"
            if hr
            else "other"
        )
        seen_r.add(r), seen_k.add(kb), seen_h.update(hr)
        kinds.setdefault(kind, [0, 0.0])
        kinds[kind][0] += 1
        kinds[kind][1] += ex[i]
        top.append((ex[i], i, r, kb * key_align, kind))
    for kind, (n, s) in sorted(kinds.items()):
        figs[f"excess_{kind}_steps"], figs[f"excess_{kind}_s"] = n, s
    figs["distinct_head_rows"] = len(seen_h)
    cum = [0.0]
    for e in ex:
        cum.append(cum[-1] + e)
    n = len(ex)
    notes = [
        "largest first-walk excess steps (ms, step, rows, key bound, kind): "
        + "; ".join(f"{e * 1e3:.0f} #{i} R{r} K{k} {kd}" for e, i, r, k, kd in sorted(top, reverse=True)[:15]),
        "cumulative excess at 0/10/25/50/75/100 % of the steps (s): "
        + ", ".join(f"{cum[int(n * q)]:.2f}" for q in (0, 0.1, 0.25, 0.5, 0.75, 1.0)),
    ]
    return figs, notes
