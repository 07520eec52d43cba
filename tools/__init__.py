"""Development tooling outside the runtime package: `tiny` (seeded tiny models for tests and benchmarks) and
`demo/` (the scripts that made the demo's committed assets).

Contract: run from the repository root (`python -m tools.demo.make_assets STEP`; tests and benchmarks have the
root on sys.path). Nothing in `dflash_dash/`, `app.py` or `pages/` imports this package (tests/test_arrows.py).
"""
