"""What sets the block drafter families apart in a config.json and a state dict, asked of the family registry:
family detection, each family's own fields, the tensors those fields add, and the legacy names SpecForge loads.

Contract: torch-free, and no family named here: every answer comes from the registered `FamilySpec`s
(`registry`). `family_of(raw)` names the family a config describes from `architectures`,
`dflash_config.projector_type` and family-only fields, or raises `CheckpointError` naming the drafter it refuses
(EAGLE, P-EAGLE, speculators-format, DeepSeek-V4 DSpark, ...) or the unregistered architecture and the fix.
`head_fields(family, raw, ...)` validates that family's fields into a plain dict (the `DrafterConfig.head`), errors
naming the field; `extra_shapes(c)` lists the tensors the family adds to DFlash's; `rename_legacy(key)` maps
legacy state-dict names to current ones. The semantics of every field are in docs/families.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import registry
from .errors import CheckpointError
from .spec import Fields

if TYPE_CHECKING:
    from .config import DrafterConfig

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


def _dcfg(raw: dict[str, Any]) -> dict[str, Any]:
    got = raw.get("dflash_config")
    return got if isinstance(got, dict) else {}


def _replayed() -> str:
    return f"block drafters of the DFlash family ({registry.names()}) only"


# ---------------------------------------------------------------------------
# detection


def family_of(raw: dict[str, Any]) -> str:
    """The registry key of the family `raw` describes; CheckpointError naming any drafter this tool refuses."""
    archs = raw.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if not isinstance(archs, list):
        raise CheckpointError(f"config.json: architectures = {archs!r}, expected a list like [\"DFlashDraftModel\"]")
    f = Fields(raw, _dcfg(raw))
    for key, what in REFUSED_FIELDS.items():
        if f.present(key):
            raise CheckpointError(f"config.json: field '{key}' belongs to {what}; dflash-dash replays {_replayed()}")
    fam = None
    for a in archs:
        low = str(a).lower()
        if low in REFUSED_ARCHITECTURES:
            raise CheckpointError(
                f"config.json: architectures {archs!r} is {REFUSED_ARCHITECTURES[low]}; dflash-dash replays "
                f"{_replayed()}"
            )
        spec = registry.by_architecture(str(a))
        if spec is not None:
            fam = spec.key
        elif str(a).endswith("ForCausalLM"):
            raise CheckpointError(
                f"config.json: architectures {archs!r}: this is a target model folder (a causal LM), not a drafter "
                "checkpoint; pass it as --target and the drafter as --drafter"
            )
        else:
            raise CheckpointError(
                f"config.json: architectures {archs!r} is not a block drafter; dflash-dash replays {_replayed()} "
                f"(a new family registers a FamilySpec: {registry.RECIPE})"
            )
    fam = _projected(raw, f, archs, fam) or registry.BASE
    if fam == registry.BASE:  # a family turned on by its fields on a DFlashDraftModel (SGLang's DFlash2)
        fam = next((s.key for s in registry.specs() if any(f.present(k) for k in s.implied_by)), fam)
    for other in registry.specs():
        hit = next((k for k in other.own_fields if other.key != fam and f.get(k) not in (None, False, 0)), None)
        if hit:
            raise CheckpointError(
                f"config.json: field '{hit}' belongs to a {other.name} drafter but the config describes "
                f"{registry.spec_of(fam).name} (architectures {archs!r}); set architectures or "
                "dflash_config.projector_type to the drafter's family"
            )
    spec = registry.spec_of(fam)
    if spec.refuse is not None:
        spec.refuse(f)
    return fam


def _projected(raw: dict[str, Any], f: Fields, archs: list[Any], fam: str | None) -> str | None:
    """The family after `projector_type`: it wins over the base architecture (SpecForge's normaliser writes a
    Domino as DFlashDraftModel + projector_type domino) and must not contradict another one."""
    proj = f.dcfg.get("projector_type", raw.get("projector_type"))
    if proj is None:
        return fam
    projectors = {s.projector: s.key for s in registry.specs() if s.projector}
    p = str(proj).lower()
    if p not in projectors:
        raise CheckpointError(
            f"config.json: dflash_config.projector_type = {proj!r} is unknown (expected one of {', '.join(projectors)})"
        )
    named = projectors[p]
    if fam not in (None, registry.BASE, named) and named != registry.BASE:
        raise CheckpointError(
            f"config.json: dflash_config.projector_type = {proj!r} contradicts architectures {archs!r} "
            f"({registry.spec_of(fam).name}); fix one of them"
        )
    return fam if named == registry.BASE else named


# ---------------------------------------------------------------------------
# each family's own fields and tensors


def head_fields(
    family: str, raw: dict[str, Any], dcfg: dict[str, Any], H: int, V: int, B: int, nh: int, nkv: int
) -> dict[str, Any]:
    """The validated fields of `family` (empty for one without fields): the `DrafterConfig.head` dict."""
    spec = registry.spec_of(family)
    return spec.head(Fields(raw, dcfg, H, V, B, nh, nkv)) if spec.head else {}


def extra_shapes(c: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the tensors family `c.family` adds to DFlash's (state-dict names, no prefix)."""
    spec = registry.spec_of(c.family)
    return spec.extra_shapes(c) if spec.extra_shapes else {}


def rename_legacy(key: str) -> str:
    """The current name of a state-dict key under any family's legacy names (SpecForge's `logit_head.*`
    prefixes, the codebooks as an `nn.Embedding` re-save spells them)."""
    for spec in registry.specs():
        if spec.rename is not None and (new := spec.rename(key)) != key:
            return new
    return key
