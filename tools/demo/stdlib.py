"""Real Python source for the demo corpus: the functions of the Python standard library that runs the build
(PSF licence, Python Software Foundation License Version 2, which allows copying, training on and redistributing
derived works with the notice kept; the notice travels in the manifest's `prepare.stdlib` record).

Contract: `functions(root)` walks the standard library under `root` (default: this interpreter's), skipping its
tests, IDLE, lib2to3, tkinter, turtledemo and site-packages, and returns every function and method (source segment,
dedented, ASCII, 80..2500 characters) as (module, prompt, body): the prompt is a `# comment` made of the docstring's
first line (when there is one) plus the `def` line(s), as the coding-10 prompts are written, and the body the rest
(the docstring left out); or, for about half of the functions with a docstring of at most DOC_LINES lines (chosen by
a hash of module and name), the `def` line(s) and the docstring as written, as HumanEval's prompts are.
`split(docs, held_out)` separates them by module, seeded by the module's name, so the
target trains on one part and the drafter's prompts come from modules the target never read. Deterministic.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sysconfig
import textwrap

SKIP = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo", "ensurepip", "tkinter", "pydoc_data"}
Doc = tuple[str, str, str]  # (module, prompt, body)
DOC_LINES = 12  # a docstring kept in the prompt (HumanEval's form) has at most this many lines


def root() -> str:
    return sysconfig.get_paths()["stdlib"]


def _doc(src: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef, mod: str = "") -> tuple[str, str] | None:
    """(prompt, body) of one function of a file's lines `src`, or None when it does not qualify."""
    if node.end_lineno - node.lineno > 80:
        return None
    seg = "".join(src[node.lineno - 1 : node.end_lineno])
    if not seg.isascii() or not 80 < len(seg) < 2500 or "\t" in seg:
        return None
    lines = textwrap.dedent(seg).splitlines(keepends=True)
    first = node.body[0]
    head_end = first.lineno - node.lineno  # the lines of the def (decorators excluded: segment starts at def)
    if head_end < 1 or head_end >= len(lines):
        return None
    head, rest = "".join(lines[:head_end]), lines[head_end:]
    comment = ""
    doc = ast.get_docstring(node)
    if doc is not None and isinstance(first, ast.Expr):
        end = first.end_lineno - node.lineno + 1  # the lines up to the docstring's last
        rest = lines[end:]
        if end - head_end <= DOC_LINES and _kept(f"{mod}:{node.name}"):  # HumanEval's form: def + docstring
            head = "".join(lines[:end])
            body = "".join(rest)
            return (head, body if body.endswith("\n") else body + "\n") if len(body.strip()) >= 20 else None
        line = doc.strip().splitlines()[0].strip() if doc.strip() else ""
        comment = f"# {line}\n" if line else ""
    body = "".join(rest)
    if len(body.strip()) < 20:
        return None
    return comment + head, body if body.endswith("\n") else body + "\n"


def _kept(key: str) -> bool:
    """Whether a function's docstring stays in its prompt: half of them, by a hash of `key`."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 2 == 0


def functions(where: str | None = None) -> list[Doc]:
    out: list[Doc] = []
    base = where or root()
    for dp, dn, fn in os.walk(base):  # top-down: the pruning below skips SKIP
        dn[:] = sorted(d for d in dn if d not in SKIP and not d.startswith("__"))
        for f in sorted(fn):
            if not f.endswith(".py"):
                continue
            path = os.path.join(dp, f)
            mod = os.path.relpath(path, base)
            try:
                src = open(path, encoding="utf-8").read()
                tree = ast.parse(src)
                lines = src.splitlines(keepends=True)
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    d = _doc(lines, node, mod)
                    if d:
                        out.append((mod, *d))
    return out


def split(docs: list[Doc], held_out: float = 0.1) -> tuple[list[Doc], list[Doc]]:
    """(train, held out) by module: a module is held out when the hash of its name falls in `held_out`."""

    def out(mod: str) -> bool:
        return int(hashlib.sha256(mod.encode()).hexdigest()[:8], 16) / 2**32 < held_out

    return [d for d in docs if not out(d[0])], [d for d in docs if out(d[0])]
