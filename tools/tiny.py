"""Tiny seeded models for tests, benchmarks and the demo's asset tools: a target folder and a DFlash checkpoint
folder. Development tooling: the app and the CLI never import it (`from tools import tiny`, repository root on
sys.path).

Contract: every function writes a Hugging Face style folder and returns its path; the same seed gives the
same bytes. Nothing here is downloaded. Weights are random unless a caller trains them afterwards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from dflash_dash.drafters import parse_config, shapes

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


# ---------------------------------------------------------------------------
# tokenizer


QWEN2_SPLIT = (  # Qwen2/Qwen3's pre-tokenizer pattern: newlines are split from the indentation that follows
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def write_tokenizer(
    out: str | Path, vocab_size: int = 512, corpus: list[str] | None = None, split: str = "bytelevel"
) -> Path:
    """Train a byte-level BPE tokenizer on `corpus` (default: a few stdlib sources) and save it to `out`.

    `split`: "bytelevel" pre-tokenizes with the GPT-2 pattern (its `\\s+(?!\\S)` glues a newline to the
    indentation after it, so a text ending in ":\\n" ends on a lone newline token that the training text
    never has before an indented line); "qwen" pre-tokenizes as Qwen2/Qwen3 tokenizers do (QWEN2_SPLIT, then
    byte-level without a regex): "):\\n" is one pre-token and the indentation starts the next, so a
    prompt ending in a newline tokenises as the prefix of prompt + body (the demo target uses it)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if corpus is None:
        import inspect  # noqa: E401  (stdlib sources are the offline corpus)
        import json as _j
        import textwrap as _t

        corpus = [inspect.getsource(m) for m in (_j, _t)]
    tok = Tokenizer(models.BPE())
    if split == "qwen":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif split == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        raise ValueError(f"split must be 'bytelevel' or 'qwen', not {split!r}")
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", mask_token="<|mask|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return out


# ---------------------------------------------------------------------------
# target


@dataclass
class TinyTarget:
    model_type: str = "qwen3_5_text"  # qwen3_5_text (hybrid GDN + full attention), qwen3 or llama
    vocab_size: int = 512  # rows of the embedding and the LM head
    hidden_size: int = 64  # H
    intermediate_size: int = 128  # MLP width
    num_hidden_layers: int = 8  # N
    num_attention_heads: int = 4  # full-attention heads
    num_key_value_heads: int = 2  # full-attention KV heads
    head_dim: int = 16  # per-head width
    full_attention_interval: int = 4  # qwen3_5: every 4th layer is full attention, the rest Gated DeltaNet
    seed: int = 0  # weight seed
    dtype: str = "float32"  # saved dtype


def target_config(t: TinyTarget):
    """The transformers config object for `t`."""
    from transformers import AutoConfig

    common = dict(
        vocab_size=t.vocab_size,
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_hidden_layers=t.num_hidden_layers,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads,
        head_dim=t.head_dim,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        eos_token_id=2,
        pad_token_id=0,
        bos_token_id=None,
    )
    if t.model_type == "qwen3_5_text":
        types = [
            "full_attention" if (i + 1) % t.full_attention_interval == 0 else "linear_attention"
            for i in range(t.num_hidden_layers)
        ]
        return AutoConfig.for_model(
            "qwen3_5_text",
            layer_types=types,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            **common,
        )
    return AutoConfig.for_model(t.model_type, **common)


def write_target(out: str | Path, t: TinyTarget = TinyTarget()) -> Path:
    """Build a seeded random causal LM from `t` and save it (config + safetensors) to `out`."""
    from transformers import AutoModelForCausalLM

    out = Path(out)
    torch.manual_seed(t.seed)
    model = AutoModelForCausalLM.from_config(target_config(t))
    model.to(getattr(torch, t.dtype)).save_pretrained(out)
    return out


# ---------------------------------------------------------------------------
# drafter


@dataclass
class TinyDrafter:
    hidden_size: int = 64  # must equal the target's H
    intermediate_size: int = 128  # MLP width
    num_hidden_layers: int = 2  # draft layers
    num_attention_heads: int = 4  # query heads
    num_key_value_heads: int = 2  # KV heads
    head_dim: int = 16  # per-head width
    vocab_size: int = 512  # must equal the target's vocabulary
    block_size: int = 4  # B: anchor + B-1 drafted slots
    num_target_layers: int = 8  # N of the target
    target_layer_ids: list[int] = field(default_factory=lambda: [1, 4])  # which target layers feed fc
    mask_token_id: int = 3  # MASK id (in the target vocabulary)
    layer_types: list[str] | None = None  # default: all full_attention
    sliding_window: int | None = None  # window of sliding_attention layers
    rope_theta: float = 10000.0  # RoPE base
    seed: int = 0  # weight seed
    init_scale: float = 2.0  # weight std x sqrt(fan_in): large enough for varied drafts
    architecture: str = "DFlashDraftModel"  # the family's architecture (DSparkDraftModel, DominoDraftModel, ...)
    family_fields: dict = field(default_factory=dict)  # the family's own dflash_config fields (markov_rank, ...)


def drafter_config(d: TinyDrafter) -> dict:
    """The config.json dict of a drafter checkpoint (z-lab / SpecForge format; the family's fields in
    dflash_config)."""
    return {
        "architectures": [d.architecture],
        "model_type": "qwen3",
        "hidden_size": d.hidden_size,
        "intermediate_size": d.intermediate_size,
        "num_hidden_layers": d.num_hidden_layers,
        "num_attention_heads": d.num_attention_heads,
        "num_key_value_heads": d.num_key_value_heads,
        "head_dim": d.head_dim,
        "rms_norm_eps": 1e-6,
        "rope_theta": d.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": 8192,
        "attention_bias": False,
        "hidden_act": "silu",
        "vocab_size": d.vocab_size,
        "layer_types": d.layer_types or ["full_attention"] * d.num_hidden_layers,
        "sliding_window": d.sliding_window,
        "block_size": d.block_size,
        "num_target_layers": d.num_target_layers,
        "dflash_config": {
            "target_layer_ids": list(d.target_layer_ids),
            "mask_token_id": d.mask_token_id,
            **d.family_fields,
        },
        "torch_dtype": "float32",
    }


def write_drafter(out: str | Path, d: TinyDrafter = TinyDrafter(), state: dict | None = None) -> Path:
    """Write a DFlash checkpoint folder: random seeded weights, or `state` (name -> tensor) when given."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = drafter_config(d)
    state = weights(d) if state is None else state
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def transformers5_config(d: TinyDrafter) -> dict:
    """The config as SpecForge's `export --to hf` writes it under transformers 5: RoPE only in
    `rope_parameters`, block_size and num_target_layers inside `dflash_config`, sliding-window fields."""
    cfg = drafter_config(d)
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.pop("rope_theta")}
    cfg.pop("rope_scaling")
    cfg["dflash_config"] |= {"block_size": cfg.pop("block_size"), "num_target_layers": cfg.pop("num_target_layers")}
    cfg |= {
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "use_sliding_window": d.sliding_window is not None,
        "max_window_layers": d.num_hidden_layers,
        "transformers_version": "5.5.3",
    }
    return cfg


def weights(d: TinyDrafter) -> dict[str, torch.Tensor]:
    """Seeded random weights (name -> tensor) of a drafter with config `d`."""
    g = torch.Generator().manual_seed(d.seed)
    state = {}
    for name, shape in shapes(parse_config(drafter_config(d))).items():
        if len(shape) == 1:  # norms: around 1
            state[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            state[name] = torch.randn(shape, generator=g) * d.init_scale / shape[1] ** 0.5
    return state


def write_runtime(
    out: str | Path, state: dict[str, torch.Tensor], step: int, run_id: str = "run", strategy: str = "dflash"
) -> Path:
    """A SpecForge runtime checkpoint folder `out/{run_id}-step{step}/`: training_state.pt holding the draft
    weights under `draft_state_dict` (no prefix, no embedding) with the training's counters, and a
    per-rank optimizer file beside it; no config.json (the draft config is the training's JSON)."""
    folder = Path(out) / f"{run_id}-step{step}"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "draft_state_dict": {k: v.clone() for k, v in state.items()},
            "global_step": step,
            "epoch": 0,
            "epoch_batch": step,
            "epoch_samples": step * 8,
            "strategy": strategy,
            "run_id": run_id,
            "world_size": 1,
        },
        folder / "training_state.pt",
    )
    torch.save(
        {"optimizer": {"state": {}, "param_groups": []}, "rng": {"torch": torch.get_rng_state()}},
        folder / "training_state_rank0.pt",
    )
    return folder
