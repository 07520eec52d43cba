"""Drafter config.json parsing: `DrafterConfig`, the family a config belongs to, and the errors a bad one raises.

Contract: `parse_config(raw)` validates a config.json dict into a `DrafterConfig`, or raises `CheckpointError`
naming the field and the expected value; the family (`fields.family_of`: from `architectures`, `projector_type`
and family-only fields, asked of the registry) and its own fields (`DrafterConfig.head`) are part of it, so a
drafter no registered family replays is refused by name rather than replayed as another family. What differs per
family (its name, alignment, candidates, default target layers) is read from its `FamilySpec`.
`context_limits(raw)` names the context positions past which a drafter sees its context differently (sliding
window, scaled RoPE's trained range, the declared maximum). Torch-free: pages read configs without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import CheckpointError
from .fields import family_of, head_fields
from .registry import spec_of

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
    family: str = "dflash"  # drafter family: a registry key, dflash | dspark | domino | dflash2 | ... (`family_of`)
    head: dict = field(default_factory=dict)  # the family's own validated fields (`fields.head_fields`)

    @property
    def K(self) -> int:  # number of feature layers
        return len(self.target_layer_ids)

    @property
    def family_name(self) -> str:  # shown to users: DFlash, DSpark, Domino, DFlash2, ...
        return spec_of(self.family).name

    @property
    def first_slot(self) -> int:
        """The block slot whose state drafts the token at anchor + 1: 1 (DFlash), 0 for the families that draft
        from the anchor's slot (DSpark with sample_from_anchor, Domino with shift_label): the family's spec."""
        return spec_of(self.family).first_slot(self.head)

    @property
    def drafts(self) -> int:
        """D: tokens drafted per block: B-1, or B for DSpark drafting from the anchor's slot (slots 0..B-1)."""
        return spec_of(self.family).drafts(self.head, self.block_size)

    @property
    def candidates(self) -> int:
        """Top-k candidates a replay keeps per slot at least: a selector's candidate count (DFlash2's
        selector_top_k, so that top-K headroom asks its own question: recall@1 against recall@K), else 0."""
        return spec_of(self.family).candidates(self.head)

    @property
    def width(self) -> int:
        """D + 1: the most tokens one verify step commits (the drafts and the target's bonus token). Every metric
        and walk takes this as its block size."""
        return self.drafts + 1


def default_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Evenly spaced target layer ids: round(1 + i*(N-4)/(n-1)); one draft layer: N//2."""
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


def parse_config(raw: dict) -> DrafterConfig:
    """Validate a config.json dict into a DrafterConfig; errors name the field and the expected value."""
    if not isinstance(raw, dict):
        raise CheckpointError("config.json: expected a JSON object")
    family = family_of(raw)
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
        ids = (spec_of(family).target_layers or default_layer_ids)(ntl, n)
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
        family=family,
        head=head_fields(family, raw, dcfg, H, V, B, nh, nkv),
    )


SLIDING_BLOCKS = ("causal", "bidirectional")  # sliding-layer block semantics a run can choose


def context_limits(raw: dict) -> list[tuple[int, str]]:
    """The context positions past which a drafter sees its context differently, from its config.json dict `raw`,
    in order: where its sliding-attention layers stop seeing the start (the window), where scaled RoPE leaves the
    positions it was trained on (`original_max_position_embeddings`), and the longest context the config declares
    (`max_position_embeddings`, when it declares one). A long trace whose acceptance falls at one of them names a
    likely cause. Raises CheckpointError for a config `parse_config` refuses."""
    c, out = parse_config(raw), []
    n = c.layer_types.count("sliding_attention")
    if n and c.sliding_window:
        out.append((c.sliding_window, f"sliding window {c.sliding_window:,} ({n} of {len(c.layer_types)} layers)"))
    scaling = c.rope_scaling or {}
    if scaling.get("original_max_position_embeddings"):
        kind, factor, orig = (
            scaling.get("rope_type", "?"),
            scaling.get("factor"),
            int(scaling["original_max_position_embeddings"]),
        )
        by = f" x{factor:g}" if isinstance(factor, (int, float)) else ""
        out.append((orig, f"RoPE {kind}{by} past {orig:,}"))
    if "max_position_embeddings" in raw:  # else parse_config's default, which no one declared
        out.append((c.max_position_embeddings, f"max_position_embeddings {c.max_position_embeddings:,}"))
    return sorted(set(out))


def sliding_semantics(c: DrafterConfig, choice: str | None = None) -> str:
    """The sliding-layer block semantics of a run: `choice` when given, else the config's own (`is_causal`,
    default causal: what SpecForge trains and SGLang serves; bidirectional is the z-lab HF reference)."""
    if choice is None:
        return "causal" if c.sliding_causal else "bidirectional"
    if choice not in SLIDING_BLOCKS:
        raise CheckpointError(f"--sliding-block {choice!r}: expected one of {', '.join(SLIDING_BLOCKS)}")
    return choice
