"""Predicted speedup and the "what to serve" advisor, shaped for eyes: table rows with readable headers, and the
captions that state the formula and the cost table's device (CPU costs labelled as such).

Contract: takes what `analysis.speedup.predict` / `advise` return and the kept cost tables (`costs.to_dict` with
their id; `cost_rows`: its measured times per context length, in ms); computes nothing a stored number depends on.
Rows keep None where a value is missing (the pages draw a dash); run names are not model output (no escaping
needed: they go through st.dataframe as text).
"""

from __future__ import annotations

from ..analysis import rounded

WHAT_TO_SERVE = "What to serve"  # the section's stable title (the browser test finds it)
PREDICTED = "Predicted speedup"  # the metric's stable label


def table_label(t: dict) -> str:
    """One kept cost table in a selectbox: its id, device and backend (CPU costs said so)."""
    where = "CPU costs" if t.get("device") == "cpu" else t.get("device", "?")
    return f"{t['id']} · {where} · {t.get('backend', '?')} · {t.get('meta', {}).get('dtype', '?')}"


def predicted_caption(got: dict, table_id: str) -> str:
    """The formula, the verify size and the cost table it was priced on."""
    return (
        f"{got['formula']}; verify = {got['verify']} tokens (the block); cost table `{table_id}`: {got['costs']}. "
        f"Plain decoding on it: {_rate(got.get('plain_tokens_per_s'))} tokens/s; speculative: "
        f"{_rate(got.get('tokens_per_s'))} tokens/s (predicted)."
    )


def cost_rows(t: dict) -> list[dict]:
    """A kept cost table (`costs.to_dict`) for eyes, one row per context length c: the target's forward of q new
    tokens after c cached tokens, the drafter's block and each DDTree's drafting, in milliseconds."""
    sizes = sorted({int(q) for _, q, _ in t.get("target", [])})
    ctxs = sorted({int(c) for c, _, _ in t.get("target", [])} | {int(c) for c, _ in t.get("draft", [])})
    at = {(int(c), int(q)): s for c, q, s in t.get("target", [])}
    draft = {int(c): s for c, s in t.get("draft", [])}
    tree = {(int(b), int(c)): s for b, c, s in t.get("tree", [])}
    return [
        {"context c": c}
        | {f"target q={q}": _ms(at.get((c, q))) for q in sizes}
        | {"drafter block": _ms(draft.get(c))}
        | {f"DDTree-{b}": _ms(tree.get((b, c))) for b in sorted({b for b, _ in tree})}
        for c in ctxs
    ]


def noisy(t: dict) -> str | None:
    """Why a kept cost table looks noisy (None: it does not): at some context, a target forward of more new tokens
    timed at under half the time of fewer (a verify is not cheaper than a step; a busy machine or too few timed
    forwards is). The first such pair, in words."""
    at: dict[int, list[tuple[int, float]]] = {}
    for c, q, s in t.get("target", []):
        at.setdefault(int(c), []).append((int(q), float(s)))
    for c, pts in sorted(at.items()):
        pts.sort()
        for i, (q, s) in enumerate(pts):
            for q2, s2 in pts[i + 1 :]:
                if s2 < s / 2:
                    return (
                        f"at context {c} the target's forward of {q2} tokens was timed at {s2 * 1000:,.1f} ms, of "
                        f"{q} at {s * 1000:,.1f} ms"
                    )
    return None


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1000, 3)


def measured_caption(m: dict | None) -> str:
    """The engine's own throughput over the set, or why there is none."""
    if not m:
        return "Measured: the engine reported no timings for these completions (imported, or an engine without them)."
    return (
        f"Measured by the engine: {_rate(m['tokens_per_s'])} tokens/s over {m['completions']} completions "
        f"({m['how']}); a prediction on another device or backend does not compare directly."
    )


def advice_rows(advice: dict) -> list[dict]:
    """One row per setting: setting, k drafts, verify size, temperature, tau, predicted speedup, tokens/s, best."""
    return [
        {
            "setting": r["setting"],
            "best": "★ best" if r["best"] else "",
            "drafts k": r["k"],
            "verify tokens": r["verify"],
            "T": r["temperature"],
            "tau": rounded(r["tau"], 3),
            "predicted speedup": rounded(r["speedup"], 3),
            "predicted tokens/s": rounded(r["tokens_per_s"], 1),
            "run": r["run"],
        }
        for r in advice["rows"]
    ]


def advice_caption(advice: dict) -> str:
    return (
        f"{advice['formula']}. Drafts k = 1..{advice['block_size'] - 1}: {advice['capped']}. DDTree-b: the run's tree "
        f"rounds, a tree drafted and verified as b + 1 tokens. Temperature rows: {advice['temperature_rule']} "
        f"(tau_expected, teacher-forced). Costs: {advice['costs']}."
    )


def _rate(x: float | None) -> str:
    return "—" if x is None else f"{x:,.1f}"
