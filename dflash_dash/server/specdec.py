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
  - `rejection` verify (`rule`, Leviathan et al. 2023; engines that sample drafts): drafts drawn from the
    drafter's q_T (`Tap`), accepted with min(1, p/q), the residual drawn at the first rejection
    (`sampler.verify_rejection`): the output is distributed as plain sampling's, not token for token equal to it.
  - Rollback (`rollback.of`): after each verify forward the cache is put back to the accepted prefix [token p,
    d_1..d_a] without running the target again: full-attention K/V cropped, each Gated DeltaNet layer's conv
    state cropped and its recurrent state recomputed from the state before the block over the accepted tokens'
    recorded kernel inputs (SGLang keeps per-token intermediate states for the same purpose).
  - Features as the replay sees them (`live` False, the stand-in's default): each step recomputes them with a cache-
    free forward (`target.extract`, the extraction's own function) over the context padded with pad tokens to prompt
    + max_new tokens, then rounds them to bf16 (the feature cache's dtype). Kernel shapes (chunked linear attention,
    SDPA splits) depend on the sequence length, and padding to the length of the extraction's forward makes the
    features bit-identical to the cached ones when the completion runs to max_new (CPU, fp32; causal layers never
    see the padding). A completion that stops early was extracted over fewer tokens: its features can then differ in
    the last bf16 bit at a few positions. The drafter runs through `replay.draft_one`, the replay's path.
  - `live` (the live loop's decoder, as an engine runs): the features are the target's own layer outputs of the
    prefill and of each verify forward's committed rows (bf16), and the drafter's context K/V grows by those rows
    (`Context`): nothing is recomputed per step.
  - `bug` (a test aid, never a default) plants one of the engine faults of `faults` (BUGS) that conformance must
    flag.
Without `live`, slow on purpose (one full forward per verify step for the features): bit-identity over speed.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import drafters as drafter_mod, replay, target as target_mod
from ..replay.head import read_out
from . import faults, rollback, sampler
from .sampler import Sampling

RULES = ("target-sample", "rejection")  # verify rules at T > 0 (= sampling.RULES; module docstring)

# ---------------------------------------------------------------------------
# counters


@dataclass
class Counters:
    """Per verify step, the drafts accepted, counted two ways: `accepted`, what verification accepted (vLLM's
    scheduler and llama.cpp's server count these before their stop check, so a last step cut at max_new / a stop
    may count drafts past the completion), and `within` (SGLang's DFlash verify: drafts appended - 1, the appending
    stopped at the token that finishes the request), so sum(within) + verify steps = completion_tokens - 1."""

    block_size: int  # B: B-1 drafts proposed per verify step
    accepted: list[int] = field(default_factory=list)  # drafts verification accepted at each step (0..B-1;
    #                                                         counted before the cut at max_new / a stop, so the
    #                                                         last step's may reach past the completion)
    cut_to: int | None = None  # tokens the last step committed when the completion ended inside it (None: not cut)
    first_at: float = field(default=0.0, compare=False)  # perf_counter when the prefill's token was known (the
    #                                                      live loop's clock starts there; not compared)

    @property
    def verify_ct(self) -> int:
        return len(self.accepted)

    @property
    def within(self) -> list[int]:
        """Drafts of each step that lie inside the completion (the last step's cut to it)."""
        if self.cut_to is None or not self.accepted:
            return list(self.accepted)
        return [*self.accepted[:-1], min(self.accepted[-1], self.cut_to - 1)]

    def cut(self, committed: int) -> None:
        """The completion ended on the `committed`-th token of the last step's (accepted drafts + bonus)."""
        if self.accepted:
            self.cut_to = committed

    def meta(self, completion_tokens: int) -> dict:
        """SGLang's speculative counters for meta_info, over the drafts `within` the completion (SGLang counts a
        step's appended tokens - 1, stopping at the finishing token). spec_accept_length = completion_tokens /
        spec_verify_ct (SGLang's own: the prefill token included); histogram index = drafts accepted in a step."""
        n, acc = self.verify_ct, sum(self.within)
        proposed = n * (self.block_size - 1)
        hist = [0] * self.block_size
        for a in self.within:
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
    dtype: Any = None  # the drafter's torch dtype; None: float32
    live: bool = False  # features from the target's own forwards and the drafter's K/V kept (`Context`), as an
    #                     engine drafts; False: the extraction's features recomputed each step (bit-identical to the
    #                     cache, for conformance; slow)

    def load(self, model) -> None:
        """Load the drafter (fp32) and check it against the loaded target `model`; CheckpointError names the field."""
        if self.bug is not None and self.bug not in faults.BUGS:
            raise drafter_mod.CheckpointError(
                f"--speculative-bug {self.bug!r}: expected one of {', '.join(faults.BUGS)}"
            )
        d = drafter_mod.load(self.path, faults.drafter_dtype(self.bug, self.dtype or torch.float32), self.device)
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

    def propose(self, model, head, seq: list[int], total: int, kv=None, tap=None) -> list[int]:
        """The drafts at anchor p = len(seq) - 1 from the drafter's context K/V `kv` of positions 0..p-1 (None:
        computed from the exact features, as `draft`); `tap` hears the scores each draft is read from."""
        p = len(seq) - 1
        if kv is None:
            feats, p = faults.visible_context(self.bug, self.features(model, seq[:p], total), p)
            kv = self.drafter.context_kv(feats.to(self.drafter.device))
        first = torch.tensor([int(seq[-1])])
        emb = self.drafter.embed_block(head, first)
        h = self.drafter.blocks(kv, torch.tensor([p], device=self.drafter.device), emb, max_anchor=p)
        return read_out(self.drafter, head, h, first, 1, tap=tap)[0][0].tolist()

    # -- the loop

    @torch.inference_mode()
    def decode(
        self,
        model,
        ids: list[int],
        max_new: int,
        stop: Callable[[list[int]], dict | None],
        sampling: Sampling | None = None,
        rule: str = "target-sample",
    ) -> tuple[list[int], dict, Counters]:
        """Speculative decode of `ids`, greedy or with `sampling` under verify `rule` (RULES): (output ids,
        finish_reason, counters). `stop(out)` says whether the last token of `out` ends the request (SGLang's
        finish_reason shape) or None."""
        if rule not in RULES:
            raise ValueError(f"verify rule {rule!r}: expected one of {', '.join(RULES)}")
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
        sampled = sampling is not None and rule == "rejection"  # drafts drawn from the drafter's q at T

        def run(tokens: list[int], cache, keep: int | None = None):
            extra = {"logits_to_keep": keep} if keep else {}
            res = model(input_ids=torch.tensor([tokens], device=dev), use_cache=True, **{kw: cache}, **extra)
            got = getattr(res, "cache", None)
            return res.logits[0], (res.past_key_values if got is None else got)

        def target(rows: torch.Tensor, first: int) -> list[int]:  # the target's token per row, row i at first + i
            if sampling is None:
                return rows.argmax(-1).tolist()
            return sampling.pick(rows, list(range(first, first + rows.shape[0])))

        rb = rollback.of(model, lambda tokens, cache: run(tokens, cache, keep=1)[1])
        live = Context(self.drafter, faults.feature_layers(self.bug, self.drafter.c.target_layer_ids))
        hooks = live.hooks(model) if self.live else contextlib.nullcontext({})
        with hooks as got:
            logits, cache = run(ids, None, keep=1)  # prefill: the first completion token
            if self.live:
                live.add(got, len(ids))
            pending = target(logits[-1:], len(ids))
            counters.first_at = time.perf_counter()
            if faults.counts_prefill(self.bug):  # planted: the prefill counted as a verify step
                counters.accepted.append(0)
            checked = faults.verified(self.bug, B - 1)  # drafts each verify step checks (B-1 unless planted)
            while True:
                for i, t in enumerate(pending):  # commit, cut at a stop or at max_new
                    out.append(t)
                    hit = stop(out)
                    if hit is not None or len(out) >= max_new:
                        counters.cut(i + 1)
                        return out, finish if hit is None else hit, counters
                seq = ids + out  # anchor p = len(seq) - 1; cache holds 0..p-1
                tap = Tap(B - 1, sampling.temperature, int(head.lm_head.shape[0])) if sampled else None
                if self.live or sampled:
                    drafts = self.propose(model, head, seq, total, live.kv if self.live else None, tap)
                else:
                    drafts = self.draft(model, head, seq, total)  # B-1 tokens for positions p+1..p+B-1
                if sampled:
                    drafts = [sampler.draw(tap.q[j], sampling.drawn_seed, len(seq) + j, "draft") for j in range(B - 1)]
                block = [seq[-1]] + drafts
                with rb.verify(cache, block):
                    logits, cache = run(block, cache)  # verify: one forward over the block
                if sampled:  # Leviathan et al.: accept with min(1, p/q), the residual drawn at the first rejection
                    a, bonus = sampler.verify_rejection(
                        sampling.probs(logits), tap.q, drafts, sampling.drawn_seed, len(seq)
                    )
                else:
                    drawn = target(logits, len(seq))  # the target's token after each block position
                    a = 0
                    while a < checked and drafts[a] == drawn[a]:  # candidates[1:] == target tokens[:-1], leading run
                        a += 1
                    bonus = drawn[a]
                counters.accepted.append(a)
                if self.live:
                    live.add(got, a + 1)  # the block's committed positions p..p+a become context
                cache = rb.keep(cache, a + 1, len(block))
                pending = drafts[:a] + [bonus]  # accepted drafts + the bonus token


# ---------------------------------------------------------------------------
# what the decoder keeps beside the target's cache


@dataclass
class Context:
    """The drafter's context as a live engine keeps it: the target's features at the drafter's layers taken from
    the prefill and each verify forward (the committed rows only), and the drafter's context K/V extended by them."""

    drafter: Any  # the loaded drafters.Drafter
    layers: list[int]  # target layer ids whose outputs are the features, in order
    kv: list | None = None  # per drafter layer (k, v) [nkv, T, hd] of context positions 0..T-1
    length: int = 0  # T

    def hooks(self, model):
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        return target_mod.outputs(target_mod._layers(decoder), self.layers)

    def add(self, got: dict, rows: int) -> None:
        """Append the first `rows` rows of the last forward's features (bf16, the feature cache's dtype)."""
        feats = torch.cat([got[l][0, :rows] for l in self.layers], dim=-1).to(torch.bfloat16)
        new = self.drafter.context_kv(feats.to(self.drafter.device), start=self.length)
        self.kv = (
            new
            if self.kv is None
            else [(torch.cat([k, nk], -2), torch.cat([v, nv], -2)) for (k, v), (nk, nv) in zip(self.kv, new)]
        )
        self.length += rows


@dataclass
class Tap:
    """The drafter's q_T [D, V] of one block, heard from its read-out (`Drafter.read_out`'s tap): softmax(scores /
    T) over the vocabulary, or over a family's candidate ids (0 elsewhere). A sequential family's q_j is the one its
    read-out walks to with its own greedy drafts before slot j (what the replay's expected acceptance uses too)."""

    drafts: int  # D
    temperature: float  # T
    vocab: int  # V
    q: torch.Tensor | None = None  # [D, V] float64 on the CPU, filled by the read-out

    def __call__(self, n: torch.Tensor, j: torch.Tensor, scores: torch.Tensor, cand: torch.Tensor | None = None):
        if self.q is None:
            self.q = torch.zeros(self.drafts, self.vocab, dtype=torch.float64)
        probs = torch.softmax(scores.detach().to("cpu", torch.float64) / self.temperature, dim=-1)
        if cand is not None:
            probs = torch.zeros(len(probs), self.vocab, dtype=torch.float64).scatter(1, cand.cpu().long(), probs)
        self.q[j.cpu().long()] = probs
