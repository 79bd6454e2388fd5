"""The command blocks of the docs: how a test reads them, and which test runs each.

A command block is a fenced block whose info string starts with a command language: ``sh``,
``bash``, ``shell``, ``console`` or ``python``. Every command block of every page runs in the
suite as written: a test reads it with :func:`blocks` and runs it, and :data:`RUN_BY` names that
test for the block's section. A block that cannot run as written (a placeholder secret, a server
that runs until stopped, a tool the suite does not have) carries ``norun`` after its language,
as in ```` ```sh norun ````, and its page says why. ``tests/test_docblocks.py`` holds every page
of :func:`pages` to this.

To cover a new page: read its blocks with ``blocks(page, language, section)`` in the test that
runs them, and add the page and its sections to :data:`RUN_BY`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = frozenset({"sh", "bash", "shell", "console", "python"})
NOT_RUN = "norun"  # the info-string word that marks a block shown, not run
WHOLE_PAGE = ""  # a section of RUN_BY that stands for every section of its page

# page -> section heading -> the test file that runs the command blocks under that heading
# (its subsections included; a page's title, only the blocks before its first subheading). The
# test file names the page it reads.
RUN_BY: dict[str, dict[str, str]] = {
    "README.md": {"tokensvc": "tests/test_readme.py", "A whole flow by hand": "tests/test_readme.py"},
    "docs/guide/clients.md": {"Stock clients": "tests/test_readme.py"},
    "docs/guide/resource-servers.md": {WHOLE_PAGE: "tests/test_readme.py"},
    "docs/reference/command-line.md": {"Adding a client to the demo": "tests/test_readme.py"},
    "docs/guide/gate.md": {"Register the gate's resource server": "tests/test_readme.py"},
    "docs/guide/quickstart.md": {"1. The secrets, in the environment": "tests/wire/test_wire_quickstart.py",
                                 "2. A production configuration": "tests/wire/test_wire_quickstart.py",
                                 "3. The first administrator": "tests/wire/test_wire_quickstart.py",
                                 "4. Monitoring": "tests/wire/test_wire_quickstart.py"},
}

# page -> section -> why no test runs its command blocks yet. Each entry is a debt: the check
# fails once the section has no command block left to run, so that the entry goes with it.
NOT_RUN_YET: dict[str, dict[str, str]] = {
    "docs/guide/operations.md": {WHOLE_PAGE: "runbooks against a production MongoDB and Kubernetes"},
    "docs/guide/deployment.md": {WHOLE_PAGE: "a production MongoDB, a container runtime and Kubernetes"},
    "docs/guide/quickstart.md": {"5. Backup and restore": "needs MongoDB's tools and a real server"},
    "docs/reference/feed.md": {"The conformance script": "runs against an API the reader writes; "
                                                         "tests/test_feed_conformance.py runs the script"},
}


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: str  # relative to the repository's root
    line: int  # of its opening fence, from 1
    language: str
    flags: tuple[str, ...]  # the info string's other words
    sections: tuple[str, ...]  # the headings it stands under, the page's title first
    text: str

    @property
    def command(self) -> bool:
        return self.language in COMMANDS

    @property
    def runnable(self) -> bool:
        return self.command and NOT_RUN not in self.flags

    def under(self, section: str) -> bool:
        """Whether ``section`` holds the block: the page's title holds only the blocks before its
        first subheading; any other heading, every block of its subsections too."""
        if section == WHOLE_PAGE:
            return True
        if self.sections[:1] == (section,):
            return len(self.sections) == 1
        return section in self.sections


def pages() -> list[str]:
    """Every page of the docs: the README and each Markdown file under docs/."""
    return ["README.md", *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").rglob("*.md"))]


FENCE = re.compile(r"^(```+|~~~+)(.*)$")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def parse(page: str) -> list[Block]:
    """The fenced blocks of ``page``, in order, each with the headings it stands under."""
    found: list[Block] = []
    path: list[tuple[int, str]] = []
    fence: tuple[str, int, str, tuple[str, ...], list[str]] | None = None
    for number, line in enumerate((ROOT / page).read_text().splitlines(), 1):
        if fence is not None:
            marker, start, language, flags, lines = fence
            if line.strip() == marker:
                found.append(Block(page, start, language, flags, tuple(title for _, title in path),
                                   "".join(text + "\n" for text in lines)))
                fence = None
            else:
                lines.append(line)
            continue
        opening = FENCE.match(line)
        if opening:
            words = opening.group(2).split()
            fence = (opening.group(1), number, words[0] if words else "", tuple(words[1:]), [])
            continue
        heading = HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            path = [(depth, title) for depth, title in path if depth < level] + [(level, heading.group(2))]
    assert fence is None, f"{page}:{fence[1]}: a block that is never closed"
    return found


def blocks(page: str, language: str, section: str = WHOLE_PAGE) -> list[str]:
    """The texts of ``page``'s blocks in ``language`` under the heading ``section``, in the
    page's order, leaving out those marked ``norun``: what a test runs, or reads, as written."""
    assert section in RUN_BY.get(page, {}), f"RUN_BY does not name {page!r}, {section!r}: add it"
    return [block.text for block in parse(page)
            if block.language == language and NOT_RUN not in block.flags and block.under(section)]


def section_text(page: str, heading: str) -> str:
    """The text of ``page`` from the heading ``heading`` to the next heading of its level or
    above: what a test reads of the prose that goes with a block."""
    text = (ROOT / page).read_text()
    start = re.search(rf"^(#+) {re.escape(heading)}\n", text, re.M)
    assert start, f"{page}: no heading {heading!r}"
    level = len(start.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, start.end())
    return text[start.start():end.start() if end else len(text)]
