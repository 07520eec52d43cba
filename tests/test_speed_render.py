"""The cost table as the Acceptance page shows it (dflash_dash/render/speedup.py): its measured times per context
length in milliseconds, and the noise check that flags a table whose verify of more tokens was timed far below one
of fewer (planted by timing one step of a linear table three times slower)."""

from __future__ import annotations

from dflash_dash import costs
from dflash_dash.render.speedup import cost_rows, noisy


def linear() -> dict:
    """t_target(q, c) = 10 ms + 1 ms q + 0.01 ms c; the drafter 2 ms; a DDTree-8 4 ms."""
    cs = (8, 64)
    return costs.to_dict(
        costs.CostTable(
            device="cpu",
            backend="torch",
            target=tuple((c, q, 0.010 + 0.001 * q + 1e-5 * c) for c in cs for q in (1, 2, 4)),
            draft=tuple((c, 0.002) for c in cs),
            tree=tuple((8, c, 0.004) for c in cs),
            meta={"dtype": "float32"},
        )
    )


def test_cost_rows_are_milliseconds_per_context():
    rows = cost_rows(linear())
    assert [r["context c"] for r in rows] == [8, 64]
    assert rows[1] == {"context c": 64, "target q=1": 11.64, "target q=2": 12.64, "target q=4": 14.64,
                       "drafter block": 2.0, "DDTree-8": 4.0}  # fmt: skip


def test_a_table_timed_backwards_is_flagged_as_noisy():
    t = linear()
    assert noisy(t) is None
    slow = [[c, q, s * 3 if (c, q) == (64, 1) else s] for c, q, s in t["target"]]  # one step timed on a busy machine
    assert (
        noisy(t | {"target": slow})
        == "at context 64 the target's forward of 2 tokens was timed at 12.6 ms, of 1 at 34.9 ms"
    )
