"""What a completion set's stored requests asked for, read in each engine's own fields: its length and how it was
sampled (greedy, or temperature / top-p / seed), per request and as one line per set.

Contract: `sent_settings(engine, request)` reads one stored completion's request through its engine's `read_request`
(SGLang's sampling_params.*, vLLM's and llama.cpp's top-level fields); `sampling_key` turns those settings (or a fetch's
`ops.Fetch`, `op_key`) into a comparable key: ("greedy",) or ("sampled", T, top-p, seed), None when the request does not
say; `describe(key)` words it ("greedy", "sampled at T=0.7, top-p 0.95, seed 1"); `set_sampling(store, name)` is the
set's line for the pages ("imported: sampling not recorded" for a set without requests, "mixed: ..." when its requests
differ). Each request keeps its own body, so nothing here is stored twice.
"""

from __future__ import annotations

from .. import engines, ops
from ..store import Store

GREEDY_T = 1e-6  # a temperature at or below this is greedy (SGLang's _SAMPLING_EPS; llama.cpp: <= 0)


def sent_settings(engine: str | None, request: dict | None) -> dict | None:
    """What a stored completion's `request` asked for, read in the fields of the `engine` it came from
    (`EngineClient.read_request`: max_new_tokens, temperature, top_p, seed, prompt_ids); None for a completion
    without a request (an imported set) or from an engine this version does not know."""
    client = engines.ENGINES.get(engine or engines.DEFAULT_ENGINE)
    return client.read_request(request) if client is not None and request else None


def field_names(used: list[str | None], key: str) -> str:
    """Where the set's engines (`used`: each completion's) keep setting `key` in their requests, for a message:
    e.g. " (llamacpp's n_predict)"."""
    names = sorted({e or engines.DEFAULT_ENGINE for e in used} & set(engines.ENGINES))
    said = [f"{n}'s {engines.spec(n).request_fields[key][0]}" for n in names if key in engines.spec(n).request_fields]
    return f" ({', '.join(said)})" if said else ""


def sampling_key(settings: dict | None) -> tuple | None:
    """("greedy",) or ("sampled", temperature, top_p, seed) from `read_request`'s settings; None when unknown."""
    t = (settings or {}).get("temperature")
    if t is None:
        return None
    if t <= GREEDY_T:
        return ("greedy",)
    top_p = settings.get("top_p")
    seed = settings.get("seed")
    return ("sampled", float(t), 1.0 if top_p is None else float(top_p), None if seed is None else int(seed))


def op_key(op: ops.Fetch) -> tuple:
    """The sampling key a fetch sends (`sampling_key`'s shape)."""
    return ("greedy",) if op.temperature <= GREEDY_T else ("sampled", op.temperature, op.top_p, op.seed)


def describe(key: tuple | None) -> str:
    """A sampling key in words: "greedy", "sampled at T=0.7, top-p 0.95, seed 1" (no seed: "no seed, not
    reproducible"), or "sampling not recorded"."""
    if key is None:
        return "sampling not recorded"
    if key[0] == "greedy":
        return "greedy"
    _, t, p, seed = key
    cut = f", top-p {p:g}" if p < 1 else ""
    return f"sampled at T={t:g}{cut}, " + ("no seed (not reproducible)" if seed is None else f"seed {seed}")


def set_sampling(store: Store, name: str) -> str:
    """How set `name` was sampled, in words: one `describe` line when its requests agree, "mixed: A; B" when they
    differ, "imported: sampling not recorded" when none has a request."""
    keys = {sampling_key(sent_settings(r["engine"], r["request"])) for r in store.completion_requests(name)} - {None}
    if not keys:
        return "imported: sampling not recorded"
    said = sorted(describe(k) for k in keys)
    return said[0] if len(said) == 1 else "mixed: " + "; ".join(said)
