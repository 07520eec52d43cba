"""The scripts that made the demo's committed assets (`dflash_dash/demo/assets/`, described by its MANIFEST.json).

Contract: `make_assets` is the entry point (`python -m tools.demo.make_assets STEP`, from the repository root),
its steps in `prepare`, `gpu`, `manifest` (unpack, finish) and `cpu_continue` (sharing `common`), with `corpus`
(the stdlib training corpus), `train_target` and `train_drafter`. They read the demo's constants
from `dflash_dash.demo`; the runtime never imports them.
"""
