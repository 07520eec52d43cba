"""The house rules of docs/architecture.md, checked on the source: imports inside `dflash_dash` only point
down the layer list, pages hold no torch and no SQL, only app.py and pages/ import streamlit, the pipeline and
`analysis` never import render or streamlit, nothing the app or the CLI runs imports the development tooling in
tools/, and, checked by running them, no page loads torch."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# top to bottom: a module may import only modules listed after it (docs/architecture.md's list, plus modules it
# does not name: demo beside jobs, parity over pipeline, vocab (token strings, for the pipeline's exports and
# the pages) under analysis, the stand-in's speculative decoder under the stand-in; launch, what `make run` runs,
# on top; ops, the operations' argument dataclasses, under the pipeline whose signatures take their defaults, and
# work, the worker specs ops re-exports, and fields, the checks of their values (names, URLs, devices, ...), under ops;
# target_info, the torch-free half of the target the pages use, under target; audit, the trainers' feature
# caches and their audit against the target's extraction, under the pipeline and above drafters and target)
ORDER = [
    "__main__",
    "launch",
    "cli",
    "cli_show",
    "jobs",
    "demo",
    "parity",
    "pipeline",
    "render",
    "analysis",
    "vocab",
    "ops",
    "work",
    "fields",
    "audit",
    "store",
    "engines",
    "server",
    "cache",
    "baselines",
    "replay",
    "metrics",
    "costs",
    "sampling",
    "walks",
    "drafters",
    "target",
    "target_info",
    "prompts",
    "config",
    "errors",
]


def imports(path: Path, package: str) -> set[str]:
    """First-level dflash_dash modules imported by `path` (relative or absolute, at any depth of the code)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x / from .x import y / from .. import x (demo/)
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod == "dflash_dash":
                out |= {a.name for a in node.names}
            elif mod.startswith("dflash_dash."):
                out.add(mod.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("dflash_dash.")}
    return out


def layer_of(path: Path) -> str:
    rel = path.relative_to(ROOT / "dflash_dash")
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def test_imports_point_down_the_layers():
    bad = []
    for f in sorted((ROOT / "dflash_dash").rglob("*.py")):
        me = layer_of(f)
        if me == "__init__":
            continue
        assert me in ORDER, f"{f}: module {me!r} has no place in the layer list; add it to ORDER"
        package = "dflash_dash" + (
            "." + ".".join(f.relative_to(ROOT / "dflash_dash").parts[:-1])
            if len(f.relative_to(ROOT / "dflash_dash").parts) > 1
            else ""
        )
        for dep in imports(f, package) - {me}:
            if dep not in ORDER or ORDER.index(dep) <= ORDER.index(me):
                bad.append(f"{f.relative_to(ROOT)} imports {dep} (layer {me} may import only lower layers)")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_an_upward_import(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("from .replay import Head\nfrom . import pipeline as p\nimport dflash_dash.render\n")
    assert imports(f, "dflash_dash") == {"replay", "pipeline", "render"}


def test_analysis_and_pipeline_never_import_render():
    """`analysis` is numpy and the registry only: no render, plotly, torch or streamlit import anywhere in its
    code (the chain walk and drafter checks, in torch modules, come through dflash_dash modules on first use); the
    pipeline, which keeps and exports analyses, never imports render (only pages draw)."""
    bad = []
    for f in sorted((ROOT / "dflash_dash" / "analysis").rglob("*.py")):
        package = "dflash_dash.analysis"
        found = ({"render"} & imports(f, package)) | ({"plotly", "torch", "streamlit"} & top_modules(f))
        bad += [f"{f.relative_to(ROOT)} imports {m}" for m in sorted(found)]
    pipeline = ROOT / "dflash_dash" / "pipeline"
    for f in sorted(pipeline.rglob("*.py")) if pipeline.is_dir() else [pipeline.with_suffix(".py")]:
        package = "dflash_dash.pipeline" if pipeline.is_dir() else "dflash_dash"
        if "render" in imports(f, package):
            bad.append(f"{f.relative_to(ROOT)} imports render")
    assert not bad, "\n".join(bad)


def test_the_render_checker_sees_a_nested_import(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from ..render.tokens import esc\n    import plotly.graph_objects as go\n")
    assert imports(f, "dflash_dash.analysis") == {"render"} and top_modules(f) == {"plotly"}


def test_pages_are_thin_and_only_they_import_streamlit():
    for f in [ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py"))]:
        tree = ast.parse(f.read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
            n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
        }
        assert not {m for m in mods if m.split(".")[0] in ("torch", "duckdb")}, f"{f} imports torch/duckdb"
        strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        assert not [s for s in strings if s.lstrip().upper().startswith(("SELECT ", "INSERT ", "UPDATE "))], f
    for f in sorted((ROOT / "dflash_dash").rglob("*.py")):
        assert "import streamlit" not in f.read_text(), f"{f} imports streamlit"


def top_modules(path: Path) -> set[str]:
    """Top-level names of the absolute imports in `path`, at any depth of the code."""
    tree = ast.parse(path.read_text())
    return {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
        n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level
    }


def test_the_runtime_never_imports_tools():
    runtime = [ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py")), *sorted((ROOT / "dflash_dash").rglob("*.py"))]
    bad = [str(f.relative_to(ROOT)) for f in runtime if "tools" in top_modules(f)]
    assert not bad, f"{bad} import the development tooling in tools/; move what the runtime needs into dflash_dash/"
    assert (ROOT / "tools" / "tiny.py").is_file() and (ROOT / "tools" / "demo" / "make_assets.py").is_file()
    # a module of the demo package is part of the demo build (`demo` imports it); a script that only makes the
    # assets belongs in tools/demo/
    demo = ROOT / "dflash_dash" / "demo"
    used = imports(demo / "__init__.py", "dflash_dash.demo") | {
        a.name
        for n in ast.walk(ast.parse((demo / "__init__.py").read_text()))
        if isinstance(n, ast.ImportFrom)
        if n.level == 1 and not n.module
        for a in n.names
    }
    loose = [f.name for f in demo.glob("*.py") if f.name != "__init__.py" and f.stem not in used]
    assert not loose, f"{loose}: development scripts belong in tools/demo/, not in the runtime package"


def test_the_tools_checker_sees_an_import(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from tools.tiny import TinyTarget\nimport tools.demo.corpus\n")
    assert top_modules(f) == {"tools"}


def test_the_pipeline_never_imports_streamlit():
    pipeline = ROOT / "dflash_dash" / "pipeline"
    files = sorted(pipeline.rglob("*.py")) if pipeline.is_dir() else [pipeline.with_suffix(".py")]
    bad = [str(f.relative_to(ROOT)) for f in files if {"streamlit", "plotly"} & top_modules(f)]
    assert not bad, f"{bad} import streamlit/plotly: only pages draw"


PAGE_RUN = """
import json, sys
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(sys.argv[1], default_timeout=300)
if sys.argv[2] != "overview":
    at.switch_page(f"pages/{sys.argv[2]}.py")
at.run()
heavy = sorted(m for m in ("torch", "transformers", "safetensors") if m in sys.modules)
print(json.dumps({"title": [t.value for t in at.title], "exceptions": [e.value for e in at.exception], "heavy": heavy}))
"""


@pytest.mark.parametrize(
    "page", ["overview", "acceptance", "compare", "completions", "extraction", "diagnostics", "conformance"]
)
def test_no_page_loads_torch(prepared, tmp_path, page):
    """Each page run whole (a first visit, app.py routing it, on the prepared workspace: token strings, the
    checkpoint-vs-extraction check, the GPU list) in a fresh process: neither torch nor transformers gets imported.
    The pages read the store, configs and tokenizers; only jobs (separate processes) load models."""
    import json
    import shutil
    import subprocess
    import sys

    ws = tmp_path / "ws"
    shutil.copytree(prepared.workspace, ws, ignore=shutil.ignore_patterns("*.lock"))
    env = {**os.environ, "DFLASH_WORKSPACE": str(ws)}
    p = subprocess.run(
        [sys.executable, "-c", PAGE_RUN, str(ROOT / "app.py"), page],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert not got["exceptions"], got
    assert got["title"], got  # the page rendered
    assert got["heavy"] == [], f"pages/{page}.py loaded {got['heavy']}"


MAX_LINES = 500  # a product module past this holds more than one concern: split it by concern


def test_no_product_module_is_over_the_line_cap():
    """Every module of the product (the package, the pages, app.py, the development tools) stays under MAX_LINES,
    so a reader takes in one concern at a time (tests and benchmarks are left out: their fixtures run long)."""
    files = [*(ROOT / "dflash_dash").rglob("*.py"), *(ROOT / "pages").glob("*.py"), ROOT / "app.py"]
    files += list((ROOT / "tools").rglob("*.py"))
    over = {str(f.relative_to(ROOT)): n for f in files if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not over, f"over {MAX_LINES} lines: {over}"
