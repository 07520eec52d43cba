"""The expected-acceptance pass of a replay at temperature T (replay/sweep --temperature T --verify RULE): what the
pipeline adds around `replay.expect`.

Contract: `require_topk` refuses a temperature on an extraction that kept no target top-K (the fix named: extract
again with --target-topk); `sampling_of` turns a worker spec into the replay's `expect.Sampling` (None: no pass);
`with_tops` attaches each sequence's stored top-K (`cache.read_top`, validated) for that pass; `labels` is what a
run's summary records of it (temperature, verify rule, the teacher-forced formula). Streaming computes the
top-K in memory instead (`stream.stream_work`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .. import ops
from ..ops import InputError
from ..store import Extraction, Store
from .base import features_root
from .extract import topk_of

if TYPE_CHECKING:
    from ..replay import Sequence
    from ..replay.expect import Sampling

TEACHER_FORCED = (
    "teacher-forced along the stored completion: the target's distribution at each position is conditioned on the "
    "stored tokens before it, exact where the drafts equal them"
)


def require_topk(store: Store, extraction: Extraction, op) -> None:
    """Refuse `op.temperature` on an extraction without the target's top-K, naming the command that makes one."""
    if getattr(op, "temperature", None) is None or topk_of(extraction) or getattr(op, "stream", False):
        return
    raise InputError(
        f"temperature: extraction {extraction.id} kept no target top-K, which the expected acceptance at a "
        f"temperature reads; re-extract with it (python -m dflash_dash --workspace {store.workspace} extract "
        f"--target {extraction.target_path} --completions {extraction.set_name} --layers "
        f"{','.join(map(str, extraction.layer_ids))} --target-topk {ops.TARGET_TOPK}), or replay with --stream"
    )


def sampling_of(spec: ops.ReplayWork) -> Sampling | None:
    s = spec.settings
    if s.temperature is None:
        return None
    from ..replay.expect import Sampling

    return Sampling(s.temperature, s.verify)


def with_tops(store: Store, extraction: Extraction, seqs: list[Sequence]) -> list[Sequence]:
    """`seqs` with each one's stored top-K (`cache.read_top`: validated against the completion and vocabulary)."""
    from .. import cache, target_info

    vocab, k = target_info.describe(extraction.target_path).vocab_size, topk_of(extraction)
    root = features_root(store)
    return [
        replace(s, top=cache.read_top(root, extraction.id, s.id, s.prompt_len, len(s.tokens) - s.prompt_len, k, vocab))
        for s in seqs
    ]


def labels(temperature: float | None, verify: str) -> dict:
    """What a run's summary records of its expected-acceptance pass ({} without one)."""
    if temperature is None:
        return {}
    return {"temperature": temperature, "verify": verify, "expected_basis": TEACHER_FORCED}
