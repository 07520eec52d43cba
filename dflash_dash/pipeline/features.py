"""Feature reading: the sequences of an extraction (token ids from the store, features from its files), the columns
a drafter reads of them, and the refusals before any read.

Contract: `iter_sequences` / `load_sequences` read an extraction's features (a drafter's own layers: `columns`,
`ops.layer_blocks`); a drafter needing a layer the extraction lacks is refused with `LayersMissing` (the layers
needed, the layers held, the extract command that adds them), one whose wiring the target cannot feed by
`check_drafter`; a streamed extraction (its features never written: `is_streamed`) is refused by `require_files`
with the command that streams again. Torch is imported inside the readers only.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from .. import drafters as drafter_mod, ops
from ..ops import InputError
from ..store import Extraction, Store, StoreError
from .base import features_root

if TYPE_CHECKING:
    from .. import replay as replay_mod, target as target_mod


STREAMED = "streamed"  # the versions key that marks an extraction computed by streaming (no feature files)


def is_streamed(extraction: Extraction) -> bool:
    """Whether an extraction row was computed by streaming (its features were never written)."""
    return bool((extraction.versions or {}).get(STREAMED))


def require_files(store: Store, extraction: Extraction, who: str) -> None:
    """Refuse to read the features of a streamed extraction: none were written, so the target must run again."""
    if is_streamed(extraction):
        raise InputError(
            f"extraction {extraction.id} was streamed (no feature files were written), so {who} needs the target "
            f"again: add --stream --target {extraction.target_path} --completions {extraction.set_name} "
            "(or extract the set first, then replay on that extraction)"
        )


SEQ_BATCH = 64  # sequences read from the cache at a time (`iter_sequences`)


def iter_sequences(
    store: Store,
    extraction: Extraction,
    batch: int = SEQ_BATCH,
    only: set[str] | None = None,
    device: str = "cpu",
    layers: list[int] | None = None,
) -> Iterator[list[replay_mod.Sequence]]:
    """Batches of token ids from the store plus validated features from the cache (no network), in set order
    (`only`: just these prompt ids); each feature file is read once (`cache.read_many`: several at a time, on CUDA
    straight to `device`), its batch yielded once all of it is read. `layers`: the features of just these layers of
    the extraction, in this order (a drafter's target_layer_ids: its columns, selected as each file lands,
    `cache.read_many`'s keep); None, or the extraction's own layers: every column as stored, no copy."""
    import torch

    from .. import cache, replay as replay_mod

    comps = {c.prompt_id: c for c in store.completions(extraction.set_name)}
    width = len(extraction.layer_ids) * extraction.hidden_size
    keep = None if layers is None else columns(store, extraction, layers, "the replay")
    items = sorted(
        (it for it in store.items(extraction.id) if only is None or it.prompt_id in only),
        key=lambda it: comps[it.prompt_id].idx or 0,
    )
    todo = []  # (completion, its token ids)
    for it in items:  # every token count checked before a file is read
        c = comps[it.prompt_id]
        tokens = torch.tensor(c.prompt_ids + c.output_ids)
        if len(tokens) != it.tokens:
            raise StoreError(
                f"prompt {c.prompt_id!r}: the completion has {len(tokens)} tokens but extraction "
                f"{extraction.id} has {it.tokens}; re-extract"
            )
        todo.append((c, tokens))
    feats = cache.read_many(
        features_root(store),
        extraction.id,
        [(c.prompt_id, len(t)) for c, t in todo],
        width,
        device,
        keep,
        extraction.hidden_size,
    )
    for b0 in range(0, len(todo), batch):
        yield [replay_mod.Sequence(c.prompt_id, t, len(c.prompt_ids), next(feats)) for c, t in todo[b0 : b0 + batch]]


def load_sequences(store: Store, extraction: Extraction, layers: list[int] | None = None) -> list[replay_mod.Sequence]:
    """Every sequence of an extraction, with the features of `layers` (see `iter_sequences`)."""
    return [s for batch in iter_sequences(store, extraction, layers=layers) for s in batch]


def columns(store: Store, extraction: Extraction, need: list[int], who: str) -> list[int] | None:
    """The blocks of `extraction`'s features that a drafter reading target layers `need` replays on
    (`ops.layer_blocks`: None when they are the extraction's layers in its order, so nothing is copied). A drafter
    needing a layer the extraction lacks is refused with `LayersMissing` (`who` names it)."""
    have = list(extraction.layer_ids)
    lack = ops.missing_layers(have, need)
    if lack:
        raise LayersMissing(store, extraction, need, lack, who)
    return ops.layer_blocks(have, need)


class LayersMissing(InputError):
    """A drafter reads target layers an extraction does not hold: the message names the layers it needs, the ones
    the extraction has, and the extract command that makes an extraction holding both."""

    def __init__(self, store: Store, extraction: Extraction, need: list[int], lack: list[int], who: str):
        have = list(extraction.layer_ids)
        both = ",".join(map(str, sorted(set(have) | set(need))))
        cmd = (
            f"python -m dflash_dash --workspace {shlex.quote(str(store.workspace))} extract --target "
            f"{shlex.quote(str(extraction.target_path))} --completions {shlex.quote(extraction.set_name)} "
            f"--layers {both}"
        )
        super().__init__(
            f"{who} reads target layers {list(need)} but extraction {extraction.id} holds layers {have} "
            f"(missing {lack}); extract an extraction holding both: {cmd} (or --drafter CKPT once per drafter "
            "it must serve), then replay on it"
        )


def check_drafter(
    cfg: drafter_mod.DrafterConfig, extraction: Extraction, info: target_mod.TargetInfo, store: Store, who: str
) -> None:
    """Refuse a drafter that cannot replay on this extraction: layers the extraction lacks (`columns`), then
    drafter.checks, the one rule list, on the extraction as the drafter reads it (its own layers' columns)."""
    columns(store, extraction, cfg.target_layer_ids, who)
    seen = replace(extraction, layer_ids=list(cfg.target_layer_ids))
    drafter_mod.check_target(cfg, info.hidden_size, info.vocab_size, info.num_layers, seen)
