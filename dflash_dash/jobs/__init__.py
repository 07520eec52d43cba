"""Background jobs: long work (fetch, extraction, replay, sweep, demo) as separate OS processes.

The parts, each imported by who needs it (this package imports none of them, so `gpu` stays torch-free):
- `lifecycle`: job records and their life (start, refresh, cancel, rerun, log tail, active/recent, Reporter).
- `dispatch`: running one recorded job in the job process (`execute`, `run`).
- `commands`: the handlers of the operations above the pipeline (demo build, job list, backend parity), registered
  with `pipeline.handle` on import (the CLI and `dispatch` import it), so they run through `pipeline.perform`.
- `workers`: the worker pool sharding an operation's prompts over one process per device; `wire`: the format
  that crosses between the pool and its workers; `cluster`: the same on a Ray cluster; `failure`: a worker's
  failure (WorkerError), one type for both.
- `orchestrate`: freeing the SGLang server's GPU around an extraction and restoring it; the pre-extraction checks.
- `gpu`: the torch-free device inventory and GPU memory (what pages import to list GPUs).
- `__main__`: the process entry, `python -m dflash_dash.jobs` (a job, or `--worker`).
"""
