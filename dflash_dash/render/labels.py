"""Labels of rows for selects and captions: a run's drafter family, an extraction's or a run's one-line label,
whether an extraction was streamed. Pure strings from store rows (`store.Run`, `store.Extraction`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..store import Extraction, Run


def family(run: Run) -> str:
    """The drafter family of a run (DFlash for runs replayed before families were recorded)."""
    return (run.summary or {}).get("family", "DFlash")


def extraction_label(by_id: dict[str, Extraction]):
    """An extraction selectbox's label: id, backend, completion set and the target layers it holds (a drafter
    replays on any extraction holding its layers)."""

    def f(i: str) -> str:
        e = by_id[i]
        label = f"{i} · {e.backend} · {e.set_name} · layers {','.join(map(str, e.layer_ids or []))}"
        return label + (" · streamed: a replay runs the target again" if streamed(e) else "")

    return f


def streamed(e: Extraction | None) -> bool:
    """Whether an extraction row was computed by streaming (replay/sweep --stream): no feature file was written."""
    return bool(e and (e.versions or {}).get("streamed"))


def run_label(runs_by_id: dict[str, Run]):
    def f(rid: str) -> str:
        r = runs_by_id.get(rid)
        return f"{r.name} · {family(r)} · {r.backend} · {rid}" if r else f"None · DFlash · None · {rid}"

    return f
