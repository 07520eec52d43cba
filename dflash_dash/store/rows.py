"""The store's rows as frozen dataclasses: one class per table the product reads, one field per column.

Contract: `Store` queries return these (`store.run(id) -> Run`, `store.runs() -> list[Run]`, ...), built once by
`Row.of(dict)` from the query's columns; nothing downstream re-reads a column by its string name. JSON columns
(`config`, `summary`, `args`, `result`, `versions`, `meta_info`, `request`) arrive decoded (dicts).

Names, one per thing:
- `extraction_id`: the id of an extraction wherever another row points at one (runs, extraction items); an
  extraction's own id is `Extraction.id`. (Older code says ex_id, eid, extraction, ext, ...: these are the one name.)
- `block_size` vs `draft_len` vs `config_block`: a run's `block_size` is the verify width of one round, the
  anchor plus the drafted slots (the summary's `block_size`, what every metric calls B); `draft_len` = block_size
  - 1 is the tokens drafted per round (D); `config_block` is the checkpoint config's own `block_size` (the
  backbone's slots, `summary["drafter_block"]`), which a family may use differently from its verify width.
- `checkpoint`: the stored checkpoint reference of a run (the resolved folder path, or `baseline:<name>` for a
  model-free baseline); `config_file` the JSON its config was read from.

Deprecated compatibility layer: `row["column"]`, `row.get("column")`, `row.items()`, `"column" in row` and
`row | {...}` still answer for the consumers not yet converted to attribute access (analysis.trace and
analysis.patterns with render's round views, reading a Completion; cli.py; tools/; benchmarks/; many tests); it
goes once they are. New code uses attributes, and `dataclasses.replace` for a changed copy. Columns a later migration
adds before a field exists here are kept in `more` (reachable the same way, and by `as_dict`).
"""

from __future__ import annotations

from collections.abc import ItemsView
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any, TypeVar

R = TypeVar("R", bound="Row")


@dataclass(frozen=True)
class Row:
    """A store row: frozen, built by `of` from a query's columns."""

    # columns this module does not know yet (keyword-only, so every row's own fields come first)
    more: dict[str, Any] = field(default_factory=dict, compare=False, repr=False, kw_only=True)

    @classmethod
    def of(cls: type[R], d: dict[str, Any]) -> R:
        """The row of one query result (its columns by name); unknown columns go to `more`."""
        names = {f.name for f in fields(cls)} - {"more"}
        return cls(**{k: v for k, v in d.items() if k in names}, more={k: v for k, v in d.items() if k not in names})

    def keys(self) -> list[str]:
        """The row's own fields by name (`more` left out)."""
        return [f.name for f in fields(self) if f.name != "more"]

    def __getitem__(self, key: str) -> Any:
        """Deprecated (module docstring): `row.column` instead."""
        if key != "more" and key in self.keys():
            return getattr(self, key)
        if key in self.more:
            return self.more[key]
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        """Deprecated (module docstring): `row.column` instead."""
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        """Deprecated (module docstring)."""
        return key in self.keys() or key in self.more

    def items(self) -> ItemsView[str, Any]:
        """Deprecated (module docstring): `as_dict().items()` instead."""
        return self.as_dict().items()

    def __or__(self, changes: dict[str, Any]) -> Any:
        """Deprecated (module docstring): `dataclasses.replace(row, field=...)` instead. A copy with some fields
        changed; with a key that is no field, the plain dict of the columns with the changes."""
        if changes.keys() <= set(self.keys()):
            return replace(self, **changes)
        return self.as_dict() | changes

    def as_dict(self) -> dict[str, Any]:
        """The columns by name (a JSON export, a table): the fields, then any `more`."""
        return {k: getattr(self, k) for k in self.keys()} | dict(self.more)


@dataclass(frozen=True)
class PromptSet(Row):
    name: str  # the set's name (completions.set_name)
    source: str | None = None  # where it came from: a file path, a URL, a fetch from an engine
    created: datetime | None = None  # when it was added
    prompts: int = 0  # completions stored for it


@dataclass(frozen=True)
class Completion(Row):
    set_name: str  # the prompt set it belongs to
    prompt_id: str  # the prompt's id within the set
    idx: int | None = None  # its position in the set (listing order)
    prompt: str | None = None  # the prompt text (untrusted: escape wherever drawn)
    output: str | None = None  # the engine's completion text (untrusted)
    prompt_ids: list[int] = field(default_factory=list)  # the prompt's token ids
    output_ids: list[int] = field(default_factory=list)  # the completion's token ids
    finish_reason: str | None = None  # why generation stopped (stop, length, ...)
    meta_info: dict[str, Any] = field(default_factory=dict)  # the engine's per-request metadata, as it came
    request: dict[str, Any] | None = None  # the request sent (sampling parameters), None for imported completions
    model_path: str | None = None  # the model the engine said it served
    created: datetime | None = None  # when it was stored
    engine: str | None = None  # the serving engine it came from (sglang, vllm, llamacpp)
    category: str | None = None  # the prompt's category where its set has them (MT-Bench, ...)


@dataclass(frozen=True)
class CompletionEntry(Row):
    """A completion as listings show it: no token ids, text cut to a preview, token counts."""

    prompt_id: str  # the prompt's id within the set
    idx: int | None = None  # its position in the set
    prompt: str | None = None  # the prompt text, cut to the preview length (untrusted)
    output: str | None = None  # the completion text, cut to the preview length (untrusted)
    prompt_tokens: int = 0  # prompt length in tokens
    output_tokens: int = 0  # completion length in tokens
    finish_reason: str | None = None  # why generation stopped
    meta_info: dict[str, Any] = field(default_factory=dict)  # the engine's per-request metadata
    model_path: str | None = None  # the model the engine said it served
    category: str | None = None  # the prompt's category, where its set has them


@dataclass(frozen=True)
class Extraction(Row):
    id: str  # the extraction's id (`extraction_id` wherever another row points at it)
    set_name: str  # the prompt set whose completions were run through the target
    target_path: str  # the target model folder
    layer_ids: list[int] = field(default_factory=list)  # the target layers whose hidden states were kept
    hidden_size: int = 0  # the target's hidden size
    device: str | None = None  # where the target ran (cuda:0, cpu)
    dtype: str | None = None  # the target's dtype (bfloat16, float32)
    backend: str | None = None  # the attention kernel backend the target used
    versions: dict[str, Any] = field(default_factory=dict)  # library versions at extraction time
    config_hash: str | None = None  # hash of the target's config (a changed target is a different extraction)
    status: str | None = None  # running, done, failed
    created: datetime | None = None  # when it started
    prompts: int = 0  # feature files stored (extraction_items)


@dataclass(frozen=True)
class Item(Row):
    extraction_id: str  # the extraction the file belongs to
    prompt_id: str  # the prompt whose features it holds
    tokens: int  # its length in tokens (prompt + completion)
    file: str  # the feature file, relative to the workspace


@dataclass(frozen=True)
class Run(Row):
    id: str  # the run's id
    extraction_id: str | None = None  # the extraction it replayed (None: a model-free baseline on a set alone)
    checkpoint: str = ""  # the checkpoint folder (resolved) it replayed, or `baseline:<name>`
    name: str | None = None  # its display name (the checkpoint folder's name unless given)
    config: dict[str, Any] = field(default_factory=dict)  # the drafter config's JSON as read at replay time
    tree_budget: int = 0  # the DDTree node budget (0: no tree walk)
    summary: dict[str, Any] = field(default_factory=dict)  # the registry's metrics over all prompts, plus how it ran
    status: str | None = None  # done, failed
    created: datetime | None = None  # when it was stored
    device: str | None = None  # where the replay ran
    dtype: str | None = None  # the drafter's dtype
    sliding_block: str | None = None  # sliding-layer block semantics used (None: the drafter has none)
    config_file: str | None = None  # the JSON the drafter config was read from
    step: int | None = None  # the training step of the checkpoint, from its folder name
    set_name: str | None = None  # the prompt set (the extraction's, or the baseline's summary)
    backend: str | None = None  # the extraction's attention backend
    target_path: str | None = None  # the extraction's target model folder

    @property
    def baseline(self) -> bool:
        """A model-free baseline (n-gram, suffix), not a drafter checkpoint."""
        return self.checkpoint.startswith("baseline:")

    @property
    def block_size(self) -> int:
        """B: the verify width of one round (anchor + drafted slots), what every metric calls block_size."""
        return int(self.summary["block_size"])

    @property
    def draft_len(self) -> int:
        """D = B - 1: the tokens drafted per round."""
        return self.block_size - 1

    @property
    def config_block(self) -> int | None:
        """The checkpoint config's own block_size (the backbone's slots; None for a baseline or an older run)."""
        got = self.summary.get("drafter_block")
        return None if got is None else int(got)


@dataclass(frozen=True)
class Attribution(Row):
    run_id: str  # the run attributed
    tap: int  # the tap (position in the drafter's target-layer list) ablated
    layer_id: int  # the target layer behind that tap
    tau_macro: float  # tau with that tap ablated (mean over prompts)
    tau_pooled: float  # tau with that tap ablated (pooled over rounds)
    base_tau_macro: float  # tau without ablation (mean over prompts)
    base_tau_pooled: float  # tau without ablation (pooled)
    created: datetime | None = None  # when it was stored


@dataclass(frozen=True)
class Job(Row):
    id: str  # the job's id
    kind: str  # the operation it runs (extract, replay, fetch, ...)
    args: dict[str, Any] = field(default_factory=dict)  # the operation's arguments as the job was started with
    status: str = "queued"  # queued, running, done, failed, cancelled
    progress: float = 0.0  # 0..1
    step: str | None = None  # what it is doing now, in words
    pid: int | None = None  # the job process, while it runs
    log_path: str | None = None  # its log file
    error: str | None = None  # the one-line error of a failed job
    result: Any = None  # what the operation returned (JSON)
    created: datetime | None = None  # when it was queued
    updated: datetime | None = None  # when it last reported
    dismissed: bool | None = False  # a failed or cancelled job a user hid from the jobs panel
