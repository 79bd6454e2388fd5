"""The records module's own behaviour: the clock every record is stamped with."""

from datetime import datetime, timedelta, timezone

from tokensvc.records import utcnow


def test_utcnow_is_utc_in_whole_milliseconds_and_current():
    before = datetime.now(timezone.utc)
    samples = [utcnow() for _ in range(5000)]
    after = datetime.now(timezone.utc)
    # Whole milliseconds: what MongoDB stores, so a record reads back equal to what was written.
    assert all(sample.tzinfo is timezone.utc and sample.microsecond % 1000 == 0 for sample in samples)
    assert before - timedelta(milliseconds=1) <= samples[0] <= samples[-1] <= after
    assert samples == sorted(samples)
