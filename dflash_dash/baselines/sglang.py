"""SGLang's n-gram speculative algorithm (`--speculative-algorithm NGRAM`), as SGLang proposes and verifies it.

Source: sgl-project/sglang `python/sglang/srt/speculative/ngram_worker.py` (what enters the cache, when) and
`cpp_ngram/trie_cache.cpp` (`TrieCache::insert`, `match`, `buildRecency`; commit 0657507f), defaults from
`server_args.py` (speculative_ngram_*). The rules:
- One trie shared by every request of the server (so earlier completions of the set feed later ones). After each
  verify step the last `branch_length` tokens of prompt + output are inserted: every window starting at i with
  i + min_match_window_size < len, i.e. each suffix longer than min_match_window_size, walked from the root;
  a node touched moves to the front of its parent's recency list. The prefill inserts nothing (the worker's
  FIXME: extend is not inserted), so the prompt enters only through those tails.
- Matching: the context's last w tokens for w from min(len, max_match_window_size) down to
  min_match_window_size, each walked from the root; every w that walks to a node is an anchor, longest first.
- BFS tree (match_type BFS, the default): per anchor a breadth-first walk from it, taking at each node its first
  `breadth` children by recency, breadth starting at (max_window - w) * scale + min_bfs_breadth and shrinking by
  scale per level (scale = (max_bfs_breadth - min_bfs_breadth) / (max_window - min_window + 1); at least 1),
  tokens merged into one draft tree under the last token, until the tree holds draft_token_num - 1 nodes (the
  verify step holds draft_token_num tokens per request, the root included, as the worker asserts).
- Verify (greedy): the longest root path whose tokens equal the target's next tokens is accepted.
Simplifications: requests are served one at a time in set order (a real server interleaves concurrent requests'
insertions); the trie's capacity eviction (10M nodes by default) is not modelled; match_type PROB is refused;
the zero tokens SGLang pads a small tree with are not drafts here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from .base import Proposal, Proposer, SettingsError, positive


@dataclass(frozen=True)
class SglangSettings:
    draft_token_num: int = 16  # --speculative-num-draft-tokens: tokens verified per step, the root included
    min_match_window_size: int = 1  # --speculative-ngram-min-match-window-size (SGLang's default 1)
    max_match_window_size: int = 12  # --speculative-ngram-max-match-window-size (default 12)
    min_bfs_breadth: int = 1  # --speculative-ngram-min-bfs-breadth (default 1)
    max_bfs_breadth: int = 10  # --speculative-ngram-max-bfs-breadth (default 10)
    branch_length: int = 18  # --speculative-ngram-branch-length: tail tokens inserted per step (default 18)
    match_type: str = "BFS"  # --speculative-ngram-match-type: BFS (recency) only; PROB is not modelled

    def __post_init__(self):
        for name in ("draft_token_num", "min_match_window_size", "min_bfs_breadth"):
            positive(name, getattr(self, name))
        positive("draft_token_num", self.draft_token_num, 2)
        if not self.min_match_window_size <= self.max_match_window_size < self.branch_length:
            raise SettingsError(
                "settings: SGLang needs min_match_window_size <= max_match_window_size < branch_length "
                f"(got {self.min_match_window_size}, {self.max_match_window_size}, {self.branch_length})"
            )
        if self.min_bfs_breadth > self.max_bfs_breadth:
            raise SettingsError("settings min_bfs_breadth: expected no more than max_bfs_breadth")
        if self.match_type != "BFS":
            raise SettingsError(f"settings match_type={self.match_type!r}: only BFS (SGLang's default) is modelled")


class NgramSglang(Proposer):
    method = "sglang-ngram"
    family = "baseline:ngram-sglang"
    source = "sglang/srt/speculative/cpp_ngram/trie_cache.cpp @ 0657507f + ngram_worker.py"

    def __init__(self, settings: SglangSettings):
        super().__init__(settings)
        self.child: list[dict[int, int]] = [{}]  # the trie: node -> {token: child}; node 0 is the root
        self.stamp: list[int] = [0]  # when each node was last touched (its recency among its siblings)
        self.clock = 0

    @property
    def width(self) -> int:
        return self.settings.draft_token_num - 1

    def insert(self, tokens: np.ndarray) -> None:
        """TrieCache::insert: each window tokens[i : i + branch_length] with i + min_window < len."""
        s, toks = self.settings, tokens.tolist()
        for i in range(len(toks) - s.min_match_window_size):
            node = 0
            for t in toks[i : i + s.branch_length]:
                nxt = self.child[node].get(t)
                if nxt is None:
                    nxt = len(self.child)
                    self.child.append({})
                    self.stamp.append(0)
                    self.child[node][t] = nxt
                self.clock += 1
                self.stamp[nxt] = self.clock
                node = nxt

    def anchors(self, context: np.ndarray) -> list[tuple[int, int]]:
        """TrieCache::match: (node, w) for every suffix window w (longest first) that walks from the root."""
        s, out = self.settings, []
        tail = context[-s.max_match_window_size :].tolist()
        for w in range(min(len(tail), s.max_match_window_size), s.min_match_window_size - 1, -1):
            node = 0
            for t in tail[len(tail) - w :]:
                node = self.child[node].get(t, -1)
                if node < 0:
                    break
            if node >= 0:
                out.append((node, w))
        return out

    def tree(self, context: np.ndarray) -> tuple[list[dict[int, int]], int]:
        """TrieCache::buildRecency: the draft tree as [{token: child}] (entry 0 the root) and the longest match."""
        s = self.settings
        found = self.anchors(context)
        scale = (s.max_bfs_breadth - s.min_bfs_breadth) / (s.max_match_window_size - s.min_match_window_size + 1)
        tree: list[dict[int, int]] = [{}]
        budget = self.width
        for node, w in found:
            queue = deque([(0, (s.max_match_window_size - w) * scale + s.min_bfs_breadth, node)])
            while queue and len(tree) - 1 < budget:
                parent, breadth, at = queue.popleft()
                kids = sorted(self.child[at].items(), key=lambda kv: -self.stamp[kv[1]])  # the recency list
                for token, kid in kids[: max(1, int(breadth))]:
                    if len(tree) - 1 >= budget:
                        break
                    pos = tree[parent].get(token)
                    if pos is None:
                        pos = tree[parent][token] = len(tree)
                        tree.append({})
                    queue.append((pos, breadth - scale, kid))
        return tree, (found[0][1] if found else 0)

    def propose(self, context: np.ndarray) -> Proposal:
        tree, w = self.tree(context)
        return Proposal(np.asarray(walk(tree, []), dtype=np.int64), -1, w, "n-gram cache")

    def accept(self, context: np.ndarray, truth: np.ndarray) -> tuple[int, Proposal]:
        """Greedy tree verify: the longest root path equal to `truth`; the chain shown is that path, then the
        tree's first branch below it."""
        tree, w = self.tree(context)
        path = walk(tree, truth.tolist())
        n = 0
        while n < min(len(path), len(truth)) and path[n] == truth[n]:
            n += 1
        return n, Proposal(np.asarray(path[: self.width], dtype=np.int64), -1, w, "n-gram cache")

    def advance(self, context: np.ndarray, committed: np.ndarray) -> None:
        self.insert(context[-self.settings.branch_length :])  # _update_ngram_cache after each verify


def walk(tree: list[dict[int, int]], truth: list[int]) -> list[int]:
    """The tokens along the tree from the root: following `truth` while a child holds its token, then the first
    child (the first made) to a leaf."""
    out, node, follow = [], 0, True
    while tree[node]:
        i = len(out)
        follow = follow and i < len(truth) and truth[i] in tree[node]
        token = truth[i] if follow else next(iter(tree[node]))
        out.append(token)
        node = tree[node][token]
    return out
