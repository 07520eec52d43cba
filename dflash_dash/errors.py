"""The one user-error type: every error meant for the user derives from `UserError`.

Contract: a `UserError`'s message names the problem and the fix; the CLI prints it as `error: ...` (exit 2),
a job records it as its error, a page shows it with st.error; never a traceback. Each module keeps its own
subclass (CheckpointError, ServerError, ...) so callers can still tell them apart. Imports nothing.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user must fix (bad input, a wrong checkpoint, an unreachable server, ...)."""
