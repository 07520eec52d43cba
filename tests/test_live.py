"""The live loop: the stand-in's speculative decoder at temperature T, its rollback of a hybrid target's
Gated DeltaNet state, the rejection rule's output distribution, and the teacher-forced estimate against the live
loop's measured acceptance over seeds.

Models: a tiny seeded qwen3_5_text target (6 Gated DeltaNet + 2 full-attention layers) with a random drafter (it
is rejected nearly every step: rollback every step) and the committed demo target with its healthy DFlash
checkpoint (a trained drafter: long accepted runs). Everything runs in-process on the CPU, one torch thread."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from speculative import DEMO, TARGET, one_torch_thread

from dflash_dash import demo, prompts, replay, sampling as sampling_math, server, target
from dflash_dash.server import live, rollback, sampler, specdec
from dflash_dash.server.sampler import Sampling
from tools import tiny

IDS = ["merge_sort", "binary_search", "graph_bfs"]  # coding-10 prompts (the demo drafter was trained on their kind)
PROMPTS = [prompts.CODING_10[i] for i in IDS]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """The tiny hybrid target (fp32, CPU) and a random drafter's speculators (exact and live features)."""
    base = tmp_path_factory.mktemp("hybrid")
    target = tiny.write_target(base / "t", tiny.TinyTarget())
    draft = tiny.write_drafter(base / "d", tiny.TinyDrafter(seed=3))
    eng = server.Engine(model_dir=target.resolve(), device="cpu")
    eng.load()
    specs = {}
    for on in (False, True):
        specs[on] = specdec.Speculator(str(draft), live=on)
        specs[on].load(eng.model)
    return eng, specs


@pytest.fixture(scope="module")
def trained():
    """The demo target and its final healthy checkpoint, live features."""
    healthy = next(c for c in demo.checkpoints(DEMO / demo.CHECKPOINTS) if c.role == "final").path
    eng = server.Engine(model_dir=TARGET.resolve(), device="cpu")
    eng.load()
    eng.load_tokenizer()
    spec = specdec.Speculator(str(healthy), live=True)
    spec.load(eng.model)
    return eng, spec


def forward(model, tokens, cache=None):
    out = model(input_ids=torch.tensor([tokens]), use_cache=True, past_key_values=cache)
    return out.logits[0], out.past_key_values


def states(cache) -> list[torch.Tensor]:
    """Every tensor the cache holds: K/V of attention layers, conv and recurrent states of linear ones."""
    got = []
    for layer in cache.layers:
        if hasattr(layer, "recurrent_states"):
            got += [layer.conv_states[0][..., -4:], layer.recurrent_states[0]]
        else:
            got += [layer.keys, layer.values]
    return got


@torch.inference_mode()
def test_rollback_leaves_the_cache_of_the_accepted_prefix(hybrid):
    """After a verify forward over 4 tokens and keep(a), the cache (K/V, conv and recurrent states) and the next
    logits equal those of a cache that only ever ran the first a tokens; cropping alone (the recurrent state left
    at the whole block's) does not."""
    eng, _ = hybrid
    model, prompt, block = eng.model, [5, 6, 7, 8, 9, 10], [11, 300, 40, 2]
    rb = rollback.of(model, None)
    assert isinstance(rb, rollback.Recorded) and len(rb.layers) == 6
    for a in (1, 2, 3, 4):
        _, cache = forward(model, prompt)
        with rb.verify(cache, block):
            _, cache = forward(model, block, cache)
        cache = rb.keep(cache, a, len(block))
        _, ref = forward(model, block[:a], forward(model, prompt)[1])
        for got, want in zip(states(cache), states(ref)):
            assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5), a
        nxt, _ = forward(model, [77], cache)
        want, _ = forward(model, [77], ref)
        assert torch.allclose(nxt, want, atol=1e-4), a
        if a < len(block):  # the planted fault: only crop, as a full-attention model may
            _, bad = forward(model, prompt)
            bad.activate_past_recording()
            _, bad = forward(model, block, bad)
            bad.crop(-(len(block) - a))
            assert not torch.allclose(forward(model, [77], bad)[0], want, atol=1e-3)


@pytest.mark.parametrize("live_features", [False, True], ids=["exact-features", "live-features"])
def test_speculative_at_T_commits_plain_samplings_tokens_on_the_hybrid_target(hybrid, live_features):
    """target-sample verify at T = 0.8, top-p 0.95: the speculative tokens equal plain decoding's for the same seed
    while almost every step rejects (and rolls back), and greedy too."""
    eng, specs = hybrid
    spec = specs[live_features]
    rejected = 0
    for seed in (None, 1, 2, 3):
        s = None if seed is None else Sampling(0.8, 0.95, seed=seed)
        for ids in ([5, 6, 7, 8, 9], [40, 41, 300, 17, 2, 9, 11]):
            want, _ = live.plain(eng.model, ids, 20, lambda o: False, s)
            out, fin, counters = spec.decode(eng.model, ids, 20, lambda o: None, s)
            assert out == want, (seed, ids)
            rejected += sum(a < spec.block_size - 1 for a in counters.accepted)
    assert rejected >= 40


def test_live_features_equal_the_exact_ones_in_what_they_draft(trained):
    """Live features (the verify forwards' rows, drafter K/V extended) draft what the extraction's features draft:
    greedy, the two decoders take the same steps on the demo drafter."""
    eng, spec = trained
    exact = specdec.Speculator(spec.path)
    exact.load(eng.model)
    ids = eng.encode(PROMPTS[0])
    a = spec.decode(eng.model, ids, 32, lambda o: None)
    b = exact.decode(eng.model, ids, 32, lambda o: None)
    assert a[0] == b[0] and a[2].accepted == b[2].accepted and sum(a[2].accepted) >= 10


def test_rejection_step_commits_tokens_distributed_as_the_target():
    """One rejection-rule step on a 6-token vocabulary, drafts drawn from q: over 20,000 seeds the first committed
    token is distributed as p_0 (not as q_0), and the second, when the first draft is accepted, as p_1 (chi-square
    p > 1e-3; q differs enough that committing the drafts unchecked fails it)."""
    p = torch.tensor([[0.5, 0.2, 0.1, 0.1, 0.05, 0.05], [0.05, 0.05, 0.1, 0.1, 0.2, 0.5], [1 / 6] * 6])
    q = torch.tensor([[0.1, 0.1, 0.4, 0.2, 0.1, 0.1], [0.3, 0.3, 0.1, 0.1, 0.1, 0.1]])
    n = 20000
    first, second = np.zeros(6), np.zeros(6)
    firsts_q = np.zeros(6)
    for seed in range(n):
        drafts = [sampler.draw(q[j], seed, 10 + j, "draft") for j in range(2)]
        a, bonus = sampler.verify_rejection(p, q, drafts, seed, 10)
        committed = drafts[:a] + [bonus]
        first[committed[0]] += 1
        firsts_q[drafts[0]] += 1
        if a >= 1:
            second[committed[1]] += 1
    assert chi2_ok(first, p[0]) and chi2_ok(second, p[1])
    assert not chi2_ok(firsts_q, p[0])  # the drafts themselves are q's: the check can tell


def chi2_ok(counts: np.ndarray, p: torch.Tensor) -> bool:
    """Pearson's chi-square against p at p-value 1e-3 (5 degrees of freedom: critical value 20.52)."""
    want = counts.sum() * p.double().numpy()
    return float(((counts - want) ** 2 / want).sum()) < 20.52


def test_rejection_rule_in_the_loop(trained):
    """The rejection rule decodes: at T = 0.01 (p and q nearly one-hot) it commits greedy decoding's tokens; at
    T = 0.7 the same seed gives the same tokens, drafts are accepted, and other seeds do not all repeat them (on a
    confident target two seeds can draw the same 24 tokens)."""
    eng, spec = trained
    ids = eng.encode(PROMPTS[1])
    greedy, _ = live.plain(eng.model, ids, 24, lambda o: False)
    cold, _, _ = spec.decode(eng.model, ids, 24, lambda o: None, Sampling(0.01, seed=1), "rejection")
    assert cold == greedy
    one = spec.decode(eng.model, ids, 24, lambda o: None, Sampling(0.7, seed=5), "rejection")
    again = spec.decode(eng.model, ids, 24, lambda o: None, Sampling(0.7, seed=5), "rejection")
    others = [spec.decode(eng.model, ids, 24, lambda o: None, Sampling(0.7, seed=s), "rejection")[0] for s in (6, 7, 8)]
    assert one[0] == again[0] and any(o != one[0] for o in others) and sum(one[2].accepted) >= 1


@torch.inference_mode()
def estimate(model, spec, ids: list[int], out: list[int], s: Sampling) -> float:
    """Teacher-forced expected accept length along ids + out (anchors P..T-2, the target's full distributions at T):
    `sampling.committed` of alpha_j = p_T(d_j | stored prefix), d the drafter's greedy drafts at every anchor (the
    replay's every-anchor drafts over the extraction's features)."""
    seq = ids + out
    P, T = len(ids), len(seq)
    head = target.Head(model.get_input_embeddings().weight, model.get_output_embeddings().weight)
    probs = s.probs(model(input_ids=torch.tensor([seq])).logits[0])  # row i: p_T of position i + 1
    drafts = replay.draft_all(spec.drafter, head, spec.features(model, seq[:-1], T), torch.tensor(seq), P).tokens
    A, D = T - 1 - P, drafts.shape[1]  # anchors P..T-2
    rows = np.minimum(P + np.arange(A)[:, None] + np.arange(D), T - 1)  # slot j at anchor p: row p + j
    alpha = probs.numpy()[rows, drafts.numpy()[:A]] * sampling_math.inside(P, T, A, D)
    return float(sampling_math.committed(alpha).mean())


def test_teacher_forced_estimate_within_the_live_loops_interval(trained):
    """At T = 0.7 on the demo target and its healthy drafter, over seeds: the live loop's measured accept length of
    each prompt and seed, and the teacher-forced estimate along the very completion that seed decoded (target-sample:
    the live loop's tokens are plain sampling's, the completion a fetch at that seed stores). The mean estimate lies
    inside the 95% interval of the live mean over seeds. What separates them, and why it is small: teacher forcing
    conditions slot j on the stored tokens before it, the live verify on the drafts (the same prefix up to the
    first mismatch, where the product of alphas is already cut short), and the estimate averages every anchor where
    the live loop visits the chain's."""
    eng, spec = trained
    seeds = list(range(100, 108))
    est, got = np.zeros((len(PROMPTS), len(seeds))), np.zeros((len(PROMPTS), len(seeds)))
    for i, text in enumerate(PROMPTS):
        ids = eng.encode(text)
        m = live.measure(eng.model, spec, ids, 32, seeds, lambda seed: Sampling(0.7, seed=seed))
        assert m["same_tokens"]  # target-sample: speculative == plain for every seed
        got[i] = [r["accept_length"] for r in m["seeds"]]
        est[i] = [estimate(eng.model, spec, ids, r["output_ids"], Sampling(0.7, seed=r["seed"])) for r in m["seeds"]]
    lo, hi = live.interval(list(got.mean(axis=0)))
    mean_est = float(est.mean())
    print("estimate", est.mean(axis=1), "live", got.mean(axis=1), "interval", lo, hi)
    assert lo <= mean_est <= hi, (mean_est, lo, hi, est.mean(axis=1), got.mean(axis=1))
    assert 1.5 < mean_est < spec.block_size  # a drafter that works at T: the comparison means something
