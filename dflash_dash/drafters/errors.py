"""The one error a drafter checkpoint raises: `CheckpointError`, a UserError whose message names the field or
tensor and what was expected."""

from __future__ import annotations

from ..errors import UserError


class CheckpointError(UserError, ValueError):
    """A drafter checkpoint that cannot be used as it is; the message names the field and what was expected."""
