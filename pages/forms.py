"""Form helpers: a user error said in a form's words, and a form's folder fields checked before a job.

Contract: `said(e, labels)` is the one place an operation's field names (and CLI flags) become form labels:
`pages.guard.guard(labels)` shows every user error of a form through it, so a page never names a CLI flag. `FIELDS`
holds the labels of the inputs every job form shares (jobs_view.where_inputs, checkpoint_inputs); a form adds
its own. `folder` refuses a folder field that is no folder here, naming the field (its label, through `said`).
"""

from __future__ import annotations

import re
from pathlib import Path

FIELDS = {  # the labels of the inputs job forms share (jobs_view.where_inputs, checkpoint_inputs)
    "device": "device",
    "gpus": "GPUs",
    "ray": "Ray cluster",
    "ray_cpus": "Ray CPU workers",
    "dtype": "dtype",
    "draft_config": "draft config JSON",
    "sliding_block": "sliding_attention layers",
}


def said(e: Exception, labels: dict[str, str]) -> str:
    """A user error in a form's words, the one place op fields become form labels: the field an ops.InputError is
    about (`e.field`, its message's first word) and any CLI flag of a labelled field (--max-new-tokens) read as the
    form's label ("Server URL 'htp://nope': ..." for "server 'htp://nope': ...")."""
    msg, field = str(e), getattr(e, "field", None)
    if field in labels and msg.startswith(field):
        msg = labels[field][:1].upper() + labels[field][1:] + msg[len(field) :]
    for name, label in labels.items():
        msg = re.sub(rf"--{re.escape(name.replace('_', '-'))}\b(?!-)", label, msg)
    return msg


def folder(value: str, field: str, hub: bool = False) -> str | None:
    """A form's folder field checked before a job: None when empty; refused (ops.InputError naming `field`) when it
    is no folder here. `hub`: a Hugging Face hub id (org/name, no leading / . or ~) passes unchecked."""
    from dflash_dash.ops import InputError

    v = value.strip()
    if not v or (hub and not v.startswith(("/", ".", "~")) and not Path(v).exists()):
        return v or None
    if not Path(v).expanduser().is_dir():
        raise InputError(f"{field} {v!r}: no such folder on this machine; give an existing folder", field)
    return v
