"""The live loop as an operation: a completion set's prompts decoded plainly and speculatively at a temperature over
seeds, the measured acceptance and tokens/s kept beside the replay runs of the same drafter on the same set.

Contract: `live(store, op, progress, runner)` loads the whole target (`replay.profile.load_target`: kernels bound as
an extraction binds them, the backend recorded) and the drafter into the stand-in's decoder with live features
(`server.specdec.Speculator(live=True)`), decodes each prompt of `op.completions` to its stored completion's length
(or `op.max_new`), stopping at the target's eos ids, for seeds seed..seed+seeds-1 (`server.live.measure`), and keeps
the result as a kept analysis under the reserved run id `LIVE`, named by `key` (set, checkpoint, temperature, top-p,
rule): a later run of the same settings replaces it. `live_for(store, run)` lists the kept results of a replay run's
set and checkpoint (any temperature), newest first; `versus(result, rows, field)` pairs each prompt's live accept
length with the run's per-prompt estimate. No network.
"""

from __future__ import annotations

import time
from pathlib import Path

from .. import ops
from ..store import Run, Store
from .base import Progress, Runner

LIVE = "live"  # the reserved run id the live results are kept under (no run has it)
INDEX = "index"  # the kept analysis listing the live result keys, newest first


def key(set_name: str, checkpoint: str, temperature: float, top_p: float, rule: str) -> str:
    return f"{set_name}|{Path(checkpoint).resolve()}|T={temperature:g}|top_p={top_p:g}|{rule}"


def live(store: Store, op: ops.Live, progress: Progress = None, runner: Runner | None = None) -> dict:
    """Decode `op.completions`' prompts both ways over seeds and keep the result (module docstring)."""
    import torch

    from ..replay.profile import device_name, load_target
    from ..server import live as live_mod, specdec
    from ..server.sampler import Sampling

    comps = store.completions(op.completions)
    if not comps:
        raise ops.InputError(f"completions {op.completions!r}: no such set (or it is empty); fetch or import it first")
    comps = comps[: op.max_prompts] if op.max_prompts else comps
    dt = getattr(torch, op.dtype)
    model, backend = load_target(op.target, op.device, dt)
    spec = specdec.Speculator(op.drafter, op.device, dtype=dt, live=True)
    spec.load(model)
    eos = getattr(model.generation_config, "eos_token_id", None) or model.config.get_text_config().eos_token_id
    stop_ids = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    seeds = list(range(op.seed, op.seed + op.seeds))

    def sampling_of(seed: int) -> Sampling | None:
        return Sampling(op.temperature, op.top_p, seed=seed) if op.temperature > 0 else None

    live_mod.measure(model, spec, comps[0].prompt_ids, 2, seeds[:1], sampling_of, op.verify, stop_ids)  # warm-up
    prompts = {}
    for i, c in enumerate(comps):
        n = op.max_new or max(len(c.output_ids), 1)
        got = live_mod.measure(model, spec, c.prompt_ids, n, seeds, sampling_of, op.verify, stop_ids)
        for s in got["seeds"]:
            s.pop("output_ids")  # tokens are not kept: the numbers are
        prompts[c.prompt_id] = got
        if progress:
            progress(i + 1, len(comps), f"live loop: {c.prompt_id}")
    out = {
        "key": key(op.completions, op.drafter, op.temperature, op.top_p, op.verify),
        "set_name": op.completions,
        "checkpoint": str(Path(op.drafter).resolve()),
        "target": str(op.target),
        "temperature": op.temperature,
        "top_p": op.top_p,
        "verify": op.verify,
        "seeds": seeds,
        "device": device_name(op.device),
        "dtype": op.dtype,
        "backend": backend,
        "block_size": spec.block_size,
        "created": time.time(),
        "summary": summarize(prompts, seeds),
        "prompts": prompts,
    }
    store.set_analysis(LIVE, out["key"], out)
    keys = [out["key"]] + [k for k in store.analysis(LIVE, INDEX) or [] if k != out["key"]]
    store.set_analysis(LIVE, INDEX, keys)
    return out


def summarize(prompts: dict[str, dict], seeds: list[int]) -> dict:
    """The set's numbers: per seed the mean accept length over prompts (its mean and 95% interval over seeds), the
    pooled tokens/s of both decoders (all tokens after the first / all decode seconds) and their ratio."""
    from ..server.live import interval

    per_seed, secs = [], {"plain": 0.0, "spec": 0.0}
    toks = {"plain": 0, "spec": 0}
    for i in range(len(seeds)):
        rows = [p["seeds"][i] for p in prompts.values()]
        acc = [r["accept_length"] for r in rows if r["accept_length"] is not None]
        if acc:
            per_seed.append(sum(acc) / len(acc))
        for r in rows:
            for side, n, rate in (
                ("plain", r["plain_tokens"], r["plain_tokens_s"]),
                ("spec", r["tokens"], r["spec_tokens_s"]),
            ):
                if rate:
                    toks[side] += n - 1
                    secs[side] += (n - 1) / rate
    lo, hi = interval(per_seed)
    plain = toks["plain"] / secs["plain"] if secs["plain"] else None
    spec = toks["spec"] / secs["spec"] if secs["spec"] else None
    return {
        "accept_length": sum(per_seed) / len(per_seed) if per_seed else None,
        "accept_length_lo": lo,
        "accept_length_hi": hi,
        "plain_tokens_s": plain,
        "spec_tokens_s": spec,
        "speedup": spec / plain if plain and spec else None,
        "same_tokens": all(p["same_tokens"] for p in prompts.values()),
    }


def live_for(store: Store, run: Run) -> list[dict]:
    """The kept live results of `run`'s completion set and checkpoint, newest first."""
    want = (run.set_name, str(Path(run.checkpoint or "").resolve()))
    out = []
    for k in store.analysis(LIVE, INDEX) or []:
        got = store.analysis(LIVE, k)
        if got and (got["set_name"], got["checkpoint"]) == want:
            out.append(got)
    return out


def versus(result: dict, rows: dict[str, dict], field: str = "expected_accept_length") -> list[dict]:
    """Per prompt: the live accept length (mean over seeds, its 95% interval), the run's estimate for the prompt
    (its per-prompt `field`: expected_accept_length at the live loop's temperature, or tau), live minus estimate,
    and the tokens/s of both decoders."""
    out = []
    for pid, got in result["prompts"].items():
        est = (rows.get(pid) or {}).get(field)
        live = got["accept_length"]
        out.append(
            {
                "prompt": pid,
                "live": live,
                "live_lo": got["accept_length_lo"],
                "live_hi": got["accept_length_hi"],
                "estimate": est,
                "difference": live - est if live is not None and est is not None else None,
                "plain_tokens_s": got["plain_tokens_s"],
                "spec_tokens_s": got["spec_tokens_s"],
                "speedup": got["speedup"],
            }
        )
    return out
