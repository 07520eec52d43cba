"""The Feature audit section in the browser: a SpecForge capture (scripts/prepare_hidden_states.py's layout,
sgl-project/SpecForge @ a6b6b0230009: rows_0-2000/data_0.ckpt holding input_ids, loss_mask, hidden_states) of a
tiny target whose layer 1 was captured from hidden_states[1] (layer 0's output: the planted off-by-one) and layer 4
correctly, audited by the CLI; Diagnostics opened on the section shows the verdict naming the off-by-one and the
table's best layer offset -1 for layer 1, +0 for layer 4 (screenshot under out/screenshots/)."""

from __future__ import annotations

import pytest
import torch
from web import CHROMIUM, dashboard, drawn, open_page, shot

from dflash_dash.render.audit import audit_rows

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"Debian chromium is not installed at {CHROMIUM}")


ROW = dict.fromkeys(
    ["layer", "kind", "fault", "rel_l2", "cosine", "zero_share", "nonfinite_share", "best_offset", "best_shift"]
    + ["best_rel_l2", "neighbour_rel_l2", "scale", "finding"]
)  # a report row's keys, to read the section's column names from render.audit


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from dflash_dash import cli, target as target_mod
    from tools import tiny

    base = tmp_path_factory.mktemp("e2e-audit")
    tgt = tiny.write_target(base / "target")
    target_mod.force_torch_kernels()
    ids = torch.randint(4, 500, (48,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hs = AutoModelForCausalLM.from_pretrained(tgt).eval().model(input_ids=ids[None], output_hidden_states=True)
    h = [x[0] for x in hs.hidden_states]
    cap = base / "capture" / "rows_0-2000"
    cap.mkdir(parents=True)
    planted = torch.cat([h[1], h[5]], dim=-1)  # layer 1 <- hidden_states[1] (off by one), layer 4 <- hidden_states[5]
    torch.save(
        {"input_ids": ids, "loss_mask": torch.ones_like(ids), "hidden_states": planted[None]}, cap / "data_0.ckpt"
    )
    ws = base / "ws"
    args = ["--workspace", str(ws), "audit", "--features", str(cap.parent), "--target", str(tgt), "--layers", "1,4"]
    assert cli.main(args) == 1  # faulty
    with dashboard(ws, base) as url:
        yield {"url": url}


def test_the_audit_section_names_the_planted_off_by_one(env, page):
    open_page(page, env, "diagnostics?section=audit", "Diagnostics")
    page.get_by_role("heading", name="Feature audit").wait_for()
    alert = page.locator("[data-testid=stAlert]").filter(has_text="layer 1's features are layer 0's output").first
    alert.wait_for()
    assert "the capture reads hidden_states[l] for layer l" in alert.inner_text()
    table = page.locator("[data-testid=stDataFrame]").filter(has_text="best layer offset").first
    table.scroll_into_view_if_needed()
    drawn(page)
    cols = list(audit_rows({"rows": [ROW]})[0])  # the section's columns, in order
    rows = {}
    for tr in table.locator("tr").all():  # the grid's accessible table (hidden): one tr per row
        tds = [c.strip() for c in tr.locator("td").all_text_contents()]
        if len(tds) == len(cols):
            rows[tds[0]] = dict(zip(cols, tds))
    assert rows["1"]["best layer offset"] == "-1" and rows["1"]["finding"] == "offset", rows
    assert rows["4"]["best layer offset"] == "+0" and rows["4"]["finding"] == "exact", rows
    shot(page, "diagnostics-audit", focus='[data-testid=stDataFrame]:has-text("best layer offset")')
