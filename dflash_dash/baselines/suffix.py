"""Suffix decoding (vLLM's `suffix` method), as Arctic Inference's SuffixDecodingCache proposes it.

Source: vllm-project/vllm `vllm/v1/spec_decode/suffix_decoding.py` (commit 044ac3a0: `SuffixDecodingProposer`,
settings `suffix_decoding_*` of `vllm/config/speculative.py`), which calls snowflakedb/ArcticInference
`arctic_inference/suffix_decoding/cache.py` (`SuffixDecodingCache.speculate`, commit 21fa211b) and
`csrc/suffix_decoding/suffix_tree.cc` (`SuffixTree::append`, `speculate`, `_match_context`, `_speculate_path`,
commit 0a11e6ad). The rules:
- Two trees of counts, each over every suffix of its sequences cut at max_tree_depth tokens: a local tree per
  request over its prompt and its output so far, and a global tree over the outputs of the requests served
  (this one's included), the oldest evicted beyond max_cached_requests (-1: no limit, 0: no global tree).
  count(s) = occurrences of s (|s| <= max_tree_depth) in the tree's sequences.
- speculate(pattern = the last max_tree_depth tokens): for match_len = 1 .. len(pattern) - 1 while the pattern's
  last match_len tokens are in the tree: at most min(num_speculative_tokens, int(match_len * max_spec_factor +
  max_spec_offset)) tokens, each step the child of largest count, prob *= count(child) / count(node) (float32),
  stopping before a token whose prob < min_token_prob; score = the sum of the drafted tokens' probs; the
  largest score wins, a later (longer) match on ties. The global tree's draft replaces the local one only when its
  score is strictly larger. Path speculation only (vLLM does not pass use_tree_spec).
Modelled on an uncompressed trie of the same counts (Arctic's tree is path-compressed: the same counts, fewer
nodes). Children of equal count: the first made wins here (Arctic iterates a hash map: unspecified order).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .base import Proposal, Proposer, SettingsError, positive


@dataclass(frozen=True)
class SuffixSettings:
    num_speculative_tokens: int = 24  # most drafts per step (vLLM's default for suffix: max_tree_depth)
    max_tree_depth: int = 24  # suffix_decoding_max_tree_depth: match + speculation length limit (default 24)
    max_cached_requests: int = 10000  # suffix_decoding_max_cached_requests: outputs kept in the global tree
    # (FIFO; -1 no limit, 0 no global tree; default 10000)
    max_spec_factor: float = 1.0  # suffix_decoding_max_spec_factor: drafts <= factor x match length (default 1.0)
    max_spec_offset: float = 0.0  # SuffixDecodingCache.speculate's max_spec_offset (vLLM leaves it at 0)
    min_token_prob: float = 0.1  # suffix_decoding_min_token_prob: stop below this estimated probability (0.1)

    def __post_init__(self):
        positive("num_speculative_tokens", self.num_speculative_tokens)
        positive("max_tree_depth", self.max_tree_depth)
        positive("max_spec_factor", self.max_spec_factor, 0)
        if self.max_cached_requests < -1:
            raise SettingsError("settings max_cached_requests: expected -1 (no limit), 0 (no global tree) or more")
        if not 0 <= self.min_token_prob <= 1:
            raise SettingsError(f"settings min_token_prob={self.min_token_prob}: expected a probability in [0, 1]")


class SuffixTrie:
    """Counts of every suffix of each sequence, cut at `depth` tokens (SuffixTree's counts, uncompressed)."""

    def __init__(self, depth: int):
        self.depth = depth
        self.child: list[dict[int, int]] = [{}]  # node -> {token: child}; node 0 is the root
        self.count: list[int] = [0]  # occurrences of each node's string (the root: tokens appended)
        self.active: dict[int, list[int]] = {}  # seq -> nodes of its suffixes in progress, shortest first
        self.seqs: dict[int, list[int]] = {}

    def append(self, seq: int, token: int) -> None:
        """SuffixTree::append: a new suffix starts at the root; the `depth` newest suffixes each grow by `token`."""
        self.seqs.setdefault(seq, []).append(token)
        grow = ([0] + self.active.get(seq, []))[: self.depth]
        self.count[0] += 1
        out = []
        for node in grow:
            kid = self.child[node].get(token)
            if kid is None:
                kid = self.child[node][token] = len(self.child)
                self.child.append({})
                self.count.append(0)
            self.count[kid] += 1
            out.append(kid)
        self.active[seq] = out

    def extend(self, seq: int, tokens) -> None:
        for t in tokens:
            self.append(seq, int(t))

    def remove(self, seq: int) -> None:
        """SuffixTree::remove: every suffix of `seq` uncounted (nodes left at zero dropped)."""
        toks = self.seqs.pop(seq, [])
        self.active.pop(seq, None)
        for start in range(len(toks)):
            self.count[0] -= 1
            node = 0
            for t in toks[start : start + self.depth]:
                kid = self.child[node][t]
                self.count[kid] -= 1
                if self.count[kid] == 0:
                    del self.child[node][t]
                    break
                node = kid

    def find(self, pattern: list[int]) -> int:
        """_match_context: the node of `pattern`, -1 when it is not in the tree."""
        node = 0
        for t in pattern:
            node = self.child[node].get(t, -1)
            if node < 0:
                return -1
        return node

    def path(self, node: int, most: int, min_prob: np.float32) -> tuple[list[int], np.float32]:
        """_speculate_path: (drafts, score) from `node`, at most `most` tokens."""
        out, prob, score = [], np.float32(1.0), np.float32(0.0)
        while len(out) < most and prob >= min_prob:
            kids = self.child[node]
            if not kids:
                break
            token, kid = max(kids.items(), key=lambda kv: self.count[kv[1]])  # first of the largest count
            prob = np.float32(prob * (np.float32(self.count[kid]) / np.float32(self.count[node])))
            if prob < min_prob:
                break
            out.append(token)
            score = np.float32(score + prob)
            node = kid
        return out, score

    def speculate(
        self, pattern: list[int], most: int, s: SuffixSettings, known: list[int] | None = None
    ) -> tuple[list[int], float, int]:
        """SuffixTree::speculate: (drafts, score, match length) of the best-scoring match length. `known`: the nodes
        of the pattern's last 1, 2, ... tokens where the caller has them (a sequence's own suffixes in progress:
        the same nodes `find` walks to, without the walks)."""
        best: tuple[list[int], float, int] = ([], 0.0, 0)
        min_prob, caps = np.float32(s.min_token_prob), spec_caps(s, len(pattern))
        known = known or []
        for n in range(1, len(pattern)):
            node = known[n - 1] if n <= len(known) else self.find(pattern[len(pattern) - n :])
            if node < 0:
                break
            ids, score = self.path(node, min(most, caps[n]), min_prob) if self.child[node] else ([], 0.0)
            if score >= best[1]:
                best = (ids, float(score), n)
        return best

    def suffixes(self, seq: int) -> list[int]:
        """The nodes of `seq`'s last 1, 2, ... tokens (up to `depth`)."""
        return self.active.get(seq, [])


@lru_cache(maxsize=64)
def spec_caps(s: SuffixSettings, n: int) -> list[int]:
    """Drafts allowed per match length 0..n-1: int(match_len x max_spec_factor + max_spec_offset) (float32, as
    SuffixTree::speculate computes it), at least 0."""
    f32 = np.float32
    return [max(0, int(float(f32(m) * f32(s.max_spec_factor) + f32(s.max_spec_offset)) + 1e-6)) for m in range(n)]


class Suffix(Proposer):
    method = "suffix"
    family = "baseline:suffix"
    source = "vllm/v1/spec_decode/suffix_decoding.py @ 044ac3a0 + arctic_inference suffix_tree.cc @ 0a11e6ad"

    def __init__(self, settings: SuffixSettings):
        super().__init__(settings)
        self.outputs = SuffixTrie(settings.max_tree_depth)  # the global tree: outputs of the requests served
        self.kept: list[int] = []  # their sequence ids, oldest first (FIFO eviction)
        self.local: SuffixTrie | None = None
        self.seq = -1
        self.prompt_len = 0  # the current request's prompt length (the context is prompt + output so far)

    @property
    def width(self) -> int:
        return self.settings.num_speculative_tokens

    def start(self, prompt: np.ndarray, first: int) -> None:
        s = self.settings
        self.local = SuffixTrie(s.max_tree_depth)
        self.local.extend(0, prompt.tolist())
        self.prompt_len = len(prompt)
        if s.max_cached_requests != 0:
            self.seq += 1
            self.kept.append(self.seq)
            while s.max_cached_requests > 0 and len(self.kept) > s.max_cached_requests:
                self.outputs.remove(self.kept.pop(0))
        self.add([first])

    def add(self, tokens) -> None:
        """add_active_response: the new output tokens into the local tree and this request's global sequence."""
        self.local.extend(0, tokens)
        if self.settings.max_cached_requests != 0:
            self.outputs.extend(self.seq, tokens)

    def propose(self, context: np.ndarray) -> Proposal:
        s = self.settings
        pattern = context[-s.max_tree_depth :].tolist()
        own = self.local.suffixes(0) if len(context) == len(self.local.seqs[0]) else None
        ids, score, n = self.local.speculate(pattern, s.num_speculative_tokens, s, own)
        origin = "prompt+output"
        if s.max_cached_requests != 0:
            held = len(self.outputs.seqs.get(self.seq, ()))  # this request's output so far (the context's tail)
            mine = self.outputs.suffixes(self.seq) if len(context) == self.prompt_len + held else None
            g_ids, g_score, g_n = self.outputs.speculate(pattern, s.num_speculative_tokens, s, mine)
            if g_score > score:
                ids, n, origin = g_ids, g_n, "outputs"
        return Proposal(np.asarray(ids, dtype=np.int64), -1, n, origin if ids else "")

    def advance(self, context: np.ndarray, committed: np.ndarray) -> None:
        self.add(committed.tolist())

    def finish(self, tokens: np.ndarray) -> None:
        self.local = None
