"""The DFlash drafter: checkpoint loading and validation, and the block forward (SPEC 2).

Contract: `load(path)` reads a z-lab / SpecForge checkpoint folder (config.json + *.safetensors) and
returns a `Drafter`; a wrong checkpoint raises `CheckpointError` naming the field and the expected value.
The drafter has no embedding and no LM head: callers pass block embeddings in and get normed hidden
states out. Two forwards exist on purpose:
  - `blocks`: many blocks of one sequence at once over shared context K/V (the every-anchor path);
  - `block`:  one block, keys = [ctx; block] concatenated, plain SDPA (the reference the tests trust).
Knows nothing of files other than the checkpoint, nor of HTTP or the store.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from .errors import UserError


class CheckpointError(UserError, ValueError):
    """A DFlash checkpoint that cannot be used as it is; the message names the field and what was expected."""


# ---------------------------------------------------------------------------
# config


@dataclass
class DrafterConfig:
    hidden_size: int  # H, must equal the target's hidden size
    intermediate_size: int  # MLP width
    num_hidden_layers: int  # draft layers
    num_attention_heads: int  # query heads
    num_key_value_heads: int  # KV heads (GQA)
    head_dim: int  # per-head width
    vocab_size: int  # must equal the target's vocabulary
    block_size: int  # B: slot 0 is the anchor, slots 1..B-1 are drafted
    target_layer_ids: list[int]  # target layers whose OUTPUTS are concatenated as features
    mask_token_id: int  # id placed in slots 1..B-1
    num_target_layers: int | None  # N of the target the checkpoint was trained against
    layer_types: list[str]  # full_attention | sliding_attention, one per draft layer
    sliding_window: int | None  # key window of sliding_attention layers
    rope_theta: float  # RoPE base (required: Qwen3.5/3.6 drafters use 1e7; no silent default)
    rms_norm_eps: float = 1e-6  # RMSNorm epsilon
    rope_scaling: dict | None = None  # {"rope_type": yarn|linear|..., scaling fields} or None (default RoPE)
    max_position_embeddings: int = 32768  # for RoPE scaling
    attention_bias: bool = False  # q/k/v/o biases
    sliding_causal: bool = True  # the config's own sliding-block semantics (is_causal; default: causal)

    @property
    def K(self) -> int:  # number of feature layers
        return len(self.target_layer_ids)


def default_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Evenly spaced target layer ids (SPEC 2): round(1 + i*(N-4)/(n-1)); one draft layer: N//2."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def _int(raw: dict, key: str, lo: int = 1, default=..., where: str = "config.json") -> int | None:
    """An integer field >= lo; missing -> default (or an error when there is none)."""
    v = raw.get(key)
    if v is None:
        if default is ...:
            raise CheckpointError(f"{where}: missing field '{key}' (expected an integer >= {lo})")
        return default
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise CheckpointError(f"{where}: field '{key}' = {v!r}, expected an integer >= {lo}")
    return v


def _both(raw: dict, dcfg: dict, key: str, lo: int) -> int | None:
    """An integer field read at the top level or inside dflash_config (SGLang reads both); they must agree."""
    top = _int(raw, key, lo=lo, default=None)
    inner = _int(dcfg, key, lo=lo, default=None, where="config.json: dflash_config")
    if top is not None and inner is not None and top != inner:
        raise CheckpointError(f"config.json: {key} = {top} but dflash_config.{key} = {inner}; they must agree")
    return top if top is not None else inner


def _num(raw: dict, key: str, default: float) -> float:
    v = raw.get(key, default)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
        raise CheckpointError(f"config.json: field '{key}' = {v!r}, expected a positive number")
    return float(v)


ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")  # what `Rope` can build


def _rope(raw: dict) -> tuple[float, dict | None]:
    """(base, scaling) from `rope_parameters` (transformers 5) and/or `rope_theta` + `rope_scaling` (older).

    Both forms present and disagreeing is an error naming both; so are an unsupported `rope_type`, a partial
    rotary factor (DFlash layers rotate the whole head) and a config with no RoPE base at all."""
    new = raw.get("rope_parameters")
    if new is not None and not isinstance(new, dict):
        raise CheckpointError(f"config.json: rope_parameters = {new!r}, expected an object")
    if new and all(isinstance(v, dict) for v in new.values()):  # per layer type: {"full_attention": {...}, ...}
        kinds = list(new.values())
        if any(k != kinds[0] for k in kinds):
            raise CheckpointError(
                f"config.json: rope_parameters differ per layer type ({', '.join(new)}); "
                "DFlash drafters use one RoPE for every layer"
            )
        new = kinds[0]
    new = dict(new or {})
    old_scaling = raw.get("rope_scaling")
    if old_scaling is not None and not isinstance(old_scaling, dict):
        raise CheckpointError(f"config.json: rope_scaling = {old_scaling!r}, expected an object or null")
    old_scaling = dict(old_scaling or {})
    old_theta, new_theta = raw.get("rope_theta"), new.pop("rope_theta", None)
    if old_theta is not None and new_theta is not None and float(old_theta) != float(new_theta):
        raise CheckpointError(
            f"config.json: rope_theta = {old_theta!r} but rope_parameters.rope_theta = "
            f"{new_theta!r}; they must agree (keep one)"
        )
    theta = new_theta if new_theta is not None else old_theta
    if theta is None:
        raise CheckpointError(
            "config.json: no RoPE base: neither 'rope_parameters.rope_theta' nor 'rope_theta' "
            "is set (Qwen3.5/3.6 DFlash drafters use 10000000); add the training's value"
        )
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise CheckpointError(f"config.json: RoPE base {theta!r}, expected a positive number")
    old_type = old_scaling.pop("rope_type", None) or old_scaling.pop("type", None)
    new_type = new.pop("rope_type", None) or new.pop("type", None)
    if old_type and new_type and old_type != new_type:
        raise CheckpointError(
            f"config.json: rope_scaling.rope_type = {old_type!r} but rope_parameters.rope_type = "
            f"{new_type!r}; they must agree (keep one)"
        )
    for k in set(old_scaling) & set(new):
        if old_scaling[k] != new[k]:
            raise CheckpointError(
                f"config.json: rope_scaling.{k} = {old_scaling[k]!r} but rope_parameters.{k} = "
                f"{new[k]!r}; they must agree (keep one)"
            )
    kind = new_type or old_type or "default"
    if kind not in ROPE_TYPES:
        raise CheckpointError(f"config.json: rope_type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    fields = old_scaling | new
    prf = fields.pop("partial_rotary_factor", 1.0)
    if prf not in (None, 1, 1.0):
        raise CheckpointError(
            f"config.json: partial_rotary_factor = {prf!r}; DFlash drafter layers rotate the whole head (expected 1.0)"
        )
    return float(theta), (None if kind == "default" and not fields else {"rope_type": kind, **fields})


# architectures / projector types of other drafter families -> the family's name (SpecForge, SGLang)
FAMILIES = {
    "dominodraftmodel": "Domino",
    "dsparkdraftmodel": "DSpark",
    "qwen3dsparkmodel": "DSpark",
    "llamaforcausallmeagle3": "EAGLE-3",
    "llamaforcausallmeagle": "EAGLE",
    "peagledraftmodel": "P-EAGLE",
    "dflash2draftmodel": "DFlash2",
    "domino": "Domino",
    "dspark": "DSpark",
    "dflash2": "DFlash2",
}
FOREIGN_FIELDS = {
    "markov_rank": "DSpark (Markov head)",
    "markov_head_type": "DSpark (Markov head)",
    "enable_confidence_head": "DSpark (confidence head)",
    "confidence_head_alpha": "DSpark (confidence head)",
    "gru_hidden_dim": "Domino (prefix GRU)",
    "pure_draft_prefix_len": "Domino (prefix GRU)",
    "draft_vocab_size": "EAGLE-3 (draft vocabulary)",
}


def refuse_family(raw: dict) -> None:
    """Raise CheckpointError naming the family when `raw` is another drafter family than DFlash (Domino,
    DSpark, DFlash2, EAGLE, ...): replaying those with the DFlash forward would give plausible wrong numbers."""
    archs = raw.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if not isinstance(archs, list):
        raise CheckpointError(f"config.json: architectures = {archs!r}, expected a list like [\"DFlashDraftModel\"]")
    for a in archs:
        fam = FAMILIES.get(str(a).lower())
        if str(a).endswith("ForCausalLM") and not fam:
            raise CheckpointError(
                f"config.json: architectures {archs!r}: this is a target model folder (a causal "
                "LM), not a DFlash drafter checkpoint; pass it as --target and the drafter as "
                "--drafter"
            )
        if fam or "dflash" not in str(a).lower():
            raise CheckpointError(
                f"config.json: architectures {archs!r} is {'a ' + fam if fam else 'not a DFlash'} "
                "drafter; dflash-dash replays DFlash drafters (architectures DFlashDraftModel) only"
            )
    dcfg = raw.get("dflash_config") if isinstance(raw.get("dflash_config"), dict) else {}
    proj = dcfg.get("projector_type", raw.get("projector_type"))
    if proj not in (None, "dflash"):
        fam = FAMILIES.get(str(proj).lower(), str(proj))
        raise CheckpointError(
            f"config.json: dflash_config.projector_type = {proj!r}: a {fam} drafter, not DFlash; "
            "dflash-dash replays DFlash drafters only"
        )
    for key, fam in FOREIGN_FIELDS.items():
        if dcfg.get(key, raw.get(key)) not in (None, False, 0):
            raise CheckpointError(
                f"config.json: field '{key}' belongs to a {fam} drafter, not DFlash; dflash-dash "
                "replays DFlash drafters only"
            )


def parse_config(raw: dict) -> DrafterConfig:
    """Validate a config.json dict into a DrafterConfig; errors name the field and the expected value."""
    if not isinstance(raw, dict):
        raise CheckpointError("config.json: expected a JSON object")
    refuse_family(raw)
    n = _int(raw, "num_hidden_layers")
    H = _int(raw, "hidden_size")
    nh = _int(raw, "num_attention_heads")
    nkv = _int(raw, "num_key_value_heads")
    if nh % nkv:
        raise CheckpointError(f"config.json: num_attention_heads={nh} must be a multiple of num_key_value_heads={nkv}")
    hd = _int(raw, "head_dim", default=H // nh)
    if hd % 2 or hd < 2:
        raise CheckpointError(f"config.json: head_dim={hd}, expected an even integer (RoPE)")
    dcfg = raw.get("dflash_config")
    if dcfg is None:
        dcfg = {}
    if not isinstance(dcfg, dict):
        raise CheckpointError(f"config.json: dflash_config = {dcfg!r}, expected an object")
    ntl = _both(raw, dcfg, "num_target_layers", lo=1)
    ids = dcfg.get("target_layer_ids")
    if ids is None:
        if ntl is None:
            raise CheckpointError(
                "config.json: missing 'dflash_config.target_layer_ids' and 'num_target_layers' (expected one of them)"
            )
        ids = default_layer_ids(ntl, n)
    if (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
    ):
        raise CheckpointError(f"config.json: dflash_config.target_layer_ids = {ids!r}, expected a list of ints >= 0")
    if ntl is not None and max(ids) >= ntl:
        raise CheckpointError(
            f"config.json: dflash_config.target_layer_ids contains {max(ids)}, expected ids < num_target_layers={ntl}"
        )
    V = _int(raw, "vocab_size")
    mask = _int(dcfg, "mask_token_id", lo=0, default=None, where="config.json: dflash_config")
    if mask is None:
        mask = _int(raw, "mask_token_id", lo=0, default=None)
    if mask is None:
        raise CheckpointError("config.json: missing field 'dflash_config.mask_token_id' (expected an integer)")
    if mask >= V:
        raise CheckpointError(f"config.json: dflash_config.mask_token_id={mask}, expected 0 <= id < vocab_size={V}")
    types = raw.get("layer_types") or ["full_attention"] * n
    if (
        not isinstance(types, list)
        or len(types) != n
        or any(t not in ("full_attention", "sliding_attention") for t in types)
    ):
        raise CheckpointError(
            f"config.json: layer_types = {types!r}, expected {n} entries of full_attention|sliding_attention"
        )
    window = _int(raw, "sliding_window", default=None) if "sliding_attention" in types else None
    if "sliding_attention" in types and not window:
        raise CheckpointError("config.json: sliding_attention layers need 'sliding_window' (expected a positive int)")
    B = _both(raw, dcfg, "block_size", lo=2)
    if B is None:
        raise CheckpointError(
            "config.json: missing field 'block_size' (expected an integer >= 2, at the top level or in dflash_config)"
        )
    theta, scaling = _rope(raw)
    causal = raw.get("is_causal", True)
    if not isinstance(causal, bool):
        raise CheckpointError(f"config.json: is_causal = {causal!r}, expected true or false")
    return DrafterConfig(
        hidden_size=H,
        intermediate_size=_int(raw, "intermediate_size"),
        num_hidden_layers=n,
        num_attention_heads=nh,
        num_key_value_heads=nkv,
        head_dim=hd,
        vocab_size=V,
        block_size=B,
        target_layer_ids=list(ids),
        mask_token_id=mask,
        num_target_layers=ntl,
        layer_types=list(types),
        sliding_window=window,
        rms_norm_eps=_num(raw, "rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=_int(raw, "max_position_embeddings", default=32768),
        attention_bias=bool(raw.get("attention_bias", False)),
        sliding_causal=causal,
    )


SLIDING_BLOCKS = ("causal", "bidirectional")  # sliding-layer block semantics a run can choose


def sliding_semantics(c: DrafterConfig, choice: str | None = None) -> str:
    """The sliding-layer block semantics of a run: `choice` when given, else the config's own (`is_causal`,
    default causal: what SpecForge trains and SGLang serves; bidirectional is the z-lab HF reference)."""
    if choice is None:
        return "causal" if c.sliding_causal else "bidirectional"
    if choice not in SLIDING_BLOCKS:
        raise CheckpointError(f"--sliding-block {choice!r}: expected one of {', '.join(SLIDING_BLOCKS)}")
    return choice


# ---------------------------------------------------------------------------
# checkpoint layouts


RUNTIME_FILE = "training_state.pt"  # SpecForge runtime checkpoint: {run_id}-step{N}/training_state.pt
_STEPS = [
    re.compile(p)
    for p in (r"epoch_(\d+)_step_(\d+)$", r"(?:^|[-_])step[-_]?(\d+)$", r"^checkpoint-(\d+)$", r"^step(\d+)$")
]


def step_of(name: str) -> int | None:
    """Training step of a checkpoint folder name: `epoch_E_step_S`, `{run_id}-step{N}`, `checkpoint-N`,
    `step_N`, `stepN`; None for other names (e.g. `{run_id}-latest`)."""
    for rx in _STEPS:
        m = rx.search(Path(name).name)
        if m:
            return int(m.groups()[-1])
    return None


@dataclass
class Checkpoint:
    path: Path  # the checkpoint folder (resolved)
    config_file: Path  # the JSON the config is read from (beside, above, or --draft-config)
    weights: list[Path]  # *.safetensors files, or [training_state.pt]
    kind: str  # "hf" (safetensors folder) or "runtime" (SpecForge training_state.pt)


def locate(path: str | Path, draft_config: str | Path | None = None) -> Checkpoint:
    """Find a checkpoint's weights and config: an HF folder (config.json + *.safetensors) or a SpecForge
    runtime folder `{run_id}-step{N}/` (training_state.pt, config from `draft_config` or a config.json beside
    or up to two folders above). Raises CheckpointError naming what is missing and the fix."""
    p = Path(path)
    if p.is_file() and p.name == RUNTIME_FILE:
        p = p.parent
    if not p.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    p = p.resolve()
    files = sorted(p.glob("*.safetensors"))
    kind = "hf" if files else "runtime" if (p / RUNTIME_FILE).is_file() else None
    if kind is None:
        what = "a target model folder, not a drafter" if list(p.glob("*.bin")) else "no drafter weights"
        raise CheckpointError(f"{p}: {what} (expected config.json + *.safetensors, or a SpecForge {RUNTIME_FILE})")
    if draft_config:
        cfg = Path(draft_config)
        if not cfg.is_file():
            raise CheckpointError(
                f"--draft-config {draft_config}: no such file (expected the training's draft config JSON)"
            )
    else:
        near = [p] + (list(p.parents)[:2] if kind == "runtime" else [])
        cfg = next((d / "config.json" for d in near if (d / "config.json").is_file()), None)
        if cfg is None:
            raise CheckpointError(
                f"{p}: no config.json beside the weights"
                + (
                    " or above them; a SpecForge runtime checkpoint holds no "
                    "config: pass --draft-config FILE (the training's --draft-config JSON)"
                    if kind == "runtime"
                    else " (expected a DFlash checkpoint folder)"
                )
            )
    return Checkpoint(p, cfg.resolve(), files or [p / RUNTIME_FILE], kind)


def raw_config(ck: Checkpoint) -> dict:
    try:
        raw = json.loads(ck.config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{ck.config_file}: not valid JSON ({e})") from None
    return raw


def read_config(path: str | Path, draft_config: str | Path | None = None) -> DrafterConfig:
    """Locate, read and validate a checkpoint's config; errors name the file they came from."""
    return config_of(locate(path, draft_config))


def config_of(ck: Checkpoint) -> DrafterConfig:
    """The validated config of a located checkpoint; errors name the file they came from."""
    try:
        return parse_config(raw_config(ck))
    except CheckpointError as e:
        raise CheckpointError(str(e).replace("config.json:", f"{ck.config_file}:", 1)) from None


def shapes(c: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint with config `c` must hold (SPEC 2 names, no prefix)."""
    H, I, hd, nh, nkv = c.hidden_size, c.intermediate_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads
    out = {"fc.weight": (H, c.K * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        out |= {
            p + "input_layernorm.weight": (H,),
            p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (nh * hd, H),
            p + "self_attn.k_proj.weight": (nkv * hd, H),
            p + "self_attn.v_proj.weight": (nkv * hd, H),
            p + "self_attn.o_proj.weight": (H, nh * hd),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (I, H),
            p + "mlp.up_proj.weight": (I, H),
            p + "mlp.down_proj.weight": (H, I),
        }
        if c.attention_bias:
            out |= {
                p + "self_attn.q_proj.bias": (nh * hd,),
                p + "self_attn.k_proj.bias": (nkv * hd,),
                p + "self_attn.v_proj.bias": (nkv * hd,),
                p + "self_attn.o_proj.bias": (H,),
            }
    return out


@dataclass(frozen=True)
class Check:
    name: str  # what is compared, e.g. "hidden size"
    drafter: object  # the drafter's value
    other: object  # the target's / extraction's value
    ok: bool  # consistent
    problem: str  # the message when not ok: names the field, what was expected and the fix
    fatal: bool = True  # a replay cannot run (False: a warning, e.g. torch-path features)


def checks(
    c: DrafterConfig, hidden_size: int, vocab_size: int, num_layers: int, extraction: dict | None = None
) -> list[Check]:
    """THE consistency rules of a drafter against its target (hidden size, vocab, layer count) and, given an
    extraction row, against the features it holds (layer ids, hidden size, backend): one Check per rule, so
    the replay's refusal, the serving stand-in's and the Diagnostics table say the same."""
    top = max(c.target_layer_ids)
    out = [
        Check(
            "hidden size",
            c.hidden_size,
            hidden_size,
            c.hidden_size == hidden_size,
            f"hidden_size={c.hidden_size} does not match the target (expected {hidden_size})",
        ),
        Check(
            "vocab size",
            c.vocab_size,
            vocab_size,
            c.vocab_size == vocab_size,
            f"vocab_size={c.vocab_size} does not match the target (expected {vocab_size})",
        ),
        Check(
            "target layers",
            c.num_target_layers,
            num_layers,
            top < num_layers and (c.num_target_layers is None or c.num_target_layers == num_layers),
            f"dflash_config.target_layer_ids contains {top}, expected ids < {num_layers} (the target's layer count)"
            if top >= num_layers
            else f"num_target_layers={c.num_target_layers} but the target has {num_layers}",
        ),
        Check(
            "mask token id < vocab",
            c.mask_token_id,
            vocab_size,
            0 <= c.mask_token_id < vocab_size,
            f"mask_token_id={c.mask_token_id} is outside the target's vocabulary (size {vocab_size})",
        ),
    ]
    if extraction is not None:
        out += [
            Check(
                "target layer ids",
                c.target_layer_ids,
                extraction["layer_ids"],
                c.target_layer_ids == extraction["layer_ids"],
                f"the drafter reads target layers {c.target_layer_ids} but extraction {extraction.get('id')} "
                f"holds layers {extraction['layer_ids']}; extract again with --drafter pointing at this checkpoint",
            ),
            Check(
                "hidden size (extraction)",
                c.hidden_size,
                extraction["hidden_size"],
                c.hidden_size == extraction["hidden_size"],
                f"hidden_size={c.hidden_size} but extraction {extraction.get('id')} holds features of "
                f"{extraction['hidden_size']}; extract with the drafter's target",
            ),
            Check(
                "extraction backend",
                "trained on fla",
                extraction["backend"],
                extraction["backend"] in ("fla", "n/a"),
                f"extraction {extraction.get('id')} ran the torch path: features differ slightly from the fla "
                "kernels the drafter was trained on",
                fatal=False,
            ),
        ]
    return out


def check_target(
    c: DrafterConfig, hidden_size: int, vocab_size: int, num_layers: int, extraction: dict | None = None
) -> None:
    """Raise CheckpointError for the first fatal rule of `checks` the drafter breaks."""
    bad = next((k for k in checks(c, hidden_size, vocab_size, num_layers, extraction) if k.fatal and not k.ok), None)
    if bad:
        raise CheckpointError(bad.problem)


# ---------------------------------------------------------------------------
# math helpers


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3 RMSNorm: normalise in fp32, cast back, then scale."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply RoPE; cos/sin broadcast against x [..., T, hd]."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


def norm_rope(x: torch.Tensor, w: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Per-head RMSNorm, then RoPE: x [..., T, n, hd] -> [..., n, T, hd]; cos/sin [..., T, hd]."""
    return rotate(rmsnorm(x, w, eps).transpose(-2, -3), cos.unsqueeze(-3), sin.unsqueeze(-3))


def silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return F.silu(g) * u


def add_norm(h: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the next RMSNorm: (h + x, rmsnorm(h + x))."""
    h = h + x
    return h, rmsnorm(h, w, eps)


KEY_ALIGN = 256  # context (+ block) keys of a batched call rounded up to a multiple of this: few distinct shapes
# reach the attention kernels (their per-shape plans), at most this many keys masked in vain


class Ops:
    """The element-wise pieces of the batched forward (`Drafter.blocks`, `context_kv`): eager torch, or each piece
    fused into one kernel by torch.compile (Inductor; CUDA only, compiled on first use, dynamic in every dim but the
    last). The same arithmetic either way; fused kernels round in another order (bf16: not bit for bit)."""

    def __init__(self, compiled: bool):
        f = _compiled if compiled else (lambda fn: fn)
        self.rmsnorm, self.norm_rope, self.silu_mul, self.add_norm = map(f, (rmsnorm, norm_rope, silu_mul, add_norm))


def _compiled(fn):
    """torch.compile(fn) that falls back to `fn` itself, with one warning, if compiling or running it fails."""
    import warnings

    import torch._inductor.config as inductor

    # deterministic: no kernel configs chosen by timing them, so every process fuses with the same reductions and
    # a replay gives the same drafts in any process (a bf16 near tie would otherwise flip between runs)
    opts = {"deterministic": True} if hasattr(inductor, "deterministic") else None
    # every dim dynamic but the last (the hidden or head size, the reductions' length): one compile serves every
    # row count, and the reductions are specialised to their length (with it dynamic too, Inductor reads a row
    # twice in a loop: 19.6 against 9.5 ms a 2,560-token sequence on the H200, bench_chunk.py)
    fused = [torch.compile(fn, dynamic=False, options=opts)]

    def call(*args):
        if fused:
            try:
                for a in args:
                    if isinstance(a, torch.Tensor):
                        for d in range(a.dim() - 1):
                            torch._dynamo.maybe_mark_dynamic(a, d)
                return fused[0](*args)
            except Exception as e:  # noqa: BLE001  (no working Inductor here: eager is the same arithmetic)
                warnings.warn(f"fused {fn.__name__} unavailable ({type(e).__name__}: {str(e)[:200]}); running eager")
                fused.clear()
        return fn(*args)

    return call


EAGER = Ops(False)
FUSE_CUDA = os.environ.get("DFLASH_FUSE", "1") != "0"  # CUDA drafters use fused element-wise kernels (`Ops(True)`,
# one per process); DFLASH_FUSE=0 turns them off
_FUSED: list[Ops] = []


_FUSING = threading.Lock()  # one Ops(True) per process, also when two threads build drafters at once


def ops_for(device: torch.device) -> Ops:
    """The element-wise kernels a drafter on `device` uses: fused on CUDA when FUSE_CUDA and Triton imports."""
    if device.type != "cuda" or not FUSE_CUDA:
        return EAGER
    with _FUSING:
        if not _FUSED:
            try:
                import triton  # noqa: F401  (Inductor's CUDA kernels are Triton)

                _FUSED.append(Ops(True))
            except ImportError:
                _FUSED.append(EAGER)
    return _FUSED[0]


class Rope:
    """cos/sin tables for absolute positions. Plain RoPE (no rope_scaling) is computed here exactly as transformers'
    default init and forward compute it (bit for bit, tested); scaled types (yarn, linear, ...) go through
    transformers' RotaryEmbedding, whose import cost 13.6 s in a fresh process on the H200 machine
    (`bench_cold.py --fetch`), so a plain drafter never pays it."""

    def __init__(self, c: DrafterConfig, device, dtype):
        self.dtype, self.emb = dtype, None
        if c.rope_scaling is None:  # inv_freq [hd/2] = 1 / theta^(2i/hd), in float32 as transformers builds it
            self.inv_freq = (
                1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float) / c.head_dim))
            ).to(device)
            return
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        rope = {"rope_type": "default"} | c.rope_scaling | {"rope_theta": c.rope_theta}
        qc = Qwen3Config(
            hidden_size=c.hidden_size,
            num_attention_heads=c.num_attention_heads,
            head_dim=c.head_dim,
            rope_parameters=rope,
            max_position_embeddings=c.max_position_embeddings,
        )
        self.emb = Qwen3RotaryEmbedding(qc).to(device)

    def __call__(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # pos [..., T] -> cos, sin [..., T, hd]
        flat = pos.reshape(1, -1)
        if self.emb is None:
            freqs = flat[..., None].float() * self.inv_freq.to(pos.device)  # [1, T', hd/2]
            ang = torch.cat((freqs, freqs), dim=-1)
            cos, sin = ang.cos().to(self.dtype), ang.sin().to(self.dtype)
        else:
            cos, sin = self.emb(torch.empty(0, dtype=self.dtype, device=pos.device), flat)
        return cos.reshape(*pos.shape, -1), sin.reshape(*pos.shape, -1)


# ---------------------------------------------------------------------------
# model


class Drafter:
    """Weights of a DFlash checkpoint plus its two forwards. Differentiable when the weights require grad
    (the demo trains through `blocks`); callers wrap inference in torch.inference_mode()."""

    def __init__(self, c: DrafterConfig, w: dict[str, torch.Tensor], path: str = "", sliding_block: str | None = None):
        self.c, self.w, self.path = c, w, path
        self.sliding_block = sliding_semantics(c, sliding_block)  # causal | bidirectional (sliding layers)
        any_w = w["fc.weight"]
        self.device, self.dtype = any_w.device, any_w.dtype
        self.rope = Rope(c, self.device, self.dtype)
        self.ops = ops_for(self.device)  # element-wise kernels of the batched forward: eager or fused

    # -- shared pieces --------------------------------------------------------

    def _lin(self, x, name):
        return F.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    def ctx(self, features: torch.Tensor) -> torch.Tensor:
        """features [T, K*H] -> ctx [T, H] = hidden_norm(fc(features))."""
        x = self._lin(features.to(self.device, self.dtype), "fc")
        return self.ops.rmsnorm(x, self.w["hidden_norm.weight"], self.c.rms_norm_eps)

    def _kv(self, i: int, x: torch.Tensor, cos, sin):
        """x [..., T, H] -> k [..., nkv, T, hd] (normed, roped), v [..., nkv, T, hd]."""
        c, p = self.c, f"layers.{i}.self_attn."
        k = self._lin(x, p + "k_proj").unflatten(-1, (c.num_key_value_heads, c.head_dim))
        v = self._lin(x, p + "v_proj").unflatten(-1, (c.num_key_value_heads, c.head_dim))
        return self.ops.norm_rope(k, self.w[p + "k_norm.weight"], c.rms_norm_eps, cos, sin), v.transpose(-2, -3)

    def _q(self, i: int, x: torch.Tensor, cos, sin):
        """x [..., B, H] -> q [..., nh, B, hd] (normed, roped)."""
        c, p = self.c, f"layers.{i}.self_attn."
        q = self._lin(x, p + "q_proj").unflatten(-1, (c.num_attention_heads, c.head_dim))
        return self.ops.norm_rope(q, self.w[p + "q_norm.weight"], c.rms_norm_eps, cos, sin)

    def _mlp(self, i: int, x):
        p = f"layers.{i}.mlp."
        return self._lin(self.ops.silu_mul(self._lin(x, p + "gate_proj"), self._lin(x, p + "up_proj")), p + "down_proj")

    def _kind(self, i: int) -> tuple[int | None, bool]:
        """(key window, causal inside the block) of layer i: (None, False) for full_attention layers."""
        if self.c.layer_types[i] != "sliding_attention":
            return None, False
        return self.c.sliding_window, self.sliding_block == "causal"

    # -- every-anchor path ----------------------------------------------------

    def context_kv(self, features: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (k, v) of the whole sequence's context, each [nkv, T, hd]; computed once per sequence."""
        ctx = self.ctx(features)  # [T, H] (or [S, T, H]: stacked sequences, K/V [S, nkv, T, hd])
        cos, sin = self.rope(torch.arange(ctx.shape[-2], device=self.device))
        return [self._kv(i, ctx, cos, sin) for i in range(self.c.num_hidden_layers)]

    def blocks(
        self,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        anchors: torch.Tensor,
        emb: torch.Tensor,
        group: int = 16,
        max_anchor: int | None = None,
        tail: bool = False,
    ) -> torch.Tensor:
        """Draft many blocks at once: of one sequence, or of several sequences in lockstep.

        kv: context_kv of the sequence (per layer k, v [nkv, T, hd]), or of S sequences stacked (per layer
        [S, nkv, T, hd], padded to one T) with N = S*G blocks, G consecutive blocks per sequence (the
        chain-only replay); anchors [N] (int, the anchor position of each block);
        emb [N, B, H]: target embeddings of [anchor token, MASK x (B-1)].
        Block n's queries see context keys at positions < anchors[n] plus their own block: bidirectional in
        full_attention layers; in sliding_attention layers keys with q - k < window, and only block slots
        0..i from slot i when `sliding_block` is causal (SpecForge training, SGLang serving).
        Returns norm(h) [N, B, H].

        Attention is one fused SDPA call per layer: blocks are taken `group` at a time (S groups), each
        group's queries [g*G*B] attend over [context keys ; the group's block keys] of one KV head, with an
        additive mask that keeps block n to keys < anchors[n] and to its own block. GQA is folded into the
        query rows, so K/V are never repeated per query head; scores never leave the kernel. The context
        length is rounded up to a multiple of KEY_ALIGN (the extra keys are masked) so that few distinct shapes
        reach the attention kernels. `max_anchor` (>= anchors.max(), optional) spares a device sync.
        `tail` (stacked kv only): each layer's k, v [S, nkv, G*B + T, hd] start with G*B spare key slots; the
        blocks' keys are written there in place and the attention runs over them and the first L context keys,
        L >= `max_anchor` rounded so that G*B + L is a multiple of KEY_ALIGN (all T without `max_anchor`): a
        prefix view, so no per-call copy of the context K/V is made (the chain-only replay's lockstep steps).
        """
        c = self.c
        N, B, _ = emb.shape
        nkv, g, hd = c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads, c.head_dim
        dev = self.device
        stacked = kv[0][0].dim() == 4  # [S, nkv, T, hd]: one group per sequence
        if stacked and N % kv[0][0].shape[0]:
            raise ValueError(f"{N} blocks do not split evenly over {kv[0][0].shape[0]} stacked sequences")
        G = N // kv[0][0].shape[0] if stacked else max(1, min(group, N))  # blocks per attention group
        S = -(-N // G)  # groups
        anchors = anchors.to(dev)
        h = emb.to(dev, self.dtype)
        if S * G > N:  # pad with copies of the last block
            pad = S * G - N
            anchors = torch.cat([anchors, anchors[-1:].expand(pad)])
            h = torch.cat([h, h[-1:].expand(pad, -1, -1)])
        T = kv[0][0].shape[-2]
        if tail:
            if not stacked:
                raise ValueError("tail=True needs stacked context K/V [S, nkv, G*B + T, hd]")
            T -= G * B  # context slots, after the block slots
            top = T if max_anchor is None else max_anchor  # no sync: the caller's bound or every key
            L = min(T, -(-(G * B + top) // KEY_ALIGN) * KEY_ALIGN - G * B)
        else:
            top = int(anchors.max()) if max_anchor is None else max_anchor
            L = min(T, -(-top // KEY_ALIGN) * KEY_ALIGN)  # context keys any block can see
        qpos = anchors[:, None] + torch.arange(B, device=dev)  # [N', B]
        cos, sin = self.rope(qpos)  # [N', B, hd]
        masks = {
            kd: self._attn_mask(anchors, qpos, L, S, G, g, *kd, blocks_first=tail)
            for kd in {self._kind(i) for i in range(c.num_hidden_layers)}
        }
        ops, eps = self.ops, c.rms_norm_eps
        x = ops.rmsnorm(h, self.w["layers.0.input_layernorm.weight"], eps)
        for i in range(c.num_hidden_layers):
            p = f"layers.{i}."
            nxt = f"layers.{i + 1}.input_layernorm.weight" if i + 1 < c.num_hidden_layers else "norm.weight"
            q = self._q(i, x, cos, sin)  # [N', nh, B, hd]
            q = q.view(S, G, nkv, g, B, hd).permute(0, 2, 3, 1, 4, 5).reshape(S, nkv, g * G * B, hd)
            kb, vb = (
                t.view(S, G, nkv, B, hd).transpose(1, 2).reshape(S, nkv, G * B, hd) for t in self._kv(i, x, cos, sin)
            )  # [S, nkv, G*B, hd]
            if tail:  # the blocks' keys into the spare slots
                k, v = kv[i]
                k[:, :, : G * B].copy_(kb)
                v[:, :, : G * B].copy_(vb)
                k, v = k[:, :, : G * B + L], v[:, :, : G * B + L]  # [S, nkv, G*B+L, hd] (a view)
            else:
                kc, vc = ((t[:, :, :L] if stacked else t[:, :L].expand(S, nkv, L, hd)) for t in kv[i])
                k, v = torch.cat([kc, kb], 2), torch.cat([vc, vb], 2)  # [S, nkv, L+G*B, hd]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[self._kind(i)])
            o = o.view(S, nkv, g, G, B, hd).permute(0, 3, 4, 1, 2, 5).reshape(S * G, B, nkv * g * hd)
            o = self._lin(o, p + "self_attn.o_proj")
            h, x = ops.add_norm(h, o, self.w[p + "post_attention_layernorm.weight"], eps)
            h, x = ops.add_norm(h, self._mlp(i, x), self.w[nxt], eps)  # x: the next layer's input (or the output)
        return x[:N]

    def _attn_mask(
        self,
        anchors,
        qpos,
        L: int,
        S: int,
        G: int,
        g: int,
        window: int | None,
        causal: bool,
        blocks_first: bool = False,
    ) -> torch.Tensor:
        """Additive mask [S, 1, g*G*B, L+G*B] (0 or -inf) of the grouped attention in `blocks`: keys are the L
        context keys then the G*B block keys, or the other way round (`blocks_first`, the `tail` layout)."""
        B, dev = qpos.shape[1], qpos.device
        kpos = torch.arange(L, device=dev)
        a, qp = anchors.view(S, G), qpos.view(S, G, B)
        ok_ctx = (kpos < a[:, :, None, None]).expand(S, G, B, L)  # [S, G, B, L]
        ok_blk = torch.eye(G, dtype=torch.bool, device=dev)[None, :, None, :, None].expand(S, G, B, G, B)
        if window:
            ok_ctx = ok_ctx & ((qp[..., None] - kpos) < window)
            d = qp[:, :, :, None, None] - qp[:, None, None, :, :]  # [S, G, B, G, B] q - k
            ok_blk = ok_blk & (d < window) & ((d >= 0) if causal else True)
        parts = [ok_ctx, ok_blk.reshape(S, G, B, G * B)]
        ok = torch.cat(parts[::-1] if blocks_first else parts, -1)  # [S, G, B, L+G*B]
        ok = ok.reshape(S, 1, 1, G * B, -1).expand(S, 1, g, G * B, L + G * B).reshape(S, 1, g * G * B, -1)
        return torch.zeros(ok.shape, dtype=self.dtype, device=dev).masked_fill_(~ok, float("-inf"))

    # -- reference path -------------------------------------------------------

    def block(self, features: torch.Tensor, anchor: int, emb: torch.Tensor) -> torch.Tensor:
        """Draft ONE block the plain way: features [anchor, K*H] of positions 0..anchor-1, emb [B, H].

        Keys/values are [proj(ctx); proj(block)] concatenated, positions 0..anchor+B-1, plain SDPA.
        Returns norm(h) [B, H]. Slow on purpose: it recomputes the context for every block.
        """
        c = self.c
        B = emb.shape[0]
        ctx = self.ctx(features[:anchor])
        pos = torch.arange(anchor + B, device=self.device)
        cos, sin = self.rope(pos)
        h = emb.to(self.device, self.dtype)
        g = c.num_attention_heads // c.num_key_value_heads
        for i in range(c.num_hidden_layers):
            p = f"layers.{i}."
            x = rmsnorm(h, self.w[p + "input_layernorm.weight"], c.rms_norm_eps)
            q = self._q(i, x, cos[anchor:], sin[anchor:])  # [nh, B, hd]
            k, v = self._kv(i, torch.cat([ctx, x]), cos, sin)  # [nkv, anchor+B, hd]
            k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
            mask = None
            w, causal = self._kind(i)
            if w:
                d = pos[anchor:, None] - pos[None, :]  # [B, anchor+B] q - k
                mask = (d < w) & (d >= 0) if causal else d < w
            o = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask).to(self.dtype)
            h = h + self._lin(o.transpose(0, 1).flatten(1), p + "self_attn.o_proj")
            h = h + self._mlp(i, rmsnorm(h, self.w[p + "post_attention_layernorm.weight"], c.rms_norm_eps))
        return rmsnorm(h, self.w["norm.weight"], c.rms_norm_eps)


# ---------------------------------------------------------------------------
# loading


COPIES = ("embed_tokens.weight", "lm_head.weight")  # copies of the target's embedding / LM head: ignored


def tensors(ck: Checkpoint):
    """(file name, tensor name, shape, getter) of a checkpoint's weights, names without `model.`/`draft_model.`
    prefixes; the shape is read without the tensor's data.

    A runtime `training_state.pt` is read with torch.load(weights_only=True) only: a file that needs arbitrary
    unpickling is refused (its code never runs)."""
    if ck.kind == "hf":
        for f in ck.weights:
            with safe_open(str(f), framework="pt", device="cpu") as sf:
                for name in sf.keys():
                    yield (
                        f.name,
                        _bare(name),
                        tuple(sf.get_slice(name).get_shape()),
                        lambda sf=sf, name=name: sf.get_tensor(name),
                    )
        return
    f = ck.weights[0]
    try:
        state = torch.load(str(f), map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{f}: needs arbitrary unpickling ({str(e).splitlines()[0][:160]}), which dflash-dash refuses because it "
            "can run code; export the checkpoint with `specforge export --to hf` and replay the exported folder"
        ) from None
    except (RuntimeError, OSError, EOFError) as e:
        raise CheckpointError(f"{f}: not a readable torch checkpoint ({type(e).__name__}: {e})") from None
    sd = state.get("draft_state_dict") if isinstance(state, dict) else None
    if not isinstance(sd, dict):
        keys = sorted(state)[:8] if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{f}: no 'draft_state_dict' (found {keys}); expected a SpecForge runtime checkpoint")
    for name, t in sd.items():
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{f}: draft_state_dict['{name}'] is {type(t).__name__}, expected a tensor")
        yield f.name, _bare(name), tuple(t.shape), lambda t=t: t


def _bare(name: str) -> str:
    for prefix in ("draft_model.", "model."):
        name = name.removeprefix(prefix)
    return name


def _weights(ck: Checkpoint, c: DrafterConfig, read: Callable[[torch.Tensor], torch.Tensor] | None) -> dict:
    """Every tensor of `ck` checked against `c` (name, shape, none missing): {name: read(tensor)}, or {name: None}
    without `read` (nothing but the files' headers is read)."""
    want = shapes(c)
    w: dict[str, torch.Tensor | None] = {}
    for fname, key, shape, get in tensors(ck):
        if key not in want:
            if key in COPIES or key.endswith("rotary_emb.inv_freq"):
                continue
            raise CheckpointError(
                f"{ck.path / fname}: unknown tensor '{key}': not part of a DFlash drafter with "
                f"this config (another drafter family, or a config that does not match the weights)"
            )
        if shape != want[key]:
            raise CheckpointError(f"{fname}: tensor '{key}' has shape {shape}, expected {want[key]}")
        w[key] = read(get()) if read else None
    missing = [k for k in want if k not in w]
    if missing:
        raise CheckpointError(
            f"{ck.path}: missing tensor '{missing[0]}' (expected shape {want[missing[0]]})"
            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
        )
    return w


def check(path: str | Path, sliding_block: str | None = None, draft_config: str | Path | None = None) -> DrafterConfig:
    """Validate a checkpoint as `load` does (config, sliding semantics, every tensor's name and shape) without
    reading its weights; returns its config. A sweep checks every checkpoint so before loading the first."""
    ck = locate(path, draft_config)
    c = config_of(ck)
    sliding_semantics(c, sliding_block)
    _weights(ck, c, None)
    return c


def load(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    sliding_block: str | None = None,
    draft_config: str | Path | None = None,
    place: Callable[[dict], dict] | None = None,
) -> Drafter:
    """Load and validate a checkpoint (HF folder or SpecForge runtime folder, see `locate`). A tensor of the
    wrong shape, a missing one or an unknown one (other than a copy of the target's embedding or LM head)
    raises CheckpointError naming it. `place`: moves the checked weights (CPU, `dtype`) to `device` all at once
    (a loader's staged upload); by default each tensor is moved as it is read."""
    ck = locate(path, draft_config)
    c = config_of(ck)
    sliding_semantics(c, sliding_block)  # validate the choice before reading weights
    if place is None:
        w = _weights(ck, c, lambda t: t.to(device=device, dtype=dtype))
    else:
        w = place(_weights(ck, c, lambda t: t.to(dtype=dtype)))
    return Drafter(c, w, str(ck.path), sliding_block)


def flops_per_block(c: DrafterConfig, ctx_len: int, vocab: int) -> float:
    """Matmul FLOPs of one block over `ctx_len` context keys, LM head of B-1 slots included (for benchmarks)."""
    H, I, hd, nh, nkv, B = (
        c.hidden_size,
        c.intermediate_size,
        c.head_dim,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.block_size,
    )
    per_layer = 2 * B * (H * nh * hd * 2 + H * nkv * hd * 2 + 3 * H * I)  # q,o ; k,v ; mlp
    per_layer += 2 * 2 * B * nh * hd * (ctx_len + B)  # scores + weighted values
    return c.num_hidden_layers * per_layer + 2 * (B - 1) * H * vocab
