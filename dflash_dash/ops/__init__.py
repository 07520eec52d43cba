"""The arguments of the operations users run, one typed dataclass per operation: the one place their defaults live.

Contract:
- One class per operation (`Fetch`, `Extract`, `Replay`, `Sweep`, `SlidingCheck`, `Attribute`, `Diagnose`, `Baseline`,
  `Demo`); `kind` is its job kind. Each field is declared with `setting(default, help)` (the help is the CLI's and
  a page's; `setting_help`; its metadata's `choices`, the values it takes, are the CLI's too). Settings several
  operations share are one frozen record embedded in each (`embeds`): Replay and Sweep embed `ReplaySettings`
  (`op.settings`, carried whole by the worker's `ReplayWork` and recorded whole with a run); Extract, Replay and
  Sweep embed `Placement` (`op.placement`: device, gpus, Ray cluster; what jobs.workers and jobs.cluster read).
- The CLI's other commands are operations too (`COMMANDS`, in `commands`: import and export, the reports, the
  listings, `jobs`, `serve`): not job kinds, but run through `pipeline.perform` with a printer each, like the rest.
  `__post_init__`
  validates (and normalises: "1,16,31" layers, "0,1" GPUs) and raises `InputError`, the UserError of bad input
  naming the field and the fix, through the field checks of `fields` (re-exported here): names (`check_name`, the one
  name validator: no path parts), server URLs (`check_url`), dtype, device, layers, checkpoint lists and GPUs
  (`check_dtype`, `check_device`, `parse_layers`, `parse_paths`, `parse_gpus`). A drafter's layers meet an
  extraction's through `missing_layers` (what the drafter needs that the extraction lacks) and `layer_blocks` (where
  the drafter's layers sit in the extraction's features, None when they are its layers in its order).
- A field with metadata {"repeat": True} (Extract's `drafter`) is a list given once per value on the command
  line (--drafter A --drafter B); a single value is accepted for it too (records written before it was a list).
- `to_args()` is the plain-JSON dict a job records; `from_args(args)` rebuilds the operation from a record:
  a missing (or None) field takes its default, so job records written before a field existed stay readable;
  an unknown field is refused by name. `of(kind, args)` does it for any kind.
- The CLI generates its options from these fields (name, default, type, choices and help from the field's
  metadata), the pages build these classes for `jobs.start`, jobs records and rebuilds them, and every pipeline
  handler takes one (`pipeline.perform(store, op)`).
- Worker specs (`CheckpointSpec`, `ExtractWork`, `ReplayWork`, `StreamWork`, `work_of`) live in `work` and are
  re-exported here (callers name them ops.X).
Data only, torch-free (store-only commands stay light): nothing here loads a model or touches the store; it
sits under pipeline, which imports it.
"""

from __future__ import annotations

from typing import Any

from .base import (  # noqa: F401  (re-exported: callers name every setting, check and worker spec ops.X)
    ANCHORS,
    DTYPES,
    ORCHESTRATE,
    SETTINGS,
    SLIDING_BLOCKS,
    TARGET_TOPK,
    VERIFY,
    WORK,
    CheckpointSpec,
    ExtractWork,
    InputError,
    Op,
    Placement,
    ReplaySettings,
    ReplayWork,
    Settings,
    StreamWork,
    Work,
    check_device,
    check_dtype,
    check_name,
    check_ray,
    check_url,
    choices,
    defaults,
    embeds,
    layer_blocks,
    missing_layers,
    parse_gpus,
    parse_layers,
    parse_paths,
    setting,
    setting_help,
    work_of,
)
from .commands import (
    Advise,
    Compare,
    Conformance,
    Export,
    ExportAiperf,
    ExportCompletions,
    ExportSpecforge,
    Extractions,
    ImportCompletions,
    ImportEngineStats,
    ImportPrompts,
    ImportSpecforgeEval,
    Jobs,
    Runs,
    Serve,
    Signatures,
)
from .main import Attribute, Demo, Diagnose, Extract, Fetch, Replay, SlidingCheck, Sweep
from .tools import METHODS, Audit, Baseline, Live, Parity, Profile  # noqa: F401  (METHODS re-exported)

OPS = (Fetch, Extract, Replay, Sweep, SlidingCheck, Attribute, Diagnose, Baseline, Demo, Audit, Profile, Live, Parity)
KINDS: dict[str, type[Op]] = {c.kind: c for c in OPS}  # the job kinds
COMMANDS: tuple[type[Op], ...] = (  # the CLI's commands that are no job: run through pipeline.perform all the same
    ImportCompletions,
    ImportPrompts,
    ExportCompletions,
    ImportEngineStats,
    Compare,
    Conformance,
    Signatures,
    Advise,
    Export,
    ExportSpecforge,
    ExportAiperf,
    ImportSpecforgeEval,
    Runs,
    Extractions,
    Jobs,
    Serve,
)


def of(kind: str, args: dict[str, Any] | None) -> Op:
    """The operation of a job record (kind + args)."""
    cls = KINDS.get(kind)
    if cls is None:
        raise InputError(f"unknown job kind {kind!r}; expected one of {', '.join(KINDS)}")
    return cls.from_args(args)
