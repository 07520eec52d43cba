"""The demo's checkpoints list (MANIFEST.json `checkpoints`) and the story the Overview tells from it, without
building the demo: a fake demo workspace (the manifest and checkpoint folders with a config.json each) and run rows.

Checks that `demo.checkpoints` follows the list's order and refuses a malformed list by naming the entry, that
`demo.story` picks the runs each sentence links (the final's on the serving-matching extraction, each bug's
reference on the bug's own extraction), and that `render.story.story_html` escapes the manifest's text and
percent-encodes the ids in its links.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_dash import demo
from dflash_dash.render.story import story_html
from dflash_dash.store import Run

ENTRIES = [
    {"dir": "healthy/step0038", "name": "early-step38", "role": "early", "bug": None, "what": "barely trained"},
    {"dir": "healthy/step0400", "name": "mid-step400", "role": "series", "bug": None, "what": "half way"},
    {"dir": "healthy/step1850", "name": "final-step1850", "role": "final", "bug": None, "what": "served <well>"},
    {"dir": "bugs/soft-kl", "name": "soft&kl", "role": "bug", "bug": "soft_kl", "what": 'a "soft" KL loss'},
]


def fake_demo(ws: Path, entries: list[dict] = ENTRIES) -> Path:
    root = ws / "demo"
    for e in entries:
        (root / demo.CHECKPOINTS / e["dir"]).mkdir(parents=True, exist_ok=True)
        (root / demo.CHECKPOINTS / e["dir"] / "config.json").write_text("{}")
    (root / "MANIFEST.json").write_text(json.dumps({"checkpoints": entries}))
    return root / demo.CHECKPOINTS


def run(i: int, ws: Path, d: str, ex: str, backend: str) -> Run:
    ck = str((ws / "demo" / demo.CHECKPOINTS / d).resolve())
    return Run(f"r{i}&x", checkpoint=ck, extraction_id=ex, backend=backend)


def test_checkpoints_follow_the_manifest_and_refuse_a_bad_list(tmp_path):
    root = fake_demo(tmp_path)
    cks = demo.checkpoints(root)
    assert [(c.name, c.role, c.bug) for c in cks] == [(e["name"], e["role"], e["bug"]) for e in ENTRIES]
    assert demo.final(cks).path == (root / "healthy" / "step1850").resolve()
    assert demo.served_drafter(tmp_path) == demo.final(cks).path
    assert demo.series_folder(tmp_path) == str((root / demo.SERIES).resolve())
    bad = [dict(ENTRIES[0], role="bug")]  # a bug role without a bug name
    with pytest.raises(demo.DemoError, match=r"checkpoints\[0\].*bug"):
        demo.checkpoints(fake_demo(tmp_path / "b1", bad))
    with pytest.raises(demo.DemoError, match="exactly one entry with role final"):
        demo.checkpoints(fake_demo(tmp_path / "b2", ENTRIES[:2]))
    (root / "bugs" / "soft-kl" / "config.json").unlink()
    with pytest.raises(demo.DemoError, match="soft-kl holds no config.json"):
        demo.checkpoints(root)
    assert demo.served_drafter(tmp_path) is None and demo.story(tmp_path, []) is None


def test_story_links_the_view_that_reveals_each_checkpoint(tmp_path):
    fake_demo(tmp_path)
    runs = [run(i, tmp_path, e["dir"], "ex-t", "torch") for i, e in enumerate(ENTRIES)]
    runs.append(run(9, tmp_path, "healthy/step1850", "ex-f", "fla"))  # the final also on the fla extraction
    s = demo.story(tmp_path, runs)
    assert s["final"]["run"] == "r9&x"  # what serving sees: the fla extraction's run
    assert [e["name"] for e in s["series"]] == ["early-step38", "mid-step400", "final-step1850"]
    assert [e["step"] for e in s["series"]] == [38, 400, 1850]
    assert s["bugs"] == [
        {"name": "soft&kl", "what": 'a "soft" KL loss', "step": None, "run": "r3&x", "ref": "r2&x"}
    ]  # the reference: the final checkpoint on the bug run's own extraction
    h = story_html(s)
    assert h.count("<li>") == 3
    assert 'href="acceptance?run=r9%26x"' in h
    assert 'href="diagnostics?sig_run=r3%26x&amp;sig_ref=r2%26x"' in h
    assert f'href="compare?sweep={s["folder"].replace("/", "%2F")}"' in h
    assert "<code>final-step1850</code>: served &lt;well&gt;." in h
    assert "<code>soft&amp;kl</code>: a &quot;soft&quot; KL loss." in h
    assert "<well>" not in h and "steps 38 to 1,850" in h
    s["bugs"][0]["run"] = None  # not replayed yet: named, no link
    assert "signature against the final one (not replayed yet)" in story_html(s)
