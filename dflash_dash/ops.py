"""The arguments of the operations users run, one typed dataclass per operation: the one place their defaults live.

Contract:
- One class per operation (`Fetch`, `Extract`, `Replay`, `Sweep`, `SlidingCheck`, `Attribute`, `Diagnose`, `Baseline`,
  `Demo`); `kind` is its job kind. Each field carries its default and a comment (the CLI's help text); `__post_init__`
  validates (and normalises: "1,16,31" layers, "0,1" GPUs) and raises `InputError`, the UserError of bad input
  naming the field and the fix, through the field checks of `fields` (re-exported here): names (`check_name`, the one
  name validator: no path parts), server URLs (`check_url`), dtype, device, layers, checkpoint lists and GPUs
  (`check_dtype`, `check_device`, `parse_layers`, `parse_paths`, `parse_gpus`). A drafter's layers meet an
  extraction's through `missing_layers` (what the drafter needs that the extraction lacks) and `layer_blocks` (where
  the drafter's layers sit in the extraction's features, None when they are its layers in its order).
- A field with metadata {"repeat": True} (Extract's `drafter`) is a list given once per value on the command
  line (--drafter A --drafter B); a single value is accepted for it too (records written before it was a list).
- `to_args()` is the plain-JSON dict a job records; `from_args(args)` rebuilds the operation from a record:
  a missing (or None) field takes its default, so job records written before a field existed stay readable;
  an unknown field is refused by name. `of(kind, args)` does it for any kind.
- The CLI generates its options from these fields (`options`: name, default, type, help from the field's
  comment), the pages build these classes for `jobs.start`, jobs records and rebuilds them, and every pipeline
  handler takes one (`pipeline.perform(store, op)`).
- Worker specs (`CheckpointSpec`, `ExtractWork`, `ReplayWork`, `StreamWork`, `work_of`) live in `work` and are
  re-exported here (callers name them ops.X).
Data only, torch-free (store-only commands stay light): nothing here loads a model or touches the store; it
sits under pipeline, which imports it.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import ClassVar

from .fields import (  # noqa: F401  (re-exported: callers name them ops.X)
    DTYPES,
    InputError,
    check_device,
    check_dtype,
    check_name,
    check_ray,
    check_url,
    layer_blocks,
    missing_layers,
    parse_gpus,
    parse_layers,
    parse_paths,
)
from .work import (  # noqa: F401  (re-exported: callers name them ops.X)
    ANCHORS,
    WORK,
    CheckpointSpec,
    ExtractWork,
    ReplayWork,
    StreamWork,
    Work,
    work_of,
)

ORCHESTRATE = ("none", "release", "command")  # how an extraction frees the server's GPU (jobs.free_gpu)
VERIFY = ("target-sample", "rejection")  # = sampling.RULES (tests/test_expected_pipeline.py checks), torch-free here
TARGET_TOPK = 64  # the target's top-K an extraction keeps by default (--target-topk)
SLIDING_BLOCKS = ("causal", "bidirectional")  # = drafter.SLIDING_BLOCKS (tests/test_gpus.py checks), torch-free here


@dataclass
class Op:
    """Base of the operations: record round trip and the shared checks."""

    kind: ClassVar[str] = ""

    def to_args(self) -> dict:
        return asdict(self)

    @classmethod
    def from_args(cls, args: dict | None) -> Op:
        args = dict(args or {})
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(args) - set(names))
        if unknown:
            raise InputError(f"{cls.kind}: unknown argument {', '.join(unknown)}; expected some of {', '.join(names)}")
        for f in fields(cls):
            if f.default is MISSING and f.default_factory is MISSING and args.get(f.name) in (None, ""):
                raise InputError(
                    f"{cls.kind}: {f.name} is required; give it (--{f.name.replace('_', '-')} on the command line)"
                )
        return cls(**{k: v for k, v in args.items() if v is not None})

    # -- checks used by __post_init__
    def _need(self, name: str, what: str) -> None:
        v = getattr(self, name)
        if not isinstance(v, str) or not v.strip():
            raise InputError(f"{name} {v!r}: give {what}", name)

    def _name(self, name: str, what: str, optional: bool = False) -> None:
        setattr(self, name, check_name(getattr(self, name), name, what, optional))

    def _int(self, name: str, lo: int, fix: str) -> None:
        v = getattr(self, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise InputError(f"{name} {v!r}: {fix}")

    def _choice(self, name: str, choices: tuple, optional: bool = False) -> None:
        v = getattr(self, name)
        if not (optional and v is None) and v not in choices:
            raise InputError(f"{name} {v!r}: expected one of {', '.join(choices)}")

    def _device(self, name: str = "device", optional: bool = False) -> None:
        check_device(getattr(self, name), name, optional)

    def _gpus(self) -> None:
        """gpus: this host's devices; ray: auto or HOST:PORT, not with gpus; ray_gpus, ray_cpus (positive) need ray."""
        self.gpus = parse_gpus(self.gpus)
        for name in ("ray_gpus", "ray_cpus"):
            if getattr(self, name) is not None:
                if self.ray is None:
                    hint = "--ray auto (or --ray HOST:PORT; on the pages, the Ray cluster field)"
                    raise InputError(f"{name}: it sizes a Ray cluster's workers; add {hint}")
                self._int(name, 1, f"expected a positive number of workers, or leave {name} unset")
        if self.ray is not None:
            self.ray = check_ray(self.ray)
            if self.gpus:
                raise InputError("gpus: it names this host's devices; with --ray the cluster's GPUs are used (drop it)")

    def _replay_fields(self) -> None:
        """The fields Replay and Sweep share: extraction, tree budget, where and how the drafters run."""
        self._name("extraction", "an extraction id, or latest")
        self._int("tree_budget", 0, "expected 0 (no tree) or a positive DDTree node budget like 8")
        self._device()
        check_dtype(self.dtype)
        self._choice("anchors", ANCHORS)
        self._choice("sliding_block", SLIDING_BLOCKS, optional=True)
        if self.max_prompts is not None:
            self._int("max_prompts", 1, "expected a positive number of prompts, or leave it unset for all")
        self._gpus()
        self._stream()
        self._temperature()

    def _temperature(self) -> None:
        """temperature: None (no expected-acceptance pass) or >= 0 (0: the greedy limit); verify one of VERIFY."""
        t = self.temperature
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 100):
            raise InputError(f"temperature {t!r}: give a sampling temperature like 0.7 (0: greedy), or leave it unset")
        self.temperature = None if t is None else float(t)
        self._choice("verify", VERIFY)

    def _stream(self) -> None:
        """stream needs target and completions (here, on the gpus pool or with ray); target and completions need it."""
        if not isinstance(self.stream, bool):
            raise InputError(f"stream: expected true or false, got {self.stream!r}")
        if self.stream:
            self._need("target", "with --stream, the target model folder the features are computed with")
            self._name("completions", "with --stream, the completion set to evaluate")
        elif getattr(self, "features", None) and not self.completions:
            return  # replay --features: target names the cache's target
        elif self.target or self.completions:
            raise InputError(
                "target/completions: they name what --stream computes; add --stream, or drop them to replay an "
                "extraction (--extraction ID)"
            )

    def devices(self) -> list[str]:
        """Where the work runs: one worker per entry of `gpus`, else this process on `device` (ray: its workers')."""
        return list(getattr(self, "gpus", None) or [getattr(self, "device", None) or "cpu"])

    def local_devices(self) -> list[str]:
        """This host's devices the work uses, each once: none with `ray` (its workers' are its hosts')."""
        return [] if getattr(self, "ray", None) else list(dict.fromkeys(self.devices()))


def defaults(cls: type[Op]) -> dict:
    """{field: default} of an operation (for argparse)."""
    return {
        f.name: (f.default_factory() if f.default_factory is not MISSING else f.default)
        for f in fields(cls)
        if f.default is not MISSING or f.default_factory is not MISSING
    }


@dataclass
class Fetch(Op):
    kind: ClassVar[str] = "fetch"
    prompt_set: str  # built-in set name (coding-10) or a JSONL file of {id, prompt}
    name: str  # completion set to fill; a rerun with it continues
    server: str | None = None  # server URL; None: [server] url of the workspace's config.toml
    max_new_tokens: int = 256  # tokens per completion
    temperature: float = 0.0  # sampling temperature; 0: greedy (the default)
    top_p: float = 1.0  # with temperature > 0: the nucleus mass kept, in (0, 1]; 1: the whole distribution
    seed: int | None = None  # with temperature > 0: the seed sent with every request (0..4294967295), recorded; unset:
    # the engine's own randomness (not reproducible)
    chat: bool = False  # wrap prompts in the target's chat template (applied locally)
    tokenizer: str | None = None  # tokenizer folder or hub id; None: the server's (llama.cpp serves a GGUF: give it)
    enable_thinking: bool = False  # leave Qwen3 thinking on (off by default: it lowers acceptance)
    readiness_timeout: float | None = None  # seconds to wait for /health 200; None: the config's (600)
    request_timeout: float = 600.0  # seconds one generate request may take before it fails

    def __post_init__(self):
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
class Extract(Op):
    kind: ClassVar[str] = "extract"
    target: str  # Hugging Face causal LM folder
    completions: str  # completion set name
    drafter: list[str] = field(default_factory=list, metadata={"repeat": True})  # checkpoint whose target_layer_ids
    # are extracted; repeat it for several drafters (families tap different layers): the union of their layers,
    # sorted, serves each of them (or give layers)
    layers: list[int] | None = None  # explicit target layer ids ("1,16,31" is accepted), instead of drafter
    device: str = "cpu"  # cpu or cuda[:N] (one process; see gpus)
    dtype: str = "float32"  # compute dtype of the target's forward
    orchestrate: str = "none"  # free the server's GPU around the extraction: none | release | command
    extraction_id: str | None = None  # resume this extraction (a rerun sets it) instead of starting one
    server: str | None = None  # server to free; None: the workspace's config.toml
    gpus: list[str] = field(default_factory=list)  # one worker process per device, the prompts sharded over them:
    # GPU indices like 0,1 (or cuda:N,...; cpu,cpu for CPU workers); none: one process on device
    ray: str | None = None  # run on a Ray cluster (auto: this host's or RAY_ADDRESS; or HOST:PORT), a worker per GPU
    ray_gpus: int | None = None  # with ray: the GPUs the cluster must have (checked before any work); None: all it has
    ray_cpus: int | None = None  # with ray on a cluster without GPUs: the CPU workers to run (one CPU slot each)
    target_topk: int = TARGET_TOPK  # the target's top-K log-probabilities kept per completion position (and the
    # mass outside them), for the expected acceptance at a temperature (replay --temperature); 0: none kept

    def __post_init__(self):
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
        self._device()
        check_dtype(self.dtype)
        self._choice("orchestrate", ORCHESTRATE)
        self._gpus()


@dataclass
class Replay(Op):
    kind: ClassVar[str] = "replay"
    drafter: str  # checkpoint: HF folder or SpecForge runtime {run_id}-step{N}/ folder
    extraction: str = "latest"  # extraction id, or latest
    tree_budget: int = 8  # DDTree node budget (0: no tree)
    device: str = "cpu"  # cpu or cuda[:N] (one process; see gpus)
    dtype: str = "float32"  # compute dtype of the drafter
    chunk: int = 64  # blocks per batched forward (every-anchor mode)
    name: str | None = None  # display name; None: the checkpoint folder's name
    anchors: str = "every"  # every (accepted(p) curves, every-anchor tau) | chain (faster, same rounds)
    sliding_block: str | None = None  # sliding layers causal | bidirectional inside the block; None: config's
    draft_config: str | None = None  # the training's draft config JSON (runtime checkpoints without config.json)
    gpus: list[str] = field(default_factory=list)  # one worker process per device, the prompts sharded over them:
    # GPU indices like 0,1 (or cuda:N,...; cpu,cpu for CPU workers); none: one process on device
    ray: str | None = None  # run on a Ray cluster (auto: this host's or RAY_ADDRESS; or HOST:PORT), a worker per GPU
    ray_gpus: int | None = None  # with ray: the GPUs the cluster must have (checked before any work); None: all it has
    ray_cpus: int | None = None  # with ray on a cluster without GPUs: the CPU workers to run (one CPU slot each)
    max_prompts: int | None = None  # replay only the first N prompts of the extraction (set order); None: all
    force: bool = False  # replay even when a run of this checkpoint on this extraction with the same settings exists
    # (without it that run is reused and named)
    stream: bool = False  # compute the features with the target (target, completions) instead of reading an
    # extraction's files: the target runs over each pass of sequences (in dtype, as the drafters), no feature file
    # is written
    target: str | None = None  # with stream: the target model folder (a Hugging Face causal LM); with features: the
    # target the cache was captured from (its embedding and LM head serve the drafter)
    completions: str | None = None  # with stream: the completion set to evaluate
    temperature: float | None = None  # also the expected acceptance at this sampling temperature (teacher-forced;
    # needs an extraction with the target's top-K, or stream); None: none
    verify: str = "target-sample"  # with temperature: target-sample (greedy drafts, accepted while the target's
    # sample equals them: SGLang's DFlash) | rejection (sampled drafts, min(1, p/q): Leviathan et al.)
    features: str | None = None  # a trainer's feature cache (SpecForge prepare_hidden_states.py output or a DeepSpec
    # target cache) replayed teacher-forced instead of an extraction: its samples become a completion set (the
    # loss-masked tokens are the completion) and an extraction whose features are the cache's; needs target
    features_layers: list[int] | None = None  # with features: the target layer ids the cache holds, in its order
    # ("1,16,31"; SpecForge captures do not record them); None: the DeepSpec manifest's

    def __post_init__(self):
        self._need("drafter", "the checkpoint folder to replay")
        self._name("name", "a display name for the run", optional=True)
        self._int("chunk", 1, "expected a positive number of blocks per forward, like 64")
        self.features_layers = parse_layers(self.features_layers)
        if self.features is not None:
            self._need("features", "the trainer's feature cache folder")
            if self.stream:
                raise InputError("features: the cache holds the features; drop --stream (or drop --features)")
            self._need("target", "with --features, the target model folder the cache was captured from")
        elif self.features_layers:
            raise InputError("features_layers: it names the layers of a trainer's cache; add --features DIR")
        self._replay_fields()


@dataclass
class Sweep(Op):
    kind: ClassVar[str] = "sweep"
    checkpoints: str  # training output folder (epoch_E_step_S/, {run_id}-step{N}/, ...)
    extraction: str = "latest"  # extraction id, or latest
    anchors: str = "chain"  # chain (only the anchors the walks visit) | every
    tree_budget: int = 8  # DDTree node budget (0: no tree)
    device: str = "cpu"  # cpu or cuda[:N] (one process; see gpus)
    dtype: str = "float32"  # compute dtype of the drafters
    sliding_block: str | None = None  # sliding layers causal | bidirectional inside the block; None: config's
    draft_config: str | None = None  # the training's draft config JSON (runtime checkpoints without config.json)
    gpus: list[str] = field(default_factory=list)  # one worker process per device, the prompts sharded over them:
    # GPU indices like 0,1 (or cuda:N,...; cpu,cpu for CPU workers); none: one process on device
    ray: str | None = None  # run on a Ray cluster (auto: this host's or RAY_ADDRESS; or HOST:PORT), a worker per GPU
    ray_gpus: int | None = None  # with ray: the GPUs the cluster must have (checked before any work); None: all it has
    ray_cpus: int | None = None  # with ray on a cluster without GPUs: the CPU workers to run (one CPU slot each)
    max_prompts: int | None = None  # replay only the first N prompts of the extraction (set order); None: all
    stream: bool = False  # compute the features with the target (target, completions) instead of reading an
    # extraction's files: the target runs over each pass of sequences (in dtype, as the drafters), no feature file
    # is written
    target: str | None = None  # with stream: the target model folder (a Hugging Face causal LM)
    completions: str | None = None  # with stream: the completion set to evaluate
    temperature: float | None = None  # also the expected acceptance at this sampling temperature (teacher-forced;
    # needs an extraction with the target's top-K, or stream); None: none
    verify: str = "target-sample"  # with temperature: target-sample (greedy drafts, accepted while the target's
    # sample equals them: SGLang's DFlash) | rejection (sampled drafts, min(1, p/q): Leviathan et al.)

    def __post_init__(self):
        self._need("checkpoints", "the training output folder")
        self._replay_fields()


@dataclass
class SlidingCheck(Op):
    kind: ClassVar[str] = "sliding-check"
    drafter: str  # checkpoint with sliding_attention layers
    extraction: str = "latest"  # extraction id, or latest
    draft_config: str | None = None  # the training's draft config JSON (runtime checkpoints without config.json)
    device: str = "cpu"  # cpu or cuda[:N]
    dtype: str = "float32"  # compute dtype of the drafter
    tree_budget: int = 8  # DDTree node budget of both replays (0: no tree)

    def __post_init__(self):
        self._need("drafter", "the checkpoint folder to check")
        self._name("extraction", "an extraction id, or latest")
        self._int("tree_budget", 0, "expected 0 (no tree) or a positive DDTree node budget like 8")
        self._device()
        check_dtype(self.dtype)


@dataclass
class Attribute(Op):
    kind: ClassVar[str] = "attribute"
    run: str = "latest"  # run id, or latest
    device: str | None = None  # None: the run's own device
    dtype: str | None = None  # None: the run's own dtype

    def __post_init__(self):
        self._name("run", "a run id, or latest")
        self._device(optional=True)
        check_dtype(self.dtype, optional=True)


@dataclass
class Diagnose(Op):
    kind: ClassVar[str] = "diagnose"
    run: str = "latest"  # replay run of the drafter the engine served (run id, or latest)
    engine: str | None = None  # engine whose stats to explain (None: sglang, or the only one)

    def __post_init__(self):
        self._name("run", "a run id, or latest")
        self._name("engine", "an engine name like sglang", optional=True)


@dataclass
class Baseline(Op):
    kind: ClassVar[str] = "baseline"
    method: str = "ngram"  # ngram (vLLM's prompt lookup) | sglang-ngram (SGLang's NGRAM) | suffix (vLLM's suffix)
    completions: str | None = None  # completion set to replay on (None: the extraction's set)
    extraction: str | None = None  # extraction whose prompts to replay and stand beside (or latest; None: the set's
    # newest finished extraction when it has one, else no extraction and every prompt of the set)
    settings: str | None = None  # the engine's settings, key=value,key=value (prompt_lookup_min=2); none: its defaults
    name: str | None = None  # display name (default: the method and its settings)

    def __post_init__(self):
        from . import baselines

        self._choice("method", tuple(baselines.METHODS))
        self._name("completions", "the completion set", optional=True)
        self._name("extraction", "an extraction id, or latest", optional=True)
        self._name("name", "a display name for the run", optional=True)
        if not (self.completions or self.extraction):
            raise InputError("completions: give the completion set to replay on (or an extraction of it)")
        try:
            baselines.make(self.method, self.settings)
        except baselines.SettingsError as e:
            raise InputError(str(e)) from None


@dataclass
class Demo(Op):
    kind: ClassVar[str] = "demo"  # builds the demo workspace from the committed assets (no arguments)


@dataclass
class Audit(Op):
    kind: ClassVar[str] = "audit"
    features: str  # a trainer's feature cache: SpecForge prepare_hidden_states.py output or a DeepSpec target cache
    target: str  # the target model folder the features were captured from (a Hugging Face causal LM)
    layers: list[int] | None = None  # target layer ids the cache holds, in order ("1,16,31"); None: the DeepSpec
    # manifest's, or the drafter's
    drafter: str | None = None  # draft config JSON or checkpoint whose dflash_config.target_layer_ids were captured
    samples: int = 8  # samples audited: the first N in the trainer's own order
    device: str = "cpu"  # cpu (the torch path, forced and recorded) or cuda[:N] (fla kernels where they import)
    dtype: str = "float32"  # compute dtype of the recomputation

    def __post_init__(self):
        self._need("features", "the feature cache folder (SpecForge's --output-path or a DeepSpec target cache)")
        self._need("target", "the target model folder the features were captured from")
        self.layers = parse_layers(self.layers)
        self._int("samples", 1, "expected a positive number of samples, like 8")
        self._device()
        check_dtype(self.dtype)


@dataclass
class Profile(Op):
    kind: ClassVar[str] = "profile"
    target: str  # the target model folder (a Hugging Face causal LM) whose verify forward is timed
    drafter: str | None = None  # checkpoint whose block is timed (needed for a speedup; None: the target alone)
    device: str = "cpu"  # cpu or cuda[:N] (CPU costs are labelled as CPU costs wherever they are shown)
    dtype: str = "float32"  # compute dtype of both (bfloat16 on a GPU, as engines serve)
    contexts: list[int] | None = None  # context lengths c the forwards follow ("512,2048,8192", the default)
    sizes: list[int] | None = None  # new tokens q per timed target forward ("1,2,4,...,64", the default)
    repeats: int = 5  # timed forwards per point (their median), after a warm-up
    tree_budget: int = 0  # also time a DDTree of this node budget and its verify of b + 1 tokens (0: none)
    draft_config: str | None = None  # the training's draft config JSON (runtime checkpoints without config.json)

    def __post_init__(self):
        self._need("target", "the target model folder to time")
        for name, default in (("contexts", [512, 2048, 8192]), ("sizes", [1, 2, 4, 8, 16, 32, 64])):
            try:
                v = parse_layers(getattr(self, name)) if getattr(self, name) is not None else default
            except InputError:
                v = None
            if not v or any(x < 1 for x in v):
                raise InputError(f"{name} {getattr(self, name)!r}: give positive token counts like {default}", name)
            setattr(self, name, sorted(set(v)))
        self._int("repeats", 1, "expected a positive number of timed forwards, like 5")
        self._int("tree_budget", 0, "expected 0 (no tree) or a positive DDTree node budget like 8")
        self._device()
        check_dtype(self.dtype)


@dataclass
class Live(Op):
    kind: ClassVar[str] = "live"
    target: str  # the target model folder (a Hugging Face causal LM) decoded plainly and speculatively
    drafter: str  # the checkpoint the speculative decoder drafts with (the one a replay of this set evaluates)
    completions: str  # the completion set whose prompts are decoded (each to its stored completion's length)
    temperature: float = 0.0  # sampling temperature of both decoders (0: greedy)
    top_p: float = 1.0  # with temperature > 0: nucleus mass kept, in (0, 1]
    seed: int = 0  # the first seed; seeds seed, seed+1, ... (each draw seeded by the seed and its position)
    seeds: int = 5  # seeds per prompt (the live accept length's 95% interval is over them)
    verify: str = "target-sample"  # target-sample (greedy drafts, accepted while the target's sample equals them:
    # SGLang's DFlash) | rejection (drafts sampled from the drafter, min(1, p/q): Leviathan et al.)
    device: str = "cpu"  # cpu or cuda[:N]: where both models run (timings are this device's)
    dtype: str = "float32"  # dtype of the target and the drafter (bfloat16 on a GPU, as engines serve)
    max_prompts: int | None = None  # decode only the first N prompts of the set; None: all
    max_new: int | None = None  # new tokens per prompt; None: the stored completion's length

    def __post_init__(self):
        self._need("target", "the target model folder to decode with")
        self._need("drafter", "the checkpoint folder to draft with")
        self._name("completions", "the completion set whose prompts are decoded")
        t, p = self.temperature, self.top_p
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 100:
            raise InputError(f"temperature {t!r}: give 0 (greedy) or a sampling temperature like 0.7", "temperature")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise InputError(f"top_p {p!r}: give a nucleus mass in (0, 1], like 0.95 (1: no cut)", "top_p")
        self.temperature, self.top_p = float(t), float(p)
        self._int("seed", 0, "expected a seed >= 0, like 0")
        self._int("seeds", 1, "expected a positive number of seeds per prompt, like 5")
        self._choice("verify", VERIFY)
        self._device()
        check_dtype(self.dtype)
        for name in ("max_prompts", "max_new"):
            if getattr(self, name) is not None:
                self._int(name, 1, f"expected a positive number, or leave {name} unset")


KINDS: dict[str, type[Op]] = {
    c.kind: c
    for c in (Fetch, Extract, Replay, Sweep, SlidingCheck, Attribute, Diagnose, Baseline, Demo, Audit, Profile, Live)
}


def of(kind: str, args: dict | None) -> Op:
    """The operation of a job record (kind + args)."""
    cls = KINDS.get(kind)
    if cls is None:
        raise InputError(f"unknown job kind {kind!r}; expected one of {', '.join(KINDS)}")
    return cls.from_args(args)
