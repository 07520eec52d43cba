"""The operations of the CLI's other commands: completions and prompts in and out, the reports on stored runs
(compare, conformance, signatures, advise, the exports), the listings, the job list and the stand-in server. Each
runs through `pipeline.perform` as every operation does (its handler in pipeline.commands or jobs.commands, its
printer in the CLI); none is a job kind. Field metadata {"positional": True} makes a field the command's positional
argument (a file), {"nargs": "+"} a list given as one option followed by its values (compare --runs A B).
Data only, torch-free: the stand-in's protocols and faults are named here as text (tests/test_cli_ops.py checks
them against server.protocols.PROTOCOLS and server.faults.BUGS, whose modules import torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..prompts import FORMATS
from .base import InputError, Op, setting

PROTOCOLS = ("sglang", "vllm", "llamacpp")  # = server.protocols.PROTOCOLS
BUGS = (  # = server.faults.BUGS
    "truncate-context",
    "context-window",
    "layer-off-by-one",
    "layer-shift",
    "draft-tokens",
    "prefill-count",
    "numerics",
    "sliding-ignored",
    "sliding-bidirectional",
)
SPEC_STATS = ("none", "summary", "detailed")  # the stand-in's per-request speculative statistics
JOB_ACTIONS = ("list", "cancel", "logs", "rerun")  # what `jobs` does


@dataclass
class ImportCompletions(Op):
    kind: ClassVar[str] = "import-completions"
    file: str = setting(help="completions JSONL file ({id, prompt, completion} per line)", positional=True)
    name: str = setting(help="completion set name")

    def __post_init__(self) -> None:
        self._need("file", "the completions JSONL file")
        self._name("name", "a completion set name")


@dataclass
class ImportPrompts(Op):
    kind: ClassVar[str] = "import-prompts"
    file: str = setting(
        help="the prompt file (MT-Bench, SPEED-Bench, GSM8K, HumanEval, JSONL of prompts)", positional=True
    )
    name: str = setting(help="prompt set name (fetch --prompt-set NAME)")
    format: str = setting("auto", "the file's format (auto: its fields)", choices=FORMATS)

    def __post_init__(self) -> None:
        self._need("file", "the prompt file")
        self._name("name", "a prompt set name")
        self._choice("format", FORMATS)


@dataclass
class ExportCompletions(Op):
    kind: ClassVar[str] = "export-completions"
    name: str = setting(help="completion set name")

    def __post_init__(self) -> None:
        self._name("name", "a completion set name")


@dataclass
class ImportEngineStats(Op):
    kind: ClassVar[str] = "import-engine-stats"
    file: str = setting(
        help='JSONL: {"id", "verify_steps", "accepted_tokens"} or {"id", "accept_lengths": [...]}', positional=True
    )
    completions: str = setting(help="the completion set the engine generated (same prompt ids)")
    engine: str = setting(help="engine name, e.g. vllm (sglang: stats recorded at fetch)")

    def __post_init__(self) -> None:
        self._need("file", "the engine's statistics JSONL file")
        self._name("completions", "the completion set name")
        self._name("engine", "an engine name like vllm")


@dataclass
class Compare(Op):
    kind: ClassVar[str] = "compare"
    runs: list[str] = setting(help="run ids (see `runs`); each is judged against the first", nargs="+")

    def __post_init__(self) -> None:
        if isinstance(self.runs, str):
            self.runs = [self.runs]
        if not self.runs:
            raise InputError("runs: give the run ids to compare (see `runs`)", "runs")


@dataclass
class Conformance(Op):
    kind: ClassVar[str] = "conformance"
    run: str = setting("latest", "replay run of the drafter the engine served")
    engine: str | None = setting(None, "engine whose stats to compare (None: sglang, or the only one)")
    threshold: float | None = setting(None, "flag when replay tau - engine tau > THRESHOLD x replay tau (None: 0.05)")

    def __post_init__(self) -> None:
        self._name("run", "a run id, or latest")
        self._name("engine", "an engine name like sglang", optional=True)


@dataclass
class Signatures(Op):
    kind: ClassVar[str] = "signatures"
    run: str | None = setting(None, "run to diagnose (None: the least healthy run beside the reference)")
    reference: str | None = setting(None, "healthy reference run (None: the highest tau macro on the run's extraction)")


@dataclass
class Advise(Op):
    kind: ClassVar[str] = "advise"
    run: str = setting("latest", "run id (see `runs`); its checkpoint's other runs join in")
    costs: str | None = setting(None, "cost table id (see `profile`; None: the newest)")


@dataclass
class Export(Op):
    kind: ClassVar[str] = "export"
    run: str = setting("latest", "run id (see `runs`), or latest")


@dataclass
class ExportSpecforge(Op):
    kind: ClassVar[str] = "export-specforge"
    run: str = setting("latest", "run id (see `runs`), or latest")


@dataclass
class ExportAiperf(Op):
    kind: ClassVar[str] = "export-aiperf"
    run: str = setting("latest", "run id (see `runs`), or latest")


@dataclass
class ImportSpecforgeEval(Op):
    kind: ClassVar[str] = "import-specforge-eval"
    file: str = setting(help="SpecForge's evaluate-checkpoint JSON", positional=True)
    run: str = setting("latest", "run id of the same checkpoint (see `runs`)")

    def __post_init__(self) -> None:
        self._need("file", "SpecForge's evaluate-checkpoint JSON file")


@dataclass
class Runs(Op):
    kind: ClassVar[str] = "runs"  # the runs, as JSON (no arguments)


@dataclass
class Extractions(Op):
    kind: ClassVar[str] = "extractions"  # the extractions, as JSON (no arguments)


@dataclass
class Jobs(Op):
    kind: ClassVar[str] = "jobs"
    action: str = setting("list", "list | cancel ID | logs ID | rerun ID", choices=JOB_ACTIONS, positional=True)
    id: str | None = setting(None, "the job (see `jobs list`); cancel, logs and rerun need it", positional=True)
    limit: int = setting(50, "list: how many recent jobs")
    lines: int = setting(200, "logs: how many last lines")

    def __post_init__(self) -> None:
        self._choice("action", JOB_ACTIONS)
        if self.action != "list" and not self.id:
            raise InputError(f"jobs {self.action} needs a job id (see `jobs list`)", "id")
        self._int("limit", 1, "expected a positive number of jobs, like 50")
        self._int("lines", 1, "expected a positive number of lines, like 200")


@dataclass
class Serve(Op):
    """The stand-in server's options (as `python -m dflash_dash.server`'s, server.options; tests/test_cli_ops.py
    checks they are the same)."""

    kind: ClassVar[str] = "serve"
    model: str = setting(help="Hugging Face model folder (config.json + safetensors)")
    protocol: str = setting(
        "sglang",
        "the engine whose HTTP protocol, startup, errors and speculative statistics to speak",
        choices=PROTOCOLS,
    )
    host: str = setting("127.0.0.1", "address to bind")
    port: int = setting(30000, "port to bind")
    startup_delay: float = setting(
        0.0, "extra startup seconds: first half with the port unbound, second half /health 503"
    )
    device: str | None = setting(None, "cpu or cuda (None: cuda when available)")
    health_delay: float = setting(0.0, "seconds GET /health takes once ready (a real one generates a token)")
    token_delay: float = setting(
        0.0,
        "extra seconds per greedily decoded token (per verify step when decoding speculatively), to model a "
        "slower model",
    )
    api_key: str | None = setting(
        None, "require `Authorization: Bearer KEY` on every route except /health (as SGLang's --api-key)"
    )
    metrics: bool = setting(
        False,
        "llama.cpp protocol: serve GET /metrics (llama-server's Prometheus counters, verify steps among them), as "
        "llama-server's --metrics; without it /metrics answers 501",
    )
    speculative_draft: str | None = setting(
        None,
        "decode speculatively with this drafter of any family (SGLang's --speculative-algorithm DFLASH "
        "--speculative-draft-model-path); meta_info then reports SGLang's spec_* counters",
    )
    speculative_bug: str | None = setting(
        None,
        "TEST AID: serve a deliberately broken speculative decoder, for conformance tests (the faults: "
        "server/faults.py)",
        choices=BUGS,
    )
    speculative_stats: str = setting(
        "none",
        "per-request speculative statistics in answers, as the engine's own switch gives them (SGLang "
        "--speculative-decoding-stats, vLLM --per-request-spec-decode-metrics); detailed adds per-step arrays",
        choices=SPEC_STATS,
    )

    def __post_init__(self) -> None:
        self._need("model", "the model folder to serve")
        self._choice("protocol", PROTOCOLS)
        self._choice("speculative_bug", BUGS, optional=True)
        self._choice("speculative_stats", SPEC_STATS)
        self._int("port", 0, "expected a port number, like 30000")
        self._device(optional=True)
