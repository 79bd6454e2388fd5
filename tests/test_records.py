"""The records module's own behaviour: the clock every record is stamped with."""

from datetime import UTC, datetime, timedelta

from tokensvc.records import utcnow


def test_utcnow_is_utc_in_whole_milliseconds_and_current():
    before = datetime.now(UTC)
    now = utcnow()
    after = datetime.now(UTC)
    # Whole milliseconds: what MongoDB stores, so a record reads back equal to what was written.
    assert now.tzinfo is UTC and now.microsecond % 1000 == 0
    assert before - timedelta(milliseconds=1) <= now <= after
