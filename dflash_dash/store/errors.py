"""The store's one error type: a store problem the user must act on (an unknown id, a newer schema, a missing
array file). Its own module so that every part of the store can raise it without importing the others."""

from __future__ import annotations

from ..errors import UserError


class StoreError(UserError, RuntimeError):
    """A store problem the user must act on (e.g. an unknown id)."""
