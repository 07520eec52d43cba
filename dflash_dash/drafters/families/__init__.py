"""The built-in drafter families, one torch-free module each declaring its `FamilySpec` as `SPEC`.

Contract: every module here is imported by `registry` on its first question and its `SPEC` registered (no list to
edit: a new module is a new family); a module imports `spec` and `errors` only (never the registry: no circle).
The model code each names lives in `drafters/<family>.py` and is imported only on first load (torch). Nothing
else in the product names a family.
"""
