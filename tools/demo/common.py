"""What every step of the demo asset build shares: the tokenizer's size and pre-tokenizer, the seed, the target's
end-of-sequence ids, and the progress log.

Contract: constants only (and `log`, a timestamped flushed print); no imports of torch or transformers, so every
step module can import it cheaply. Changing a constant changes every asset the build makes.
"""

from __future__ import annotations

import time

VOCAB = 2048
SEED = 0
SPLIT = "qwen"  # the tokenizer's pre-tokenizer (tools/tiny.write_tokenizer): newlines split from indentation
EOS = {2, 0}  # <|im_end|>, <|endoftext|>: the target's eos ids (its config), as Qwen's generation config


def log(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)
