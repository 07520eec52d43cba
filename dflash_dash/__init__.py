"""dflash-dash: analyse DFlash drafters against their target (see README.md; CLI: python -m dflash_dash)."""
