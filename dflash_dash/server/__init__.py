"""The local stand-in for an SGLang server (tests, demo, offline use): one transformers causal LM, greedy or DFlash
speculative decoding, stdlib HTTP.

Contract: `protocol` (the request and answer shapes of SGLang's HTTP protocol), `model` (the `Engine`: loading,
greedy decoding, memory release), `specdec` (greedy speculative decoding with a drafter, SGLang's counters),
`faults` (planted engine faults, a test aid), `protocols` (each engine's stand-in protocol, `<engine>_api`, by name),
`httpd` (routing, API keys, startup, `serve`), `options` (the command line, `python -m dflash_dash.server`).
Callers import what they use from here.
"""

from .httpd import serve
from .model import Engine, torch_kernels
from .options import main, speculative_args
from .protocol import BadRequest
from .sglang_api import speculative_info

__all__ = ["BadRequest", "Engine", "main", "serve", "speculative_args", "speculative_info", "torch_kernels"]
