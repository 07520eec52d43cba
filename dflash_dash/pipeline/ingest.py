"""Getting completions in and out: import and export of completion sets, feature import, and fetching completions
(greedy or sampled) from a serving engine (with the tokenizer lookup, hub cache included).

Contract: completions enter the store only here, validated line by line (`parse_jsonl`: InputError naming the
line and the fix). `fetch` is resumable: prompts already in the set are skipped, each completion is committed as
it arrives. Tokenizers are read locally (a folder, or a hub id in the local Hugging Face cache, looked up
offline): nothing is ever downloaded.
"""

from __future__ import annotations

from pathlib import Path

from .. import engines, ops, prompts as prompts_mod
from ..ops import InputError
from ..store import Store, StoreError, new_id
from .base import Progress, Runner, features_root, tick
from .kept import record_engine_stats
from .sampled import describe, field_names, op_key, sampling_key, sent_settings
from .served import record_served


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
        for key in ("prompt", "output", "category"):
            if key in rec and rec[key] is not None and not isinstance(rec[key], str):
                raise InputError(f"line {n} (id {pid!r}): field '{key}' must be a string")
        out.append(
            {
                "id": pid,
                "prompt_ids": rec["prompt_ids"],
                "output_ids": rec["output_ids"],
                "prompt": rec.get("prompt"),
                "output": rec.get("output"),
                "category": rec.get("category") or None,
            }
        )
    if not out:
        raise InputError("the file holds no completions (expected one JSON object per line)")
    return out


def import_completions(store: Store, file: str | Path, name: str) -> int:
    """Import a completions JSONL file as set `name`; returns the number of completions."""
    name = ops.check_name(name, "name", "the completion set's name")
    p = Path(file)
    if not p.is_file():
        raise InputError(f"{file}: no such file")
    recs = parse_jsonl(p.read_text())
    store.add_set(name, str(p.resolve()))
    store.add_completions(name, [r | {"idx": i, "finish_reason": "imported"} for i, r in enumerate(recs)])
    return len(recs)


PROMPT_SETS = "prompt_sets"  # the workspace's folder of prompt sets (imported, and uploaded on the Completions page)


def prompt_folder(store: Store) -> Path:
    return Path(store.workspace) / PROMPT_SETS


def import_prompts(store: Store, file: str | Path, name: str, fmt: str = "auto") -> list[dict]:
    """A prompt file in a format users hold (prompts.FORMATS: MT-Bench, SPEED-Bench, GSM8K, HumanEval, any JSONL
    with a category) kept in the workspace as prompt set `name` (the project's JSONL, categories kept), which a
    fetch names like a built-in set. Returns its prompts; PromptSetError (a user error) on a bad file or name."""
    import json

    name = ops.check_name(name, "name", "the prompt set's name")  # it names a file of the workspace
    if name in prompts_mod.SETS:
        raise prompts_mod.PromptSetError(
            f"prompt set name {name!r}: give a name that is not a built-in set's name ({', '.join(prompts_mod.SETS)})"
        )
    p = Path(file)
    if not p.is_file():
        raise prompts_mod.PromptSetError(f"{file}: no such file")
    got = prompts_mod.read(p, fmt)
    dst = prompt_folder(store) / f"{name}.jsonl"
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "turns"}) + "\n" for r in got))
    tmp.replace(dst)
    return got


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
    from .. import cache, target as target_mod

    info = target_mod.describe(target)
    if meta.get("config_hash") != info.config_hash:
        raise InputError(
            f"the features under {source} were extracted from a target whose config hash is "
            f"{meta.get('config_hash')}, but {target} has {info.config_hash}; extract them again with "
            "this target"
        )
    rows = {r.prompt_id: r for r in store.completions(set_name)}
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
        if row is None or row.prompt_ids != c["prompt_ids"] or row.output_ids != c["output_ids"]:
            bad.append(c["id"])
            continue
        n = len(c["prompt_ids"]) + len(c["output_ids"])
        feats = cache.read(Path(source), "features", c["id"], n, width)
        f = cache.write(features_root(store), ex_id, c["id"], feats, meta | {"extraction": ex_id})
        store.add_item(ex_id, c["id"], n, str(f))
        tick(progress, i + 1, len(completions), f"imported features of {c['id']} ({n} tokens)")
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
            "id": r.prompt_id,
            "prompt_ids": r.prompt_ids,
            "output_ids": r.output_ids,
            "prompt": r.prompt,
            "output": r.output,
            "category": r.category,
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


def check_same_settings(store: Store, op: ops.Fetch, prompt_set: list[dict]) -> None:
    """Refuse to fetch into an existing set with other settings than it was fetched with (a set of mixed
    prompts, lengths or sampling measures nothing): raises InputError naming the setting, both values and the fix.
    Checked from what the set holds, without the server: max_new_tokens and the sampling (greedy, or temperature,
    top-p and seed: `sampled.sampling_key`) from the stored requests, each read in its engine's own fields
    (`sampled.sent_settings`: SGLang's sampling_params.max_new_tokens / temperature / top_p / sampling_seed, vLLM's
    max_tokens / temperature / top_p / seed, llama.cpp's n_predict / temperature / top_p / seed); the chat template
    (and thinking) by encoding a stored prompt's text (one `prompt_set` gives as text, not ids) with this fetch's
    settings and the tokenizer of `op.tokenizer` or the set's model_path (skipped when neither is a readable folder
    here)."""
    rows = store.completions(op.name)
    if not rows:
        return
    fix = f"fetch into a new set (another completion set name than {op.name!r}), or use the set's settings"
    asked = {r.prompt_id: sent_settings(r.engine, r.request) for r in rows}  # each in its own engine's fields
    used = [r.engine for r in rows]
    had = {a["max_new_tokens"] for a in asked.values() if a is not None} - {None}
    if had and had != {op.max_new_tokens}:
        was = " and ".join(f"{v:g}" for v in sorted(had))
        raise InputError(
            f"max_new_tokens: set {op.name!r} was fetched with max_new_tokens {was}"
            f"{field_names(used, 'max_new_tokens')}, this fetch asks for {op.max_new_tokens}; {fix}"
        )
    keys = {sampling_key(a) for a in asked.values()} - {None}
    if keys and keys != {op_key(op)}:
        was = " and ".join(sorted(describe(k) for k in keys))
        raise InputError(
            f"temperature/top_p/seed: set {op.name!r} was fetched {was}{field_names(used, 'temperature')}, this "
            f"fetch would be {describe(op_key(op))}; {fix}"
        )
    texts = {p["id"] for p in prompt_set if "prompt_ids" not in p}
    sent_ids = [r for r in rows if r.prompt_id in texts and r.prompt and (asked[r.prompt_id] or {}).get("prompt_ids")]
    row = sent_ids[0] if sent_ids else None
    folder = op.tokenizer or (row.model_path if row else None)
    if row is None or not folder or not Path(folder).is_dir():
        return
    tok = load_tokenizer(folder)

    def ids(chat: bool, thinking: bool) -> list[int]:
        return engines.chat_ids(tok, row.prompt, thinking) if chat else list(tok(row.prompt)["input_ids"])

    def said(chat: bool, thinking: bool) -> str:
        thought = f", thinking {'on' if thinking else 'off'}" if chat else ""
        return f"chat template {'on' if chat else 'off'}{thought}"

    if ids(op.chat, op.enable_thinking) == row.prompt_ids:
        return
    was = next(
        (said(c, t) for c in (False, True) for t in (False, True) if (c or not t) and ids(c, t) == row.prompt_ids),
        "other prompt settings (another tokenizer?)",
    )
    raise InputError(
        f"chat: set {op.name!r} was fetched with {was}, this fetch asks for {said(op.chat, op.enable_thinking)} "
        f"(prompt {row.prompt_id!r} would be sent as other token ids); {fix}"
    )


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


def fetch(store: Store, op: ops.Fetch, progress: Progress = None, runner: Runner | None = None) -> int:
    """Completions of `op.prompt_set` (built-in name or JSONL file), greedy or sampled (`op.temperature`, top_p and
    seed, sent in the engine's own fields and kept with each request), from the serving engine at `op.server`
    (None: the workspace config's; the engine its [server] engine names: sglang, vllm or llamacpp), stored as set
    `op.name` with the engine's name, each committed as it arrives; prompts already in the set are skipped, so an
    interrupted fetch continues when run again (from the same engine and model only). Returns how many
    completions were fetched now.

    Prompts are tokenised locally (tokenizer from `tokenizer` or the server's `tokenizer_path`: a readable
    folder, or a hub id found in the local Hugging Face cache; with `chat`, wrapped in its chat template) and
    sent as `input_ids`; token ids come from the server. The server's API key comes from the environment
    (`engines.for_workspace`), never from the store."""
    from .. import config as config_mod

    cfg = config_mod.load(store.workspace)
    server, prompt_set, name, max_new_tokens = op.server or cfg.server_url, op.prompt_set, op.name, op.max_new_tokens
    chat, tokenizer, enable_thinking = op.chat, op.tokenizer, op.enable_thinking
    readiness_timeout = op.readiness_timeout or cfg.readiness_timeout
    try:
        todo_all = prompts_mod.load(prompt_set, folder=prompt_folder(store))
    except prompts_mod.PromptSetError as e:
        raise InputError(str(e)) from None
    if max_new_tokens < 1:
        raise InputError(f"--max-new-tokens {max_new_tokens}: must be at least 1")
    check_same_settings(store, op, todo_all)
    done = store.completion_ids(name)
    order = {p["id"]: i for i, p in enumerate(todo_all)}
    todo = [p for p in todo_all if p["id"] not in done]
    n = len(todo_all)
    if not todo:
        tick(progress, n, n, f"set {name!r} already holds all {n} prompts of {prompt_set}")
        return 0
    try:
        client = engines.for_workspace(cfg, server, timeout=op.request_timeout)
    except ValueError as e:
        raise InputError(f"--server: {e}") from None
    kept = store.completions(name)
    engine_was = {r.engine or engines.DEFAULT_ENGINE for r in kept}
    if engine_was and client.name not in engine_was:  # known before the server is asked anything
        raise InputError(
            f"set {name!r} was fetched from engine {sorted(engine_was)[0]} but the workspace's server is "
            f"{client.name} ([server] engine in config.toml); use another --name"
        )
    client.wait_ready(
        readiness_timeout,
        progress=lambda t, state: tick(progress, len(done), n, f"waiting for {server}/health: {state} ({t:.0f} s)"),
    )
    info = client.model_info()
    model_path = info.get("model_path")
    earlier = {r.model_path for r in kept} - {None}
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
            tick(progress, len(done), n, f"tokenizer {tok_dir} from the local Hugging Face cache: {snap}")
            tok = load_tokenizer(snap)
        if chat and tok is None:
            raise InputError(
                f"--chat needs the target's tokenizer here to apply its chat template; {_no_tokenizer(tok_dir)}"
            )
    imported = prompt_folder(store) / f"{prompt_set}.jsonl"
    file = imported if imported.is_file() else Path(prompt_set)
    source = prompt_set if prompt_set in prompts_mod.SETS else str(file.resolve())
    store.add_set(name, source)
    record_served(store, name, client)  # what the engine says it serves, beside its stats (refuses another drafter)
    sampled = engines.Sampled(op.temperature, op.top_p, op.seed) if op_key(op)[0] == "sampled" else None
    fetched = 0
    for p in todo:
        tick(progress, len(done) + fetched, n, f"fetching {p['id']}")
        ids = p.get("prompt_ids")
        if ids is None and tok is not None:
            ids = engines.chat_ids(tok, p["prompt"], enable_thinking) if chat else list(tok(p["prompt"])["input_ids"])
        try:
            res = (
                client.generate(input_ids=ids, max_new_tokens=max_new_tokens, sampled=sampled)
                if ids is not None
                else client.generate(text=p["prompt"], max_new_tokens=max_new_tokens, sampled=sampled)
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
            ids = res.get("prompt_ids") or meta.get("input_ids")
            if not isinstance(ids, list) or not ids:
                raise InputError(
                    f"prompt {p['id']!r}: no tokenizer is readable here and the server did not "
                    f"report the prompt's token ids; {_no_tokenizer(tok_dir)}"
                )
        fin = meta.get("finish_reason")
        record_engine_stats(store, name, p["id"], res, client, server)  # before: a rerun redoes both
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
                "engine": client.name,
                "category": p.get("category"),
            },
        )
        fetched += 1
    tick(progress, n, n, f"fetched {fetched} completions into set {name!r} ({describe(op_key(op))})")
    return fetched
