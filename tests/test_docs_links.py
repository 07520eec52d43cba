"""The README and the docs pages, checked as text: every relative link points at a file that exists (and at a
heading of it when the link has an anchor), the README stays a five-minute read (at most 220 lines) that opens
with the two commands, names every CLI command, and every `python -m dflash_dash CMD --flag` in a page names a
command and flags the CLI has; docs/concepts.md lists every metric of the registry."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")  # [text](target): markdown links, images excluded
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if m := re.match(r"#{1,6}\s+(.*)", line):
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


def test_slug_follows_github():
    assert slug("1. Alignment at a glance (read this first)") == "1-alignment-at-a-glance-read-this-first"
    assert slug("The workspace config: `config.toml`") == "the-workspace-config-configtoml"
    assert slug("Train/serve checks: sliding layers") == "trainserve-checks-sliding-layers"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    bad = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto: are not checked here
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not bad, f"{page.name}: " + "; ".join(bad)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"docs pages not linked from README.md: {missing}"


def test_readme_is_short_and_opens_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines; move reference material to docs/"
    body = [ln for ln in lines if ln.strip()]
    assert body[0].startswith("# ")  # the title, then the two commands before anything else
    assert body[1] == "```" and body[4] == "```", body[:5]
    assert body[2].split("#")[0].strip() == "make run"
    assert body[3].split("#")[0].strip() == "make test"


@pytest.fixture(scope="module")
def commands():
    """CLI command -> its option strings, read from the parser the CLI runs."""
    import argparse

    from dflash_dash import cli

    sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {name: {o for a in sp._actions for o in a.option_strings} for name, sp in sub.choices.items()}


def test_readme_names_every_command(commands):
    text = (ROOT / "README.md").read_text()
    missing = [c for c in commands if f"`{c}`" not in text]
    assert not missing, f"README.md's CLI at a glance lacks: {missing}"


def test_documented_command_lines_exist(commands):
    """Every `python -m dflash_dash [--workspace W] CMD ...` line: CMD is a command and each --flag is its own."""
    bad = []
    for page in PAGES:
        for line in page.read_text().splitlines():
            for m in re.finditer(r"python -m dflash_dash (?:--workspace \S+ )?([a-z][a-z-]*)([^`\n]*)", line):
                cmd, rest = m.group(1), m.group(2)
                if cmd not in commands:
                    bad.append(f"{page.name}: no command {cmd!r}")
                    continue
                rest = rest.split("#")[0].split(" | ")[0]  # a comment, or a second command after "|"
                for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", rest):
                    if flag not in commands[cmd] and flag != "--workspace":
                        bad.append(f"{page.name}: {cmd} has no {flag}")
    assert not bad, "; ".join(bad)


def test_concepts_lists_every_metric():
    from dflash_dash.metrics.registry import REGISTRY

    text = (ROOT / "docs" / "concepts.md").read_text()
    missing = [m.key for m in REGISTRY if f"`{m.key}`" not in text]
    assert not missing, f"docs/concepts.md's metric table lacks: {missing}"
