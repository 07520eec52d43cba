"""A drafter family plugged in from this file alone: ToyFlash, DFlash's backbone plus a logit bias [V] scaled by
its own config field, is declared in one `FamilySpec`, registered, written as a tiny seeded checkpoint and
replayed through `drafters.load` and `replay.every_anchor` (what the replay operation runs). With a zero bias it
replays token for token as the DFlash checkpoint of the same backbone; a planted bias moves every draft to the
planted token; its field is validated and owned; unregistered, its checkpoints and its key are refused in one
line naming it and the fix. Also: importing `dflash_dash.drafters`, listing the families and reading configs
import no torch, and docs/families.md's "Adding a family" matches `FamilySpec`."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from synthetic import random_head

from dflash_dash import drafters as dr, replay as rp
from dflash_dash.drafters.dflash import DFlash
from dflash_dash.drafters.readout import lm_top, slot_tap
from dflash_dash.errors import UserError
from tools import tiny

ROOT = Path(__file__).resolve().parents[1]
BIAS = "toy_head.bias"  # the one tensor ToyFlash adds: a logit bias [V]


class ToyFlash(DFlash):
    """DFlash whose drafts read LM(h) + bias_scale * bias."""

    def read_out(self, head, h, anchor_ids, topk, slots=None, tap=None):
        lo, hi = slots or (0, self.c.drafts)
        f, N, S = self.c.first_slot, h.shape[0], hi - lo
        bias = self.w.extra[BIAS] * self.c.head["bias_scale"]
        x = h[:, f + lo : f + hi].reshape(N * S, -1)
        drafts, ids, logp = lm_top(head, x, topk, lambda r0, r1: bias.expand(r1 - r0, -1), slot_tap(tap, None, S, lo))
        return drafts.view(N, S), ids.view(N, S, topk), logp.view(N, S, topk)


def head(f: dr.Fields) -> dict:
    return {"bias_scale": f.positive("bias_scale", 1.0)}


SPEC = dr.FamilySpec(
    key="toyflash",
    name="ToyFlash",
    architectures=("ToyFlashDraftModel",),
    model=ToyFlash,
    own_fields=("bias_scale",),
    head=head,
    extra_shapes=lambda c: {BIAS: (c.vocab_size,)},
)


@pytest.fixture
def toy():
    dr.register(SPEC)
    yield SPEC
    if SPEC.key in [s.key for s in dr.specs()]:
        dr.unregister(SPEC.key)


def toy_drafter(**fields) -> tiny.TinyDrafter:
    return tiny.TinyDrafter(seed=5, architecture="ToyFlashDraftModel", family_fields=fields)


def write(folder: Path, d: tiny.TinyDrafter, state: dict) -> Path:
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(tiny.drafter_config(d)))
    return folder


def pair(tmp_path: Path, bias: torch.Tensor, scale: float = 1.0) -> tuple[Path, Path]:
    """A ToyFlash checkpoint and the DFlash checkpoint of the same backbone (DFlash's tensors, same values)."""
    d = toy_drafter(bias_scale=scale)
    state = tiny.weights(d)
    state[BIAS] = bias
    plain = dataclasses.replace(d, architecture="DFlashDraftModel", family_fields={})
    base = {k: v for k, v in state.items() if k != BIAS}
    return write(tmp_path / "toy", d, state), write(tmp_path / "dflash", plain, base)


def sequences(n: int = 2, T: int = 28, P: int = 6) -> list[rp.Sequence]:
    g = torch.Generator().manual_seed(2)
    return [
        rp.Sequence(f"p{i}", torch.randint(10, 500, (T,), generator=g), P, torch.randn(T, 128, generator=g))
        for i in range(n)
    ]


def replayed(path: Path):
    return rp.every_anchor(dr.load(path), random_head(), sequences(), budget=4, chunk=8)


def test_toy_family_replays_like_dflash_of_the_same_backbone(toy, tmp_path):
    toy_ck, dflash_ck = pair(tmp_path, torch.zeros(512), scale=3.0)
    m = dr.load(toy_ck)
    assert type(m) is ToyFlash and m.c.family == "toyflash" and m.c.family_name == "ToyFlash"
    assert m.c.head == {"bias_scale": 3.0} and m.width == 4
    got, got_sum = replayed(toy_ck)
    want, want_sum = replayed(dflash_ck)
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a.drafts, b.drafts) and np.array_equal(a.accepted_at, b.accepted_at)
        assert a.rounds == b.rounds and np.allclose(a.draft_logp, b.draft_logp, atol=1e-5)
    assert got_sum == want_sum and (got[0].drafts >= 0).all() and len(np.unique(got[0].drafts)) > 5


def test_toy_family_head_is_what_drafts(toy, tmp_path):
    """A planted bias on token 77, strong only once scaled by the family's field, makes every draft 77: the
    head tensor and the field both reach the replay."""
    bias = torch.zeros(512)
    bias[77] = 50.0
    weak_ck, _ = pair(tmp_path / "weak", bias, scale=1e-3)
    strong_ck, _ = pair(tmp_path / "strong", bias, scale=10.0)
    weak, _ = replayed(weak_ck)
    strong, _ = replayed(strong_ck)
    assert all((p.drafts == 77).all() for p in strong)
    assert not all((p.drafts == 77).all() for p in weak)
    assert dr.flops_per_block(dr.read_config(strong_ck), 100, 512) > 0  # DFlash's count when none is declared


def test_toy_family_fields_are_validated_and_owned(toy, tmp_path):
    with pytest.raises(dr.CheckpointError, match=r"dflash_config.bias_scale = -1, expected a positive number"):
        dr.parse_config(tiny.drafter_config(toy_drafter(bias_scale=-1)))
    plain = tiny.drafter_config(tiny.TinyDrafter(family_fields={"bias_scale": 2.0}))
    with pytest.raises(dr.CheckpointError, match="'bias_scale' belongs to a ToyFlash drafter but the config describes"):
        dr.parse_config(plain)
    d = toy_drafter()
    state = tiny.weights(d)
    del state[BIAS]
    with pytest.raises(dr.CheckpointError, match=f"missing tensor '{BIAS}'"):
        dr.load(write(tmp_path / "cut", d, state))


def test_unregistered_family_is_refused_naming_it_and_the_fix(toy, tmp_path):
    toy_ck, _ = pair(tmp_path, torch.zeros(512))
    dr.unregister("toyflash")
    with pytest.raises(UserError, match=r"'ToyFlashDraftModel'\] is not a block drafter.*Adding a family"):
        dr.load(toy_ck)
    with pytest.raises(UserError, match=r"family 'toyflash' is not registered.*register.*Adding a family"):
        dr.spec_of("toyflash")
    assert [s.key for s in dr.specs()] == ["dflash", "dspark", "domino", "dflash2"]
    dr.register(SPEC)
    with pytest.raises(ValueError, match="architecture toyflashdraftmodel already names family 'toyflash'"):
        dr.register(dataclasses.replace(SPEC, key="toy2"))


def test_drafters_import_no_torch():
    code = (
        "import sys, dflash_dash.drafters as dr; assert 'torch' not in sys.modules; "
        "assert [s.name for s in dr.specs()] == ['DFlash', 'DSpark', 'Domino', 'DFlash2']; "
        "assert 'torch' not in sys.modules, 'a family spec imported torch'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr


def test_adding_a_family_recipe_matches_the_code():
    """docs/families.md's recipe: its example's SPEC registers and parses a config of its family, and the example
    and the field table together name every `FamilySpec` field."""
    text = (ROOT / "docs/families.md").read_text()
    section = text.split("## Adding a family", 1)[1].split("\n## ", 1)[0]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(example, "docs/families.md", "exec"), scope)
    dr.register(scope["SPEC"])
    try:
        raw = tiny.drafter_config(toy_drafter(bias_scale=2.0))
        assert dr.parse_config(raw).head == {"bias_scale": 2.0}
    finally:
        dr.unregister(scope["SPEC"].key)
    for f in dataclasses.fields(dr.FamilySpec):  # each field set in the example or described in the table
        assert f"{f.name}=" in example or f"| `{f.name}` |" in section, f.name
