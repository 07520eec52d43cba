"""Sampling at temperature T for the stand-in: the target's distribution filtered by top-k, top-p and min-p, and a
seeded draw per sequence position.

Contract: `Sampling.pick(logits [N, V], positions [N])` returns one token id per row, row i drawn from the
distribution of `logits[i]` as the request's engine defines it:
  - SGLang and vLLM temper first, then filter: p = softmax(logits / T), keep the top_k most probable, then the
    smallest prefix (by descending p) whose mass before each kept token is <= top_p, then tokens with
    p >= min_p x max p (python/sglang/srt/layers/sampler.py, top_k_top_p_min_p_sampling_from_probs_torch;
    vllm/v1/sample/sampler.py applies the temperature before its top-k/top-p sampler).
  - llama.cpp filters the UNtempered distribution and tempers last: its default chain is ... top_k, typ_p, top_p,
    min_p, xtc, temperature (common/common.h, common_params_sampling::samplers), so `top_p_first` takes the kept set
    from softmax(logits), then samples softmax(logits / T) over it.
  Either way the draw is proportional to exp(logits / T) over the kept tokens.
The draw is the Gumbel-max trick with noise that depends only on (seed, position, token id): a torch.Generator seeded
per request and position (`noise`), on the logits' device. SGLang's seeded sampling works the same way
(multinomial_with_seed hashes the request's sampling_seed with the token's position), so a token's draw does not
depend on how many draws came before: speculative decoding at T commits exactly the tokens plain decoding at T commits
with the same seed, the same seed gives the same completion and another seed another one. Without a seed a request
draws a fresh random one.
Greedy requests never build a Sampling (protocols decide greediness in their engine's own terms).

The `rejection` verify rule (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding",
Algorithm 1; vLLM's rejection sampler, vllm/v1/sample/rejection_sampler.py): drafts sampled from the drafter's
q at T (`draw(q, seed, position, "draft")`), draft j accepted when u_j < min(1, p_j(d_j) / q_j(d_j)), and at the
first rejection a token drawn from norm(max(0, p_j - q_j)); all accepted, the bonus drawn from p after the last
draft. `verify_rejection` is that step on given distributions; its draws come from streams of their own
(`stream` "draft", "accept"), so the committed tokens are distributed exactly as p, whatever q is.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field

import torch


def _generator(seed: int, position: int, stream: str = "", device="cpu") -> torch.Generator:
    """A torch.Generator on `device` seeded from a hash of (seed, position[, stream]): every triple has its own
    stream (on one device: a CUDA generator draws other numbers than the CPU's for the same seed)."""
    key = hashlib.blake2b(f"{seed}:{position}{':' + stream if stream else ''}".encode(), digest_size=8).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(key, "little") & (2**63 - 1))


def noise(seed: int, position: int, vocab: int, stream: str = "", device="cpu") -> torch.Tensor:
    """Gumbel noise [vocab] (float64, on `device`) for the token at sequence `position` of a request seeded `seed`
    (`stream`: another independent draw for the same position, e.g. a sampled draft's)."""
    g = _generator(seed, position, stream, device)
    u = torch.rand(vocab, generator=g, dtype=torch.float64, device=device)
    return -torch.log(-torch.log(u))  # u = 0 gives -inf: that token is never drawn


def uniform(seed: int, position: int, stream: str) -> float:
    """One U(0, 1) draw for (seed, position, stream)."""
    return float(torch.rand(1, generator=_generator(seed, position, stream), dtype=torch.float64))


def draw(p: torch.Tensor, seed: int, position: int, stream: str = "") -> int:
    """One token from probabilities p [V] (any scale; zeros never drawn), by Gumbel-max on log p."""
    return int((p.double().cpu().log() + noise(seed, position, p.shape[-1], stream)).argmax())


def verify_rejection(p: torch.Tensor, q: torch.Tensor, drafts: list[int], seed: int, first: int) -> tuple[int, int]:
    """The rejection rule over one block: target probabilities p [D+1, V] (row j: the position draft j fills;
    row D: the one after the last draft), the drafter's q [D, V], the D drafts (sampled from q), the position of
    draft 0 `first` -> (accepted drafts a, the token committed after them)."""
    p, q = p.double().cpu(), q.double().cpu()
    for j, d in enumerate(drafts):
        if uniform(seed, first + j, "accept") * float(q[j, d]) < float(p[j, d]):
            continue
        rest = (p[j] - q[j]).clamp(min=0.0)
        return j, draw(rest if float(rest.sum()) > 0 else p[j], seed, first + j)
    return len(drafts), draw(p[len(drafts)], seed, first + len(drafts))


@dataclass(frozen=True)
class Sampling:
    """How one request samples (every field validated by its protocol, in its engine's words)."""

    temperature: float  # > 0: logits are divided by it
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]; 1: no cut
    top_k: int = 0  # the most probable tokens kept; 0: the whole vocabulary
    min_p: float = 0.0  # tokens below min_p x the most probable token's p are dropped; 0: none
    seed: int | None = None  # the request's seed; None: a fresh random one (set in __post_init__)
    top_p_first: bool = False  # llama.cpp's order: filter the untempered distribution, temper last
    drawn_seed: int = field(default=0, repr=False)  # the seed actually used (`seed`, or the random one)

    def __post_init__(self):
        object.__setattr__(self, "drawn_seed", secrets.randbits(63) if self.seed is None else int(self.seed))

    def kept(self, logits: torch.Tensor) -> torch.Tensor:
        """Log-probabilities [N, V] (float64) at the temperature, -inf outside the kept set."""
        x = logits.detach().to(torch.float64)  # on the logits' device (a GPU decoder samples there)
        logp = torch.log_softmax(x / self.temperature, dim=-1)
        if not self.top_k and self.top_p >= 1.0 and self.min_p <= 0.0:
            return logp  # nothing is cut: no sort over the vocabulary
        p = torch.softmax(x if self.top_p_first else x / self.temperature, dim=-1)
        ps, order = p.sort(dim=-1, descending=True)
        drop = torch.zeros_like(ps, dtype=torch.bool)
        if self.top_k and self.top_k < ps.shape[-1]:
            drop[:, self.top_k :] = True
        if self.top_p < 1.0:
            drop |= (ps.cumsum(dim=-1) - ps) > self.top_p  # the mass before this token already exceeds top_p
        if self.min_p > 0.0:
            drop |= ps < ps[:, :1] * self.min_p
        drop[:, 0] = False  # the most probable token always stays
        mask = torch.zeros_like(drop).scatter(1, order, drop)
        return logp.masked_fill(mask, float("-inf"))

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """p_T [N, V] (float64, on the logits' device): the kept distribution at the temperature, 0 outside it."""
        return self.kept(logits.reshape(-1, logits.shape[-1])).exp()

    def pick(self, logits: torch.Tensor, positions: list[int]) -> list[int]:
        """One token per row of `logits` [N, V]: row i drawn for sequence position `positions[i]`."""
        logp = self.kept(logits.reshape(-1, logits.shape[-1]))
        V = logp.shape[-1]
        return [
            int((logp[i] + noise(self.drawn_seed, pos, V, device=logp.device)).argmax())
            for i, pos in enumerate(positions)
        ]
