"""The scripts that made the demo's committed assets (`dflash_dash/demo/assets/`, described by its MANIFEST.json).

Contract: `make_assets` is the entry point (`python -m tools.demo.make_assets STEP`, from the repository root),
its steps in `prepare`, `gpu` and `manifest` (unpack, finish), sharing `common`, with `synth` (the synthetic
training corpus: `coding` for the coding-10 families, `synth_base` for what the families share, `vary` for a
writer's free choices), `train_target` and `train_drafter`. They read the demo's constants from
`dflash_dash.demo`; the runtime never imports them.
"""
