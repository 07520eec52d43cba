"""DFlash speculative decoding for the local SGLang stand-in, greedy or sampled (its model calls it, nothing else
does).

Contract: `Speculator.decode(model, prompt ids, max_new, stop, sampling)` returns the same tokens as plain decoding
of `model` (greedy, or with the same `sampler.Sampling` and seed), produced the speculative way, with SGLang's
counters (`Counters.meta`):
  - The first completion token comes from the prefill, not from a verify step.
  - Each verify step at anchor p (the last committed token, position p; the target's cache holds 0..p-1):
    the drafter drafts one block [token p, MASK x (B-1)] from the target's hidden states at its
    `target_layer_ids` (layer l = the OUTPUT of decoder layer l) of positions 0..p-1; the target runs ONE
    forward over the block from its cache; the leading drafts equal to the target's greedy tokens are
    accepted, plus the target's bonus token. Committed = accepted + 1 (cut at max_new / a stop).
  - Sampled (`target-sample` verify, SGLang's DFlash at temperature > 0): the drafts stay the drafter's greedy
    tokens; the target draws its own token at every block position (`Sampling.pick`, each draw seeded by the
    request's seed and the position it fills) and drafts are accepted while candidates[1:] == target_sampled[:-1]
    (python/sglang/srt/speculative/dflash_utils.py: compute_dflash_accept_len_and_bonus on the target's samples);
    the bonus is the target's draw at the first mismatch. compute_dflash_sampling_accept_len_and_bonus there
    accepts a draft d with probability p_T(d) and on rejection draws from p_T without d: the same distribution.
    The first token is the prefill's draw, as plain decoding's.
  - Rollback: the cache is snapshotted before the verify forward and, unless every draft was accepted,
    restored and re-run over the accepted prefix [token p, d_1..d_a]: this puts back the full-attention K/V AND
    the Gated DeltaNet recurrent and conv states of hybrid (qwen3_5_text) targets, which cannot be cropped.
  - Features as the replay sees them: each step recomputes them with a cache-free forward (`target.extract`,
    the extraction's own function) over the context padded with pad tokens to prompt + max_new tokens, then
    rounds them to bf16 (the feature cache's dtype). Kernel shapes (chunked linear attention, SDPA splits)
    depend on the sequence length, and padding to the length of the extraction's forward makes the features
    bit-identical to the cached ones when the completion runs to max_new (CPU, fp32; causal layers never see
    the padding). A completion that stops early was extracted over fewer tokens: its features can then differ
    in the last bf16 bit at a few positions. The drafter runs through `replay.draft_one`, the replay's path.
  - `bug` (a test aid, never a default) plants one of the engine faults of `faults` (BUGS) that conformance must
    flag.
Slow on purpose (one full forward per verify step for the features): correctness over speed.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import drafters as drafter_mod, replay, target as target_mod
from . import faults
from .sampler import Sampling

# ---------------------------------------------------------------------------
# counters


@dataclass
class Counters:
    block_size: int  # B: B-1 drafts proposed per verify step
    accepted: list[int] = field(default_factory=list)  # drafts verification accepted at each step (0..B-1;
    #                                                         counted before the cut at max_new / a stop, so the
    #                                                         last step's may reach past the completion)

    @property
    def verify_ct(self) -> int:
        return len(self.accepted)

    def meta(self, completion_tokens: int) -> dict:
        """SGLang's speculative counters for meta_info. spec_accept_length = completion_tokens / spec_verify_ct
        (SGLang's own: the prefill token included); histogram index = drafts accepted in a verify step."""
        n, acc = self.verify_ct, sum(self.accepted)
        proposed = n * (self.block_size - 1)
        hist = [0] * self.block_size
        for a in self.accepted:
            hist[a] += 1
        out = {
            "spec_verify_ct": n,
            "spec_accept_token_num": acc,
            "spec_draft_token_num": proposed,
            "spec_accepted_drafts": acc,
            "spec_proposed_drafts": proposed,
            "spec_accept_histogram": hist,
        }
        if n:
            out |= {"spec_accept_length": completion_tokens / n, "spec_accept_rate": acc / proposed}
        return out


# ---------------------------------------------------------------------------
# decoding


@dataclass
class Speculator:
    path: str  # the DFlash checkpoint folder (--speculative-draft)
    device: str = "cpu"  # where the drafter runs (the target's device)
    bug: str | None = None  # one of faults.BUGS (a test aid) or None: the correct decoder
    drafter: Any = None  # the loaded drafters.Drafter, None until `load` (and while released)

    def load(self, model) -> None:
        """Load the drafter (fp32) and check it against the loaded target `model`; CheckpointError names the field."""
        if self.bug is not None and self.bug not in faults.BUGS:
            raise drafter_mod.CheckpointError(
                f"--speculative-bug {self.bug!r}: expected one of {', '.join(faults.BUGS)}"
            )
        d = drafter_mod.load(self.path, faults.drafter_dtype(self.bug, torch.float32), self.device)
        cfg = model.config.get_text_config()
        drafter_mod.check_target(
            d.c, cfg.hidden_size, int(model.get_output_embeddings().weight.shape[0]), cfg.num_hidden_layers
        )
        self.drafter = faults.drafter_variant(self.bug, d)

    def release(self) -> None:
        self.drafter = None

    @property
    def block_size(self) -> int:  # drafts per verify step + 1 (the drafter family's width)
        return self.drafter.width

    # -- pieces

    def features(self, model, context: list[int], total: int) -> torch.Tensor:
        """Target features [total, K*H] (bf16) of `context` padded with pad tokens to `total` tokens: rows
        < len(context) are the context's (causal layers never see the padding), the rest are never read."""
        pad = getattr(model.config.get_text_config(), "pad_token_id", None) or 0
        ids = torch.tensor(context + [pad] * (total - len(context)))
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        layers = faults.feature_layers(self.bug, self.drafter.c.target_layer_ids)
        return target_mod.extract(decoder, ids, layers).to(torch.bfloat16)

    def draft(self, model, head: target_mod.Head, seq: list[int], total: int) -> list[int]:
        """The drafter's D drafts for positions p+1..p+D at anchor p = len(seq) - 1 from the features of positions
        0..p-1 (D = B-1, or B for DSpark drafting from the anchor's slot)."""
        p = len(seq) - 1
        feats = self.features(model, seq[:p], total)
        feats, p = faults.visible_context(self.bug, feats, p)
        return replay.draft_one(self.drafter, head, feats, p, seq[-1])

    # -- the loop

    @torch.inference_mode()
    def decode(
        self,
        model,
        ids: list[int],
        max_new: int,
        stop: Callable[[list[int]], dict | None],
        sampling: Sampling | None = None,
    ) -> tuple[list[int], dict, Counters]:
        """Speculative decode of `ids`, greedy or with `sampling`: (output ids, finish_reason, counters). `stop(out)`
        says whether the last token of `out` ends the request (SGLang's finish_reason shape) or None."""
        B = self.block_size
        counters = Counters(B)
        finish: dict = {"type": "length", "length": max_new}
        out: list[int] = []
        if max_new <= 0:
            return out, finish, counters
        kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        head = target_mod.Head(model.get_input_embeddings().weight, model.get_output_embeddings().weight)
        total = len(ids) + max_new  # the extraction's sequence length when the completion runs to max_new
        dev = model.device

        def run(tokens: list[int], cache, keep: int | None = None):
            extra = {"logits_to_keep": keep} if keep else {}
            res = model(input_ids=torch.tensor([tokens], device=dev), use_cache=True, **{kw: cache}, **extra)
            got = getattr(res, "cache", None)
            return res.logits[0], (res.past_key_values if got is None else got)

        def target(rows: torch.Tensor, first: int) -> list[int]:  # the target's token per row, row i at first + i
            if sampling is None:
                return rows.argmax(-1).tolist()
            return sampling.pick(rows, list(range(first, first + rows.shape[0])))

        logits, cache = run(ids, None, keep=1)  # prefill: the first completion token
        pending = target(logits[-1:], len(ids))
        if faults.counts_prefill(self.bug):  # planted: the prefill counted as a verify step
            counters.accepted.append(0)
        checked = faults.verified(self.bug, B - 1)  # drafts each verify step checks (B-1 unless planted)
        while True:
            for t in pending:  # commit, cut at a stop or at max_new
                out.append(t)
                hit = stop(out)
                if hit is not None:
                    return out, hit, counters
                if len(out) >= max_new:
                    return out, finish, counters
            seq = ids + out  # anchor p = len(seq) - 1; cache holds 0..p-1
            drafts = self.draft(model, head, seq, total)  # B-1 tokens for positions p+1..p+B-1 (B: the width)
            snap = copy.deepcopy(cache)
            block = [seq[-1]] + drafts
            logits, cache = run(block, cache)  # verify: one forward over the block
            greedy = target(logits, len(seq))  # the target's token after each block position (greedy or drawn)
            a = 0
            while a < checked and drafts[a] == greedy[a]:  # candidates[1:] == target tokens[:-1], leading run
                a += 1
            counters.accepted.append(a)
            if a < B - 1:  # roll back to the accepted prefix: restore, re-run [token p, d_1..d_a]
                cache = snap
                _, cache = run(block[: a + 1], cache, keep=1)
            pending = drafts[:a] + [greedy[a]]  # accepted drafts + the bonus token
