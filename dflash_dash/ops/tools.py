"""The operations beside the main path: model-free baselines, the trainers' feature audit, the cost profile
the live speculative loop and the backend parity of two extractions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import (
    DTYPES,
    VERIFY,
    InputError,
    Op,
    check_dtype,
    parse_layers,
    setting,
)

METHODS = ("ngram", "sglang-ngram", "suffix")  # = baselines.METHODS (tests/test_baselines.py checks), numpy-free here


@dataclass
class Baseline(Op):
    kind: ClassVar[str] = "baseline"
    method: str = setting(
        "ngram",
        "ngram (vLLM's prompt lookup) | sglang-ngram (SGLang's NGRAM) | suffix (vLLM's suffix)",
        choices=METHODS,
    )
    completions: str | None = setting(None, "completion set to replay on (None: the extraction's set)")
    extraction: str | None = setting(
        None,
        "extraction whose prompts to replay and stand beside (or latest; None: the set's newest finished "
        "extraction when it has one, else no extraction and every prompt of the set)",
    )
    settings: str | None = setting(
        None,
        "the engine's settings, key=value,key=value (prompt_lookup_min=2); none: its defaults",
    )
    name: str | None = setting(None, "display name (default: the method and its settings)")

    def __post_init__(self) -> None:
        from .. import baselines

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
class Audit(Op):
    kind: ClassVar[str] = "audit"
    features: str = setting(
        help="a trainer's feature cache: SpecForge prepare_hidden_states.py output or a DeepSpec target cache",
    )
    target: str = setting(help="the target model folder the features were captured from (a Hugging Face causal LM)")
    layers: list[int] | None = setting(
        None,
        "target layer ids the cache holds, in order (\"1,16,31\"); None: the DeepSpec manifest's, or the drafter's",
    )
    drafter: str | None = setting(
        None,
        "draft config JSON or checkpoint whose dflash_config.target_layer_ids were captured",
    )
    samples: int = setting(8, "samples audited: the first N in the trainer's own order")
    device: str = setting(
        "cpu",
        "cpu (the torch path, forced and recorded) or cuda[:N] (fla kernels where they import)",
    )
    dtype: str = setting("float32", "compute dtype of the recomputation", choices=DTYPES)

    def __post_init__(self) -> None:
        self._need("features", "the feature cache folder (SpecForge's --output-path or a DeepSpec target cache)")
        self._need("target", "the target model folder the features were captured from")
        self.layers = parse_layers(self.layers)
        self._int("samples", 1, "expected a positive number of samples, like 8")
        self._device()
        check_dtype(self.dtype)


@dataclass
class Profile(Op):
    kind: ClassVar[str] = "profile"
    target: str = setting(help="the target model folder (a Hugging Face causal LM) whose verify forward is timed")
    drafter: str | None = setting(
        None,
        "checkpoint whose block is timed (needed for a speedup; None: the target alone)",
    )
    device: str = setting("cpu", "cpu or cuda[:N] (CPU costs are labelled as CPU costs wherever they are shown)")
    dtype: str = setting("float32", "compute dtype of both (bfloat16 on a GPU, as engines serve)", choices=DTYPES)
    contexts: list[int] | None = setting(None, "context lengths c the forwards follow (\"512,2048,8192\", the default)")
    sizes: list[int] | None = setting(None, "new tokens q per timed target forward (\"1,2,4,...,64\", the default)")
    repeats: int = setting(5, "timed forwards per point (their median), after a warm-up")
    tree_budget: int = setting(0, "also time a DDTree of this node budget and its verify of b + 1 tokens (0: none)")
    draft_config: str | None = setting(
        None,
        "the training's draft config JSON (runtime checkpoints without config.json)",
    )

    def __post_init__(self) -> None:
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
    target: str = setting(help="the target model folder (a Hugging Face causal LM) decoded plainly and speculatively")
    drafter: str = setting(
        help="the checkpoint the speculative decoder drafts with (the one a replay of this set evaluates)",
    )
    completions: str = setting(
        help="the completion set whose prompts are decoded (each to its stored completion's length)",
    )
    temperature: float = setting(0.0, "sampling temperature of both decoders (0: greedy)")
    top_p: float = setting(1.0, "with temperature > 0: nucleus mass kept, in (0, 1]")
    seed: int = setting(0, "the first seed; seeds seed, seed+1, ... (each draw seeded by the seed and its position)")
    seeds: int = setting(5, "seeds per prompt (the live accept length's 95% interval is over them)")
    verify: str = setting(
        "target-sample",
        "target-sample (greedy drafts, accepted while the target's sample equals them: SGLang's DFlash) |"
        " rejection (drafts sampled from the drafter, min(1, p/q): Leviathan et al.)",
        choices=VERIFY,
    )
    device: str = setting("cpu", "cpu or cuda[:N]: where both models run (timings are this device's)")
    dtype: str = setting(
        "float32", "dtype of the target and the drafter (bfloat16 on a GPU, as engines serve)", choices=DTYPES
    )
    max_prompts: int | None = setting(None, "decode only the first N prompts of the set; None: all")
    max_new: int | None = setting(None, "new tokens per prompt; None: the stored completion's length")

    def __post_init__(self) -> None:
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


@dataclass
class Parity(Op):
    kind: ClassVar[str] = "parity"  # backend parity: two extractions of the same completions compared per layer
    a: str = setting(help="the extraction compared (normally the torch path's), by id")
    b: str = setting(help="the reference extraction (normally the fla kernels'), by id")
    max_prompts: int | None = setting(None, "compare only the first N prompts both hold; None: all")

    def __post_init__(self) -> None:
        self._name("a", "the id of the extraction compared")
        self._name("b", "the id of the reference extraction")
        if self.a == self.b:
            raise InputError(f"b {self.b!r}: the same extraction as a; choose two different extractions", "b")
        if self.max_prompts is not None:
            self._int("max_prompts", 1, "expected a positive number of prompts, or leave it unset")
