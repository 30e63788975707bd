"""format_ts and the summary line's timestamp, written from the fields: exactly the text the
isoformat-based formulas gave, for every instant and offset."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from effect_ledger import logs
from effect_ledger.domain.timefmt import format_ts, parse_ts

OFFSETS = st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-9, minutes=-30))])


def by_isoformat(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=OFFSETS))
def test_format_ts_is_the_isoformat_text_in_utc(moment: datetime) -> None:
    assert format_ts(moment) == by_isoformat(moment)


def test_format_ts_edges() -> None:
    assert format_ts(None) is None
    assert format_ts(datetime(999, 1, 2, 3, 4, 5, 999, tzinfo=UTC)) == "0999-01-02T03:04:05.000Z"
    assert format_ts(datetime(2026, 12, 1, 23, 59, 59, 999999, tzinfo=UTC)) == "2026-12-01T23:59:59.999Z"
    assert (
        format_ts(datetime(2026, 12, 2, 1, 0, tzinfo=timezone(timedelta(hours=2))))
        == "2026-12-01T23:00:00.000Z"
    )


@pytest.mark.parametrize(
    "ns",
    [
        0,
        999,
        1000,
        1_000_000_000,
        1_764_600_000_123_456_789,
        1_764_600_000_000_000_999,
        1_764_600_000_000_001_000,
    ],
)
def test_the_summary_timestamp_is_now_in_isoformat_with_z(ns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs.time, "time_ns", lambda: ns)
    second, rest = divmod(ns, 1_000_000_000)
    expected = datetime.fromtimestamp(second, UTC).replace(microsecond=rest // 1000).isoformat()
    assert logs._Stamp().now() == expected.replace("+00:00", "Z")


def test_the_summary_timestamp_follows_the_clock_across_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    stamp = logs._Stamp()
    for ns in (5_000_000_000, 5_500_000_000, 6_000_000_001_000, 6_000_000_002_000):
        monkeypatch.setattr(logs.time, "time_ns", lambda ns=ns: ns)
        second, rest = divmod(ns, 1_000_000_000)
        expected = datetime.fromtimestamp(second, UTC).replace(microsecond=rest // 1000).isoformat()
        assert stamp.now() == expected.replace("+00:00", "Z")


@pytest.mark.parametrize(
    "text", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00", "2026-12-01T10:00:00"]
)
def test_parse_ts_refuses_with_a_value_error(text: str) -> None:
    """Valid RFC 3339 whose UTC instant is outside Python's years (an OverflowError before round 24,
    answered 500 by the HTTP layer), and a time without an offset."""
    with pytest.raises(ValueError):
        parse_ts(text)


def test_parse_ts_at_the_edges_that_fit() -> None:
    assert parse_ts("9999-12-31T23:59:59.9999Z") == datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
    assert parse_ts("0001-01-01T00:00:00-14:00") == datetime(1, 1, 1, 14, tzinfo=UTC)
