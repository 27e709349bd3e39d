"""The README stays a page or two, and every relative link in it and in docs/ resolves.

A link resolves when its file exists and, for a ``#anchor`` into a markdown file, when that file
has a heading whose GitHub anchor it is: lowercase, punctuation dropped, spaces as ``-``, and a
repeated heading numbered ``-1``, ``-2``. Links inside code (fenced blocks and backtick spans)
are text, not links.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 125

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """Every line, those of fenced code blocks and inline code spans blanked (numbers stay true)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            line = ""
        lines.append("" if fenced else CODE_SPAN.sub("", line))
    return lines


def github_anchor(heading: str) -> str:
    # Inline markup is dropped with the punctuation; the text of a link in a heading stays.
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        heading = None if fenced else HEADING.match(line)
        if heading is None:
            continue
        anchor = github_anchor(heading.group(1))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    broken = []
    for number, line in enumerate(prose_lines(path.read_text(encoding="utf-8")), start=1):
        for target in LINK.findall(line):
            if EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}:{number}: {target}"
            if not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where} (no heading #{anchor} in {resolved.relative_to(ROOT)})")
    return broken


def test_the_readme_fits_on_a_page_or_two() -> None:
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the rest belongs in docs/"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    broken = broken_links(path)
    assert not broken, "\n".join(broken)


def test_the_checker_sees_links_and_anchors_as_github_does() -> None:
    assert github_anchor("docker-compose (production-like)") == "docker-compose-production-like"
    spec_heading = "Source spec (TOML, `ingest source apply FILE`)"
    assert github_anchor(spec_heading) == "source-spec-toml-ingest-source-apply-file"
    assert github_anchor("The `ingest` command") == "the-ingest-command"
    text = "a `[x](nowhere.md)` b\n```\n[y](nowhere.md)\n```\n[z](here.md)"
    assert prose_lines(text) == ["a  b", "", "", "", "[z](here.md)"]
    assert LINK.findall("see [a](docs/a.md#b) and ![c](img.png) and [d](https://example.org)") == [
        "docs/a.md#b",
        "img.png",
        "https://example.org",
    ]
