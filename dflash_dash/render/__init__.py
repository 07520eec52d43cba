"""Data shaped for eyes: number formats, escaped token HTML, the compare view, plotly figures and tables.

Contract: only the pages import this package (tests/test_arrows.py checks that the pipeline and `analysis` never
do): it turns the rows of `analysis`, `metrics` and the store into what a page shows, and computes nothing a
stored or exported number depends on. Every piece of model output that ends up in HTML goes through
`tokens.esc`, the one escaping function. plotly is imported on first use (`figures.go`).

  formats           numbers (`fmt`, `prob`, `ci`), labels, relative links, CSV text
  tokens            token view HTML/CSS, escaping, the round view
  compare           Compare's two scroll-synced token views (its script and style are the package assets
                    compare.js and compare.css)
  figures           plotly figures of runs, comparisons, sweeps, parity, attribution, conformance
  analysis_figures  plotly figures of the kept analyses: calibration and failure patterns
  tables            tables of runs, prompts, completions, extractions, GPUs and conformance
"""
