"""The error guard of a page body: a user error shown as its message (in a form's words when given its labels),
anything else as a short message with the traceback in the server log only: never a traceback in the browser."""

from __future__ import annotations

import sys
import traceback
from contextlib import contextmanager

import streamlit as st

from dflash_dash.errors import UserError
from pages import forms


@contextmanager
def guard(labels: dict[str, str] | None = None):
    """Run a page body; show user errors as their message and anything else as a short message (the
    traceback goes to the server log only). `labels` {op field: form label} (a form's own, beside forms.FIELDS): a
    form's errors name its fields (`forms.said`)."""
    try:
        yield
    except UserError as e:
        st.error(forms.said(e, forms.FIELDS | labels) if labels is not None else str(e))
    except Exception as e:  # noqa: BLE001  (never a traceback in the browser)
        traceback.print_exc(file=sys.stderr)
        st.error(f"Unexpected error ({type(e).__name__}): {e}. The details are in the log of `streamlit run`.")
