"""The metric registry (SPEC 3): every metric defined once, with its key, label, formula and functions.

Contract: plain per-round data in, numbers out (no torch, no store, no Streamlit). A metric is a `Metric`
entry of `REGISTRY`: `run(prompts, ctx)` gives the run-level value stored in the run's summary under `key`,
`prompt(p, ctx)` (when the metric has one) the per-prompt value. `replay.summarize`, `pipeline.export`, the
listings, the pages, compare, the sweep chart and the downloads all read this registry, so adding a metric is
one entry here, its function and its test.

A prompt is seen as a `Prompt`: prompt length P, accepted(p) at every completion anchor (-1 where a chain-only
replay did not compute it: metrics that need every anchor are then None), the committed
tokens of each chain-walk round (and of the DDTree walk), the per-slot top-1 log-probability of the drafts
where the run recorded it. `Prompt.of` builds one from a `replay.PromptResult` or a `run_prompts` row.

Statistics over prompts (bootstrap intervals, median, Tukey outliers) treat the prompt as the sampling unit and
are deterministic (seeded); numpy is the only dependency. `show` prints every value with its metric's format:
TAU (2 decimals) for tau-like numbers, PROB (3 decimals) for probabilities. Metrics whose label names DDTree
(`tree_only`) are about the tree walk or its budget and shown only for runs with a tree.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# ---------------------------------------------------------------------------
# data


def flat(v: Any) -> Any:
    """An array field of a result or row flat: [] for None, a numpy array raveled (numpy: a worker's chain-only
    results travel as arrays, never as Python lists), nested lists joined, a flat list as it is."""
    if v is None:
        return []
    if hasattr(v, "ravel"):
        return v.ravel()
    if len(v) and isinstance(v[0], (list, tuple)):
        return [x for row in v for x in flat(row)]
    return v


@dataclass
class Prompt:
    id: str
    prompt_len: int  # P: position of the first completion token
    accepted_at: list[int]  # accepted(p), p = P..T-1
    rounds: list[int]  # committed tokens per round of the chain walk (bonus included)
    tree_rounds: list[int] = field(default_factory=list)  # committed per round of the DDTree walk
    draft_logp: list[float] = field(default_factory=list)  # [A*(B-1)] top-1 log-prob per anchor and slot

    @property
    def T(self) -> int:  # tokens of prompt + completion
        return self.prompt_len + len(self.accepted_at)

    @property
    def anchors(self) -> list[int]:
        """Anchor of each chain-walk round: P, then + committed."""
        return self.walk()[0].tolist()

    def walk(self) -> tuple:
        """The chain-walk rounds as numpy arrays (computed once per Prompt): anchors a [R], accepted(a) [R],
        tokens left after each anchor T-1-a [R]."""
        got = self.__dict__.get("_walk")
        if got is None:
            import numpy as np

            a = (
                self.prompt_len + np.concatenate([[0], np.cumsum(self.rounds, dtype=np.int64)[:-1]]).astype(np.int64)
                if self.rounds
                else np.zeros(0, dtype=np.int64)
            )
            acc = np.asarray(self.accepted_at, dtype=np.int64)[a - self.prompt_len]
            got = self.__dict__["_walk"] = (a, acc, self.T - 1 - a)
        return got

    def draft_p(self, D: int):
        """[R, D] min(1, exp(draft_logp)) at the rounds' anchors (math.exp, value for value as the per-round loops
        computed it), computed once per Prompt and D; call only when `recorded`."""
        got = self.__dict__.get(("_p", D))
        if got is None:
            import numpy as np

            a = self.walk()[0] - self.prompt_len
            lp = np.asarray(self.draft_logp, dtype=np.float64).reshape(-1, D)[a].ravel()
            got = np.minimum(1.0, np.fromiter(map(math.exp, lp.tolist()), np.float64, len(lp))).reshape(-1, D)
            self.__dict__[("_p", D)] = got
        return got

    @classmethod
    def of(cls, r: Any) -> Prompt:
        """From a replay.PromptResult (attributes) or a run_prompts row (dict); a Prompt is itself (what it computed
        once, its walk and probabilities, is kept: a store step builds each prompt's Prompt once for every metric)."""
        if isinstance(r, Prompt):
            return r
        get = (lambda k, d=None: r.get(k, d)) if isinstance(r, dict) else (lambda k, d=None: getattr(r, k, d))
        return cls(
            get("prompt_id") or get("id"),
            int(get("prompt_len")),
            list(flat(get("accepted_at"))),
            list(flat(get("rounds"))),
            list(flat(get("tree_rounds"))),
            flat(get("draft_logp")),
        )


@dataclass
class Ctx:
    block_size: int  # B
    tree_budget: int  # DDTree node budget (0: no tree)


# ---------------------------------------------------------------------------
# functions


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def tau(p: Prompt, ctx: Ctx) -> float | None:
    return sum(p.rounds) / len(p.rounds) if p.rounds else None


def tree_tau(p: Prompt, ctx: Ctx) -> float | None:
    return sum(p.tree_rounds) / len(p.tree_rounds) if ctx.tree_budget and p.tree_rounds else None


def every_anchor(p: Prompt, ctx: Ctx) -> float | None:
    """Mean of accepted(p) + 1 over anchors P..T-2 (the last token has nothing left to draft); None for a
    chain-only replay (anchors off the walks hold -1: not computed)."""
    return _every_anchor_mean([p])


def _every_anchor_mean(ps: list[Prompt]) -> float | None:
    """Mean of accepted(p) + 1 over the anchors P..T-2 of every prompt (integer sums, then one division);
    None when one is -1 (not computed)."""
    import numpy as np

    acc = [np.asarray(p.accepted_at[:-1], dtype=np.int64) for p in ps]
    n = sum(len(a) for a in acc)
    if any(len(a) and a.min() < 0 for a in acc) or not n:
        return None
    return (sum(int(a.sum()) for a in acc) + n) / n


def macro(fn: Callable[[Prompt, Ctx], float | None]) -> Callable[[list[Prompt], Ctx], float | None]:
    def run(ps: list[Prompt], ctx: Ctx) -> float | None:
        return _mean([v for v in (fn(p, ctx) for p in ps) if v is not None])

    return run


def pooled(attr: str, need_tree: bool = False) -> Callable[[list[Prompt], Ctx], float | None]:
    def run(ps: list[Prompt], ctx: Ctx) -> float | None:
        if need_tree and not ctx.tree_budget:
            return None
        rs = [c for p in ps for c in getattr(p, attr)]
        return sum(rs) / len(rs) if rs else None

    return run


def every_anchor_run(ps: list[Prompt], ctx: Ctx) -> float | None:
    return _every_anchor_mean(ps)


def accept_hist(ps: list[Prompt], ctx: Ctx) -> list[int]:
    """Rounds of the chain walk by accepted drafts 0..B-1."""
    h = [0] * ctx.block_size
    for p in ps:
        for a in p.walk()[1].tolist():
            h[a] += 1
    return h


def depth_counts(ps: list[Prompt], ctx: Ctx) -> tuple[list[int], list[int], list[int]]:
    """Per depth k = 1..B-1 over the trace rounds whose slot k lies inside the completion: (inside, reached:
    d_1..d_{k-1} accepted, hit: d_1..d_k accepted)."""
    import numpy as np

    D = ctx.block_size - 1
    if not ps:
        return [0] * D, [0] * D, [0] * D
    acc = np.concatenate([p.walk()[1] for p in ps])
    kmax = np.minimum(D, np.concatenate([p.walk()[2] for p in ps]))  # slots inside the completion

    def at_least(m):  # [#(m >= k) for k = 1..D]
        return np.cumsum(np.bincount(np.clip(m, 0, D), minlength=D + 1)[::-1])[::-1][1:].tolist()

    return at_least(kmax), at_least(np.minimum(kmax, acc + 1)), at_least(np.minimum(kmax, acc))


def depth_conditional(ps: list[Prompt], ctx: Ctx) -> list[float | None]:
    _, reach, hit = depth_counts(ps, ctx)
    return [h / r if r else None for r, h in zip(reach, hit)]


def depth_marginal(ps: list[Prompt], ctx: Ctx) -> list[float | None]:
    inside, _, hit = depth_counts(ps, ctx)
    return [h / n if n else None for n, h in zip(inside, hit)]


def depth_samples(ps: list[Prompt], ctx: Ctx) -> list[int]:
    """Rounds behind each point of the conditional curve (d_1..d_{k-1} accepted, slot k inside)."""
    return depth_counts(ps, ctx)[1]


# ---------------------------------------------------------------------------
# calibration: the drafter's probability of its own top-1 draft against how often the target accepts it
#
# p_k = exp(draft_logp) of the argmax draft at slot k of a round's block. A sample is a chain-walk round and a
# depth k with slot k inside the completion and d_1..d_{k-1} accepted; its outcome is whether d_k was accepted
# too (the same rounds as `depth_conditional`). Runs replayed before draft log-probabilities were stored have
# none: every calibration value is then None ("not recorded, replay again").

CAL_BINS = 10  # equal-width bins of the predicted probability over [0, 1]


def recorded(p: Prompt, ctx: Ctx) -> bool:
    """The prompt's replay stored the log-probability of every draft (A*(B-1) values)."""
    return bool(p.accepted_at) and len(p.draft_logp) == len(p.accepted_at) * (ctx.block_size - 1)


def cal_samples(p: Prompt, ctx: Ctx) -> list[tuple[int, float, bool]]:
    """(depth k, predicted p_k, accepted) per chain-walk round and depth k: slot k inside the completion and
    d_1..d_{k-1} accepted. [] when the prompt has no draft log-probabilities."""
    k, q, ok = _cal(p, ctx)
    return list(zip(k.tolist(), q.tolist(), ok.tolist()))


def _cal(p: Prompt, ctx: Ctx) -> tuple:
    """`cal_samples` as arrays (depth k [S], p_k [S], accepted [S]), round by round, k ascending; once per Prompt."""
    import numpy as np

    D = ctx.block_size - 1
    got = p.__dict__.get(("_cal", D))
    if got is not None:
        return got
    if not recorded(p, ctx):
        got = (np.zeros(0, np.int64), np.zeros(0, np.float64), np.zeros(0, bool))
    else:
        _, acc, left = p.walk()
        ks = np.arange(1, D + 1)
        take = ks[None, :] <= np.minimum(np.minimum(D, left), acc + 1)[:, None]  # [R, D], row-major = loop order
        got = (np.broadcast_to(ks, take.shape)[take], p.draft_p(D)[take], (acc[:, None] >= ks[None, :])[take])
    p.__dict__[("_cal", D)] = got
    return got


def _samples(ps: list[Prompt], ctx: Ctx) -> tuple | None:
    """Samples of every prompt as arrays (depth k, p_k, accepted); None when no prompt recorded draft
    log-probabilities."""
    import numpy as np

    if not any(recorded(p, ctx) for p in ps):
        return None
    got = [_cal(p, ctx) for p in ps]
    return tuple(np.concatenate([g[i] for g in got]) for i in range(3))


def _bins(q, ok, n: int = CAL_BINS) -> list[dict]:
    """Reliability bins over samples p_k [S], accepted [S]: per equal-width bin [lo, hi) of p (the last one closed)
    the sample count, the mean predicted p (confidence) and the share accepted (observed); None for an empty bin
    (sums in sample order)."""
    import numpy as np

    b = np.minimum((q * n).astype(np.int64), n - 1)
    cnt, sp = np.bincount(b, minlength=n).tolist(), np.bincount(b, weights=q, minlength=n).tolist()
    hit = np.bincount(b[ok], minlength=n).tolist()
    return [
        {
            "lo": b / n,
            "hi": (b + 1) / n,
            "n": cnt[b],
            "predicted": sp[b] / cnt[b] if cnt[b] else None,
            "observed": hit[b] / cnt[b] if cnt[b] else None,
        }
        for b in range(n)
    ]


def ece_of(bins: list[dict]) -> float | None:
    """Expected calibration error: sum over bins of (n_b / N) * |observed_b - predicted_b|."""
    N = sum(b["n"] for b in bins)
    return sum(b["n"] / N * abs(b["observed"] - b["predicted"]) for b in bins if b["n"]) if N else None


def calibration_ece(ps: list[Prompt], ctx: Ctx) -> float | None:
    s = _samples(ps, ctx)
    return None if s is None else ece_of(_bins(s[1], s[2]))


def calibration_ece_depth(ps: list[Prompt], ctx: Ctx) -> list[float | None] | None:
    s = _samples(ps, ctx)
    return None if s is None else [ece_of(_bins(s[1][s[0] == k], s[2][s[0] == k])) for k in range(1, ctx.block_size)]


def confidence_depth(ps: list[Prompt], ctx: Ctx) -> list[float | None] | None:
    """Mean p_k per depth over the samples (the conditional curve's rounds): against depth_conditional."""
    import numpy as np

    s = _samples(ps, ctx)
    if s is None:
        return None
    n = np.bincount(s[0], minlength=ctx.block_size).tolist()
    tot = np.bincount(s[0], weights=s[1], minlength=ctx.block_size).tolist()  # summed in sample order
    return [tot[k] / n[k] if n[k] else None for k in range(1, ctx.block_size)]


def reliability(ps: list[Prompt], ctx: Ctx) -> dict | None:
    """{"bins": n, "pooled": bins over all depths, "by_depth": [bins of depth k] for k = 1..B-1}."""
    s = _samples(ps, ctx)
    if s is None:
        return None
    return {
        "bins": CAL_BINS,
        "pooled": _bins(s[1], s[2]),
        "by_depth": [_bins(s[1][s[0] == k], s[2][s[0] == k]) for k in range(1, ctx.block_size)],
    }


def expected_rounds(p: Prompt, ctx: Ctx) -> list[float]:
    """Expected committed tokens of each chain-walk round from the draft probabilities:
    1 + sum_{k=1}^{min(B-1, left-1)} prod_{j<=k} p_j, left = T-1-anchor (the same cap as the committed count)."""
    import numpy as np

    if not recorded(p, ctx):
        return []
    got = p.__dict__.get(("_exp", ctx.block_size))
    if got is None:
        D, (_, _, left) = ctx.block_size - 1, p.walk()
        pk = np.where(np.arange(1, D + 1)[None, :] <= np.minimum(D, left - 1)[:, None], p.draft_p(D), 0.0)
        run = np.cumprod(pk, axis=1)  # products in the loop's order; 0 past the cap adds nothing
        got = np.cumsum(np.concatenate([np.ones((len(run), 1)), run], axis=1), axis=1)[:, -1].tolist()
        if np.isnan(pk).any():  # a chain-only replay without DDTree computes no slot after the rejected one
            got = []
        p.__dict__[("_exp", ctx.block_size)] = got
    return list(got)


def expected_tau(p: Prompt, ctx: Ctx) -> float | None:
    return _mean(expected_rounds(p, ctx))


def _slots_missing(ps: list[Prompt], ctx: Ctx) -> bool:
    """Some prompt's rounds lack slots (a chain-only replay without DDTree): no run-level expected tau."""
    return any(recorded(p, ctx) and p.rounds and not expected_rounds(p, ctx) for p in ps)


def expected_tau_run(ps: list[Prompt], ctx: Ctx) -> float | None:
    return None if _slots_missing(ps, ctx) else macro(expected_tau)(ps, ctx)


def expected_tau_pooled(ps: list[Prompt], ctx: Ctx) -> float | None:
    es = [e for p in ps for e in expected_rounds(p, ctx)]
    return sum(es) / len(es) if es and not _slots_missing(ps, ctx) else None


# ---------------------------------------------------------------------------
# statistics over prompts (issue 14): how sure tau is. The prompts are the sampling unit: a bootstrap resamples
# whole prompts (their rounds travel together); outliers are prompts whose tau lies outside Tukey's fences.
# Quantiles are numpy's default (linear interpolation between order statistics).

BOOT_N, BOOT_SEED, BOOT_LEVEL = 1000, 0, 0.95  # resamples, numpy default_rng seed, two-sided level
TUKEY_K = 1.5  # fences Q1 - k*IQR .. Q3 + k*IQR
TUKEY_MIN = 4  # fewer prompts: no fences, no outliers
TUKEY_RULE = (
    f"outlier: per-prompt tau < Q1 - {TUKEY_K:g}·IQR or > Q3 + {TUKEY_K:g}·IQR (Tukey's fences; "
    f"Q1, Q3 = quartiles of per-prompt tau, IQR = Q3 - Q1; needs at least {TUKEY_MIN} prompts)"
)


def _taus(ps: list[Prompt], ctx: Ctx) -> list[tuple[str, float]]:
    """(id, tau) of the prompts that have rounds."""
    return [(p.id, t) for p in ps if (t := tau(p, ctx)) is not None]


def bootstrap(
    values, stat: Callable, n: int = BOOT_N, seed: int = BOOT_SEED, level: float = BOOT_LEVEL
) -> list[float] | None:
    """Percentile bootstrap interval [lo, hi] of `stat` over the rows of `values` (one row per prompt):
    idx = default_rng(seed).integers(0, m, size=(n, m)); stat(values[idx]) gives the n resampled statistics
    (vectorised over the first axis); lo, hi = their (1-level)/2 and (1+level)/2 quantiles. None for no rows."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    if not len(v):
        return None
    idx = np.random.default_rng(seed).integers(0, len(v), size=(n, len(v)))
    lo, hi = np.quantile(stat(v[idx]), [(1 - level) / 2, (1 + level) / 2])
    return [float(lo), float(hi)]


def tau_macro_ci(ps: list[Prompt], ctx: Ctx) -> list[float] | None:
    return bootstrap([t for _, t in _taus(ps, ctx)], lambda x: x.mean(axis=1))


def tau_pooled_ci(ps: list[Prompt], ctx: Ctx) -> list[float] | None:
    return bootstrap(
        [(sum(p.rounds), len(p.rounds)) for p in ps if p.rounds],
        lambda x: x[..., 0].sum(axis=1) / x[..., 1].sum(axis=1),
    )


def tau_median(ps: list[Prompt], ctx: Ctx) -> float | None:
    import statistics

    ts = [t for _, t in _taus(ps, ctx)]
    return float(statistics.median(ts)) if ts else None


def fences(ps: list[Prompt], ctx: Ctx) -> list[float] | None:
    """Tukey's fences [Q1 - k*IQR, Q3 + k*IQR] of per-prompt tau; None under TUKEY_MIN prompts."""
    return fences_of([t for _, t in _taus(ps, ctx)])


def fences_of(ts: list[float]) -> list[float] | None:
    import numpy as np

    if len(ts) < TUKEY_MIN:
        return None
    q1, q3 = np.quantile(ts, [0.25, 0.75])
    return [float(q1 - TUKEY_K * (q3 - q1)), float(q3 + TUKEY_K * (q3 - q1))]


def outliers(ps: list[Prompt], ctx: Ctx) -> dict[str, str]:
    """Prompt id -> "low" / "high" for the prompts whose tau lies outside the fences."""
    return outliers_of(dict(_taus(ps, ctx)))


def outliers_of(taus: dict[str, float | None]) -> dict[str, str]:
    """`outliers` from per-prompt tau values alone (None: a prompt without rounds, never an outlier)."""
    known = {i: t for i, t in taus.items() if t is not None}
    f = fences_of(list(known.values()))
    if f is None:
        return {}
    return {i: "low" if t < f[0] else "high" for i, t in known.items() if not f[0] <= t <= f[1]}


def tau_macro_trimmed(ps: list[Prompt], ctx: Ctx) -> float | None:
    out = outliers(ps, ctx)
    return _mean([t for i, t in _taus(ps, ctx) if i not in out])


def budget_rounds(p: Prompt, ctx: Ctx) -> list[int] | None:
    """Committed tokens per round of a chain whose block verifies as many drafts as the DDTree budget N (block
    N+1), from the same drafts cut to their first N slots: walk from P, commit min(min(accepted(p), N) + 1,
    T-1-p) per round (`replay.walk` with accepted capped at N). None without a tree budget, or where the walk
    reaches an anchor whose accepted(p) was not computed (chain-only replay)."""
    N = ctx.tree_budget
    if not N:
        return None
    if ("_budget", N) in p.__dict__:  # once per Prompt and budget
        got = p.__dict__[("_budget", N)]
        return None if got is None else list(got)
    out, a, T, P, at = [], p.prompt_len, p.T, p.prompt_len, p.accepted_at
    while a < T - 1:
        acc = at[a - P]
        if acc < 0:
            out = None
            break
        c = min(min(acc, N) + 1, T - 1 - a)
        out.append(c)
        a += c
    p.__dict__[("_budget", N)] = out
    return None if out is None else list(out)


def chain_tau_at_budget(p: Prompt, ctx: Ctx) -> float | None:
    rs = budget_rounds(p, ctx)
    return sum(rs) / len(rs) if rs else None


def _budget_all(ps: list[Prompt], ctx: Ctx) -> list[list[int]] | None:
    """budget_rounds of every prompt with rounds; None when any is unknown (a mean over the rest would be biased)."""
    rs = [budget_rounds(p, ctx) for p in ps if p.rounds]
    return None if not rs or any(r is None for r in rs) else rs


def chain_tau_at_budget_run(ps: list[Prompt], ctx: Ctx) -> float | None:
    rs = _budget_all(ps, ctx)
    return None if rs is None else _mean([sum(r) / len(r) for r in rs if r])


def chain_tau_at_budget_pooled(ps: list[Prompt], ctx: Ctx) -> float | None:
    rs = _budget_all(ps, ctx)
    flat = [c for r in rs or [] for c in r]
    return sum(flat) / len(flat) if flat else None


# ---------------------------------------------------------------------------
# one-position draft lag (issue 14, Compare): how often the draft at slot k is the target's token one position
# BEHIND the one it should predict: the signature of a drafter trained with the anchor's own hidden state in view
# (at inference the context stops before the anchor, so its drafts come out shifted by one). Plain per-prompt data
# in: the flat drafts [A*(B-1)] of a run_prompts row (-1 where a chain-only replay did not draft), the prompt +
# completion token ids and P. Not in REGISTRY (it needs the tokens, which run rows do not hold).

LAG_FORMULA = (
    "lag rate at slot k = #(d_k = t[p+k-1]) / #anchors, over every anchor p with drafts and slot k "
    "inside the completion where t[p+k] != t[p+k-1] (else a lag cannot be told from a hit); "
    "on-target rate = #(d_k = t[p+k]) / the same anchors"
)


def lag_counts(
    drafts: list[int], tokens: list[int], prompt_len: int, block_size: int
) -> tuple[list[int], list[int], list[int]]:
    """Per slot k = 1..B-1 of one prompt: (anchors counted, drafts lagging one position, drafts on target).
    Anchors counted: p = P..T-1 with drafts, p+k <= T-1 and t[p+k] != t[p+k-1]."""
    import numpy as np

    D, P, T = block_size - 1, prompt_len, len(tokens)
    n, lag, hit = [0] * D, [0] * D, [0] * D
    A = T - P
    if D < 1 or A < 1 or len(drafts) != A * D:
        return n, lag, hit
    d, t = np.asarray(drafts, dtype=np.int64).reshape(A, D), np.asarray(tokens, dtype=np.int64)
    for k in range(1, min(D, A - 1) + 1):  # anchor p = P + a drafts d_k for t[p+k]: anchors a = 0..A-1-k
        col, want, prev = d[: A - k, k - 1], t[P + k :], t[P + k - 1 : T - 1]
        ok = (col >= 0) & (want != prev)  # -1: not drafted (chain-only replay, off the walks)
        n[k - 1] = int(ok.sum())
        lag[k - 1], hit[k - 1] = int((ok & (col == prev)).sum()), int((ok & (col == want)).sum())
    return n, lag, hit


def lag_rate(prompts: list[tuple[list[int], list[int], int]], block_size: int) -> dict:
    """Pooled over prompts given as (drafts, tokens, prompt_len): {"anchors", "lag", "on_target"} per slot
    k = 1..B-1 (rates None where no anchor counts)."""
    return lag_pool(
        [lag_counts(list(drafts), list(tokens), int(P), block_size) for drafts, tokens, P in prompts], block_size
    )


def lag_pool(counts: list, block_size: int) -> dict:
    """`lag_rate` from per-prompt `lag_counts` triples (as kept by pipeline.analysis "lag")."""
    D = block_size - 1
    n, lag, hit = [0] * D, [0] * D, [0] * D
    for triple in counts:
        for acc, part in zip((n, lag, hit), triple):
            for k, v in enumerate(part[:D]):
                acc[k] += v
    return {
        "anchors": n,
        "lag": [l / c if c else None for l, c in zip(lag, n)],
        "on_target": [h / c if c else None for h, c in zip(hit, n)],
    }


# ---------------------------------------------------------------------------
# registry


@dataclass(frozen=True)
class Metric:
    key: str  # summary key (stored, exported)
    label: str  # shown in the UI
    formula: str  # shown next to every value
    run: Callable[[list[Prompt], Ctx], Any]  # run-level value
    prompt: Callable[[Prompt, Ctx], Any] | None = None  # per-prompt value, when the metric has one
    kind: str = "scalar"  # scalar | histogram | curve | count | interval | ids
    headline: bool = False  # one of the run's headline numbers (cards, compare, listings)
    fmt: str = "{:.2f}"  # how a scalar is printed: TAU (tau-like) unless set


TAU, PROB = "{:.2f}", "{:.3f}"  # the one format of tau-like numbers (tokens per round) and of probabilities


REGISTRY: list[Metric] = [
    Metric(
        "tau_macro",
        "tau (macro)",
        "mean over prompts of committed / rounds (bonus token included)",
        macro(tau),
        tau,
        headline=True,
    ),
    Metric("tau_pooled", "tau (pooled)", "all committed tokens / all rounds", pooled("rounds"), headline=True),
    Metric(
        "every_anchor_tau",
        "every-anchor tau",
        "mean over completion anchors p of accepted(p) + 1",
        every_anchor_run,
        every_anchor,
        headline=True,
    ),
    Metric(
        "ddtree_tau",
        "DDTree tau (macro)",
        "tree of `tree_budget` nodes per round; mean over prompts of committed / rounds",
        macro(tree_tau),
        tree_tau,
        headline=True,
    ),
    Metric(
        "ddtree_tau_pooled",
        "DDTree tau (pooled)",
        "all committed / all rounds of the tree walk",
        pooled("tree_rounds", need_tree=True),
    ),
    Metric(
        "rounds",
        "rounds",
        "chain-walk rounds over all prompts",
        lambda ps, c: sum(len(p.rounds) for p in ps),
        lambda p, c: len(p.rounds),
        kind="count",
        fmt="{}",
    ),
    Metric(
        "committed",
        "committed tokens",
        "tokens the rounds committed (bonus included)",
        lambda ps, c: sum(sum(p.rounds) for p in ps),
        lambda p, c: sum(p.rounds),
        kind="count",
        fmt="{}",
    ),
    Metric("prompts", "prompts", "prompts replayed", lambda ps, c: len(ps), kind="count", fmt="{}"),
    Metric(
        "accept_hist",
        "acceptance histogram",
        "rounds of the chain walk by accepted drafts 0..B-1",
        accept_hist,
        kind="histogram",
    ),
    Metric(
        "depth_conditional",
        "per-depth conditional acceptance",
        "P(d_k accepted | d_1..d_{k-1} accepted), k = 1..B-1, over the rounds of the trace",
        depth_conditional,
        kind="curve",
        fmt=PROB,
    ),
    Metric(
        "depth_marginal",
        "per-depth marginal acceptance",
        "P(d_1..d_k all accepted), k = 1..B-1, over the rounds of the trace",
        depth_marginal,
        kind="curve",
        fmt=PROB,
    ),
    Metric(
        "depth_samples",
        "rounds per depth",
        "rounds behind each conditional point: d_1..d_{k-1} accepted and slot k inside the completion",
        depth_samples,
        kind="curve",
        fmt="{}",
    ),
]
# -- calibration (issue 11): None for runs replayed before draft log-probabilities were stored
REGISTRY += [
    Metric(
        "calibration_ece",
        "calibration ECE (pooled over depths)",
        "sum over 10 equal-width bins b of p_k of (n_b / N) * |observed_b - predicted_b|; p_k = the drafter's "
        "probability of its top-1 draft at slot k, observed = share of those drafts accepted, over the rounds "
        "with d_1..d_{k-1} accepted and slot k in the completion",
        calibration_ece,
        fmt=PROB,
    ),
    Metric(
        "expected_tau",
        "expected tau (macro)",
        "mean over prompts of the mean over rounds of 1 + sum_{k=1}^{min(B-1, left-1)} prod_{j<=k} p_j "
        "(left = tokens left after the anchor); compare with tau (macro)",
        expected_tau_run,
        expected_tau,
    ),
    Metric(
        "expected_tau_pooled",
        "expected tau (pooled)",
        "all expected committed tokens / all rounds; compare with tau (pooled)",
        expected_tau_pooled,
    ),
    Metric(
        "calibration_ece_depth",
        "calibration ECE per depth",
        "ECE of the samples of depth k alone, k = 1..B-1",
        calibration_ece_depth,
        kind="curve",
        fmt=PROB,
    ),
    Metric(
        "confidence_depth",
        "mean draft probability per depth",
        "mean p_k over the rounds with d_1..d_{k-1} accepted and slot k in the completion; against "
        "P(d_k accepted | d_1..d_{k-1} accepted)",
        confidence_depth,
        kind="curve",
        fmt=PROB,
    ),
]
# -- statistics over prompts (issue 14): how sure tau is, and DDTree against a chain of the same token budget
_BOOT = (
    f"percentile bootstrap over prompts: {BOOT_N} resamples of the prompts with replacement (seed "
    f"{BOOT_SEED}), the {(1 - BOOT_LEVEL) / 2:.1%} and {(1 + BOOT_LEVEL) / 2:.1%} quantiles of"
)
REGISTRY += [
    Metric(
        "depth_rounds",
        "rounds per depth (marginal)",
        "rounds behind each marginal point: slot k inside the completion",
        lambda ps, c: depth_counts(ps, c)[0],
        kind="curve",
        fmt="{}",
    ),
    Metric(
        "tau_macro_ci",
        f"tau (macro), {BOOT_LEVEL:.0%} CI",
        f"{_BOOT} the mean over prompts of committed / rounds",
        tau_macro_ci,
        kind="interval",
    ),
    Metric(
        "tau_pooled_ci",
        f"tau (pooled), {BOOT_LEVEL:.0%} CI",
        f"{_BOOT} all committed / all rounds of the resampled prompts",
        tau_pooled_ci,
        kind="interval",
    ),
    Metric("tau_median", "tau (median)", "median over prompts of committed / rounds", tau_median),
    Metric(
        "tau_fences",
        "tau outlier fences",
        f"[Q1 - {TUKEY_K:g}·IQR, Q3 + {TUKEY_K:g}·IQR] of per-prompt tau (at least {TUKEY_MIN} prompts)",
        fences,
        kind="interval",
    ),
    Metric("tau_outliers", "outlier prompts", TUKEY_RULE, lambda ps, c: sorted(outliers(ps, c)), kind="ids"),
    Metric(
        "tau_outlier_count",
        "outlier prompts (count)",
        TUKEY_RULE,
        lambda ps, c: len(outliers(ps, c)),
        kind="count",
        fmt="{}",
    ),
    Metric(
        "tau_macro_trimmed",
        "tau (macro) without outliers",
        "mean over the prompts inside the fences of committed / rounds",
        tau_macro_trimmed,
    ),
    Metric(
        "chain_tau_at_budget",
        "chain tau at the DDTree budget (macro)",
        "chain whose block verifies as many drafts as the tree (block N+1, N = tree budget): per round commit "
        "min(accepted(p), N) + 1 (capped to the tokens left), walking from P over the same drafts cut to N "
        "slots; mean over prompts of committed / rounds",
        chain_tau_at_budget_run,
        chain_tau_at_budget,
    ),
    Metric(
        "chain_tau_at_budget_pooled",
        "chain tau at the DDTree budget (pooled)",
        "all committed / all rounds of that block-(N+1) chain walk",
        chain_tau_at_budget_pooled,
    ),
]
RELIABILITY_FORMULA = (
    "per equal-width bin b of p_k: n_b samples, predicted_b = mean p_k, observed_b = share of "
    "those drafts accepted; pooled over depths and per depth k"
)  # metrics.reliability (not stored)
BY_KEY = {m.key: m for m in REGISTRY}
HEADLINE = [m for m in REGISTRY if m.headline]
PER_PROMPT = [m for m in REGISTRY if m.prompt is not None]


def tree_only(key: str) -> bool:
    """A metric of the DDTree walk or its budget (its label names DDTree): shown only for runs with a tree."""
    return "DDTree" in BY_KEY[key].label


def label(key: str, summary: dict | None = None) -> str:
    """The UI label of a metric; DDTree labels carry the run's budget (DDTree-8 tau)."""
    m = BY_KEY[key]
    if tree_only(key) and summary and summary.get("tree_budget"):
        return m.label.replace("DDTree", f"DDTree-{summary['tree_budget']}")
    return m.label


def show(key: str, value: Any) -> str:
    """A value as the UI prints it: the metric's format (TAU: 2 decimals for tau-like numbers, PROB: 3 for
    probabilities), integers as such, an interval as [lo, hi], ids comma-separated ('none' for no ids), '—' for
    missing/NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    kind = BY_KEY[key].kind if key in BY_KEY else ""
    if kind == "interval" and isinstance(value, (list, tuple)) and len(value) == 2:
        return f"[{show(key, value[0])}, {show(key, value[1])}]"
    if kind == "ids":
        return ", ".join(map(str, value)) or "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(show(key, v) for v in value)
    return BY_KEY[key].fmt.format(value) if key in BY_KEY else f"{value}"


def summarize(prompts: list, block_size: int, tree_budget: int) -> dict:
    """Every run-level metric of the registry over `prompts` (PromptResults or run_prompts rows)."""
    ps = [Prompt.of(p) for p in prompts]
    ctx = Ctx(block_size, tree_budget)
    return {m.key: m.run(ps, ctx) for m in REGISTRY} | {"block_size": block_size, "tree_budget": tree_budget}


def complete(summary: dict, rows: list) -> dict:
    """A stored run summary with every registry metric it lacks computed from the run's prompts (a run summarised
    before the metric existed); the stored values are kept."""
    missing = [m for m in REGISTRY if m.key not in summary]
    if not missing or not rows or not summary.get("block_size"):
        return summary
    ps, ctx = [Prompt.of(r) for r in rows], Ctx(summary["block_size"], summary.get("tree_budget") or 0)
    return summary | {m.key: m.run(ps, ctx) for m in missing}


def per_prompt(row: Any, block_size: int, tree_budget: int) -> dict:
    """Every per-prompt metric of the registry for one prompt (computed once per Prompt, block size and budget: a
    run's store step asks for them twice, for its rows and for its prompts analysis)."""
    p = Prompt.of(row)
    got = p.__dict__.get(("_per", block_size, tree_budget))
    if got is None:
        ctx = Ctx(block_size, tree_budget)
        got = p.__dict__[("_per", block_size, tree_budget)] = {m.key: m.prompt(p, ctx) for m in PER_PROMPT}
    return dict(got)


def prompt_rows(
    rows: list[dict], block_size: int, tree_budget: int, prompts: dict[str, Prompt] | None = None
) -> list[dict]:
    """One small row per prompt of a run (run_prompts rows in): prompt_id, tau, tree_tau, prompt_len,
    completion_tokens and every per-prompt registry metric (`rounds` the count); no token arrays. `prompts`: the
    rows' Prompts by id, when the caller has built them."""
    ps = prompts or {}
    return [
        {
            "prompt_id": r["prompt_id"],
            "tau": r["tau"],
            "tree_tau": r["tree_tau"],
            "prompt_len": r["prompt_len"],
            "completion_tokens": len(r.get("accepted_at") or []),
            **per_prompt(ps.get(r["prompt_id"], r), block_size, tree_budget),
        }
        for r in rows
    ]


# ---------------------------------------------------------------------------
# engine conformance (issue 11): engine tau beside replay tau, per prompt (rows of `conformance.compare`).
# Not replay metrics, so not in REGISTRY (summarize never sees them): `run(rows, threshold)` over the compared
# prompts; `conformance.summary` applies this block; `show`/`label` know the keys.


def _of(rows: list[dict], key: str) -> list[float]:
    return [r[key] for r in rows if r.get(key) is not None]


def _conf_pooled(rows: list[dict], thr: float) -> tuple[float | None, float | None]:
    """(engine, replay) pooled over the prompts where both exist: all committed / all verify steps (rounds)."""
    both = [r for r in rows if r.get("engine_tau") is not None and r.get("replay_tau") is not None]
    v, n = sum(r["verify_steps"] for r in both), sum(r["completion_tokens"] - 1 for r in both)
    rounds, committed = sum(r["rounds"] for r in both), sum(r["committed"] for r in both)
    return (n / v if v else None), (committed / rounds if rounds else None)


CONFORMANCE: list[Metric] = [
    Metric(
        "engine_tau",
        "engine tau (macro)",
        "mean over prompts of (completion_tokens - 1) / verify_steps: committed tokens per verify step, the "
        "prefill's first token left out (like the replay)",
        lambda rows, thr: _mean(_of(rows, "engine_tau")),
        lambda r, thr: r.get("engine_tau"),
        headline=True,
    ),
    Metric(
        "replay_tau",
        "replay tau (macro)",
        "mean over the same prompts of the replay's committed / rounds (chain walk, bonus included)",
        lambda rows, thr: _mean(_of(rows, "replay_tau")),
        lambda r, thr: r.get("replay_tau"),
        headline=True,
    ),
    Metric(
        "conformance_gap",
        "gap (macro)",
        "mean over prompts of engine tau - replay tau (negative: the engine falls short)",
        lambda rows, thr: _mean(_of(rows, "gap")),
        lambda r, thr: r.get("gap"),
        headline=True,
    ),
    Metric(
        "conformance_flagged",
        "flagged prompts",
        "prompts with replay tau - engine tau > threshold x replay tau (more than numeric noise)",
        lambda rows, thr: sum(bool(r.get("flagged")) for r in rows),
        lambda r, thr: bool(r.get("flagged")),
        kind="count",
        headline=True,
        fmt="{}",
    ),
    Metric(
        "engine_tau_pooled",
        "engine tau (pooled)",
        "all (completion_tokens - 1) / all verify steps",
        lambda rows, thr: _conf_pooled(rows, thr)[0],
    ),
    Metric(
        "replay_tau_pooled",
        "replay tau (pooled)",
        "all committed / all rounds of the replay, same prompts",
        lambda rows, thr: _conf_pooled(rows, thr)[1],
    ),
    Metric(
        "sglang_accept_length",
        "SGLang spec_accept_length (macro)",
        "mean over prompts of completion_tokens / verify_steps, as SGLang reports it (prefill token included: "
        "not like with like, shown for reference)",
        lambda rows, thr: _mean(_of(rows, "sglang_accept_length")),
        lambda r, thr: r.get("sglang_accept_length"),
    ),
    Metric(
        "conformance_prompts",
        "prompts compared",
        "prompts with both engine stats and a replay row",
        lambda rows, thr: len(rows),
        kind="count",
        fmt="{}",
    ),
]
BY_KEY.update({m.key: m for m in CONFORMANCE})
