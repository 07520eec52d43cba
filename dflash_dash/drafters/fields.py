"""What sets the block drafter families apart in a config.json and a state dict: family detection, each family's
own fields, the tensors those fields add, and the legacy tensor names SpecForge still loads.

Contract: torch-free. `family_of(raw)` names the family a config describes ("dflash", "dspark", "domino",
"dflash2") from `architectures`, `dflash_config.projector_type` and family-only fields, or raises
`CheckpointError` naming the drafter it refuses (EAGLE, P-EAGLE, speculators-format, DeepSeek-V4 DSpark, ...).
`head_fields(family, raw, ...)` validates that family's fields into a plain dict (the `DrafterConfig.head`), errors
naming the field; `extra_shapes(c)` lists the tensors the family adds to DFlash's; `rename_legacy(key)` maps
SpecForge's `logit_head.*` names. The semantics of every field are in docs/families.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import CheckpointError

if TYPE_CHECKING:
    from .config import DrafterConfig

FAMILY_NAMES = {"dflash": "DFlash", "dspark": "DSpark", "domino": "Domino", "dflash2": "DFlash2"}

ARCHITECTURES = {  # config.json `architectures` value (lower case) -> family
    "dflashdraftmodel": "dflash",
    "dsparkdraftmodel": "dspark",
    "qwen3dsparkmodel": "dspark",  # SGLang's normalised DSpark export
    "dominodraftmodel": "domino",
    "dflash2draftmodel": "dflash2",
}
PROJECTORS = ("dflash", "dspark", "domino", "dflash2")  # dflash_config.projector_type values

REFUSED_ARCHITECTURES = {  # not block drafters, or block drafters with other tensors
    "llamaforcausallmeagle3": "EAGLE-3 (not a block drafter)",
    "llamaforcausallmeagle": "EAGLE (not a block drafter)",
    "peagledraftmodel": "P-EAGLE (not a block drafter)",
    "dflashlineardraftmodel": "SpecForge's linear-context DFlash (other attention tensors)",
    "dflash2lineardraftmodel": "SpecForge's linear-context DFlash2 (other attention tensors)",
}
REFUSED_FIELDS = {  # field anywhere in the config -> the drafter it belongs to
    "speculators_model_type": "a speculators-format drafter (another tensor layout)",
    "dspark_markov_rank": "DeepSeek-V4 DSpark (an MTP-stack drafter)",
    "dspark_block_size": "DeepSeek-V4 DSpark (an MTP-stack drafter)",
    "draft_vocab_size": "EAGLE-3 (draft vocabulary)",
    "attention_modes": "SpecForge's per-layer attention modes (other attention tensors)",
}
OWN_FIELDS = {  # fields that belong to one family: on another family's config they are an error
    "dspark": ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov"),
    "domino": ("emb_dim", "gru_hidden_dim", "pure_draft_prefix_len", "shift_label"),
    "dflash2": ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"),
}
DFLASH2_FIELDS = OWN_FIELDS["dflash2"]
MARKOV_TYPES = ("vanilla", "gated", "rnn")

LEGACY = {  # SpecForge `normalize_draft_head_checkpoint_keys`: early Domino/DSpark heads under `logit_head`
    "logit_head.prefix_gru.": "prefix_gru.",
    "logit_head.embed_proj.": "embed_proj.",
    "logit_head.markov_head.": "markov_head.",
    "logit_head.confidence_head.": "confidence_head.",
}


def _places(raw: dict, dcfg: dict) -> list[tuple[str, dict]]:
    """Where a family field may be written: dflash_config, SpecForge's newer dspark_config, the top level (engines
    and exporters write any of them)."""
    dsp = raw.get("dspark_config") if isinstance(raw.get("dspark_config"), dict) else {}
    return [("dflash_config.", dcfg), ("dspark_config.", dsp), ("", raw)]


def _get(raw: dict, dcfg: dict, key: str, default: Any = None) -> Any:
    """A field read wherever it is written (`_places`); two places with different values is an error naming
    both."""
    found = [(where + key, d[key]) for where, d in _places(raw, dcfg) if d.get(key) is not None]
    for name, v in found[1:]:
        if v != found[0][1]:
            raise CheckpointError(f"config.json: {found[0][0]} = {found[0][1]!r} but {name} = {v!r}; they must agree")
    return found[0][1] if found else default


def _present(raw: dict, dcfg: dict, key: str) -> bool:
    return any(d.get(key) is not None for _, d in _places(raw, dcfg))


# ---------------------------------------------------------------------------
# detection


def family_of(raw: dict) -> str:
    """The registry key of the family `raw` describes; CheckpointError naming any drafter this tool refuses."""
    archs = raw.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if not isinstance(archs, list):
        raise CheckpointError(f"config.json: architectures = {archs!r}, expected a list like [\"DFlashDraftModel\"]")
    dcfg = raw.get("dflash_config") if isinstance(raw.get("dflash_config"), dict) else {}
    for key, what in REFUSED_FIELDS.items():
        if _present(raw, dcfg, key):
            raise CheckpointError(f"config.json: field '{key}' belongs to {what}; dflash-dash replays {_FAMILIES}")
    fam = None
    for a in archs:
        low = str(a).lower()
        if low in REFUSED_ARCHITECTURES:
            raise CheckpointError(
                f"config.json: architectures {archs!r} is {REFUSED_ARCHITECTURES[low]}; dflash-dash replays {_FAMILIES}"
            )
        if low in ARCHITECTURES:
            fam = ARCHITECTURES[low]
        elif str(a).endswith("ForCausalLM"):
            raise CheckpointError(
                f"config.json: architectures {archs!r}: this is a target model folder (a causal LM), not a drafter "
                "checkpoint; pass it as --target and the drafter as --drafter"
            )
        else:
            raise CheckpointError(
                f"config.json: architectures {archs!r} is not a block drafter; dflash-dash replays {_FAMILIES}"
            )
    proj = dcfg.get("projector_type", raw.get("projector_type"))
    if proj is not None:
        if str(proj).lower() not in PROJECTORS:
            raise CheckpointError(
                f"config.json: dflash_config.projector_type = {proj!r} is unknown "
                f"(expected one of {', '.join(PROJECTORS)})"
            )
        p = str(proj).lower()
        if fam not in (None, "dflash", p) and p != "dflash":
            raise CheckpointError(
                f"config.json: dflash_config.projector_type = {proj!r} contradicts architectures {archs!r} "
                f"({FAMILY_NAMES[fam]}); fix one of them"
            )
        if p != "dflash":  # a projector type wins over a DFlashDraftModel architecture (SpecForge's normaliser)
            fam = p
    fam = fam or "dflash"
    if fam == "dflash" and any(_present(raw, dcfg, k) for k in DFLASH2_FIELDS):
        fam = "dflash2"  # SGLang serves DFlash2 from these fields on a DFlashDraftModel architecture
    for other, keys in OWN_FIELDS.items():
        hit = next((k for k in keys if other != fam and _get(raw, dcfg, k) not in (None, False, 0)), None)
        if hit:
            raise CheckpointError(
                f"config.json: field '{hit}' belongs to a {FAMILY_NAMES[other]} drafter but the config describes "
                f"{FAMILY_NAMES[fam]} (architectures {archs!r}); set architectures or dflash_config.projector_type "
                f"to the drafter's family"
            )
    if fam == "dflash" and _get(raw, dcfg, "sample_from_anchor"):
        raise CheckpointError(
            "config.json: sample_from_anchor = true on a DFlash drafter (DeepSpec's convention: drafts from the "
            "anchor's slot); dflash-dash replays DFlash with slot k drafting anchor + k only"
        )
    return fam


_FAMILIES = "block drafters of the DFlash family (DFlash, DSpark, Domino, DFlash2) only"


# ---------------------------------------------------------------------------
# each family's own fields


def _int(v: Any, key: str, lo: int, hi: int | None = None) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise CheckpointError(f"config.json: dflash_config.{key} = {v!r}, expected an integer {rng}")
    return v


def _bool(v: Any, key: str) -> bool:
    if not isinstance(v, bool):
        raise CheckpointError(f"config.json: dflash_config.{key} = {v!r}, expected true or false")
    return v


def _pos(v: Any, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise CheckpointError(f"config.json: dflash_config.{key} = {v!r}, expected a positive number")
    return float(v)


def head_fields(family: str, raw: dict, dcfg: dict, H: int, V: int, B: int, nh: int, nkv: int) -> dict:
    """The validated fields of `family` (empty for DFlash): the `DrafterConfig.head` dict."""
    if family == "dspark":
        return _dspark(raw, dcfg, H, nh, nkv)
    if family == "domino":
        return _domino(raw, dcfg, B)
    if family == "dflash2":
        return _dflash2(raw, dcfg, H, V, B)
    return {}


def _dspark(raw: dict, dcfg: dict, H: int, nh: int, nkv: int) -> dict:
    mode = _get(raw, dcfg, "attention_mode", "gqa")
    if mode not in ("gqa", "mha"):
        raise CheckpointError(
            f"config.json: dflash_config.attention_mode = {mode!r}: only gqa and mha DSpark drafters are replayed "
            "(mla/kda hold other attention tensors)"
        )
    if (mode == "mha") != (nkv == nh):
        raise CheckpointError(
            f"config.json: dflash_config.attention_mode = {mode!r} with {nh} query and {nkv} key/value heads "
            "(gqa needs fewer key/value heads, mha as many)"
        )
    rank = _int(_get(raw, dcfg, "markov_rank", 0), "markov_rank", 0)
    kind = str(_get(raw, dcfg, "markov_head_type", "vanilla")).lower()
    if kind not in MARKOV_TYPES:
        raise CheckpointError(
            f"config.json: dflash_config.markov_head_type = {kind!r}, expected one of {', '.join(MARKOV_TYPES)} "
            "(SGLang's cond/attn heads are not SpecForge's and are not replayed)"
        )
    alpha = _get(raw, dcfg, "confidence_head_alpha", 0.0)
    conf = _bool(_get(raw, dcfg, "enable_confidence_head", bool(alpha and alpha > 0)), "enable_confidence_head")
    with_markov = _bool(_get(raw, dcfg, "confidence_head_with_markov", False), "confidence_head_with_markov")
    if with_markov and conf and not rank:
        raise CheckpointError(
            "config.json: dflash_config.confidence_head_with_markov = true needs markov_rank > 0 (the head reads "
            "the Markov embedding of the previous token)"
        )
    anchor = _bool(_get(raw, dcfg, "sample_from_anchor", True), "sample_from_anchor")
    return {
        "markov_rank": rank,  # r: 0 = no Markov head
        "markov_head_type": kind,  # vanilla | gated | rnn
        "confidence": conf,  # a confidence head is present
        "confidence_with_markov": with_markov and conf,  # its input is [h ; W1[prev]]
        "sample_from_anchor": anchor,  # slot s drafts anchor + s + 1 (B drafts) rather than anchor + s
        "attention_mode": mode,
    }


def _domino(raw: dict, dcfg: dict, B: int) -> dict:
    for key in ("emb_dim", "gru_hidden_dim"):
        if not _present(raw, dcfg, key):
            raise CheckpointError(f"config.json: missing field 'dflash_config.{key}' (a Domino drafter needs it)")
    return {
        "emb_dim": _int(_get(raw, dcfg, "emb_dim"), "emb_dim", 1),  # E: width of the correction's bottleneck
        "gru_hidden_dim": _int(_get(raw, dcfg, "gru_hidden_dim"), "gru_hidden_dim", 1),  # G: prefix GRU state
        "pure_draft_prefix_len": _int(_get(raw, dcfg, "pure_draft_prefix_len", 0), "pure_draft_prefix_len", 0, B - 1),
        "shift_label": _bool(_get(raw, dcfg, "shift_label", False), "shift_label"),  # slot k-1 drafts anchor + k
    }


def _dflash2(raw: dict, dcfg: dict, H: int, V: int, B: int) -> dict:
    missing = [k for k in DFLASH2_FIELDS if not _present(raw, dcfg, k)]
    if missing:
        raise CheckpointError(
            f"config.json: a DFlash2 drafter needs dflash_config.{missing[0]} (convolutions and candidate selector "
            f"are configured together: {', '.join(DFLASH2_FIELDS)})"
        )
    T = _int(_get(raw, dcfg, "conv_kernel_size"), "conv_kernel_size", 1, B)
    group = _int(_get(raw, dcfg, "conv_group_size"), "conv_group_size", 1)
    if H % group:
        raise CheckpointError(f"config.json: dflash_config.conv_group_size = {group} does not divide hidden_size {H}")
    cap = _get(raw, dcfg, "final_logit_softcapping")
    return {
        "conv_kernel_size": T,  # taps of the block-local causal convolution
        "conv_group_size": group,  # channels sharing one dynamic kernel correction
        "selector_rank": _int(_get(raw, dcfg, "selector_rank"), "selector_rank", 1),  # R of the codebooks
        "selector_top_k": _int(_get(raw, dcfg, "selector_top_k"), "selector_top_k", 1, V),  # candidates per slot
        "output_multiplier": _pos(_get(raw, dcfg, "output_multiplier", 1.0), "output_multiplier"),
        "final_logit_softcapping": None if not cap else _pos(cap, "final_logit_softcapping"),
        "input_embedding_scale": _pos(_get(raw, dcfg, "input_embedding_scale", 1.0), "input_embedding_scale"),
    }


# ---------------------------------------------------------------------------
# tensors


def extra_shapes(c: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the tensors family `c.family` adds to DFlash's (state-dict names, no prefix)."""
    H, V, f = c.hidden_size, c.vocab_size, c.head
    out: dict[str, tuple[int, ...]] = {}
    if c.family == "dspark":
        r = f["markov_rank"]
        if r:
            out |= {"markov_head.markov_w1.weight": (V, r), "markov_head.markov_w2.weight": (V, r)}
            if f["markov_head_type"] == "gated":
                out |= {"markov_head.gate_proj.weight": (r, H + r), "markov_head.gate_proj.bias": (r,)}
            if f["markov_head_type"] == "rnn":
                out |= {"markov_head.joint_proj.weight": (3 * r, 2 * r + H), "markov_head.joint_proj.bias": (3 * r,)}
        if f["confidence"]:
            width = H + r if f["confidence_with_markov"] else H
            out |= {"confidence_head.proj.weight": (1, width), "confidence_head.proj.bias": (1,)}
    elif c.family == "domino":
        E, G = f["emb_dim"], f["gru_hidden_dim"]
        out |= {
            "prefix_gru.weight_ih_l0": (3 * G, H),
            "prefix_gru.weight_hh_l0": (3 * G, G),
            "embed_proj.0.weight": (E, H + G),
            "embed_proj.2.weight": (V, E),
        }
    elif c.family == "dflash2":
        T, R = f["conv_kernel_size"], f["selector_rank"]
        groups = H // f["conv_group_size"]
        for i in range(c.num_hidden_layers):
            for conv in ("attention_conv", "mlp_conv"):
                p = f"layers.{i}.{conv}."
                out |= {p + "base_kernel": (2, T, H), p + "kernel_projection.weight": (2 * T * groups, H)}
        out |= {
            "candidate_selector.predecessor_codebook": (V, R),
            "candidate_selector.successor_codebook": (V, R),
            "candidate_selector.hidden_projection.weight": (R, H),
        }
    return out


def rename_legacy(key: str) -> str:
    """The current name of a state-dict key: SpecForge's legacy `logit_head.*` prefixes, and the codebooks as an
    `nn.Embedding` re-save spells them (`...codebook.weight`)."""
    for old, new in LEGACY.items():
        if key.startswith(old):
            return new + key[len(old) :]
    if key.startswith("candidate_selector.") and key.endswith("_codebook.weight"):
        return key.removesuffix(".weight")
    return key
