"""The demo's training corpus: the Python standard library's own sources, offline, deterministic.

Contract: `files()` lists the stdlib sources used (sorted; tests, tk, encodings tables and the like left
out); `samples(files, seed)` turns documented functions into comment-prompted documents (the docstring
summary as a `#` comment, then the function: the shape of the `coding-10` prompts) and chat samples (a
user request naming the function, the assistant answering with the source in a ```python fence);
`stream(tokenizer, ...)` tokenises all of them into one uint16 token stream, documents separated by
<|endoftext|> (raw files with their license / copyright header comments left out: `strip_header`), and
`stream(..., starts=True)` also returns where each document starts, by kind, so that training can put
document starts (the prompt/body boundary of the coding-10 shape) at a window's first position. The same
Python version gives the same bytes (its version and a hash of the file list go into the manifest). CPU
only; nothing here is downloaded.
"""

from __future__ import annotations

import ast
import hashlib
import random
import sysconfig
import textwrap
from pathlib import Path

import numpy as np

SKIP = (
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "site-packages",
    "turtledemo",
    "__pycache__",
    "ensurepip",
    "tkinter",
    "pydoc_data",
    "encodings",
)
ASKS = [  # user-request templates of the chat samples
    "Write a Python function `{sig}`. {doc}",
    "Implement `{sig}` in Python: {doc}",
    "Write a Python function {name} that does the following. {doc}",
    "{doc} Write it as a Python function `{sig}`.",
]


def stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def files() -> list[Path]:
    """The stdlib source files of the corpus, sorted."""
    root = stdlib()
    return sorted(p for p in root.rglob("*.py") if not any(part in SKIP for part in p.relative_to(root).parts))


def fingerprint(paths: list[Path]) -> str:
    """sha256 (first 16 hex) over relative names and contents: which corpus a model was trained on."""
    h = hashlib.sha256()
    root = stdlib()
    for p in paths:
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def read(p: Path) -> str:
    return p.read_text(encoding="utf-8", errors="replace")


# ---------------------------------------------------------------------------
# chat samples


def functions(src: str) -> list[dict]:
    """The public documented functions of `src`: name, signature, docstring summary, dedented source
    (`code`) and the same function without its docstring (`bare`, None when nothing else is left)."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return []
    lines = src.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if not doc or not 3 <= node.end_lineno - node.lineno + 1 <= 40:
            continue
        code = textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno])).rstrip()
        bare = None
        if len(node.body) > 1:
            head = lines[node.lineno - 1 : node.body[0].lineno - 1]
            body = lines[node.body[0].end_lineno : node.end_lineno]
            bare = textwrap.dedent("".join(head + body)).rstrip()
        summary = " ".join(doc.strip().split("\n\n")[0].split())[:240]
        out.append(
            {
                "name": node.name,
                "sig": f"{node.name}({ast.unparse(node.args)})",
                "doc": summary,
                "code": code,
                "bare": bare,
            }
        )
    return out


def comment(text: str, width: int = 88) -> str:
    """`text` as `# ` comment lines."""
    return "".join(f"# {line}\n" for line in textwrap.wrap(text, width - 2) or [""])


def samples(paths: list[Path], seed: int) -> tuple[list[str], list[tuple[str, str]]]:
    """From every documented public function: a comment-prompted document (the summary as a comment, then
    the function without its docstring: the shape of the coding-10 prompts) and a chat pair (user request,
    assistant answer with the source in a ```python fence). Both lists shuffled with `seed`."""
    rng = random.Random(seed)
    docs, pairs = [], []
    for p in paths:
        for f in functions(read(p)):
            if f["bare"]:
                docs.append(comment(f["doc"]) + f["bare"] + "\n")
            ask = rng.choice(ASKS).format(sig=f["sig"], name=f["name"], doc=f["doc"])
            pairs.append((ask, f"```python\n{f['code']}\n```"))
    rng.shuffle(docs)
    rng.shuffle(pairs)
    return docs, pairs


# ---------------------------------------------------------------------------
# token stream


def chat_text(tokenizer, ask: str, answer: str, thinking_block: bool) -> str:
    """One chat sample in the tokenizer's template (thinking switched off, as the client sends it)."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": ask}],
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=not thinking_block,
    )
    return prompt + answer + "<|im_end|>\n"


HEADER_WORDS = ("copyright", "license", "licence", "all rights reserved", "author", "written by", "contributed")


def strip_header(src: str) -> str:
    """`src` without its leading comment block (after a shebang / coding line) when that block is a license,
    copyright or authorship notice: header noise that would otherwise follow the comment of a comment-prompted
    function as easily as code does."""
    lines = src.splitlines(keepends=True)
    i = 0
    while i < len(lines) and (lines[i].startswith("#!") or lines[i].lstrip().startswith("# -*-")):
        i += 1
    j = i
    while j < len(lines) and (lines[j].startswith("#") or not lines[j].strip()):
        j += 1
    block = "".join(lines[i:j]).lower()
    if j > i and any(w in block for w in HEADER_WORDS):
        return "".join(lines[:i] + lines[j:])
    return src


def stream(
    tokenizer,
    paths: list[Path],
    commented: list[str],
    pairs: list[tuple[str, str]],
    repeat: int,
    seed: int,
    starts: bool = False,
):
    """All documents tokenised into one uint16 stream: raw files once (their license headers stripped),
    comment-prompted functions and chat samples `repeat` times each, in a seeded order, each document
    followed by <|endoftext|>. With `starts`: (stream, {"raw" | "commented" | "chat": int64 array of the
    positions where such documents start}) — a document's first token, right after the <|endoftext|>."""
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    docs = [("raw", strip_header(read(p))) for p in paths] + [("commented", d) for d in commented * repeat]
    docs += [
        ("chat", chat_text(tokenizer, a, b, thinking_block=(i + r) % 2 == 0))
        for r in range(repeat)
        for i, (a, b) in enumerate(pairs)
    ]
    random.Random(seed).shuffle(docs)
    ids: list[int] = []
    at: dict[str, list[int]] = {"raw": [], "commented": [], "chat": []}
    for (kind, _), enc in zip(docs, tokenizer([d for _, d in docs], add_special_tokens=False)["input_ids"]):
        at[kind].append(len(ids))
        ids.extend(enc)
        ids.append(eot)
    assert max(ids) < 65536
    out = np.asarray(ids, dtype=np.uint16)
    return (out, {k: np.asarray(v, dtype=np.int64) for k, v in at.items()}) if starts else out
