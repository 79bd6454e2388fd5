"""Every command block of the docs runs in the suite (tests/docblocks.py): each lies in a
section whose test RUN_BY names, or is marked ``norun``; the tables name only what is there."""

from __future__ import annotations

from pathlib import Path

import pytest
from docblocks import NOT_RUN_YET, ROOT, RUN_BY, WHOLE_PAGE, Block, blocks, pages, parse, section_text


def owner(block: Block) -> str | None:
    """The test file that runs ``block``, or why none does yet, or None."""
    for table in (RUN_BY, NOT_RUN_YET):
        for section, who in table.get(block.page, {}).items():
            if block.under(section):
                return who
    return None


@pytest.mark.parametrize("page", pages())
def test_every_command_block_of_the_page_is_run_or_marked_not_run(page):
    unowned = [f"{page}:{block.line} ({block.language}, under {block.sections[-1:]})"
               for block in parse(page) if block.runnable and owner(block) is None]
    assert not unowned, ("command blocks no test runs: run each in a test and name its section in "
                         "docblocks.RUN_BY, or mark it ```sh norun and say why on the page", unowned)


def test_the_tables_name_pages_sections_and_tests_that_are_there():
    """A page moved or a heading renamed fails here, naming the entry to change; a test named
    for a page reads that page; a section of NOT_RUN_YET still has a block no test runs."""
    documented = set(pages())
    for table in (RUN_BY, NOT_RUN_YET):
        for page, sections in table.items():
            assert page in documented, f"{page}: no such page (moved?); change its entry in docblocks.py"
            found = parse(page)
            for section in sections:
                assert any(block.runnable and block.under(section) for block in found), \
                    f"{page}: no command block under {section or 'the page'!r} (heading renamed?)"
    for page, sections in RUN_BY.items():
        for test in sections.values():
            assert Path(page).name in (ROOT / test).read_text(), f"{test} does not read {page}"
    for page, sections in NOT_RUN_YET.items():
        for section in sections:
            assert section not in RUN_BY.get(page, {}), (page, section)


def test_a_block_marked_norun_is_not_run_and_the_rest_are_read_in_order(tmp_path, monkeypatch):
    import docblocks

    page = tmp_path / "page.md"
    page.write_text("# Title\n\n```sh\nmake run\n```\n\n"
                    "## One\n\n```sh\necho one\n```\n\n```sh norun\nserve forever\n```\n\n"
                    "### Deeper\n\n```python\nprint(2)\n```\n\n## Two\n\n```sh\necho two\n```\n\n"
                    "```toml\nkey = 1\n```\n")
    monkeypatch.setattr(docblocks, "ROOT", tmp_path)
    monkeypatch.setattr(docblocks, "RUN_BY", {"page.md": {"Title": "t", "One": "t", WHOLE_PAGE: "t"}})
    assert [(block.language, block.runnable, block.sections) for block in parse("page.md")] == [
        ("sh", True, ("Title",)), ("sh", True, ("Title", "One")), ("sh", False, ("Title", "One")),
        ("python", True, ("Title", "One", "Deeper")), ("sh", True, ("Title", "Two")), ("toml", False, ("Title", "Two"))]
    assert blocks("page.md", "sh", "One") == ["echo one\n"]
    assert blocks("page.md", "python", "One") == ["print(2)\n"]
    assert blocks("page.md", "sh", "Title") == ["make run\n"]  # the title: only what precedes a subheading
    assert blocks("page.md", "sh") == ["make run\n", "echo one\n", "echo two\n"]
    assert blocks("page.md", "toml") == ["key = 1\n"]  # read, not run: a test reads any language
    assert section_text("page.md", "Deeper") == "### Deeper\n\n```python\nprint(2)\n```\n\n"
    with pytest.raises(AssertionError, match="RUN_BY does not name"):
        blocks("page.md", "sh", "Two")

