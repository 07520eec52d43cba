"""The built-in drafter families, one torch-free module each declaring its `FamilySpec` and registering it.

Contract: every module here is imported by `registry` on its first question (no list to edit: a new module is a
new family); each defines `SPEC` and calls `registry.register(SPEC)` at import. The model code each names lives in
`drafters/<family>.py` and is imported only on first load (torch). Nothing else in the product names a family.
"""
