"""DuckDB workspace store: schema, forward migrations, queries; typed rows out. Knows nothing of torch.

Contract: `Store(workspace)` is the one way into a workspace's `dflash.duckdb`: `schema` (append-only migrations,
the version), `database` (connections under a cross-process lock, sessions, transactions), `arrays` (a run
prompt's result arrays packed into array files beside the database), `queries` (the `Store` class and its typed
query methods), `rows` (the frozen dataclass each query returns: `Run`, `Extraction`, `Completion`, `Job`, ...).
Callers import what they use from here.
"""

from .arrays import ARRAYS, ARRAYS_DIR, pack_arrays, unpack_arrays
from .database import DB_NAME, new_id
from .errors import StoreError
from .queries import Store, default_workspace
from .rows import Attribution, Completion, CompletionEntry, Extraction, Item, Job, PromptSet, Row, Run
from .schema import MIGRATIONS, VERSION

__all__ = [
    "ARRAYS",
    "Attribution",
    "Completion",
    "CompletionEntry",
    "Extraction",
    "Item",
    "Job",
    "PromptSet",
    "Row",
    "Run",
    "ARRAYS_DIR",
    "DB_NAME",
    "MIGRATIONS",
    "VERSION",
    "Store",
    "StoreError",
    "default_workspace",
    "new_id",
    "pack_arrays",
    "unpack_arrays",
]
