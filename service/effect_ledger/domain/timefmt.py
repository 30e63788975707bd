"""RFC 3339 UTC timestamps with milliseconds, the only time format the ledger shows or hashes."""

from __future__ import annotations

from datetime import UTC, datetime


def to_ms(moment: datetime) -> datetime:
    """Truncate to whole milliseconds so that what is stored is exactly what is shown and hashed."""
    return moment.replace(microsecond=moment.microsecond - moment.microsecond % 1000)


_TWO = tuple(f"{n:02d}" for n in range(100))
_THREE = tuple(f"{n:03d}" for n in range(1000))


def format_ts(moment: datetime | None) -> str | None:
    """Render a timestamp as `YYYY-MM-DDTHH:MM:SS.mmmZ` (or None)."""
    if moment is None:
        return None
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    year = moment.year
    if year < 1000:  # isoformat pads the year to four digits; the ledger holds none of these
        return moment.isoformat(timespec="milliseconds")[:-6] + "Z"
    # Written out from the fields: an operation view shows five of these, and isoformat (or strftime)
    # costs several times more; the same text as isoformat(timespec="milliseconds") in UTC.
    return (
        f"{year}-{_TWO[moment.month]}-{_TWO[moment.day]}T{_TWO[moment.hour]}:{_TWO[moment.minute]}:"
        f"{_TWO[moment.second]}.{_THREE[moment.microsecond // 1000]}Z"
    )


def parse_ts(text: str) -> datetime:
    """Parse an RFC 3339 timestamp that carries an offset; raises ValueError otherwise, also for an
    instant whose UTC time falls outside the years 1 - 9999 (`9999-12-31T23:59:59-14:00`: Python's
    OverflowError, a 500 until round 24, where every caller answers a ValueError with a 422)."""
    moment = datetime.fromisoformat(text.replace("z", "Z"))
    if moment.tzinfo is None:
        raise ValueError("timestamp needs a UTC offset")
    try:
        return to_ms(moment.astimezone(UTC))
    except OverflowError:
        raise ValueError("timestamp outside the years 1 - 9999 in UTC") from None
