"""The store format's history (tokensvc/storage/mongo/format.py) holds together: one entry per
format, numbered in order, each first written by a later release than the one before; every
migration implemented, running no earlier than the format before its own; no index this
release makes is one the history retires; each tripwire renames an index this release makes;
and this release writes the newest format."""

from __future__ import annotations

from tokensvc import __version__
from tokensvc.storage.mongo import INDEXES, migrations
from tokensvc.storage.mongo.format import FORMATS, HISTORY, release_key


def test_formats_are_numbered_in_order_and_each_came_with_a_later_release():
    assert [entry.version for entry in FORMATS] == list(range(1, len(FORMATS) + 1))
    releases = [release_key(entry.release) for entry in FORMATS]
    assert releases == sorted(releases) and len(set(releases)) == len(releases)
    assert release_key(FORMATS[-1].release) <= release_key(__version__)
    assert HISTORY.release == __version__ and HISTORY.newest == FORMATS[-1].version
    assert 1 <= HISTORY.oldest <= HISTORY.newest


def test_every_migration_is_implemented_and_runs_no_earlier_than_the_format_before_its_own():
    names = [migration.name for migration in HISTORY.migrations]
    assert len(set(names)) == len(names) and set(names) == set(migrations.STEPS)
    for entry in FORMATS:
        for migration in entry.migrations:
            assert entry.version - 1 <= migration.runs_from <= entry.version, migration


def test_no_index_this_release_makes_is_one_the_history_retires():
    retired = {index for entry in FORMATS for index in entry.retired_indexes}
    made = {(collection, options["name"]) for collection, _, options in INDEXES}
    assert not retired & made


def test_each_tripwire_renames_an_index_this_release_makes_to_a_name_of_its_own():
    made = {(collection, options["name"]) for collection, _, options in INDEXES}
    tripwires = [wire for entry in FORMATS for wire in entry.tripwires]
    assert tripwires  # 0.9.0 predates the format document: only its start-up can stop it
    for collection, old, new in tripwires:
        assert (collection, old) in made and (collection, new) not in made and old != new


def test_what_each_release_reads():
    assert HISTORY.newest_format_of(None) == 1  # 0.9.0 does not name itself
    assert HISTORY.newest_format_of("0.9.0") == 1
    assert HISTORY.newest_format_of(__version__) == HISTORY.newest
    assert HISTORY.newest_format_of("99.0.0") >= HISTORY.newest  # a later one reads what this one writes
