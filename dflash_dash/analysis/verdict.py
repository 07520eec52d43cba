"""The conformance verdict of one run against one engine: did the engine serve the replayed drafter, and does it
reach the acceptance the replay says a correct engine reaches, no more and no less?

Contract: pure (no torch, no store, no HTTP). Inputs: the compared rows (`conformance.compare`), what the engine
said it served (`engines.base.served_row`, plus "local": the identity of its draft path where that path is
readable here, `drafters.identity`; None when the engine does not say or nothing was recorded) and the identity of
the replayed drafter ("replayed": `drafters.identity`, or its config alone when the checkpoint is gone).
- `match(served, replayed)`: the fields both sides report, compared: fingerprint (config + weights), draft name
  (the path's last part; a Hugging Face cache path names its repository), algorithm (the engine's name of it
  against the drafter family), block size B, verify width (tokens a verify step checks), target layer ids.
  same = False on any difference, True when the fingerprints agree (or, without the served weights, the names
  agree and nothing differs), None when the engine names no drafter.
- `verdict(...)`: one of VERDICTS, first that applies:
  other-drafter  the engine reported another drafter or config than the replayed one (the replay is no ceiling
                 for it, whatever the numbers say);
  engine-below / engine-above  the engine's pooled tau is below / above the replay's by more than the threshold
                 (of the replay's), or, within it, prompts are flagged that way (the majority direction; a tie
                 reads below): a correct engine serving the same drafter with the same numerics matches exactly;
  conforms       the engine served the replayed drafter and matches within the threshold;
  unverified     it matches within the threshold but does not say what it served: numbers alone cannot tell the
                 same drafter from another of similar acceptance.
  The "why" names taus with metrics.TAU (2 decimals), as the tables do.
- `backend_explains(backend, verdict)`: whether a torch-path replay's caveat (its features differ from the fla
  kernels' the drafter was trained on, so the replay can read low) can explain the verdict: only an engine above
  the replay.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from .. import metrics

VERDICTS = ("conforms", "engine-below", "engine-above", "other-drafter", "unverified")
FIELDS = {  # compared field -> what it is, in words
    "fingerprint": "fingerprint (config + weights)",
    "name": "draft model",
    "algorithm": "algorithm",
    "block_size": "block size",
    "verify_width": "verify width (tokens per verify step)",
    "target_layer_ids": "target layer ids",
}


def draft_name(path: str | None) -> str | None:
    """The name a draft path stands for: its last part, or the repository of a Hugging Face cache path
    (.../models--ORG--NAME/snapshots/HASH -> NAME) or id (ORG/NAME -> NAME)."""
    if not path:
        return None
    parts = [p for p in PurePosixPath(path.replace("\\", "/")).parts if p not in ("/", "")]
    for p in reversed(parts):
        if p.startswith("models--"):
            return p.split("--")[-1]
    return parts[-1] if parts else None


def _algorithm(a: str | None) -> str | None:
    a = (a or "").strip().lower().removeprefix("draft-").replace("_", "")
    return a or None


def engine_side(served: dict[str, Any] | None) -> dict[str, Any]:
    """The served fields `match` compares, None where the engine (or the local draft path) does not say."""
    s, loc = served or {}, (served or {}).get("local") or {}
    return {
        "fingerprint": loc.get("fingerprint"),
        "name": draft_name(s.get("draft_model_path")),
        "algorithm": _algorithm(s.get("algorithm")),
        "block_size": s.get("block_size") or loc.get("block_size"),
        "verify_width": s.get("verify_width"),
        "target_layer_ids": loc.get("target_layer_ids"),
    }


def replay_side(replayed: dict[str, Any]) -> dict[str, Any]:
    """The replayed drafter's fields `match` compares."""
    return {
        "fingerprint": replayed.get("fingerprint"),
        "name": draft_name(replayed.get("path")) or replayed.get("name"),
        "algorithm": replayed.get("family"),
        "block_size": replayed.get("block_size"),
        "verify_width": replayed.get("width"),
        "target_layer_ids": replayed.get("target_layer_ids"),
    }


def match(served: dict[str, Any] | None, replayed: dict[str, Any]) -> dict[str, Any]:
    """{"same": True | False | None, "how": the basis in words, "differs": [{"field", "label", "engine",
    "replay"}], "agrees": [field names]} (see the module contract)."""
    e, r = engine_side(served), replay_side(replayed)
    differs, agrees = [], []
    for k, label in FIELDS.items():
        if e[k] is None or r[k] is None:
            continue
        if k == "name" and e["fingerprint"] is not None and r["fingerprint"] is not None:
            continue  # the weights decide; a copy under another name is the same drafter
        if e[k] == r[k]:
            agrees.append(k)
        else:
            differs.append({"field": k, "label": label, "engine": e[k], "replay": r[k]})
    if differs:
        what = "; ".join(f"{d['label']} {d['engine']}, replayed {d['replay']}" for d in differs)
        same, how = False, f"the engine serves {e['name'] or 'another drafter'}, not the replayed {r['name']}: {what}"
    elif "fingerprint" in agrees:
        same, how = True, "same fingerprint (config and weights) as the replayed drafter"
    elif "name" in agrees:
        also = [FIELDS[k] for k in agrees if k != "name"]
        same = True
        how = "same draft model name as the replayed drafter" + (f" and the same {', '.join(also)}" if also else "")
        how += " (its weights are not readable here to compare)"
    elif served is None:
        same, how = None, "the engine does not say which drafter it served"
    else:
        same, how = None, "the engine names no draft model"
        how += f" (it reports {', '.join(FIELDS[k] for k in agrees)}, as replayed)" if agrees else ""
    return {"same": same, "how": how, "differs": differs, "agrees": agrees}


def _pooled(rows: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    both = [r for r in rows if r.get("engine_tau") is not None and r.get("replay_tau") is not None]
    v, n = sum(r["verify_steps"] for r in both), sum(r["completion_tokens"] - 1 for r in both)
    rounds, committed = sum(r["rounds"] for r in both), sum(r["committed"] for r in both)
    return (n / v if v else None), (committed / rounds if rounds else None)


def direction(rows: list[dict[str, Any]], threshold: float) -> tuple[str | None, dict[str, Any]]:
    """("below" | "above" | None, the numbers): the pooled taus, their relative gap and the prompts flagged each way."""
    e, r = _pooled(rows)
    gap = (e - r) / r if e is not None and r else None
    below = [x["id"] for x in rows if x.get("flagged")]
    above = [x["id"] for x in rows if x.get("above")]
    nums = {"engine_tau_pooled": e, "replay_tau_pooled": r, "gap_rel": gap, "below": below, "above": above}
    if gap is not None and gap < -threshold:
        return "below", nums
    if gap is not None and gap > threshold:
        return "above", nums
    if below or above:
        return ("below" if len(below) >= len(above) else "above"), nums
    return None, nums


TORCH_ABOVE = "so the replay's acceptance can sit below serving's and a correct engine above the replay"


def backend_explains(backend: str | None, v: dict[str, Any]) -> bool:
    """A torch-path replay (`backend` "torch") can read below what the engine's fla-kernel features reach, so it can
    explain only an engine above the replay (`v`: a `verdict`): never one that matches it or falls short of it."""
    return backend == "torch" and (v["verdict"] == "engine-above" or bool(v.get("above")))


def verdict(
    rows: list[dict[str, Any]], served: dict[str, Any] | None, replayed: dict[str, Any], threshold: float
) -> dict[str, Any]:
    """{"verdict" (one of VERDICTS), "why" (one paragraph, the evidence in words), "identity" (`match`), and the
    numbers of `direction`}."""
    ident = match(served, replayed)
    way, nums = direction(rows, threshold)
    e, r, gap = nums["engine_tau_pooled"], nums["replay_tau_pooled"], nums["gap_rel"]
    taus = (
        f"engine tau {metrics.TAU.format(e)} against the replay's {metrics.TAU.format(r)} (pooled, {gap:+.1%})"
        if e is not None and r is not None and gap is not None
        else "no prompt to compare"
    )
    per = f"{len(nums['below'])} prompt(s) below and {len(nums['above'])} above by more than {threshold:g} x replay tau"
    unsaid = "" if ident["same"] is not None else f" ({ident['how']}: another drafter would read the same)"
    if ident["same"] is False:
        v = "other-drafter"
        why = (
            f"{ident['how']}. The replay is the ceiling only for the drafter it replayed, so these numbers ({taus}) "
            "say nothing of the engine: replay the drafter the engine served, or fetch from an engine serving this one."
        )
    elif way == "below":
        v = "engine-below"
        why = f"{taus}; {per}: the engine loses acceptance the replay keeps; look at the engine first{unsaid}."
    elif way == "above":
        v = "engine-above"
        why = (
            f"{taus}; {per}. A correct engine serving the replayed drafter with its numerics cannot beat the replay: "
            f"the engine served another drafter or config, or the replay does not replay what the engine ran{unsaid}."
        )
    elif ident["same"]:
        v = "conforms"
        why = f"{ident['how']}; {taus}: the engine reaches the acceptance the replay says a correct engine reaches."
    else:
        v = "unverified"
        why = (
            f"{taus}, within {threshold:g} x replay tau, but {ident['how']}: matching numbers alone cannot tell the "
            "replayed drafter from another of similar acceptance."
        )
    return {"verdict": v, "why": why, "identity": ident} | nums
