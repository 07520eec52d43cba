"""The pipeline's operations: fetch, extract, replay and sweep, and the checks run on a run (sliding-window
semantics, target-layer attribution, engine-fault diagnosis); the demo build."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import (
    DTYPES,
    ORCHESTRATE,
    TARGET_TOPK,
    InputError,
    Op,
    Placement,
    ReplaySettings,
    check_dtype,
    check_url,
    embeds,
    parse_layers,
    parse_paths,
    setting,
)


@dataclass
class Fetch(Op):
    kind: ClassVar[str] = "fetch"
    prompt_set: str = setting(help="built-in set name (coding-10) or a JSONL file of {id, prompt}")
    name: str = setting(help="completion set to fill; a rerun with it continues")
    server: str | None = setting(None, "server URL; None: [server] url of the workspace's config.toml")
    max_new_tokens: int = setting(256, "tokens per completion")
    temperature: float = setting(0.0, "sampling temperature; 0: greedy (the default)")
    top_p: float = setting(1.0, "with temperature > 0: the nucleus mass kept, in (0, 1]; 1: the whole distribution")
    seed: int | None = setting(
        None,
        "with temperature > 0: the seed sent with every request (0..4294967295), recorded; unset: the "
        "engine's own randomness (not reproducible)",
    )
    chat: bool = setting(False, "wrap prompts in the target's chat template (applied locally)")
    tokenizer: str | None = setting(
        None,
        "tokenizer folder or hub id; None: the server's (llama.cpp serves a GGUF: give it)",
    )
    enable_thinking: bool = setting(False, "leave Qwen3 thinking on (off by default: it lowers acceptance)")
    readiness_timeout: float | None = setting(None, "seconds to wait for /health 200; None: the config's (600)")
    request_timeout: float = setting(600.0, "seconds one generate request may take before it fails")

    def __post_init__(self) -> None:
        self._need("prompt_set", "a built-in prompt set (coding-10) or a JSONL file of {id, prompt}")
        self._name("name", "a completion set name")
        self._int("max_new_tokens", 1, "must be at least 1")
        self._sampling()
        if self.readiness_timeout is not None and not (
            isinstance(self.readiness_timeout, (int, float)) and self.readiness_timeout > 0
        ):
            raise InputError(f"readiness_timeout {self.readiness_timeout!r}: give seconds > 0 (or leave it unset: 600)")
        if not (isinstance(self.request_timeout, (int, float)) and self.request_timeout > 0):
            raise InputError(f"request_timeout {self.request_timeout!r}: give seconds > 0, like 600")
        self.chat, self.enable_thinking = bool(self.chat), bool(self.enable_thinking)
        self.server = check_url(self.server) if self.server else None

    def _sampling(self) -> None:
        """temperature >= 0 (0 greedy); top_p in (0, 1] and seed 0..2^32-1 (llama.cpp's uint32), only when sampling."""
        t, p = self.temperature, self.top_p
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 100:
            raise InputError(f"temperature {t!r}: give 0 (greedy) or a sampling temperature like 0.7", "temperature")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise InputError(f"top_p {p!r}: give a nucleus mass in (0, 1], like 0.95 (1: no cut)", "top_p")
        s = self.seed
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**32):
            raise InputError(f"seed {s!r}: give an integer 0..4294967295 (llama.cpp's are 32-bit), or none", "seed")
        if t == 0 and p != 1:
            raise InputError(f"top_p {p:g}: it cuts a sampled distribution; give a temperature > 0, or 1", "top_p")
        if t == 0 and s is not None:
            raise InputError(f"seed {s}: it seeds sampling; give a temperature > 0, or no seed (greedy)", "seed")
        self.temperature, self.top_p = float(t), float(p)


@dataclass
@embeds(Placement, "placement")
class Extract(Op):
    kind: ClassVar[str] = "extract"
    target: str = setting(help="Hugging Face causal LM folder")
    completions: str = setting(help="completion set name")
    drafter: list[str] = setting(
        [],
        "checkpoint whose target_layer_ids are extracted; repeat it for several drafters (families tap "
        "different layers): the union of their layers, sorted, serves each of them (or give layers)",
        repeat=True,
    )
    layers: list[int] | None = setting(None, "explicit target layer ids (\"1,16,31\" is accepted), instead of drafter")
    dtype: str = setting("float32", "compute dtype of the target's forward", choices=DTYPES)
    orchestrate: str = setting(
        "none", "free the server's GPU around the extraction: none | release | command", choices=ORCHESTRATE
    )
    extraction_id: str | None = setting(None, "resume this extraction (a rerun sets it) instead of starting one")
    server: str | None = setting(None, "server to free; None: the workspace's config.toml")
    target_topk: int = setting(
        TARGET_TOPK,
        "the target's top-K log-probabilities kept per completion position (and the mass outside them), "
        "for the expected acceptance at a temperature (replay --temperature); 0: none kept",
    )
    # + every field of Placement (device, gpus, ray, ray_gpus, ray_cpus), declared there once

    def __post_init__(self) -> None:
        self._need("target", "the target model folder (a Hugging Face causal LM)")
        self._int(
            "target_topk", 0, "expected 0 (keep none) or the number of the target's top log-probabilities, like 64"
        )
        self._name("completions", "the completion set name")
        self._name("extraction_id", "the extraction id to resume", optional=True)
        self.layers = parse_layers(self.layers)
        self.drafter = parse_paths(self.drafter)
        if not self.layers and not self.drafter:
            raise InputError(
                "layers: give a drafter checkpoint (its target_layer_ids are used) or layer ids like 1,16,31"
            )
        check_dtype(self.dtype)
        self._choice("orchestrate", ORCHESTRATE)
        self._settle()  # the placement: device, gpus, ray


@dataclass
@embeds(Placement, "placement")
@embeds(ReplaySettings)
class Replay(Op):
    kind: ClassVar[str] = "replay"
    drafter: str = setting(help="checkpoint: HF folder or SpecForge runtime {run_id}-step{N}/ folder")
    extraction: str = setting("latest", "extraction id, or latest")
    name: str | None = setting(None, "display name; None: the checkpoint folder's name")
    force: bool = setting(
        False,
        "replay even when a run of this checkpoint on this extraction with the same settings exists "
        "(without it that run is reused and named)",
    )
    stream: bool = setting(
        False,
        "compute the features with the target (target, completions) instead of reading an extraction's "
        "files: the target runs over each pass of sequences (in dtype, as the drafters), no feature file "
        "is written",
    )
    target: str | None = setting(
        None,
        "with stream: the target model folder (a Hugging Face causal LM); with features: the target the "
        "cache was captured from (its embedding and LM head serve the drafter)",
    )
    completions: str | None = setting(None, "with stream: the completion set to evaluate")
    features: str | None = setting(
        None,
        "a trainer's feature cache (SpecForge prepare_hidden_states.py output or a DeepSpec target cache)"
        " replayed teacher-forced instead of an extraction: its samples become a completion set (the "
        "loss-masked tokens are the completion) and an extraction whose features are the cache's; needs "
        "target",
    )
    features_layers: list[int] | None = setting(
        None,
        "with features: the target layer ids the cache holds, in its order (\"1,16,31\"; SpecForge captures"
        " do not record them); None: the DeepSpec manifest's",
    )
    # + every field of ReplaySettings (tree_budget, anchors, dtype, chunk, ...) and of Placement (device, gpus, ray,
    # ray_gpus, ray_cpus), each declared there once

    def __post_init__(self) -> None:
        self._need("drafter", "the checkpoint folder to replay")
        self._name("name", "a display name for the run", optional=True)
        self.features_layers = parse_layers(self.features_layers)
        if self.features is not None:
            self._need("features", "the trainer's feature cache folder")
            if self.stream:
                raise InputError("features: the cache holds the features; drop --stream (or drop --features)")
            self._need("target", "with --features, the target model folder the cache was captured from")
        elif self.features_layers:
            raise InputError("features_layers: it names the layers of a trainer's cache; add --features DIR")
        _replay_fields(self)

    @property
    def settings(self) -> ReplaySettings:
        """How the replay runs: the embedded `ReplaySettings` (or the subclass a subclass embeds)."""
        return _replay_settings(self)


@dataclass
@embeds(Placement, "placement")
@embeds(ReplaySettings, anchors="chain")  # a sweep walks the chain only by default: every anchor is a replay's
class Sweep(Op):
    kind: ClassVar[str] = "sweep"
    checkpoints: str = setting(help="training output folder (epoch_E_step_S/, {run_id}-step{N}/, ...)")
    extraction: str = setting("latest", "extraction id, or latest")
    stream: bool = setting(
        False,
        "compute the features with the target (target, completions) instead of reading an extraction's "
        "files: the target runs over each pass of sequences (in dtype, as the drafters), no feature file "
        "is written",
    )
    target: str | None = setting(None, "with stream: the target model folder (a Hugging Face causal LM)")
    completions: str | None = setting(None, "with stream: the completion set to evaluate")
    # + every field of ReplaySettings and of Placement, declared there once

    def __post_init__(self) -> None:
        self._need("checkpoints", "the training output folder")
        _replay_fields(self)

    @property
    def settings(self) -> ReplaySettings:
        """How each checkpoint is replayed: the embedded `ReplaySettings`."""
        return _replay_settings(self)


def _replay_settings(op: Op) -> ReplaySettings:
    s = op.embedded("settings")
    assert isinstance(s, ReplaySettings)
    return s


def _replay_fields(op: Replay | Sweep) -> None:
    """The checks Replay and Sweep share beside their records': extraction, the stream."""
    op._settle()
    op._name("extraction", "an extraction id, or latest")
    _stream(op)


def _stream(op: Replay | Sweep) -> None:
    """stream needs target and completions (here, on the gpus pool or with ray); target and completions need it."""
    if not isinstance(op.stream, bool):
        raise InputError(f"stream: expected true or false, got {op.stream!r}")
    if op.stream:
        op._need("target", "with --stream, the target model folder the features are computed with")
        op._name("completions", "with --stream, the completion set to evaluate")
    elif isinstance(op, Replay) and op.features and not op.completions:
        return  # replay --features: target names the cache's target
    elif op.target or op.completions:
        raise InputError(
            "target/completions: they name what --stream computes; add --stream, or drop them to replay an "
            "extraction (--extraction ID)"
        )


@dataclass
class SlidingCheck(Op):
    kind: ClassVar[str] = "sliding-check"
    drafter: str = setting(help="checkpoint with sliding_attention layers")
    extraction: str = setting("latest", "extraction id, or latest")
    draft_config: str | None = setting(
        None,
        "the training's draft config JSON (runtime checkpoints without config.json)",
    )
    device: str = setting("cpu", "cpu or cuda[:N]")
    dtype: str = setting("float32", "compute dtype of the drafter", choices=DTYPES)
    tree_budget: int = setting(8, "DDTree node budget of both replays (0: no tree)")

    def __post_init__(self) -> None:
        self._need("drafter", "the checkpoint folder to check")
        self._name("extraction", "an extraction id, or latest")
        self._int("tree_budget", 0, "expected 0 (no tree) or a positive DDTree node budget like 8")
        self._device()
        check_dtype(self.dtype)


@dataclass
class Attribute(Op):
    kind: ClassVar[str] = "attribute"
    run: str = setting("latest", "run id, or latest")
    device: str | None = setting(None, "None: the run's own device")
    dtype: str | None = setting(None, "None: the run's own dtype", choices=DTYPES)

    def __post_init__(self) -> None:
        self._name("run", "a run id, or latest")
        self._device(optional=True)
        check_dtype(self.dtype, optional=True)


@dataclass
class Diagnose(Op):
    kind: ClassVar[str] = "diagnose"
    run: str = setting("latest", "replay run of the drafter the engine served (run id, or latest)")
    engine: str | None = setting(None, "engine whose stats to explain (None: sglang, or the only one)")

    def __post_init__(self) -> None:
        self._name("run", "a run id, or latest")
        self._name("engine", "an engine name like sglang", optional=True)


@dataclass
class Demo(Op):
    kind: ClassVar[str] = "demo"  # builds the demo workspace from the committed assets (no arguments)
