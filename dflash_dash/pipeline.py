"""The operations users run: import, extract, replay, export. Glue between the pieces and the store.

Contract: each operation takes a `Store` and plain arguments, reports progress through an optional
`progress(done, total, message)` callback and returns plain data. No math, no HTTP details, no SQL here:
the math lives in replay/drafter/target, the SQL in store. Every operation is resumable: work already
recorded in the store is not redone. Replay and export never touch the network.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch

from . import cache, drafter as drafter_mod, prompts as prompts_mod, replay as replay_mod, sglang
from . import target as target_mod
from .store import Store, StoreError, new_id

Progress = Callable[[int, int, str], None] | None
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class InputError(ValueError):
    """Bad user input; the message names the line or field and the fix."""


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions whose message is meant for the user: shown as is (`error: ...`), never a traceback."""
    from .config import ConfigError
    return (InputError, StoreError, drafter_mod.CheckpointError, target_mod.TargetError, cache.CacheError,
            sglang.ServerError, ConfigError)


def _tick(progress: Progress, done: int, total: int, msg: str) -> None:
    if progress:
        progress(done, total, msg)


def features_root(store: Store) -> Path:
    return store.workspace / "features"


# ---------------------------------------------------------------------------
# completions


def parse_jsonl(text: str, vocab_size: int | None = None) -> list[dict]:
    """Validate the completions JSONL format: {"id", "prompt_ids", "output_ids"} (+ "prompt", "output")."""
    out = []
    for n, rec, pid in prompts_mod.records(text, InputError):
        for key in ("prompt_ids", "output_ids"):
            ids = rec.get(key)
            if not isinstance(ids, list) or not ids:
                raise InputError(f"line {n} (id {pid!r}): field '{key}' must be a non-empty list of token ids")
            for t in ids:
                if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                    raise InputError(f"line {n} (id {pid!r}): field '{key}' holds {t!r}, expected ids >= 0")
                if vocab_size is not None and t >= vocab_size:
                    raise InputError(f"line {n} (id {pid!r}): token id {t} in '{key}' is outside the "
                                     f"vocabulary (size {vocab_size})")
        for key in ("prompt", "output"):
            if key in rec and rec[key] is not None and not isinstance(rec[key], str):
                raise InputError(f"line {n} (id {pid!r}): field '{key}' must be a string")
        out.append({"id": pid, "prompt_ids": rec["prompt_ids"], "output_ids": rec["output_ids"],
                    "prompt": rec.get("prompt"), "output": rec.get("output")})
    if not out:
        raise InputError("the file holds no completions (expected one JSON object per line)")
    return out


def import_completions(store: Store, file: str | Path, name: str) -> int:
    """Import a completions JSONL file as set `name`; returns the number of completions."""
    p = Path(file)
    if not p.is_file():
        raise InputError(f"{file}: no such file")
    recs = parse_jsonl(p.read_text())
    store.add_set(name, str(p.resolve()))
    for i, r in enumerate(recs):
        store.add_completion(name, r | {"idx": i, "finish_reason": "imported"})
    return len(recs)


def export_completions(store: Store, name: str) -> list[dict]:
    rows = store.completions(name)
    if not rows:
        raise StoreError(f"no completion set named {name!r} (see the Completions page or `extractions`)")
    return [{"id": r["prompt_id"], "prompt_ids": r["prompt_ids"], "output_ids": r["output_ids"],
             "prompt": r["prompt"], "output": r["output"]} for r in rows]


def load_tokenizer(path: str | Path):
    """A local tokenizer folder via transformers (never downloads); raises InputError naming the folder."""
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # noqa: BLE001  (any loading failure is the folder's)
        raise InputError(f"--tokenizer {path}: cannot load a tokenizer there ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}); point it at the target's folder") from None


def fetch(store: Store, server: str, prompt_set: str, name: str, max_new_tokens: int = 256, chat: bool = False,
          tokenizer: str | None = None, enable_thinking: bool = False, progress: Progress = None,
          readiness_timeout: float = 600.0, request_timeout: float = 600.0) -> int:
    """Greedy completions of `prompt_set` (built-in name or JSONL file) from the SGLang server at `server`,
    stored as set `name`, each committed as it arrives; prompts already in the set are skipped, so an
    interrupted fetch continues when run again. Returns how many completions were fetched now.

    Prompts are tokenised locally (tokenizer from `tokenizer` or the server's readable `tokenizer_path`;
    with `chat`, wrapped in its chat template) and sent as `input_ids`; token ids come from the server."""
    try:
        todo_all = prompts_mod.load(prompt_set)
    except prompts_mod.PromptSetError as e:
        raise InputError(str(e)) from None
    if max_new_tokens < 1:
        raise InputError(f"--max-new-tokens {max_new_tokens}: must be at least 1")
    done = store.completion_ids(name)
    order = {p["id"]: i for i, p in enumerate(todo_all)}
    todo = [p for p in todo_all if p["id"] not in done]
    n = len(todo_all)
    if not todo:
        _tick(progress, n, n, f"set {name!r} already holds all {n} prompts of {prompt_set}")
        return 0
    try:
        client = sglang.Client(server, timeout=request_timeout)
    except ValueError as e:
        raise InputError(f"--server: {e}") from None
    client.wait_ready(readiness_timeout, progress=lambda t, state: _tick(
        progress, len(done), n, f"waiting for {server}/health: {state} ({t:.0f} s)"))
    info = client.model_info()
    model_path = info.get("model_path")
    earlier = {r["model_path"] for r in store.completions(name)} - {None}
    if earlier and model_path not in earlier:
        raise InputError(f"set {name!r} was fetched from model {sorted(earlier)[0]} but {server} serves "
                         f"{model_path}; use another --name")
    tok = None
    if any("prompt_ids" not in p for p in todo):
        tok_dir = tokenizer or info.get("tokenizer_path")
        if tokenizer:
            tok = load_tokenizer(tokenizer)
        elif tok_dir and Path(tok_dir).is_dir():
            tok = load_tokenizer(tok_dir)
        if chat and tok is None:
            raise InputError(f"--chat needs the target's tokenizer here to apply its chat template; the server's "
                             f"tokenizer_path {tok_dir!r} is not a readable folder: pass --tokenizer DIR")
    store.add_set(name, prompt_set if prompt_set in prompts_mod.SETS else str(Path(prompt_set).resolve()))
    fetched = 0
    for p in todo:
        _tick(progress, len(done) + fetched, n, f"fetching {p['id']}")
        ids = p.get("prompt_ids")
        if ids is None and tok is not None:
            ids = (sglang.chat_ids(tok, p["prompt"], enable_thinking) if chat
                   else list(tok(p["prompt"])["input_ids"]))
        try:
            res = (client.generate(input_ids=ids, max_new_tokens=max_new_tokens) if ids is not None
                   else client.generate(text=p["prompt"], max_new_tokens=max_new_tokens))
        except sglang.ServerError as e:
            kept = len(done) + fetched
            raise sglang.ServerError(
                f"prompt {p['id']!r}: {e}. The {kept} completions fetched so far are kept in set {name!r}; "
                "run the same fetch again to continue", status=e.status, transient=e.transient,
                detail=e.detail) from None
        meta = res["meta_info"]
        if ids is None:
            ids = meta.get("input_ids")
            if not isinstance(ids, list) or not ids:
                raise InputError(f"prompt {p['id']!r}: no tokenizer is readable here and the server did not "
                                 "report the prompt's token ids; pass --tokenizer DIR (the target's folder)")
        fin = meta.get("finish_reason")
        store.add_completion(name, {
            "id": p["id"], "idx": order[p["id"]], "prompt": p.get("prompt"), "output": res["text"],
            "prompt_ids": ids, "output_ids": res["output_ids"],
            "finish_reason": fin.get("type") if isinstance(fin, dict) else fin, "meta_info": meta,
            "request": res["request"], "model_path": model_path})
        fetched += 1
    _tick(progress, n, n, f"fetched {fetched} completions into set {name!r}")
    return fetched


# ---------------------------------------------------------------------------
# extraction


def layer_ids_of(drafter: str | None, layers: str | list[int] | None) -> list[int]:
    """Layer ids from a drafter checkpoint or an explicit '1,16,31' list."""
    if layers:
        if isinstance(layers, list):
            return layers
        try:
            return [int(x) for x in layers.split(",") if x.strip()]
        except ValueError:
            raise InputError(f"--layers {layers!r}: expected comma-separated integers like 1,16,31") from None
    if drafter:
        return drafter_mod.read_config(drafter).target_layer_ids
    raise InputError("give --drafter CKPT (its layer ids are used) or --layers 1,16,31")


def extract(store: Store, target: str, set_name: str, layer_ids: list[int], device: str = "cpu",
            dtype: str = "float32", extraction_id: str | None = None, progress: Progress = None) -> str:
    """Extract features of every completion of `set_name`; resumes `extraction_id` when it exists, else
    creates the extraction under that id (a job records its id before starting)."""
    info = target_mod.describe(target)
    target_mod.check_layers(info, layer_ids)
    if dtype not in DTYPES:
        raise InputError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device on this machine; use --device cpu")
    rows = store.completions(set_name)
    if not rows:
        raise StoreError(f"no completions in set {set_name!r}; import or fetch them first")
    _tick(progress, 0, len(rows), f"loading target {info.path}")
    model, backend = target_mod.load(info.path, layer_ids, device, DTYPES[dtype])
    vers = target_mod.versions()
    done: set[str] = set()
    if extraction_id and any(e["id"] == extraction_id for e in store.extractions()):
        e = store.extraction(extraction_id)
        if e["layer_ids"] != layer_ids or e["target_path"] != info.path:
            raise InputError(f"extraction {extraction_id} used other layers or another target; start a new one")
        done = {r["prompt_id"] for r in store.items(extraction_id)}
    else:
        extraction_id = extraction_id or new_id("ex")
        store.add_extraction(dict(id=extraction_id, set_name=set_name, target_path=info.path, layer_ids=layer_ids,
                                  hidden_size=info.hidden_size, device=device, dtype=dtype, backend=backend,
                                  versions=vers | {"fla_bound": backend == "fla"}, config_hash=info.config_hash))
    meta = dict(extraction=extraction_id, target=info.path, config_hash=info.config_hash, layer_ids=layer_ids,
                device=device, dtype=dtype, backend=backend, **vers)
    def todo():  # (key, ids) of the prompts left, checked one by one as the extraction reaches them
        for i, r in enumerate(rows):
            if r["prompt_id"] in done:
                continue
            ids = torch.tensor(r["prompt_ids"] + r["output_ids"])
            if int(ids.max()) >= info.vocab_size:
                raise InputError(f"prompt {r['prompt_id']!r}: token id {int(ids.max())} is outside the target's "
                                 f"vocabulary ({info.vocab_size}); wrong target for this completion set?")
            yield (i, r["prompt_id"], len(ids)), ids

    def write(key, feats):
        return cache.write(features_root(store), extraction_id, key[1], feats, meta)

    # device forwards overlap the previous prompts' copies and file writes (target.extract_stream)
    for (i, pid, n), f in target_mod.extract_stream(model, todo(), layer_ids, write):
        store.add_item(extraction_id, pid, n, str(f))
        _tick(progress, i + 1, len(rows), f"extracted {pid} ({n} tokens)")
    store.set_status("extractions", extraction_id, "done")
    return extraction_id


# ---------------------------------------------------------------------------
# replay


def load_sequences(store: Store, extraction: dict) -> list[replay_mod.Sequence]:
    """Token ids from the store plus validated features from the cache (no network)."""
    comps = {r["prompt_id"]: r for r in store.completions(extraction["set_name"])}
    width = len(extraction["layer_ids"]) * extraction["hidden_size"]
    seqs = []
    for it in sorted(store.items(extraction["id"]), key=lambda r: comps[r["prompt_id"]]["idx"]):
        c = comps[it["prompt_id"]]
        tokens = torch.tensor(c["prompt_ids"] + c["output_ids"])
        if len(tokens) != it["tokens"]:
            raise StoreError(f"prompt {c['prompt_id']!r}: the completion has {len(tokens)} tokens but extraction "
                             f"{extraction['id']} has {it['tokens']}; re-extract")
        feats = cache.read(features_root(store), extraction["id"], c["prompt_id"], len(tokens), width)
        seqs.append(replay_mod.Sequence(c["prompt_id"], tokens, len(c["prompt_ids"]), feats))
    return seqs


def check_drafter(cfg: drafter_mod.DrafterConfig, extraction: dict, info: target_mod.TargetInfo) -> None:
    drafter_mod.check_target(cfg, info.hidden_size, info.vocab_size, info.num_layers)
    if cfg.target_layer_ids != extraction["layer_ids"]:
        raise InputError(f"the drafter reads target layers {cfg.target_layer_ids} but extraction "
                         f"{extraction['id']} holds layers {extraction['layer_ids']}; extract again with "
                         f"--drafter pointing at this checkpoint")


def replay(store: Store, drafter: str, extraction: str = "latest", budget: int = 8, device: str = "cpu",
           dtype: str = "float32", chunk: int = 64, name: str | None = None, progress: Progress = None) -> dict:
    """Replay a checkpoint over a cached extraction; stores the run; returns {"id", "summary"}."""
    ex = store.extraction(extraction)
    if ex["status"] != "done":
        raise InputError(f"extraction {ex['id']} is {ex['status']}, not done; finish it (re-extract) first")
    info = target_mod.describe(ex["target_path"])
    cfg = drafter_mod.read_config(drafter)
    check_drafter(cfg, ex, info)
    _tick(progress, 0, 1, f"loading drafter {drafter}")
    d = drafter_mod.load(drafter, DTYPES[dtype], device)
    head = target_mod.load_head(ex["target_path"], device, DTYPES[dtype])
    seqs = load_sequences(store, ex)
    results, summary = replay_mod.run(
        d, head, seqs, budget=budget, chunk=chunk,
        progress=lambda i, n: _tick(progress, i, n, f"replayed {seqs[i - 1].id}"))
    summary |= {"backend": ex["backend"], "extraction": ex["id"]}
    run_id = new_id("run")
    raw_cfg = json.loads((Path(drafter) / "config.json").read_text())
    store.add_run(dict(id=run_id, extraction_id=ex["id"], checkpoint=str(Path(drafter).resolve()),
                       name=name or Path(drafter).resolve().name, config=raw_cfg, tree_budget=budget,
                       summary=summary, device=device, dtype=dtype),
                  [dict(asdict(r), tau=r.tau, tree_tau=r.tree_tau, drafts=[t for row in r.drafts for t in row])
                   for r in results])
    return {"id": run_id, "summary": summary}


def checkpoints_in(folder: str | Path) -> list[Path]:
    """Checkpoint folders under `folder` (itself included): SpecForge `epoch_E_step_S/` or any folder with a
    config.json, ordered by (epoch, step) where the name has them, else by path."""
    import re
    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"--checkpoints {folder}: no such folder (point at a training output folder)")
    found = sorted({f.parent.resolve() for f in root.rglob("config.json")})
    if not found:
        raise InputError(f"{folder}: no checkpoint inside (expected epoch_E_step_S/ folders with config.json)")

    def key(p: Path):
        m = re.search(r"epoch_(\d+)_step_(\d+)", p.name)
        return (0, int(m.group(1)), int(m.group(2)), str(p)) if m else (1, 0, 0, str(p))
    return sorted(found, key=key)


def sweep(store: Store, checkpoints: str, extraction: str = "latest", progress: Progress = None,
          **replay_args) -> list[str]:
    """Replay every checkpoint found under `checkpoints` on one extraction; returns run ids in step order.
    A checkpoint already replayed on this extraction is not replayed again (its latest run id is returned)."""
    ex = store.extraction(extraction)
    cks = checkpoints_in(checkpoints)
    have = {r["checkpoint"]: r["id"] for r in store.runs() if r["extraction_id"] == ex["id"]}
    ids = []
    for i, ck in enumerate(cks):
        _tick(progress, i, len(cks), f"checkpoint {i + 1}/{len(cks)}: {ck.name}")
        if str(ck) in have:
            ids.append(have[str(ck)])
            continue
        ids.append(replay(store, str(ck), ex["id"], **replay_args)["id"])
    _tick(progress, len(cks), len(cks), f"replayed {len(cks)} checkpoints")
    return ids


# ---------------------------------------------------------------------------
# export


def export(store: Store, run: str = "latest") -> dict:
    """A run as JSON-able data: run row, summary and per-prompt results (store only, no network)."""
    r = store.run_row(run)
    prompts = store.run_prompts(r["id"])
    order = {c["prompt_id"]: c["idx"] for c in store.completions(store.extraction(r["extraction_id"])["set_name"])}
    prompts.sort(key=lambda p: order.get(p["prompt_id"], 0))
    return {
        "run": {k: (str(v) if k == "created" else v) for k, v in r.items() if k != "summary"},
        "summary": r["summary"],
        "prompts": [{"id": p["prompt_id"], "tau": p["tau"], "prompt_len": p["prompt_len"], "rounds": p["rounds"],
                     "accepted_at": p["accepted_at"], "ddtree_tau": p["tree_tau"], "ddtree_rounds": p["tree_rounds"]}
                    for p in prompts],
    }


def listing(store: Store, what: str) -> list[dict]:
    """`runs` / `extractions` listings for scripts."""
    if what == "runs":
        return [{"id": r["id"], "checkpoint": r["checkpoint"], "name": r["name"], "extraction": r["extraction_id"],
                 "completions": r["set_name"], "backend": r["backend"], "created": str(r["created"]),
                 "summary": {k: r["summary"].get(k) for k in ("tau_macro", "tau_pooled", "every_anchor_tau",
                                                              "ddtree_tau")}} for r in store.runs()]
    return [{"id": e["id"], "target": e["target_path"], "completions": e["set_name"], "backend": e["backend"],
             "device": e["device"], "dtype": e["dtype"], "layer_ids": e["layer_ids"], "status": e["status"],
             "prompts": e["prompts"], "created": str(e["created"]), "versions": e["versions"]}
            for e in store.extractions()]
