"""A workspace of many completions and runs built without replaying: the scale workspace of the pages'
benchmark (`benchmarks/bench_pages.py --planted`) and of the 1,000-prompt browser tests.

Completions are cut from real text (the standard library's sources, tokenised by a tiny byte-level tokenizer) and
imported by `pipeline.import_completions`; the extraction is recorded without feature files (nothing that reads a
built workspace reads features); each run is the parent's store step of a replay (`pipeline.store_run`: summary,
rows, kept analyses) on planted results shaped as a real every-anchor replay's (`planted_results`).

Contract: development tooling (like `tools/tiny.py`), never imported by the app or the CLI; it writes the store
only through `pipeline` and `Store`'s own methods.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

SET = "scale"  # the completion set's name


# ---------------------------------------------------------------------------
# completions


def corpus_ids(tok, need: int) -> list[int]:
    """A long token stream of real text (the standard library's sources) for the completions."""
    import argparse
    import email.message
    import inspect
    import json as json_mod
    import textwrap

    text = "".join(inspect.getsource(m) for m in (json_mod, textwrap, argparse, inspect, email.message))
    ids = tok.encode(text, add_special_tokens=False)
    return (ids * (need // len(ids) + 1))[:need]


def completions_file(work: Path, tok, prompts: int, tokens: int, seed: int = 0) -> Path:
    """`prompts` completions of `tokens` output tokens each (24-token prompts), cut at seeded offsets of the
    corpus; ids p0000, p0001, ..."""
    rng = random.Random(seed)
    stream = corpus_ids(tok, 400_000)
    f = work / f"{SET}.jsonl"
    with f.open("w") as out:
        for i in range(prompts):
            at = rng.randrange(0, len(stream) - tokens - 32)
            p_ids, o_ids = stream[at : at + 24], stream[at + 24 : at + 24 + tokens]
            out.write(
                json.dumps(
                    {
                        "id": f"p{i:04d}",
                        "prompt": tok.decode(p_ids),
                        "prompt_ids": p_ids,
                        "output": tok.decode(o_ids),
                        "output_ids": o_ids,
                    }
                )
                + "\n"
            )
    return f


# ---------------------------------------------------------------------------
# planted runs


def planted_results(
    comps: list[dict],
    seed: int,
    block_size: int,
    budget: int,
    vocab: int = 512,
    mean_accepted: float = 2.3,
    lag: float = 0.0,
) -> list:
    """`metrics.Prompt`s of a drafter that does not exist, shaped as a real every-anchor replay's (accepted(p)
    at every anchor, drafts [A][B-1], draft log-probabilities, the rounds' top-K blocks, a DDTree walk): per
    anchor the first a drafts equal the target's next tokens (a geometric, mean about `mean_accepted`), the next
    differs, the rest are seeded random ids. `lag`: the share of anchors drafted as the anchor-visible bug does,
    one position behind (d_k = t[p+k-1]) and sure of it (p_k near 1); accepted(p) then counts the leading drafts
    that happen to equal the target's."""
    import numpy as np

    from dflash_dash import metrics, replay, walks

    rng, D, K = np.random.default_rng(seed), block_size - 1, replay.ROUND_TOPK
    out = []
    for c in comps:
        toks = np.asarray(list(c["prompt_ids"]) + list(c["output_ids"]), dtype=np.int64)
        P, T = len(c["prompt_ids"]), len(toks)
        A = T - P
        pos = P + 1 + np.arange(A)[:, None] + np.arange(D)[None, :]  # [A, D] positions the slots draft
        inside = pos < T
        tgt = np.where(inside, toks[np.minimum(pos, T - 1)], -1)
        want = np.minimum(rng.geometric(1 / (1 + mean_accepted), A) - 1, D)
        drafts = rng.integers(0, vocab, (A, D))
        drafts = np.where(np.arange(D)[None, :] < want[:, None], tgt, drafts)
        clash = (np.arange(D)[None, :] == want[:, None]) & (drafts == tgt)
        drafts = np.where(clash, (drafts + 1) % vocab, drafts)
        acc = np.minimum(want, inside.sum(1))
        logp = -rng.exponential(1.0, (A, D)).astype(np.float32)
        if lag:
            behind = rng.random(A) < lag
            drafts = np.where(behind[:, None], toks[np.minimum(pos, T) - 1], drafts)
            acc = np.where(behind, np.cumprod((drafts == tgt) & inside, axis=1).sum(1), acc)
            logp = np.where(behind[:, None], -rng.exponential(0.05, (A, D)), logp).astype(np.float32)
        rounds = walks.chain_walk(acc, P, T)
        at = np.asarray([p for p, _, _ in rounds], dtype=np.int64) - P
        top_ids = np.concatenate([drafts[at][..., None], rng.integers(0, vocab, (len(at), D, K - 1))], -1)
        top_p = np.sort(rng.random((len(at), D, K)), -1)[..., ::-1] / K
        tacc = np.minimum(acc + rng.integers(0, 2, A), inside.sum(1)) if budget else acc
        out.append(
            metrics.Prompt(
                c["prompt_id"],
                P,
                acc,
                [n for _, _, n in rounds],
                [n for _, _, n in walks.chain_walk(tacc, P, T)] if budget else [],
                logp,
                drafts=drafts,
                tree_at=tacc if budget else None,
                round_top_ids=top_ids,
                round_top_p=top_p,
            )
        )
    return out


# ---------------------------------------------------------------------------
# the workspace


def build(
    work: str | Path,
    prompts: int,
    tokens: int,
    runs: int,
    block_size: int = 16,
    budget: int = 8,
    each: Callable[[int, Callable[[], dict]], dict] | None = None,
    lags: tuple[float, ...] = (),
) -> Path:
    """The workspace `work/ws`: tiny target and tokenizer (`work/models`), `prompts` completions of `tokens`
    tokens imported as set `SET`, one extraction recorded done without features, and `runs` planted runs of
    checkpoints `work/models/sweep/step_{100 i}` (tiny drafters, seeds 0..runs-1). `each(i, store_step)` wraps run
    i's store step (the benchmark times it); by default it is just called. `lags[i]`: run i's share of anchors
    drafted one position behind (`planted_results`; 0 past the tuple). Returns the workspace."""
    from transformers import AutoTokenizer

    from dflash_dash import ops, pipeline
    from dflash_dash.store import Store, new_id
    from tools import tiny

    work = Path(work)
    ws, models = work / "ws", work / "models"
    target = tiny.write_target(models / "target", tiny.TinyTarget())
    tiny.write_tokenizer(target, vocab_size=512)
    tok = AutoTokenizer.from_pretrained(target)
    st = Store(ws)
    pipeline.import_completions(st, completions_file(work, tok, prompts, tokens), SET)
    cks = models / "sweep"
    d0 = tiny.write_drafter(cks / "step_100", tiny.TinyDrafter(seed=0, block_size=block_size))
    ex = new_id("ex")
    st.add_extraction(
        dict(
            id=ex,
            set_name=SET,
            target_path=str(target),
            layer_ids=pipeline.layers_of(str(d0), None),
            hidden_size=64,
            device="cpu",
            dtype="float32",
            backend="torch",
            versions={"planted": True},
        )
    )
    st.set_status("extractions", ex, "done")
    ex_row, comps = st.extraction(ex), st.completions(SET)
    for i in range(runs):
        ck = tiny.write_drafter(cks / f"step_{(i + 1) * 100}", tiny.TinyDrafter(seed=i, block_size=block_size))
        res = planted_results(comps, i, block_size, budget, lag=lags[i] if i < len(lags) else 0.0)

        def step(ck=ck, res=res):
            return pipeline.store_run(
                st,
                extraction=ex_row,
                checkpoint=ops.CheckpointSpec(str(ck)),
                results=res,
                settings=ops.ReplaySettings(tree_budget=budget),
                device="cpu",
            )

        (each or (lambda _, go: go()))(i, step)
    return ws
