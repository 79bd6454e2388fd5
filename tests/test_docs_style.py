"""The measurable part of the docs' style (CONTRIBUTING.md, Writing the docs), held on every
page the repository ships: a heading at least every 3 KB of prose, no paragraph over 8 lines,
no parenthesis inside a parenthesis, and relative links that resolve, anchors included.

A page's prose is what a reader reads as sentences: fenced code blocks and tables are not
prose, and neither are inline code spans, link targets or bare addresses."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LINE = 100  # the width a paragraph's lines are counted at, as the pages are wrapped
MOST_LINES = 8
MOST_PROSE_BETWEEN_HEADINGS = 3 * 1024

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
ADDRESS = re.compile(r"<?https?://[^\s>)]+>?")


def pages() -> list[Path]:
    """Every Markdown page the repository tracks, save the tests' own fixtures."""
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    return sorted(ROOT / name for name in listed.stdout.split() if not name.startswith("tests/"))


@dataclass(slots=True)
class Block:
    kind: str  # "heading" | "paragraph" | "code" | "table"
    line: int  # 1-based, where it starts
    lines: list[str]


def blocks(text: str) -> Iterator[Block]:
    """The page cut into headings, paragraphs (each list item one), code blocks and tables."""
    current: Block | None = None
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if fence is not None:
            current.lines.append(line)  # type: ignore[union-attr]
            if line.strip().startswith(fence):
                yield current  # type: ignore[misc]
                current, fence = None, None
            continue
        opening = FENCE.match(line)
        if opening:
            if current:
                yield current
            current, fence = Block("code", number, [line]), opening.group(1)
            continue
        if not line.strip():
            if current:
                yield current
            current = None
            continue
        if HEADING.match(line):
            if current:
                yield current
            yield Block("heading", number, [line])
            current = None
            continue
        kind = "table" if line.lstrip().startswith("|") else "paragraph"
        starts_item = kind == "paragraph" and ITEM.match(line) is not None
        if current is None or current.kind != kind or starts_item:
            if current:
                yield current
            current = Block(kind, number, [line])
        else:
            current.lines.append(line)
    if current:
        yield current


def prose(line: str) -> str:
    """What a reader reads of a line as sentences: no code span, link target or address."""
    line = IMAGE.sub("", CODE_SPAN.sub("code", line))
    line = LINK.sub(lambda match: match.group("text"), line)
    return ADDRESS.sub("address", line)


def reading_lines(block: Block) -> int:
    return sum(max(1, -(-len(line.strip()) // LINE)) for line in block.lines)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = LINK.sub(lambda match: match.group("text"), heading)
    text = re.sub(r"`([^`]*)`", r"\1", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for block in blocks(page.read_text()):
        if block.kind == "heading":
            base = slug(HEADING.match(block.lines[0]).group(2))  # type: ignore[union-attr]
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", page.read_text()))
    return found


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


PAGES = pages()


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_a_heading_comes_at_least_every_3_kb_of_prose(page):
    stretches, run, since = [], 0, 1
    for block in blocks(page.read_text()):
        if block.kind == "heading":
            if run > MOST_PROSE_BETWEEN_HEADINGS:
                stretches.append(f"line {since}: {run} characters")
            run, since = 0, block.line
        elif block.kind == "paragraph":
            run += sum(len(prose(line)) + 1 for line in block.lines)
    if run > MOST_PROSE_BETWEEN_HEADINGS:
        stretches.append(f"line {since}: {run} characters")
    assert not stretches, f"{name(page)}: over {MOST_PROSE_BETWEEN_HEADINGS} characters with no heading: {stretches}"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_no_paragraph_is_over_8_lines(page):
    long = [f"line {block.line}: {reading_lines(block)} lines" for block in blocks(page.read_text())
            if block.kind == "paragraph" and reading_lines(block) > MOST_LINES]
    assert not long, f"{name(page)}: paragraphs over {MOST_LINES} lines of {LINE} characters: {long}"


def nested(text: str) -> bool:
    depth = 0
    for character in text:
        if character == "(":
            depth += 1
            if depth > 1:
                return True
        elif character == ")":
            depth = max(0, depth - 1)
    return False


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_no_parenthesis_is_inside_a_parenthesis(page):
    found = [f"line {block.line}" for block in blocks(page.read_text())
             if block.kind in ("paragraph", "table") and nested(" ".join(prose(line) for line in block.lines))]
    assert not found, f"{name(page)}: a parenthesis inside a parenthesis at {found}"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_relative_link_resolves(page):
    broken = []
    for block in blocks(page.read_text()):
        if block.kind not in ("paragraph", "table", "heading"):
            continue
        for match in LINK.finditer(CODE_SPAN.sub("code", " ".join(block.lines))):
            target = match.group("target")
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"line {block.line}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"line {block.line}: {target} (no such heading)")
    assert not broken, f"{name(page)}: links that resolve to nothing: {broken}"


def test_the_style_check_sees_what_it_measures():
    """Each rule catches what it names, on a page made to break it."""
    page = "# Title\n\n" + ("word " * 700) + "\n\n- " + "x" * 900 + "\n\nText (with (nested) words).\n"
    cut = list(blocks(page))
    assert [block.kind for block in cut] == ["heading", "paragraph", "paragraph", "paragraph"]
    assert sum(len(prose(line)) for line in cut[1].lines) > MOST_PROSE_BETWEEN_HEADINGS
    assert reading_lines(cut[2]) > MOST_LINES
    assert nested(prose(cut[3].lines[0]))
    assert not nested(prose("A [link](https://example.com/a_(b)) and `f(g(x))` (one level)."))
    assert slug("The `tokensvc gate` command: nginx & Traefik") == "the-tokensvc-gate-command-nginx--traefik"
    fenced = list(blocks("```\n# not a heading\n\n(a (b))\n```\n"))
    assert [block.kind for block in fenced] == ["code"]
