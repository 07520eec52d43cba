"""Sampling at temperature T in the stand-in (`server.sampler`), in-process: the draw follows each engine's filtered
distribution (SGLang/vLLM temper then cut at top-p; llama.cpp cuts the untempered distribution, then tempers),
speculative decoding at T commits exactly plain decoding's tokens for the same seed (the target-sample verify rule,
SGLang's DFlash: accept while candidates[1:] == target_sampled[:-1]), seeds reproduce, and each protocol reads its own
sampling fields (greedy stays greedy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from speculative import DEMO, TARGET, one_torch_thread

from dflash_dash import demo, server
from dflash_dash.server import llamacpp_api, protocol, specdec, vllm_api
from dflash_dash.server.sampler import Sampling

LOGITS = [2.0, 1.5, 1.0, 0.0, -1.0, -2.0]  # T=0.5, top-p 0.8: tempered keeps 2 tokens, untempered keeps 3


def reference(logits: list[float], t: float, top_p: float, temper_first: bool) -> np.ndarray:
    """The sampled distribution by hand: the kept set (smallest prefix by descending p whose mass before each token
    is <= top_p) from softmax(l / t) or softmax(l), then softmax(l / t) over the kept set."""
    x = np.array(logits)
    p = np.exp(x / t if temper_first else x)
    p /= p.sum()
    order = np.argsort(-p)
    before = np.cumsum(p[order]) - p[order]
    keep = np.zeros(len(x), bool)
    keep[order[before <= top_p]] = True
    q = np.where(keep, np.exp(x / t), 0.0)
    return q / q.sum()


@pytest.mark.parametrize("llama_order", [False, True])
def test_draws_follow_the_engines_filtered_distribution(llama_order):
    s = Sampling(0.5, top_p=0.8, seed=7, top_p_first=llama_order)
    n = 4000
    got = np.bincount(s.pick(torch.tensor([LOGITS] * n), list(range(n))), minlength=len(LOGITS)) / n
    want = reference(LOGITS, 0.5, 0.8, temper_first=not llama_order)
    assert (want[2] > 0.05) == llama_order  # the two orders keep different sets here: the test can tell them apart
    assert np.abs(got - want).max() < 0.03, (got, want)
    assert got[want == 0].sum() == 0  # nothing outside the kept set, ever


def test_a_draw_depends_on_seed_and_position_only():
    s = Sampling(1.0, seed=3)
    rows = torch.tensor([LOGITS] * 64)
    assert s.pick(rows, list(range(64))) == Sampling(1.0, seed=3).pick(rows, list(range(64)))
    assert s.pick(rows[10:12], [10, 11]) == s.pick(rows, list(range(64)))[10:12]  # batch shape does not matter
    assert s.pick(rows, list(range(64))) != Sampling(1.0, seed=4).pick(rows, list(range(64)))
    assert Sampling(1.0).drawn_seed != Sampling(1.0).drawn_seed  # no seed: a fresh one per request


@pytest.fixture(scope="module")
def engine():
    """The demo target in-process with its healthy DFlash checkpoint, on one torch thread (as the servers run)."""
    healthy = demo.final(demo.checkpoints(DEMO / demo.CHECKPOINTS)).path
    with one_torch_thread():
        eng = server.Engine(model_dir=TARGET.resolve(), device="cpu")
        eng.load()
        eng.load_tokenizer()
        spec = specdec.Speculator(str(healthy))
        spec.load(eng.model)
        yield eng, spec


def test_speculative_sampling_commits_plain_samplings_tokens(engine):
    """At T = 0.7, top-p 0.95 the speculative decoder's tokens equal plain decoding's with the same seed (each draw
    seeded by the position it fills), drafts are accepted (the verify rule works at T), and seeds differ."""
    eng, spec = engine
    ids = eng.encode("def merge_sort(xs):\n")
    greedy, _, _ = eng.plain(ids, 24, set(), [])
    outs = {}
    for seed in (1, 2):
        plain, _, _ = eng.plain(ids, 24, set(), [], sampling=Sampling(0.7, 0.95, seed=seed))
        out, fin, counters = spec.decode(eng.model, ids, 24, lambda o: None, Sampling(0.7, 0.95, seed=seed))
        assert out == plain and fin == {"type": "length", "length": 24}
        assert sum(counters.accepted) > 0 and counters.verify_ct < 23  # drafts accepted while the samples agree
        outs[seed] = out
    assert outs[1] != outs[2]  # another seed, another completion
    hot, _, _ = eng.plain(ids, 24, set(), [], sampling=Sampling(1.5, seed=1))
    assert hot != greedy  # sampling is not greedy


def test_each_protocol_reads_its_own_sampling_fields():
    """Greedy stays greedy in each engine's terms; sampled requests carry their engine's defaults and checks."""
    assert protocol.sglang_sampling({"temperature": 0}) is None
    assert protocol.sglang_sampling({"temperature": 0.7, "top_k": 1}) is None  # SGLang: top_k 1 is greedy
    s = protocol.sglang_sampling({"temperature": 0.7, "top_p": 0.9, "top_k": -1, "sampling_seed": 5})
    assert (s.temperature, s.top_p, s.top_k, s.seed, s.top_p_first) == (0.7, 0.9, 0, 5, False)
    assert protocol.sglang_sampling({}).temperature == 1.0  # SGLang's default temperature
    for bad, words in (({"top_p": 0}, "top_p must be in (0, 1]"), ({"temperature": -1}, "non-negative")):
        with pytest.raises(protocol.BadRequest, match=words.replace("(", r"\(").replace("]", r"\]")):
            protocol.sglang_sampling(bad)
    assert vllm_api.sampling({"temperature": 0}) is None
    v = vllm_api.sampling({"temperature": 0.7, "top_p": 0.95, "top_k": -1, "seed": 9})
    assert (v.top_k, v.seed, v.top_p_first) == (0, 9, False)
    assert llamacpp_api.sampling({"temperature": 0, "top_k": 1}) is None
    d = llamacpp_api.sampling({"temperature": 0.7})  # llama-server's defaults: top_k 40, top_p 0.95, min_p 0.05
    assert (d.top_k, d.top_p, d.min_p, d.seed, d.top_p_first) == (40, 0.95, 0.05, None, True)
    c = llamacpp_api.sampling({"temperature": 0.7, "top_p": 0.9, "top_k": 0, "min_p": 0.0, "seed": 4})
    assert (c.top_k, c.top_p, c.min_p, c.seed) == (0, 0.9, 0.0, 4)
