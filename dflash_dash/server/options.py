"""The stand-in server's command line: `python -m dflash_dash.server --model DIR ...` (and the speculative options
that `python -m dflash_dash serve` shares).
"""

from __future__ import annotations

import argparse

from . import faults, protocols
from .httpd import serve


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m dflash_dash.server",
        description="Local stand-in for an SGLang, vLLM or llama.cpp server (tests, demo, offline): one "
        "transformers model, greedy decoding.",
    )
    serve_args(p)
    speculative_args(p)
    run(p.parse_args(argv))


def run(a: argparse.Namespace) -> None:
    """Serve with the options of `serve_args` and `speculative_args` (blocking)."""
    serve(
        a.model,
        a.host,
        a.port,
        a.startup_delay,
        a.device,
        a.health_delay,
        a.api_key,
        a.speculative_draft,
        a.speculative_bug,
        a.token_delay,
        a.protocol,
        a.speculative_stats,
        a.metrics,
    )


def serve_args(p: argparse.ArgumentParser) -> None:
    """The stand-in's own options (shared with `python -m dflash_dash serve`)."""
    p.add_argument("--model", required=True, help="Hugging Face model folder (config.json + safetensors)")
    p.add_argument(
        "--protocol",
        default="sglang",
        choices=list(protocols.PROTOCOLS),
        help="the engine whose HTTP protocol, startup, errors and speculative statistics to speak: "
        + ", ".join(f"{n} ({p.GENERATE})" for n, p in protocols.PROTOCOLS.items())
        + " (default sglang)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port to bind (default 30000)")
    p.add_argument(
        "--startup-delay",
        type=float,
        default=0.0,
        help="extra startup seconds: first half with the port unbound, second half /health 503",
    )
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument(
        "--health-delay",
        type=float,
        default=0.0,
        help="seconds GET /health takes once ready (a real one generates a token; default 0)",
    )
    p.add_argument(
        "--token-delay",
        type=float,
        default=0.0,
        help="extra seconds per greedily decoded token (per verify step when decoding speculatively), to model a "
        "slower model (default 0)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require `Authorization: Bearer KEY` on every route except /health (as SGLang's --api-key)",
    )
    p.add_argument(
        "--metrics",
        action="store_true",
        help="llama.cpp protocol: serve GET /metrics (llama-server's Prometheus counters, verify steps among them), "
        "as llama-server's --metrics; without it /metrics answers 501",
    )


def speculative_args(p: argparse.ArgumentParser) -> None:
    """--speculative-draft / --speculative-bug (shared with `python -m dflash_dash serve`)."""
    p.add_argument(
        "--speculative-draft",
        default=None,
        metavar="CKPT",
        help="decode speculatively with this drafter of any family (SGLang's --speculative-algorithm DFLASH "
        "--speculative-draft-model-path); meta_info then reports SGLang's spec_* counters",
    )
    p.add_argument(
        "--speculative-bug",
        default=None,
        choices=list(faults.BUGS),
        help="TEST AID: serve a deliberately broken speculative decoder, for conformance tests "
        f"(truncate-context: the drafter sees only the last {faults.TRUNCATE} context positions; "
        "layer-off-by-one: it gets decoder layer l-1's output for target layer id l; layer-shift: layer l+1's; "
        f"context-window: as truncate-context; draft-tokens: each step verifies {faults.VERIFIED} draft(s) only; "
        "prefill-count: the prefill counted as a verify step; numerics: the drafter in bf16; sliding-ignored: the "
        "drafter's sliding-window layers see the whole context; sliding-bidirectional: they are bidirectional "
        "inside the block)",
    )
    p.add_argument(
        "--speculative-stats",
        default="none",
        choices=["none", "summary", "detailed"],
        help="per-request speculative statistics in answers, as the engine's own switch gives them (SGLang "
        "--speculative-decoding-stats: speculative_decoding_stats; vLLM --per-request-spec-decode-metrics: "
        "metrics.speculative_decoding); detailed adds per-step arrays. SGLang's spec_* counters and llama.cpp's "
        "draft counts come regardless (default none)",
    )
