"""A worker's failure, one type for both runners (the local pool in `workers`, the Ray cluster in `cluster`): the
caller catches it the same whichever ran the shards."""

from __future__ import annotations

from ..errors import UserError


class WorkerError(UserError, RuntimeError):
    """A worker process failed or died; the message names it, its device and the end of its stderr."""
