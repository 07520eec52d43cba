"""What a serving engine says it served, kept at fetch beside the set's engine stats, and the identity of the
drafter a run replayed: the two sides of the conformance verdict (`analysis.verdict`).

Contract: `record_served(store, set_name, client)` asks the engine (`client.served_drafter()`: SGLang's
/get_server_info, vLLM's /server_info where it runs in dev mode, llama.cpp's /props) and keeps the answer for (set,
engine), with "local": the identity of the draft path (`drafters.identity`) when that path is a checkpoint readable
here (None and "local_error" otherwise). A fetch that resumes a set from a server serving another drafter than the
one recorded is refused by name, before anything is generated. `replayed(store, run)` is the identity of the run's
checkpoint: kept with the run when it was replayed (`keep_replayed`), else computed from its stored checkpoint path,
else (the checkpoint gone) from the config stored with the run, without weights.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from ..drafters import CheckpointError, parse_config
from ..drafters.identity import identity
from ..ops import InputError
from ..store import Run, Store

KEPT = "drafter"  # the run analysis holding the replayed drafter's identity


def local_identity(path: str | None) -> tuple[dict | None, str | None]:
    """(identity of the checkpoint at `path`, None) when it is readable here, else (None, why not)."""
    if not path:
        return None, None
    if not Path(path).is_dir():
        return None, f"{path} is not a folder here (the engine's machine may be another)"
    try:
        return identity(path), None
    except CheckpointError as e:
        return None, str(e)


def record_served(store: Store, set_name: str, client) -> dict | None:
    """Ask `client`'s engine what it serves and keep it for (`set_name`, engine); returns what was kept. A server
    that cannot say (an error of the info route) is kept as not saying, with the error as its source."""
    from ..engines import ServerError

    try:
        got = client.served_drafter()
        source = (got or {}).get("source") or "not reported by the engine"
    except ServerError as e:
        got, source = None, f"asking the server failed: {e}"
    if got is not None:
        got["local"], got["local_error"] = local_identity(got.get("draft_model_path"))
    was = store.served(set_name, client.name)
    if was is not None and was["served"] is not None and got is not None and _other(was["served"], got):
        raise InputError(
            f"set {set_name!r} was fetched from a server serving drafter {_named(was['served'])} but this one "
            f"serves {_named(got)}; use another name for the set"
        )
    store.set_served(set_name, client.name, got, source)
    return got


def _other(a: dict, b: dict) -> bool:
    fa, fb = (a.get("local") or {}).get("fingerprint"), (b.get("local") or {}).get("fingerprint")
    if fa and fb:
        return fa != fb
    pa, pb = a.get("draft_model_path"), b.get("draft_model_path")
    return bool(pa and pb and pa != pb)


def _named(s: dict) -> str:
    return str(s.get("draft_model_path") or s.get("algorithm") or "(unnamed)")


def keep_replayed(
    store: Store, run_id: str, path: str | Path, draft_config: str | Path | None = None, ident: dict | None = None
) -> None:
    """Keep the identity of the checkpoint a run just replayed (at its store step): `ident` when the caller
    computed it already (`runs.identified`, which adds the weights files' stamps reuse compares), else computed."""
    store.set_analysis(run_id, KEPT, ident if ident is not None else identity(path, draft_config))


def replayed(store: Store, run: Run) -> dict:
    """The identity of run `run`'s checkpoint (see the module contract); "source" says where it came from."""
    got = store.analysis(run.id, KEPT)
    if got is not None:
        return got | {"source": "kept with the run"}
    ident, why = local_identity(run.checkpoint)
    if ident is not None:
        store.set_analysis(run.id, KEPT, ident)
        return ident | {"source": "read from the run's checkpoint"}
    raw: object = run.config
    raw = json.loads(raw) if isinstance(raw, str) else raw
    try:
        cfg = parse_config(raw or {})
    except CheckpointError:
        cfg = None
    path = run.checkpoint or ""
    return {
        "path": path,
        "name": Path(path).name or None,
        "family": cfg.family if cfg else None,
        "block_size": cfg.block_size if cfg else None,
        "width": cfg.width if cfg else None,
        "target_layer_ids": list(cfg.target_layer_ids) if cfg else None,
        "config_hash": hashlib.sha256(json.dumps(asdict(cfg), sort_keys=True).encode()).hexdigest() if cfg else None,
        "weights_hash": None,
        "fingerprint": None,
        "source": f"the config stored with the run ({why})",
    }
