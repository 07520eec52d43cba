"""The live loop: the stand-in's own speculative decoder timed against plain decoding of the same target, at a
temperature, over seeds (the exact answer the teacher-forced `tau_expected` approximates).

Contract: `plain(model, ids, max_new, stop, sampling)` decodes one token per target forward with the KV cache (the
draw for the token at position n seeded by (seed, n), as the stand-in's Engine.plain); `measure(model, spec, ids,
...)` decodes one prompt both ways for each seed and returns per-seed numbers and their means:
  - accept length = tokens committed by verify steps / verify steps = (completion tokens - 1) / steps: the
    replay's tau of the decoded trace (the prefill's token is in neither side; the last step is cut at max_new or
    a stop, as the replay caps its last round). SGLang's spec_accept_length counts the prefill token too.
  - tokens/s = (completion tokens - 1) / seconds after the first token (the prefill, paid once by both decoders,
    left out of both, as `costs.speedup` leaves it out); speedup = plain seconds per token / speculative's.
  - `same`: with the target-sample rule (and greedy) the speculative tokens equal plain's for the same seed, which
    is checked per seed; with `rejection` they are only distributed alike.
`interval(values)` is the Student-t 95% interval of a mean over seeds (the unit of the live loop's luck).
Times are wall-clock with the device synchronised (each decoder reads its tokens back to the host every step).
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable

import torch

from .sampler import Sampling
from .specdec import Speculator

# Student-t 97.5% quantiles for 1..30 degrees of freedom (two-sided 95%); 1.96 beyond
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045,
        2.042)  # fmt: skip


def interval(values: list[float]) -> tuple[float | None, float | None]:
    """Student-t 95% interval of the mean of `values` (None, None for fewer than two)."""
    n = len(values)
    if n < 2:
        return None, None
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    h = (T975[n - 2] if n - 1 <= len(T975) else 1.96) * sd / math.sqrt(n)
    return m - h, m + h


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def plain(
    model, ids: list[int], max_new: int, stop: Callable[[list[int]], bool], sampling: Sampling | None = None
) -> tuple[list[int], float]:
    """Plain decoding with the KV cache: (output ids, perf_counter time when the first token was known)."""
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    dev = model.device
    out: list[int] = []
    res = model(input_ids=torch.tensor([ids], device=dev), use_cache=True, logits_to_keep=1)
    first_at = 0.0
    while True:
        last = res.logits[0, -1:]
        tok = int(last[0].argmax()) if sampling is None else sampling.pick(last, [len(ids) + len(out)])[0]
        out.append(tok)
        if len(out) == 1:
            first_at = time.perf_counter()
        if stop(out) or len(out) >= max_new:
            return out, first_at
        cache = getattr(res, "cache", None)
        cache = res.past_key_values if cache is None else cache
        res = model(input_ids=torch.tensor([[tok]], device=dev), use_cache=True, **{kw: cache})


def measure(
    model,
    spec: Speculator,
    ids: list[int],
    max_new: int,
    seeds: list[int | None],
    sampling_of: Callable[[int | None], Sampling | None],
    rule: str = "target-sample",
    stop_ids: set[int] | frozenset = frozenset(),
) -> dict:
    """One prompt decoded plainly and speculatively for each seed (`sampling_of(seed)`: its Sampling, None for
    greedy): per-seed accept length, tokens/s of both, speedup, tokens and whether they match; and their means."""
    dev = model.device

    def stop(out: list[int]) -> bool:
        return out[-1] in stop_ids

    seeds_out = []
    for seed in seeds:
        sampling = sampling_of(seed)
        _sync(dev)
        p_out, p_first = plain(model, ids, max_new, stop, sampling)
        _sync(dev)
        p_end = time.perf_counter()
        s_out, _, counters = spec.decode(
            model, ids, max_new, lambda o: {"type": "stop"} if stop(o) else None, sampling, rule
        )
        _sync(dev)
        s_end = time.perf_counter()
        steps = counters.verify_ct
        seeds_out.append(
            {
                "seed": seed,
                "tokens": len(s_out),
                "plain_tokens": len(p_out),
                "steps": steps,
                "accept_length": (len(s_out) - 1) / steps if steps else None,
                "plain_tokens_s": _rate(len(p_out), p_end - p_first),
                "spec_tokens_s": _rate(len(s_out), s_end - counters.first_at),
                "same": s_out == p_out,
                "output_ids": s_out,
            }
        )
    return summarize(seeds_out)


def _rate(n: int, seconds: float) -> float | None:
    """Tokens after the first per second (None when only the first token was decoded)."""
    return (n - 1) / seconds if n > 1 and seconds > 0 else None


def summarize(seeds: list[dict]) -> dict:
    """Means over seeds (of the seeds that have each number) and the accept length's 95% interval."""

    def mean(key):
        vals = [s[key] for s in seeds if s[key] is not None]
        return sum(vals) / len(vals) if vals else None

    acc = [s["accept_length"] for s in seeds if s["accept_length"] is not None]
    lo, hi = interval(acc)
    plain_s, spec_s = mean("plain_tokens_s"), mean("spec_tokens_s")
    return {
        "accept_length": mean("accept_length"),
        "accept_length_lo": lo,
        "accept_length_hi": hi,
        "plain_tokens_s": plain_s,
        "spec_tokens_s": spec_s,
        "speedup": spec_s / plain_s if plain_s and spec_s else None,
        "same_tokens": all(s["same"] for s in seeds),
        "seeds": seeds,
    }
