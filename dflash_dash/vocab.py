"""Token strings of a target: each token id as its tokenizer decodes it, for token views, tables and exports.

Contract: `Vocab.strings(ids)` returns one string per id, memoised per id; without a tokenizer (or for an id the
tokenizer refuses) the string is `⟨id⟩`, so a page or an export never fails on a missing or broken tokenizer.
`load_vocab` reads the target folder's tokenizer.json with `tokenizers` (Rust, no torch: the pages decode without
loading torch; the same decode a transformers fast tokenizer does); only a folder without tokenizer.json (a slow
tokenizer) goes through transformers, imported on first use.
The strings are raw model output: escape them before they go into HTML (`render.tokens.esc`).
"""

from __future__ import annotations

from pathlib import Path


class Vocab:
    """Token strings of one target: its tokenizer's decode of each id (memoised), else `⟨id⟩`."""

    def __init__(self, tokenizer=None):
        self.tok = tokenizer  # decode(ids, skip_special_tokens=, clean_up_tokenization_spaces=) -> str; or None
        self.memo: dict[int, str] = {}

    def strings(self, ids) -> list[str]:
        out, memo = [], self.memo
        for i in ids:
            i = int(i)
            s = memo.get(i)
            if s is None:
                s = memo[i] = self._one(i)
            out.append(s)
        return out

    def _one(self, i: int) -> str:
        if self.tok is None:
            return f"⟨{i}⟩"
        try:
            return self.tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        except Exception:  # noqa: BLE001  (an id outside the tokenizer: show the id)
            return f"⟨{i}⟩"


def load_vocab(target_path: str | None) -> Vocab:
    """A Vocab from the target folder's tokenizer files; ids only when it has none or they do not load."""
    if not target_path or not any(
        (Path(target_path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    ):
        return Vocab()
    try:
        return Vocab(_tokenizer(Path(target_path)))
    except Exception:  # noqa: BLE001  (a broken tokenizer must not break the page: show ids)
        return Vocab()


class FastTokenizer:
    """tokenizer.json read by `tokenizers`, decoding as a transformers fast tokenizer does (its decode is this
    one's, followed by an optional clean-up that token strings never ask for)."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(path))

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        if clean_up_tokenization_spaces:
            raise ValueError("token strings are decoded raw: no clean-up")
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _tokenizer(path: Path):
    if (path / "tokenizer.json").is_file():
        return FastTokenizer(path / "tokenizer.json")
    from transformers import AutoTokenizer  # a slow tokenizer only: transformers imports torch

    return AutoTokenizer.from_pretrained(path)
