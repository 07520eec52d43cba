"""Headless Debian Chromium as the browser tests and `benchmarks/bench_browser.py` drive it (Playwright): its
path, its flags, and the page predicates they wait on.

Contract: strings only, no Playwright import (the callers own the browser), so that tests/ and benchmarks/ share
one definition of "the page is drawn".
"""

from __future__ import annotations

import os

CHROMIUM = os.environ.get("DFLASH_CHROMIUM", "/usr/bin/chromium")  # override: tests of the skip policy
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# no skeleton left, every shown plotly chart and table drawn (a collapsed expander or an unselected tab draws
# nothing and is not waited for)
_PLACEHOLDERS_GONE = """!document.querySelector('[data-testid=stSkeleton]')
    && [...document.querySelectorAll('[data-testid=stPlotlyChart]')].filter(e => e.checkVisibility())
           .every(e => e.querySelector('.main-svg'))
    && [...document.querySelectorAll('[data-testid=stDataFrame]')].filter(e => e.checkVisibility())
           .every(e => e.querySelector('canvas'))"""
PLACEHOLDERS_GONE = f"() => {_PLACEHOLDERS_GONE}"
# ... and the script run over (no status widget): a page drawn to the end, as a timed benchmark needs it
DRAWN = f"""() => document.querySelector('[data-testid=stApp]')?.dataset.testScriptState === 'notRunning'
    && !document.querySelector('[data-testid="stStatusWidget"]')
    && {_PLACEHOLDERS_GONE}"""
