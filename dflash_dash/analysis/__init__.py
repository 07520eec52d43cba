"""The computations behind the pages and the kept analyses: numpy and the metric registry only.

Contract: pure functions over the rows the store returns (run rows, run_prompts rows, completions, engine stats,
attributions) that return plain rows (lists of dicts of numbers and strings) or small dataclasses: the pipeline
keeps and exports them, `render` shapes them for eyes. No module here imports torch, plotly, streamlit or
`render`, and none writes HTML (tests/test_arrows.py checks the imports): a GPU worker's image may lack plotly,
and a number must not depend on how it is drawn. The chain walk and the drafter checks, which live in modules
that import torch, are imported on first use.

  trace        per completion position: which round committed it and how (accepted draft, target token)
  rounds       one prompt's blocks and one chain round slot by slot (top-K candidates beside the target)
  compare      two runs side by side: default pair, per-prompt delta, draft lag per slot, config diff, sweeps
  calibration  predicted against observed acceptance: by depth, reliability bins, expected tau per prompt
  attribution  tau lost per target-layer tap
  checks       drafter config against an extraction and its target, sliding-window train/serve rows
  conformance  engine tau beside the replay's tau per prompt; engine-stats parsing
  patterns     failure patterns: by token class, position, context length, rejected pairs, worst spans
  signatures   training-bug signatures: a run against a healthy reference, each figure with its interval
"""

from __future__ import annotations


def rounded(x: float | None, digits: int = 3) -> float | None:
    """`x` rounded to `digits` decimals as a plain float (None stays None): how every table row stores a number."""
    return None if x is None else round(float(x), digits)
