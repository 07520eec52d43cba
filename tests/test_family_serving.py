"""The stand-in decodes speculatively with a drafter of every family: the tokens equal plain greedy's, the verify
steps propose the family's D drafts (B for DSpark drafting from the anchor's slot), the stand-in's drafts at an
anchor are the replay's drafts there token for token, and each step accepts exactly what the replay's chain walk
accepts at the same anchor over the same features (engine conformance for every family). Tiny seeded models,
in-process."""

from __future__ import annotations

import pytest
import torch

from dflash_dash import replay as rp, server, target as tg
from dflash_dash.server import specdec
from tools import tiny

FAMILIES = {
    "dflash": {},
    "dspark": dict(
        architecture="DSparkDraftModel",
        family_fields=dict(projector_type="dspark", markov_rank=4, markov_head_type="rnn", enable_confidence_head=True),
    ),
    "domino": dict(
        architecture="DominoDraftModel",
        family_fields=dict(emb_dim=8, gru_hidden_dim=8, pure_draft_prefix_len=1, shift_label=True),
    ),
    "dflash2": dict(
        architecture="DFlash2DraftModel",
        family_fields=dict(conv_kernel_size=2, conv_group_size=16, selector_rank=4, selector_top_k=8),
    ),
}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    t = tiny.write_target(tmp_path_factory.mktemp("fam-serve") / "t", tiny.TinyTarget())
    eng = server.Engine(model_dir=t.resolve(), device="cpu")
    eng.load()
    return t, eng


@pytest.mark.parametrize("family", list(FAMILIES))
def test_speculative_decoding_with_every_family_matches_greedy_and_the_replay(target, tmp_path, family):
    t, eng = target
    ck = tiny.write_drafter(tmp_path / family, tiny.TinyDrafter(seed=4, **FAMILIES[family]))
    spec = specdec.Speculator(str(ck))
    spec.load(eng.model)
    D = spec.drafter.drafts
    assert spec.block_size == D + 1 and D == (4 if family == "dspark" else 3)
    assert server.speculative_info(server.Engine(model_dir=t, device="cpu", spec=spec))["speculative_algorithm"] == (
        family.upper()
    )
    ids, n = [5, 6, 7, 8, 9, 40, 41], 40
    plain, _, _ = eng.greedy(ids, n, set(), [])
    out, _, counters = spec.decode(eng.model, ids, n, lambda o: None)
    assert out == plain  # a drafter of any family costs speed, never tokens
    assert all(0 <= a <= D for a in counters.accepted)
    meta = counters.meta(len(out))
    assert len(meta["spec_accept_histogram"]) == D + 1 and meta["spec_draft_token_num"] == counters.verify_ct * D
    # the replay over the features the stand-in's drafter saw: the same acceptance at every verify step's anchor
    seq = torch.tensor(ids + out)
    feats = spec.features(eng.model, (ids + out)[:-1], len(seq))
    head = tg.Head(eng.model.get_input_embeddings().weight, eng.model.get_output_embeddings().weight)
    d = rp.draft_all(spec.drafter, head, feats, seq, len(ids))
    acc = rp.score("p", d, seq.numpy(), len(ids), 0).accepted_at
    q, steps = len(ids), []
    for a in counters.accepted[:-1]:  # the last step may reach past the completion's cut
        steps.append(int(acc[q - len(ids)]))
        q += a + 1
    assert steps == counters.accepted[:-1]
    for q in range(len(ids), len(seq) - 1, 5):  # the serving path's drafts are the replay's
        assert spec.draft(eng.model, head, (ids + out)[: q + 1], len(seq)) == d.tokens[q - len(ids)].tolist(), q
