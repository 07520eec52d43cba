"""The operations users run: import, extract, replay, export. Glue between the pieces and the store.

Contract: each operation takes a `Store` and plain arguments whose defaults are those of its `ops` dataclass
(`perform(store, op)` runs one given as that dataclass), reports progress through an optional
`progress(done, total, message)` callback and returns plain data. No math, no HTTP details, no SQL here:
the math lives in replay/drafter/target, the SQL in store. Every operation is resumable: work already
recorded in the store is not redone. Replay and export never touch the network.
Extract and replay (so sweep) split into a parent part (validate, then record in the store: only this process
writes it) and a per-prompt part, `work`, run over a list of prompt ids; a `runner` (jobs.workers) runs that part
in one worker process per GPU and streams its events back, so N workers give the same results as one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from . import engines, lazy, metrics, ops
from . import prompts as prompts_mod
from .errors import UserError
from .store import Store, StoreError, new_id

if TYPE_CHECKING:  # the torch-backed modules load on first use: the store-only listings never import torch
    import torch

    from . import cache
    from . import drafters as drafter_mod
    from . import replay as replay_mod
    from . import target as target_mod
else:
    torch, cache, drafter_mod, replay_mod, target_mod = map(
        lazy.module, ("torch", "dflash_dash.cache", "dflash_dash.drafters", "dflash_dash.replay", "dflash_dash.target")
    )

Progress = Callable[[int, int, str], None] | None
# The per-prompt part of an operation, run over a list of prompt ids: (kind, args, prompt ids, progress) ->
# events (`work`). None: here, in this process; jobs.workers shards the ids over worker processes.
Runner = Callable[[str, dict, list, Progress], Iterator[dict]]
F, E, R, S = ops.Fetch, ops.Extract, ops.Replay, ops.Sweep  # defaults of the signatures below come from the ops


class _Dtypes(dict):
    """dtype name -> torch dtype; the names alone (CLI choices, validation) need no torch."""

    def __getitem__(self, name: str):
        return getattr(torch, dict.__getitem__(self, name))


DTYPES = _Dtypes(float32="float32", bfloat16="bfloat16")


class InputError(UserError, ValueError):
    """Bad user input; the message names the line or field and the fix."""


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
                    raise InputError(
                        f"line {n} (id {pid!r}): token id {t} in '{key}' is outside the vocabulary (size {vocab_size})"
                    )
        for key in ("prompt", "output"):
            if key in rec and rec[key] is not None and not isinstance(rec[key], str):
                raise InputError(f"line {n} (id {pid!r}): field '{key}' must be a string")
        out.append(
            {
                "id": pid,
                "prompt_ids": rec["prompt_ids"],
                "output_ids": rec["output_ids"],
                "prompt": rec.get("prompt"),
                "output": rec.get("output"),
            }
        )
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
    store.add_completions(name, [r | {"idx": i, "finish_reason": "imported"} for i, r in enumerate(recs)])
    return len(recs)


def import_features(
    store: Store,
    set_name: str,
    target: str | Path,
    layer_ids: list[int],
    source: str | Path,
    completions: list[dict],
    meta: dict,
    versions: dict,
    progress: Progress = None,
) -> tuple[str, list[str]]:
    """Import features extracted elsewhere (another machine's feature cache under `source`, `cache` layout) as
    a new extraction of `set_name`: `completions` are the source's {"id", "prompt_ids", "output_ids"}, `meta`
    its features' provenance (backend, device, dtype, config_hash, ...). Only completions whose ids equal the
    set's are imported (the features belong to those ids). Returns (extraction id, mismatched prompt ids);
    InputError when the source's target differs (config hash) or no completion matches."""
    info = target_mod.describe(target)
    if meta.get("config_hash") != info.config_hash:
        raise InputError(
            f"the features under {source} were extracted from a target whose config hash is "
            f"{meta.get('config_hash')}, but {target} has {info.config_hash}; extract them again with "
            "this target"
        )
    rows = {r["prompt_id"]: r for r in store.completions(set_name)}
    ex_id = new_id("ex")
    store.add_extraction(
        dict(
            id=ex_id,
            set_name=set_name,
            target_path=str(target),
            layer_ids=list(layer_ids),
            hidden_size=info.hidden_size,
            device=meta.get("device", "cuda"),
            dtype=meta.get("dtype", "float32"),
            backend=meta.get("backend", "fla"),
            versions=versions,
            config_hash=info.config_hash,
        )
    )
    width, bad = len(layer_ids) * info.hidden_size, []
    for i, c in enumerate(completions):
        row = rows.get(c["id"])
        if row is None or row["prompt_ids"] != c["prompt_ids"] or row["output_ids"] != c["output_ids"]:
            bad.append(c["id"])
            continue
        n = len(c["prompt_ids"]) + len(c["output_ids"])
        feats = cache.read(Path(source), "features", c["id"], n, width)
        f = cache.write(features_root(store), ex_id, c["id"], feats, meta | {"extraction": ex_id})
        store.add_item(ex_id, c["id"], n, str(f))
        _tick(progress, i + 1, len(completions), f"imported features of {c['id']} ({n} tokens)")
    if len(bad) == len(completions):
        store.set_status("extractions", ex_id, "failed")
        raise InputError(
            f"none of the {len(completions)} completions under {source} equals one of set "
            f"{set_name!r} (ids, prompt and output tokens), so their features belong to none"
        )
    store.set_status("extractions", ex_id, "done")
    return ex_id, bad


def export_completions(store: Store, name: str) -> list[dict]:
    rows = store.completions(name)
    if not rows:
        raise StoreError(f"no completion set named {name!r} (see the Completions page or `extractions`)")
    return [
        {
            "id": r["prompt_id"],
            "prompt_ids": r["prompt_ids"],
            "output_ids": r["output_ids"],
            "prompt": r["prompt"],
            "output": r["output"],
        }
        for r in rows
    ]


def load_tokenizer(path: str | Path):
    """A local tokenizer folder via transformers (never downloads); raises InputError naming the folder."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # noqa: BLE001  (any loading failure is the folder's)
        raise InputError(
            f"--tokenizer {path}: cannot load a tokenizer there ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); point it at the target's folder"
        ) from None


def hub_cache_dir() -> Path:
    """The local Hugging Face hub cache as huggingface_hub resolves it, read from the environment now:
    HF_HUB_CACHE, else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    import os

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return Path(home).expanduser() / "hub"


def hub_snapshot(repo_id: str) -> Path | None:
    """The snapshot folder of hub model `repo_id` (e.g. "Qwen/Qwen3-8B", as a server's tokenizer_path may be)
    in the local Hugging Face cache, looked up offline (local_files_only, as with HF_HUB_OFFLINE=1: nothing is
    downloaded); None when it is not cached or `repo_id` is not a hub id."""
    import re

    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", repo_id) or repo_id.startswith(".") or Path(repo_id).exists():
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, cache_dir=str(hub_cache_dir()), local_files_only=True))
    except Exception:  # noqa: BLE001  (not cached, not a valid id, no huggingface_hub: not found here)
        return None


def _no_tokenizer(tok_dir: str | None) -> str:
    """Why no tokenizer was found for the server's tokenizer_path `tok_dir`, and what to do."""
    if not tok_dir:
        return "the server reports no tokenizer_path: pass --tokenizer DIR (the target's folder)"
    return (
        f"the server's tokenizer_path {tok_dir!r} is neither a folder here nor a Hugging Face hub id in the "
        f"local cache {hub_cache_dir()} (looked up offline; nothing is downloaded): pass --tokenizer DIR (the "
        "target's folder), or put the model in that cache (`huggingface-cli download ID` where there is "
        "network, with HF_HOME or HF_HUB_CACHE pointing at the cache)"
    )


def fetch(
    store: Store,
    server: str,
    prompt_set: str,
    name: str,
    max_new_tokens: int = F.max_new_tokens,
    chat: bool = F.chat,
    tokenizer: str | None = F.tokenizer,
    enable_thinking: bool = F.enable_thinking,
    progress: Progress = None,
    readiness_timeout: float = 600.0,
    request_timeout: float = 600.0,
) -> int:
    """Greedy completions of `prompt_set` (built-in name or JSONL file) from the SGLang server at `server`,
    stored as set `name`, each committed as it arrives; prompts already in the set are skipped, so an
    interrupted fetch continues when run again. Returns how many completions were fetched now.

    Prompts are tokenised locally (tokenizer from `tokenizer` or the server's `tokenizer_path`: a readable
    folder, or a hub id found in the local Hugging Face cache; with `chat`, wrapped in its chat template) and
    sent as `input_ids`; token ids come from the server. The server's API key comes from the environment
    (`engines.for_workspace`), never from the store."""
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
    from . import config as config_mod

    try:
        client = engines.for_workspace(config_mod.load(store.workspace), server, timeout=request_timeout)
    except ValueError as e:
        raise InputError(f"--server: {e}") from None
    client.wait_ready(
        readiness_timeout,
        progress=lambda t, state: _tick(progress, len(done), n, f"waiting for {server}/health: {state} ({t:.0f} s)"),
    )
    info = client.model_info()
    model_path = info.get("model_path")
    earlier = {r["model_path"] for r in store.completions(name)} - {None}
    if earlier and model_path not in earlier:
        raise InputError(
            f"set {name!r} was fetched from model {sorted(earlier)[0]} but {server} serves "
            f"{model_path}; use another --name"
        )
    tok = None
    if any("prompt_ids" not in p for p in todo):
        tok_dir = tokenizer or info.get("tokenizer_path")
        if tokenizer:  # a folder, or a hub id in the local cache
            tok = load_tokenizer(tokenizer if Path(tokenizer).is_dir() else (hub_snapshot(tokenizer) or tokenizer))
        elif tok_dir and Path(tok_dir).is_dir():
            tok = load_tokenizer(tok_dir)
        elif tok_dir and (snap := hub_snapshot(tok_dir)) is not None:
            _tick(progress, len(done), n, f"tokenizer {tok_dir} from the local Hugging Face cache: {snap}")
            tok = load_tokenizer(snap)
        if chat and tok is None:
            raise InputError(
                f"--chat needs the target's tokenizer here to apply its chat template; {_no_tokenizer(tok_dir)}"
            )
    store.add_set(name, prompt_set if prompt_set in prompts_mod.SETS else str(Path(prompt_set).resolve()))
    fetched = 0
    for p in todo:
        _tick(progress, len(done) + fetched, n, f"fetching {p['id']}")
        ids = p.get("prompt_ids")
        if ids is None and tok is not None:
            ids = engines.chat_ids(tok, p["prompt"], enable_thinking) if chat else list(tok(p["prompt"])["input_ids"])
        try:
            res = (
                client.generate(input_ids=ids, max_new_tokens=max_new_tokens)
                if ids is not None
                else client.generate(text=p["prompt"], max_new_tokens=max_new_tokens)
            )
        except engines.ServerError as e:
            kept = len(done) + fetched
            raise engines.ServerError(
                f"prompt {p['id']!r}: {e}. The {kept} completions fetched so far are kept in set {name!r}; "
                "run the same fetch again to continue",
                status=e.status,
                transient=e.transient,
                detail=e.detail,
            ) from None
        meta = res["meta_info"]
        if ids is None:
            ids = meta.get("input_ids")
            if not isinstance(ids, list) or not ids:
                raise InputError(
                    f"prompt {p['id']!r}: no tokenizer is readable here and the server did not "
                    f"report the prompt's token ids; {_no_tokenizer(tok_dir)}"
                )
        fin = meta.get("finish_reason")
        record_engine_stats(store, name, p["id"], meta, len(res["output_ids"]), server)  # before: a rerun redoes both
        store.add_completion(
            name,
            {
                "id": p["id"],
                "idx": order[p["id"]],
                "prompt": p.get("prompt"),
                "output": res["text"],
                "prompt_ids": ids,
                "output_ids": res["output_ids"],
                "finish_reason": fin.get("type") if isinstance(fin, dict) else fin,
                "meta_info": meta,
                "request": res["request"],
                "model_path": model_path,
            },
        )
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


def extract(
    store: Store,
    target: str,
    set_name: str,
    layer_ids: list[int],
    device: str = E.device,
    dtype: str = E.dtype,
    extraction_id: str | None = E.extraction_id,
    progress: Progress = None,
    runner: Runner | None = None,
) -> str:
    """Extract features of every completion of `set_name`; resumes `extraction_id` when it exists (its items are
    kept, only the missing prompts are extracted), else creates the extraction under that id (a job records its
    id before starting). The per-prompt work (`work`, kind "extract") runs here, or through `runner` (one worker
    process per GPU, each with its own `device`); either way this process alone writes the store: the record
    when the first worker reports the backend it bound, then each item as its feature file is written."""
    info = target_mod.describe(target)
    target_mod.check_layers(info, layer_ids)
    if dtype not in DTYPES:
        raise InputError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device on this machine; use --device cpu")
    rows = store.completions(set_name)
    if not rows:
        raise StoreError(f"no completions in set {set_name!r}; import or fetch them first")
    done: set[str] = set()
    exists = bool(extraction_id) and any(e["id"] == extraction_id for e in store.extractions())
    if exists:
        e = store.extraction(extraction_id)
        if e["layer_ids"] != layer_ids or e["target_path"] != info.path:
            raise InputError(f"extraction {extraction_id} used other layers or another target; start a new one")
        done = {r["prompt_id"] for r in store.items(extraction_id)}
        store.set_status("extractions", extraction_id, "running")
    extraction_id = extraction_id or new_id("ex")
    todo = [r["prompt_id"] for r in rows if r["prompt_id"] not in done]
    args = dict(
        target=info.path, set_name=set_name, layer_ids=layer_ids, device=device, dtype=dtype, extraction=extraction_id
    )

    def shifted(d: int, t: int, msg: str) -> None:  # the work counts this run's prompts; show the set's
        _tick(progress, len(done) + d, len(done) + t, msg)

    bound = None
    try:
        for ev in (runner or here(store))("extract", args, todo, shifted):
            if "backend" in ev:  # a worker loaded the target: record the extraction with what it bound
                if bound is not None and ev["backend"] != bound:
                    raise InputError(
                        f"the workers bound different kernel backends ({bound} and {ev['backend']} "
                        f"on {ev['device']}); extract on devices of one kind"
                    )
                bound = ev["backend"]
                if not exists:
                    store.add_extraction(
                        dict(
                            id=extraction_id,
                            set_name=set_name,
                            target_path=info.path,
                            layer_ids=layer_ids,
                            hidden_size=info.hidden_size,
                            device=ev["device"],
                            dtype=dtype,
                            backend=bound,
                            versions=ev["versions"] | {"fla_bound": bound == "fla"},
                            config_hash=info.config_hash,
                        )
                    )
                    exists = True
            else:
                store.add_item(extraction_id, ev["item"], ev["tokens"], ev["file"])
    except BaseException as e:  # every way out leaves the record failed or cancelled, never running
        if exists:
            store.set_status(
                "extractions", extraction_id, "cancelled" if isinstance(e, KeyboardInterrupt) else "failed"
            )
        raise
    store.set_status("extractions", extraction_id, "done")
    return extraction_id


def _extract_work(store: Store, a: dict, ids: list[str], progress: Progress) -> Iterator[dict]:
    """Extract prompts `ids` of set a["set_name"] into extraction a["extraction"] on a["device"]: yields
    {"backend", "versions", "device"} once the target is loaded, then {"item", "tokens", "file"} per prompt
    whose feature file is written (the caller records it)."""
    info = target_mod.describe(a["target"])
    want = set(ids)
    rows = [r for r in store.completions(a["set_name"]) if r["prompt_id"] in want]
    _tick(progress, 0, len(rows), f"loading target {info.path}")
    if not rows:
        return
    model, backend = target_mod.load(info.path, a["layer_ids"], a["device"], DTYPES[a["dtype"]])
    vers = target_mod.versions()
    yield {"backend": backend, "versions": vers, "device": a["device"]}
    meta = dict(
        extraction=a["extraction"],
        target=info.path,
        config_hash=info.config_hash,
        layer_ids=a["layer_ids"],
        device=a["device"],
        dtype=a["dtype"],
        backend=backend,
        **vers,
    )

    def todo():  # (key, ids) of the prompts, checked one by one as the extraction reaches them
        for i, r in enumerate(rows):
            tokens = torch.tensor(r["prompt_ids"] + r["output_ids"])
            if int(tokens.max()) >= info.vocab_size:
                raise InputError(
                    f"prompt {r['prompt_id']!r}: token id {int(tokens.max())} is outside the target's "
                    f"vocabulary ({info.vocab_size}); wrong target for this completion set?"
                )
            yield (i, r["prompt_id"], len(tokens)), tokens

    def write(key, feats):
        return cache.write(features_root(store), a["extraction"], key[1], feats, meta)

    # device forwards overlap the previous prompts' copies and file writes (target.extract_stream)
    for (i, pid, n), f in target_mod.extract_stream(model, todo(), a["layer_ids"], write):
        yield {"item": pid, "tokens": n, "file": str(f)}
        _tick(progress, i + 1, len(rows), f"extracted {pid} ({n} tokens)")


def work(store: Store, kind: str, args: dict, ids: list[str], progress: Progress = None) -> Iterator[dict]:
    """The per-prompt part of an operation over prompts `ids` (what each worker process runs on its shard):
    "extract" yields the backend bound and the items written; "replay" yields {"checkpoint": index, "result":
    PromptResult} per checkpoint and prompt. Plain data (the results as dicts once sent between processes)."""
    if kind == "extract":
        return _extract_work(store, args, ids, progress)
    if kind == "replay":
        return _replay_work(store, args, ids, progress)
    raise InputError(f"no per-prompt work for {kind!r}; expected extract or replay")


def here(store: Store) -> Runner:
    """The runner that does the work in this process."""
    return lambda kind, args, ids, progress: work(store, kind, args, ids, progress)


# ---------------------------------------------------------------------------
# replay


SEQ_BATCH = 64  # sequences read from the cache at a time (`iter_sequences`)


def iter_sequences(
    store: Store, extraction: dict, batch: int = SEQ_BATCH, only: set[str] | None = None, device: str = "cpu"
) -> Iterator[list[replay_mod.Sequence]]:
    """Batches of token ids from the store plus validated features from the cache (no network), in set order
    (`only`: just these prompt ids); each feature file is read once (`cache.read_many`: several at a time, on CUDA
    straight to `device`), its batch yielded once all of it is read."""
    comps = {r["prompt_id"]: r for r in store.completions(extraction["set_name"])}
    width = len(extraction["layer_ids"]) * extraction["hidden_size"]
    items = sorted(
        (it for it in store.items(extraction["id"]) if only is None or it["prompt_id"] in only),
        key=lambda r: comps[r["prompt_id"]]["idx"],
    )
    todo = []  # (completion, its token ids)
    for it in items:  # every token count checked before a file is read
        c = comps[it["prompt_id"]]
        tokens = torch.tensor(c["prompt_ids"] + c["output_ids"])
        if len(tokens) != it["tokens"]:
            raise StoreError(
                f"prompt {c['prompt_id']!r}: the completion has {len(tokens)} tokens but extraction "
                f"{extraction['id']} has {it['tokens']}; re-extract"
            )
        todo.append((c, tokens))
    feats = cache.read_many(
        features_root(store), extraction["id"], [(c["prompt_id"], len(t)) for c, t in todo], width, device
    )
    for b0 in range(0, len(todo), batch):
        yield [
            replay_mod.Sequence(c["prompt_id"], t, len(c["prompt_ids"]), next(feats)) for c, t in todo[b0 : b0 + batch]
        ]


def load_sequences(store: Store, extraction: dict) -> list[replay_mod.Sequence]:
    """Every sequence of an extraction (see `iter_sequences`)."""
    return [s for batch in iter_sequences(store, extraction) for s in batch]


def check_drafter(cfg: drafter_mod.DrafterConfig, extraction: dict, info: target_mod.TargetInfo) -> None:
    """Refuse a drafter that cannot replay on this extraction (drafter.checks, the one rule list)."""
    drafter_mod.check_target(cfg, info.hidden_size, info.vocab_size, info.num_layers, extraction)


ANCHORS = ops.ANCHORS  # every completion anchor (curves of accepted(p)) | only those the walks visit


@dataclass
class Checkpoint:
    path: str  # folder (or training_state.pt) as the user gave it
    sliding_block: str | None  # the run's choice, None: the config's own
    draft_config: str | None  # the training's draft config JSON (SpecForge runtime checkpoints)
    name: str | None = None  # display name (default: the folder name)


def replay(
    store: Store,
    drafter: str,
    extraction: str = R.extraction,
    budget: int = R.tree_budget,
    device: str = R.device,
    dtype: str = R.dtype,
    chunk: int = R.chunk,
    name: str | None = R.name,
    progress: Progress = None,
    sliding_block: str | None = R.sliding_block,
    draft_config: str | None = R.draft_config,
    anchors: str = R.anchors,
    runner: Runner | None = None,
) -> dict:
    """Replay a checkpoint over a cached extraction; stores the run; returns {"id", "summary"}.

    `drafter` is an HF folder or a SpecForge runtime folder (`draft_config`: the training's draft config JSON
    when no config.json lies beside or above it). `sliding_block` (causal | bidirectional, default: the
    config's own, causal) is how sliding_attention layers see their block; it is stored with the run.
    `anchors` every (default) or chain (only the anchors the walks visit: faster, no every-anchor metrics).
    A refused checkpoint (other family, unknown tensors, unsafe pickle) raises before anything is stored."""
    return replay_many(
        store,
        [Checkpoint(drafter, sliding_block, draft_config, name)],
        extraction,
        budget,
        device,
        dtype,
        chunk,
        progress,
        anchors,
        runner,
    )[0]


def replay_many(
    store: Store,
    checkpoints: list[Checkpoint],
    extraction: str = R.extraction,
    budget: int = R.tree_budget,
    device: str = R.device,
    dtype: str = R.dtype,
    chunk: int = R.chunk,
    progress: Progress = None,
    anchors: str = R.anchors,
    runner: Runner | None = None,
) -> list[dict]:
    """Replay several checkpoints over ONE read of the extraction's features (`_replay_work`: passes of sequences,
    each replayed by every checkpoint in turn, one drafter loaded at a time). Every checkpoint is validated
    (config, tensors, target) before any replay; each run is stored, with the metrics over all prompts, as soon
    as its checkpoint's results are all in (so a later failure keeps it). The per-prompt work (`work`, kind
    "replay") runs here, or through `runner` (prompts sharded over worker processes, one per GPU). Returns
    [{"id", "summary"}] in the order given."""
    if anchors not in ANCHORS:
        raise InputError(f"--anchors {anchors!r}: expected one of {', '.join(ANCHORS)}")
    if dtype not in DTYPES:
        raise InputError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    ex = store.extraction(extraction)
    if ex["status"] != "done":
        raise InputError(f"extraction {ex['id']} is {ex['status']}, not done; finish it (re-extract) first")
    info = target_mod.describe(ex["target_path"])
    plan = []
    for ck in checkpoints:  # configs checked here; tensors when the work loads them, before any replay
        loc = drafter_mod.locate(ck.path, ck.draft_config)
        cfg = drafter_mod.config_of(loc)
        check_drafter(cfg, ex, info)
        plan.append((ck, loc, cfg, drafter_mod.sliding_semantics(cfg, ck.sliding_block)))
    comps = {c["prompt_id"]: c for c in store.completions(ex["set_name"])}  # read once: every store step needs them
    ids = sorted((it["prompt_id"] for it in store.items(ex["id"])), key=lambda i: comps[i]["idx"])
    args = dict(
        checkpoints=[asdict(ck) for ck in checkpoints],
        extraction=ex["id"],
        budget=budget,
        device=device,
        dtype=dtype,
        chunk=chunk,
        anchors=anchors,
    )
    got: list[dict] = [{} for _ in plan]
    out: list[dict | None] = [None for _ in plan]
    for ev in (runner or here(store))("replay", args, ids, progress):
        r = ev["result"]
        # a worker's result (packed: its 2-D fields numpy) or this process's (the same, as `jobs.unpack` gives)
        r = replay_mod.PromptResult(**r) if isinstance(r, dict) else replay_mod.listed(r, keep_2d=True)
        j = ev["checkpoint"]
        got[j][r.id] = r
        if len(got[j]) == len(ids):  # complete: stored now (a worker process replays the next one meanwhile)
            by_id, got[j] = got[j], {}
            out[j] = store_run(
                store, ex, checkpoints[j], [by_id[i] for i in ids], budget, device, dtype, anchors, progress, comps
            )
    for (ck, loc, cfg, sem), o, by_id in zip(plan, out, got):
        if o is None:
            raise RuntimeError(f"the replay of {loc.path} returned {len(by_id)} of {len(ids)} prompts")
    return out


def store_run(
    store: Store,
    ex: dict,
    ck: Checkpoint,
    res: list[replay_mod.PromptResult],
    budget: int,
    device: str,
    dtype: str,
    anchors: str,
    progress: Progress = None,
    comps: dict[str, dict] | None = None,
) -> dict:
    """The parent's store step of one replayed checkpoint: its summary over all prompts (`res`, in set order), the
    run and its per-prompt rows stored, then every whole-run analysis kept. `comps`: the set's completions by
    prompt id, when the caller has them. Returns {"id", "summary"}."""
    loc = drafter_mod.locate(ck.path, ck.draft_config)
    cfg = drafter_mod.config_of(loc)
    sem = drafter_mod.sliding_semantics(cfg, ck.sliding_block)
    semantics = sem if "sliding_attention" in cfg.layer_types else None
    ps = [metrics.Prompt.of(r) for r in res]  # built once: every metric below reads their walks and probabilities
    summary = replay_mod.summarize(ps, cfg.block_size, budget) | {
        "backend": ex["backend"],
        "extraction": ex["id"],
        "sliding_block": semantics,
        "anchors": anchors,
        "round_topk": replay_mod.ROUND_TOPK,
    }  # K of run_prompts.round_top_ids/_p, flattened [R][B-1][K]
    run_id = new_id("run")
    rows = [prompt_row(r, cfg.block_size, budget, p) for r, p in zip(res, ps)]
    store.add_run(
        dict(
            id=run_id,
            extraction_id=ex["id"],
            checkpoint=str(loc.path),
            name=ck.name or loc.path.name,
            config=drafter_mod.raw_config(loc),
            tree_budget=budget,
            summary=summary,
            device=device,
            dtype=dtype,
            sliding_block=semantics,
            config_file=str(loc.config_file),
            step=drafter_mod.step_of(loc.path.name),
        ),
        rows,
    )
    _tick(progress, 0, 0, f"analysing run {run_id} (kept for the pages)")
    stored = [dict(r, prompt_id=r["id"]) for r in rows]  # as run_prompts reads them back
    _keep(store, run_id, ANALYSES, stored, summary, comps, {p.id: p for p in ps})  # computed now, from the rows
    # in hand: no page scans them
    return {"id": run_id, "summary": summary}


PASS_GIB = 32.0  # features held at once by a replay's worker (GiB, 2 bytes a value): a pass, read once
PASS_FREE = 0.4  # on CUDA also at most this share of the device's free memory (the drafter and the replay's
# work need the rest)


def _passes(store: Store, ex: dict, ids: list[str], device: str) -> list[list[str]]:
    """`ids` (in set order) cut into passes of at most PASS_GIB of features each, on CUDA at most PASS_FREE of the
    free device memory (at least one prompt a pass)."""
    tokens = {it["prompt_id"]: it["tokens"] for it in store.items(ex["id"])}
    width, cap = len(ex["layer_ids"]) * ex["hidden_size"] * 2, PASS_GIB * 2**30
    if device.startswith("cuda"):
        cap = min(cap, PASS_FREE * torch.cuda.mem_get_info(torch.device(device))[0])
    out: list[list[str]] = [[]]
    size = 0.0
    for i in ids:
        b = tokens[i] * width
        if out[-1] and size + b > cap:
            out.append([])
            size = 0.0
        out[-1].append(i)
        size += b
    return out


STAGE_BYTES = 2**27  # a pinned staging chunk of `_upload`: at the 27B shapes (2,560 tokens x 25,600 values) the
# size class the feature read's staging buffers round to (`cache.read_many`), so torch's
# caching host allocator hands those back


def _fetch(ck: Checkpoint, dtype, device: str, side=None):
    """(checkpoint `ck` loaded onto `device`, seconds it took), on a loader thread of `_replay_work`. On CUDA the
    weights go from the mapped file to the device through pinned chunks, copied on the side stream `side`
    (`_upload`), beside the replay of the checkpoint before; returns once they are there. Measured on the H200:
    copying from pageable memory stalled the replay's launches (+0.5 s a checkpoint), and pinning a whole
    checkpoint (3.5 GB) cost +1.4 s beside a first walk, or +5.5 s of the first load when done beside it."""
    t = time.perf_counter()
    place = None if side is None else (lambda w: _upload(w, device, side))
    d = drafter_mod.load(ck.path, dtype, device, ck.sliding_block, ck.draft_config, place)
    return d, time.perf_counter() - t


def _upload(w: dict, device: str, side) -> dict:
    """CPU tensors `w` copied to `device` on CUDA stream `side` through two pinned chunks of STAGE_BYTES (a chunk
    is refilled once its last copy is done: the host never waits on a pageable copy, nothing big is pinned);
    returns {name: device tensor} once every copy is done."""
    slots = [[torch.empty(STAGE_BYTES, dtype=torch.uint8, pin_memory=True), None] for _ in range(2)]
    out, n = {}, 0
    with torch.cuda.stream(side):
        for k, t in w.items():
            dst = torch.empty(t.shape, dtype=t.dtype, device=device)
            src, to = t.contiguous().view(-1).view(torch.uint8), dst.view(-1).view(torch.uint8)
            for o in range(0, src.numel(), STAGE_BYTES):
                slot, m = slots[n % 2], min(STAGE_BYTES, src.numel() - o)
                n += 1
                if slot[1] is not None:
                    slot[1].synchronize()  # its previous copy has left the chunk
                slot[0][:m].copy_(src[o : o + m])
                to[o : o + m].copy_(slot[0][:m], non_blocking=True)
                slot[1] = side.record_event()
            out[k] = dst
    side.synchronize()
    return out


def _adopt(d: drafter_mod.Drafter) -> drafter_mod.Drafter:
    """`d`, its CUDA weights (allocated on a loader's side stream) recorded as used by this thread's stream: the
    caching allocator then reuses their memory only once this stream's work on them is done."""
    if d.device.type == "cuda":
        cur = torch.cuda.current_stream(d.device)
        for v in d.w.named().values():
            v.record_stream(cur)
    return d


def _replay_work(store: Store, a: dict, ids: list[str], progress: Progress) -> Iterator[dict]:
    """Replay prompts `ids` of extraction a["extraction"] with every checkpoint of a["checkpoints"] on
    a["device"]: yields {"checkpoint": index, "result": PromptResult}.

    Every checkpoint is checked (config, tensor names and shapes: `drafter.check`) before any replay. The
    prompts are read in passes (`_passes`: each feature file once, a pass's features on the device); each
    checkpoint replays a whole pass before the next one, while a loader thread loads the next checkpoint onto the
    device on a side stream (`_fetch`; the first one, and the target's head, while the features are read; on
    CUDA the fused kernels' imports start on a third thread at once). With one pass a checkpoint's results are
    complete, and stored by the parent, while the next checkpoint replays. (A warm-up of the first replay's
    kernels with blank weights while the first checkpoint loaded, 10964a0/5c00bd7, ended the first checkpoint
    2.1 s later on the H200: RESULTS, stop 25.)"""
    ex = store.extraction(a["extraction"])
    device, dtype, budget = a["device"], DTYPES[a["dtype"]], a["budget"]
    cks = [Checkpoint(**c) for c in a["checkpoints"]]
    n, total, done = len(ids), len(ids) * len(cks), 0
    for i, ck in enumerate(cks):
        _tick(progress, 0, total, f"checking drafter {i + 1}/{len(cks)}: {ck.path}")
        drafter_mod.check(ck.path, ck.sliding_block, ck.draft_config)
    passes = _passes(store, ex, ids, device)
    order = [(k, j) for k in range(len(passes)) for j in range(len(cks))]  # (pass, checkpoint), in replay order
    side = torch.cuda.Stream(torch.device(device)) if device.startswith("cuda") else None
    with ThreadPoolExecutor(3) as loader:  # the target's head, one checkpoint at a time, the fused kernels' imports
        heads = loader.submit(target_mod.load_head, ex["target_path"], device, dtype)
        if side is not None:  # Triton and Inductor (seconds) beside the feature read and the first upload
            loader.submit(drafter_mod.kernels_for, torch.device(device))
        nxt = loader.submit(_fetch, cks[0], dtype, device, side)
        for at, (k, j) in enumerate(order):
            part, ck = passes[k], cks[j]
            if j == 0:
                seqs = []  # the pass before's features go first
                t0 = (
                    time.perf_counter()
                )  # one read per pass, on CUDA straight to the device, shared by every checkpoint
                seqs = [s for batch in iter_sequences(store, ex, only=set(part), device=device) for s in batch]
                _tick(
                    progress,
                    done,
                    total,
                    f"read the features of {len(seqs)} prompts (pass {k + 1}/{len(passes)}) "
                    f"in {time.perf_counter() - t0:.1f} s",
                )
            _tick(progress, done, total, f"loading drafter {j + 1}/{len(cks)}: {ck.path}")
            t0 = time.perf_counter()
            d, fetch_s = nxt.result()
            d = _adopt(d)
            head = heads.result()
            if at + 1 < len(order):
                nxt = loader.submit(_fetch, cks[order[at + 1][1]], dtype, device, side)
            t1 = time.perf_counter()

            def tick(i: int, m: int, j=j, base=done) -> None:
                _tick(
                    progress,
                    base + i,
                    total,
                    f"checkpoint {j + 1}/{len(cks)}: replayed {i}/{m} prompts"
                    + (f" of this pass ({len(part)} of {n})" if len(part) < n else ""),
                )

            res = (
                replay_mod.chain_only_results(d, head, seqs, budget, progress=tick, arrays=True)
                if a["anchors"] == "chain"
                else replay_mod.every_anchor(d, head, seqs, budget, a["chunk"], progress=tick, arrays=True)[0]
            )
            del d  # its memory goes to the next checkpoint
            _tick(
                progress,
                done + len(seqs),
                total,
                f"checkpoint {j + 1}/{len(cks)}: loaded in {t1 - t0:.1f} s (read "
                f"beside in {fetch_s:.1f} s), {len(seqs)} prompts replayed in {time.perf_counter() - t1:.1f} s",
            )
            for r in res:
                yield {"checkpoint": j, "result": r}
            done += len(seqs)


def prompt_row(r: replay_mod.PromptResult, B: int, budget: int, p: metrics.Prompt | None = None) -> dict:
    """A run_prompts row of one replayed prompt: its results plus the registry's per-prompt tau values (`p`: its
    Prompt, when the caller has built it)."""
    m = metrics.per_prompt(r if p is None else p, B, budget)
    shallow = {f.name: getattr(r, f.name) for f in fields(r)}  # not asdict: it deep-copies ~10^5 list values
    return dict(
        shallow,
        tau=m["tau_macro"],
        tree_tau=m["ddtree_tau"],
        drafts=metrics.flat(r.drafts),
        draft_logp=metrics.flat(r.draft_logp),
        round_top_ids=metrics.flat(r.round_top_ids),  # [R*(B-1)*K]
        round_top_p=metrics.flat(r.round_top_p),
    )


def checkpoints_in(folder: str | Path) -> tuple[list[Path], list[str]]:
    """(checkpoints, notes) under `folder` (itself included), in step order: HF folders (config.json +
    *.safetensors; SpecForge `epoch_E_step_S/`, `checkpoint-N/`, ...) and SpecForge runtime folders
    (`{run_id}-step{N}/training_state.pt`). Links such as `{run_id}-latest`/`-best` count once (their target);
    folders that are not DFlash drafters (a target model, another family) are skipped with a note."""
    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"--checkpoints {folder}: no such folder (point at a training output folder)")
    dirs = {f.parent.resolve() for pat in ("*.safetensors", drafter_mod.RUNTIME_FILE) for f in root.rglob(pat)}
    found, notes = [], []
    for d in sorted(dirs):
        if (d / "config.json").is_file():  # a runtime folder without one is checked with --draft-config later
            try:
                drafter_mod.refuse_family(drafter_mod.raw_config(drafter_mod.locate(d)))
            except drafter_mod.CheckpointError as e:
                notes.append(f"{d.name}: skipped ({str(e).removeprefix('config.json: ')})")
                continue
        found.append(d)
    if not found:
        raise InputError(
            f"{folder}: no checkpoint inside (expected epoch_E_step_S/ or {{run_id}}-step{{N}}/ "
            "folders)" + (f"; {'; '.join(notes)}" if notes else "")
        )
    big = 1 << 62
    return sorted(
        found, key=lambda p: (drafter_mod.step_of(p.name) is None, drafter_mod.step_of(p.name) or big, str(p))
    ), notes


def sweep(
    store: Store,
    checkpoints: str,
    extraction: str = S.extraction,
    progress: Progress = None,
    sliding_block: str | None = S.sliding_block,
    draft_config: str | None = S.draft_config,
    anchors: str = S.anchors,
    **replay_args,
) -> list[str]:
    """Replay every checkpoint found under `checkpoints` on one extraction, in one pass over its features
    (`replay_many`, chain-only anchors by default); returns run ids in step order. A checkpoint already replayed
    on this extraction (with the same sliding semantics) is not replayed again (its latest run id is
    returned). Every checkpoint is validated before the first replay, so a refused one stops the sweep with
    nothing stored."""
    ex = store.extraction(extraction)
    cks, notes = checkpoints_in(checkpoints)
    for n in notes:
        _tick(progress, 0, len(cks), n)
    plan = []
    for ck in cks:
        cfg = drafter_mod.read_config(ck, draft_config)
        sem = drafter_mod.sliding_semantics(cfg, sliding_block) if "sliding_attention" in cfg.layer_types else None
        plan.append((ck, sem))
    have = {(r["checkpoint"], r.get("sliding_block")): r["id"] for r in store.runs() if r["extraction_id"] == ex["id"]}
    todo = [ck for ck, sem in plan if (str(ck), sem) not in have]
    _tick(progress, 0, len(cks), f"{len(cks)} checkpoints, {len(cks) - len(todo)} already replayed on {ex['id']}")
    new = (
        replay_many(
            store,
            [Checkpoint(str(ck), sliding_block, draft_config) for ck in todo],
            ex["id"],
            progress=progress,
            anchors=anchors,
            **replay_args,
        )
        if todo
        else []
    )
    fresh = {str(ck): r["id"] for ck, r in zip(todo, new)}
    ids = [have.get((str(ck), sem)) or fresh[str(ck)] for ck, sem in plan]
    _tick(progress, len(cks), len(cks), f"replayed {len(todo)} checkpoints")
    return ids


def sliding_check(
    store: Store,
    drafter: str,
    extraction: str = ops.SlidingCheck.extraction,
    draft_config: str | None = ops.SlidingCheck.draft_config,
    progress: Progress = None,
    **replay_args,
) -> dict:
    """The train/serve mismatch detector: the checkpoint replayed with its sliding layers causal inside the
    block (SpecForge training, SGLang serving) and bidirectional (z-lab HF reference) on one extraction, runs
    reused where they exist. Returns {"causal": run id, "bidirectional": run id, "tau_macro": {...}, "delta"}."""
    ex = store.extraction(extraction)
    cfg = drafter_mod.read_config(drafter, draft_config)
    if "sliding_attention" not in cfg.layer_types:
        raise InputError(
            f"{drafter}: the drafter has no sliding_attention layers, so both semantics give the same "
            "drafts; nothing to check"
        )
    ck = str(drafter_mod.locate(drafter, draft_config).path)
    have = {r.get("sliding_block"): r for r in store.runs() if r["checkpoint"] == ck and r["extraction_id"] == ex["id"]}
    out: dict = {"checkpoint": ck, "extraction": ex["id"], "tau_macro": {}}
    for i, sem in enumerate(drafter_mod.SLIDING_BLOCKS):
        _tick(progress, i, 2, f"replaying with sliding layers {sem} inside the block")
        run = have.get(sem)
        rid = (
            run["id"]
            if run
            else replay(store, drafter, ex["id"], sliding_block=sem, draft_config=draft_config, **replay_args)["id"]
        )
        out[sem] = rid
        out["tau_macro"][sem] = store.run_row(rid)["summary"].get("tau_macro")
    t = out["tau_macro"]
    out["delta"] = None if None in t.values() else t["causal"] - t["bidirectional"]
    _tick(progress, 2, 2, f"tau macro causal {t['causal']} vs bidirectional {t['bidirectional']}")
    return out


# ---------------------------------------------------------------------------
# why drafts fail (issue 11): target-layer attribution, and the analyses a run's export carries


def tap_means(seqs: list[replay_mod.Sequence]) -> torch.Tensor:
    """The mean feature vector [K*H] over every token of every sequence (summed in float64)."""
    total = sum(len(s.tokens) for s in seqs)
    if not total:
        raise InputError("the extraction holds no tokens; nothing to attribute")
    return sum(s.features.sum(0, dtype=torch.float64) for s in seqs) / total


def attribute(
    store: Store,
    run: str = ops.Attribute.run,
    device: str | None = ops.Attribute.device,
    dtype: str | None = ops.Attribute.dtype,
    progress: Progress = None,
) -> dict:
    """Target-layer attribution of a run: its drafter (same checkpoint, config file and sliding semantics) is
    replayed on its extraction (chain-only anchors, whose tau equals every-anchor's; DDTree budget 0) once as it
    is and once per target tap with that tap replaced by its mean over the extraction (tap k =
    features[:, k*H:(k+1)*H], averaged over all tokens of all prompts); tau lost = base tau - ablated tau.
    Stored in `attributions` (replacing an earlier attribution of the run). `device`/`dtype` default to the
    run's own. Returns {"run", "base_tau_macro", "base_tau_pooled", "taps": [{tap, layer_id, tau_macro,
    tau_pooled, base_tau_macro, base_tau_pooled}]}."""
    r = store.run_row(run)
    ex = store.extraction(r["extraction_id"])
    if ex["status"] != "done":
        raise InputError(f"extraction {ex['id']} of run {r['id']} is {ex['status']}, not done; re-extract first")
    device, dtype = device or r.get("device") or "cpu", dtype or r.get("dtype") or "float32"
    if dtype not in DTYPES:
        raise InputError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {device}: no CUDA device on this machine; use --device cpu")
    layers, H = ex["layer_ids"], ex["hidden_size"]
    K = len(layers)
    _tick(progress, 0, K + 1, f"loading drafter {r['checkpoint']}")
    d = drafter_mod.load(r["checkpoint"], DTYPES[dtype], device, r.get("sliding_block"), r.get("config_file"))
    if d.c.target_layer_ids != layers:
        raise InputError(
            f"the checkpoint at {r['checkpoint']} now reads target layers {d.c.target_layer_ids} but "
            f"extraction {ex['id']} holds {layers}; the checkpoint changed since run {r['id']}"
        )
    head = target_mod.load_head(ex["target_path"], device, DTYPES[dtype])
    seqs = load_sequences(store, ex)
    mean = tap_means(seqs)
    n = len(seqs)

    def tau_of(i: int, what: str) -> dict:
        _, summ = replay_mod.chain_only(
            d,
            head,
            seqs,
            budget=0,
            progress=lambda j, m: _tick(
                progress, i * n + j, (K + 1) * n, f"replay {i + 1}/{K + 1} ({what}): {seqs[j - 1].id}"
            ),
        )
        return summ

    base = tau_of(0, "no tap ablated")
    rows = []
    for k, layer in enumerate(layers):
        cols = slice(k * H, (k + 1) * H)
        saved = [s.features[:, cols].clone() for s in seqs]
        try:
            for s in seqs:
                s.features[:, cols] = mean[cols].to(s.features.dtype)
            summ = tau_of(k + 1, f"tap {k}, target layer {layer}, replaced by its mean")
        finally:
            for s, v in zip(seqs, saved):
                s.features[:, cols] = v
        rows.append(
            {
                "tap": k,
                "layer_id": layer,
                "tau_macro": summ["tau_macro"],
                "tau_pooled": summ["tau_pooled"],
                "base_tau_macro": base["tau_macro"],
                "base_tau_pooled": base["tau_pooled"],
            }
        )
    store.set_attribution(r["id"], rows)
    _tick(progress, (K + 1) * n, (K + 1) * n, f"attributed {K} taps of run {r['id']}")
    return {"run": r["id"], "base_tau_macro": base["tau_macro"], "base_tau_pooled": base["tau_pooled"], "taps": rows}


def perform(store: Store, op: ops.Op, progress: Progress = None, runner: Runner | None = None) -> dict:
    """Run one operation given as its `ops` dataclass (what a job runs); returns the job's result dict. `runner`
    shards the per-prompt work of extract, replay and sweep over worker processes (jobs.workers); without it the
    work runs here, on the op's device (its one GPU when `gpus` names one). Demo builds a workspace above the
    pipeline, so jobs runs it; an extraction's GPU orchestration is the job's too (it calls this inside it)."""
    device = op.devices()[0]
    if isinstance(op, ops.Fetch):
        from . import config as config_mod

        cfg = config_mod.load(store.workspace)
        n = fetch(
            store,
            op.server or cfg.server_url,
            op.prompt_set,
            op.name,
            op.max_new_tokens,
            op.chat,
            op.tokenizer,
            op.enable_thinking,
            progress,
            op.readiness_timeout or cfg.readiness_timeout,
        )
        return {"set": op.name, "fetched": n}
    if isinstance(op, ops.Extract):
        return {
            "extraction": extract(
                store,
                op.target,
                op.completions,
                layer_ids_of(op.drafter, op.layers),
                device,
                op.dtype,
                op.extraction_id,
                progress,
                runner,
            )
        }
    if isinstance(op, ops.Replay):
        return {
            "run": replay(
                store,
                op.drafter,
                op.extraction,
                op.tree_budget,
                device,
                op.dtype,
                op.chunk,
                op.name,
                progress,
                op.sliding_block,
                op.draft_config,
                op.anchors,
                runner,
            )["id"]
        }
    if isinstance(op, ops.Sweep):
        return {
            "runs": sweep(
                store,
                op.checkpoints,
                op.extraction,
                progress,
                op.sliding_block,
                op.draft_config,
                op.anchors,
                budget=op.tree_budget,
                device=device,
                dtype=op.dtype,
                runner=runner,
            )
        }
    if isinstance(op, ops.SlidingCheck):
        out = sliding_check(store, op.drafter, op.extraction, op.draft_config, progress, device=device, dtype=op.dtype)
        return {"causal": out["causal"], "bidirectional": out["bidirectional"]}
    if isinstance(op, ops.Attribute):
        out = attribute(store, op.run, op.device, op.dtype, progress)
        return {"run": out["run"], "taps": len(out["taps"])}
    raise InputError(f"{op.kind}: not a pipeline operation (the job runs it)")


ANALYSES = ("prompts", "calibration", "patterns", "lag")  # whole-run analyses kept in the store (run_analyses)


def analysis(store: Store, run_id: str, name: str, rows: list[dict] | None = None) -> dict:
    """One whole-run analysis of a finished run, computed once from its per-prompt rows and kept in the store
    (a run never changes), so pages read a small JSON value instead of every token of every prompt:
    "prompts" (metrics.prompt_rows: per-prompt numbers, no arrays), "calibration" (analysis.calibration),
    "patterns" (failure-pattern tables, tokens decoded with the target's tokenizer when it has one) or "lag"
    ({prompt_id: [anchors, lagging, on target] per slot}, metrics.lag_counts). `rows`: the run's run_prompts rows
    when the caller holds them (else read from the store)."""
    if name not in ANALYSES:
        raise InputError(f"analysis {name!r}: not one of {', '.join(ANALYSES)}")
    got = store.analysis(run_id, name)
    if got is not None:
        return got
    return _keep(store, run_id, [name], rows)[name]


def _keep(
    store: Store,
    run_id: str,
    names,
    rows: list[dict] | None = None,
    summary: dict | None = None,
    comps: dict[str, dict] | None = None,
    prompts: dict[str, metrics.Prompt] | None = None,
) -> dict:
    """The analyses `names` of run `run_id` (`analysis`) computed from one read of the run, its extraction and its
    completions, then kept in the store (one connection); {name: value}. `summary`: the run's summary just computed
    from the same rows (the store step), which the calibration would otherwise compute again; `comps`: the set's
    completions by prompt id, when the caller has them already (a sweep's store steps); `prompts`: the rows'
    `metrics.Prompt`s by prompt id (the store step's, which hold what the summary computed once)."""
    from .analysis import patterns
    from .analysis.calibration import calibration
    from .vocab import load_vocab

    r = store.run_row(run_id)
    B, budget = r["summary"]["block_size"], r["tree_budget"]
    ex = store.extraction(r["extraction_id"])
    rows = sorted(rows, key=lambda p: p["prompt_id"]) if rows is not None else store.run_prompts(run_id)
    if comps is None:
        comps = (
            {c["prompt_id"]: c for c in store.completions(ex["set_name"])} if {"lag", "patterns"} & set(names) else {}
        )
    out = {}
    for name in names:
        if name == "prompts":
            val = metrics.prompt_rows(rows, B, budget, prompts)
        elif name == "calibration":
            val = calibration([prompts[p["prompt_id"]] for p in rows] if prompts else rows, B, budget, summary)
        elif name == "lag":
            val = {
                p["prompt_id"]: list(
                    metrics.lag_counts(
                        metrics.flat(p.get("drafts")),
                        list(comps[p["prompt_id"]]["prompt_ids"]) + list(comps[p["prompt_id"]]["output_ids"]),
                        p["prompt_len"],
                        B,
                    )
                )
                for p in rows
                if p["prompt_id"] in comps
            }
        else:
            order = {pid: c["idx"] for pid, c in comps.items()}
            vocab = load_vocab(ex["target_path"])
            val = {
                "decoded_tokens": vocab.tok is not None,
                **patterns.analyse(
                    sorted(rows, key=lambda p: (order.get(p["prompt_id"], 0), p["prompt_id"])),
                    comps,
                    B,
                    vocab.strings,
                    run_id,
                ),
            }
        out[name] = json.loads(json.dumps(val, default=lambda x: x.item()))  # numpy scalars -> numbers, as read back
    with store.session():
        for name, val in out.items():
            store.set_analysis(run_id, name, val)
    return out


def analyses(store: Store, r: dict) -> dict:
    """What a run's export adds to its numbers: "calibration", "patterns" (`analysis`) and, once attributed,
    "attribution"."""
    from .analysis.attribution import attribution_rows

    out = {name: analysis(store, r["id"], name) for name in ("calibration", "patterns")}
    att = store.attributions(r["id"])
    if att:
        out["attribution"] = attribution_rows(att)
    return out


# ---------------------------------------------------------------------------
# engine conformance (issue 11): what a serving engine reported beside what the replay says it must reach


def record_engine_stats(
    store: Store, set_name: str, prompt_id: str, meta: dict, output_tokens: int, server: str
) -> None:
    """At fetch: SGLang's per-request speculative counters (meta_info) as engine "sglang" stats of the prompt; a
    server that decoded plainly reports none and nothing is recorded. (The one way engine stats of SGLang enter
    the store; `conformance` reads engine_stats only.)"""
    from .analysis import conformance as conformance_mod

    row = engines.SGLangClient.spec_stats(meta, output_tokens)
    if row is not None:
        store.add_engine_stats(set_name, conformance_mod.SGLANG, [row | {"id": prompt_id}], f"meta_info of {server}")


def import_engine_stats(store: Store, file: str | Path, set_name: str, engine: str) -> int:
    """Import another engine's per-prompt stats (JSONL: {"id", "verify_steps", "accepted_tokens"} or {"id",
    "accept_lengths": [...]}) for completion set `set_name` as engine `engine`; all lines are validated before
    anything is stored. Returns the number of prompts."""
    from .analysis import conformance as conformance_mod

    p = Path(file)
    if not p.is_file():
        raise InputError(f"{file}: no such file (a JSONL file of engine stats)")
    if not engine or not engine.strip() or len(engine) > 64:
        raise InputError(f"--engine {engine!r}: give the engine's name (1 to 64 characters, e.g. vllm)")
    comps = store.completions(set_name)
    if not comps:
        raise StoreError(f"no completion set named {set_name!r}; fetch or import the completions first")
    rows = conformance_mod.parse_stats(p.read_text(), {c["prompt_id"]: len(c["output_ids"]) for c in comps}, set_name)
    store.add_engine_stats(set_name, engine.strip(), rows, f"import {p.resolve()}")
    return len(rows)


def engine_of(store: Store, set_name: str, engine: str | None) -> str:
    """The engine to compare: `engine` when it has stats for the set, else the only one (or sglang) there is."""
    have = store.engines(set_name)
    if not have:
        raise InputError(
            f"no engine stats for completion set {set_name!r}: fetch it from a server that decodes "
            "speculatively (`serve --speculative-draft CKPT`, or SGLang with a DFlash drafter), or "
            "`import-engine-stats FILE --completions SET --engine NAME`"
        )
    if engine is None:
        from .analysis.conformance import SGLANG

        if len(have) > 1 and SGLANG not in have:
            raise InputError(
                f"completion set {set_name!r} has stats of engines {', '.join(have)}: choose one with --engine"
            )
        return SGLANG if SGLANG in have else have[0]
    if engine not in have:
        raise InputError(f"--engine {engine!r}: completion set {set_name!r} has stats of {', '.join(have)} only")
    return engine


def conformance(
    store: Store, run: str = "latest", engine: str | None = None, threshold: float | None = None
) -> tuple[dict, list[dict], list[str]]:
    """Engine tau beside the replay's tau of the same drafter on the same completions, per prompt (store only,
    no network): (the CLI's JSON {"run", "engine", "threshold", "prompts": [{"id", "engine_tau", "replay_tau",
    "flagged"}]}, the full rows of `conformance.compare`, the run's prompt ids without engine stats)."""
    from .analysis import conformance as conformance_mod

    thr = conformance_mod.THRESHOLD if threshold is None else threshold
    if not 0 <= thr < 1:
        raise InputError(f"--threshold {thr}: expected a fraction of the replay's tau in [0, 1), e.g. 0.05")
    r = store.run_row(run)
    set_name = store.extraction(r["extraction_id"])["set_name"]
    eng = engine_of(store, set_name, engine)
    order = {c["prompt_id"]: c["idx"] for c in store.completions(set_name)}
    prompts = sorted(store.run_prompts(r["id"]), key=lambda p: (order.get(p["prompt_id"], 0), p["prompt_id"]))
    stats = store.engine_stats(set_name, eng)
    rows = conformance_mod.compare(prompts, stats, thr)
    return conformance_mod.report(r["id"], eng, thr, rows), rows, conformance_mod.missing(prompts, stats)


# ---------------------------------------------------------------------------
# export


def export(store: Store, run: str = "latest") -> dict:
    """A run as JSON-able data: run row, summary and per-prompt results (store only, no network). Per prompt also
    its blocks (`analysis.rounds.blocks`): "round_anchors" [R], "drafts" [A][B-1] (-1: not drafted), "draft_p" [A][B-1]
    (exp(draft_logp), the top-1 probability; null: not recorded) and "round_top_ids"/"round_top_p" [R][B-1][K]
    (K = summary `round_topk`; empty for runs replayed before they were kept)."""
    from .analysis.rounds import blocks

    r = store.run_row(run)
    prompts = store.run_prompts(r["id"])
    order = {c["prompt_id"]: c["idx"] for c in store.completions(store.extraction(r["extraction_id"])["set_name"])}
    prompts.sort(key=lambda p: order.get(p["prompt_id"], 0))
    B, budget = r["summary"]["block_size"], r["tree_budget"]
    out = {
        "run": {k: (str(v) if k == "created" else v) for k, v in r.items() if k != "summary"},
        "summary": r["summary"],
        "metrics": [{"key": m.key, "label": m.label, "formula": m.formula, "kind": m.kind} for m in metrics.REGISTRY],
        "prompts": [
            {
                "id": p["prompt_id"],
                "tau": p["tau"],
                "prompt_len": p["prompt_len"],
                "rounds": p["rounds"],
                "accepted_at": p["accepted_at"],
                "ddtree_tau": p["tree_tau"],
                "ddtree_rounds": p["tree_rounds"],
                "metrics": metrics.per_prompt(p, B, budget),
            }
            | {k: v for k, v in blocks(p, B, r["summary"].get("round_topk")).items() if k != "round_topk"}
            for p in prompts
        ],
    }
    return out | analyses(store, r)  # calibration, failure patterns, attribution (when present)


def listing(store: Store, what: str) -> list[dict]:
    """`runs` / `extractions` listings for scripts."""
    if what == "runs":
        return [
            {
                "id": r["id"],
                "checkpoint": r["checkpoint"],
                "name": r["name"],
                "extraction": r["extraction_id"],
                "completions": r["set_name"],
                "backend": r["backend"],
                "created": str(r["created"]),
                "sliding_block": r.get("sliding_block"),
                "step": r.get("step"),
                "summary": {m.key: r["summary"].get(m.key) for m in metrics.HEADLINE},
            }
            for r in store.runs()
        ]
    return [
        {
            "id": e["id"],
            "target": e["target_path"],
            "completions": e["set_name"],
            "backend": e["backend"],
            "device": e["device"],
            "dtype": e["dtype"],
            "layer_ids": e["layer_ids"],
            "status": e["status"],
            "prompts": e["prompts"],
            "created": str(e["created"]),
            "versions": e["versions"],
        }
        for e in store.extractions()
    ]
