"""RFC 3339 UTC timestamps with milliseconds, the only time format the ledger shows or hashes."""

from __future__ import annotations

from datetime import UTC, datetime


def to_ms(moment: datetime) -> datetime:
    """Truncate to whole milliseconds so that what is stored is exactly what is shown and hashed."""
    return moment.replace(microsecond=moment.microsecond - moment.microsecond % 1000)


def format_ts(moment: datetime | None) -> str | None:
    """Render a timestamp as `YYYY-MM-DDTHH:MM:SS.mmmZ` (or None)."""
    if moment is None:
        return None
    # isoformat is several times cheaper than strftime; four-digit years are all the ledger holds
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def parse_ts(text: str) -> datetime:
    """Parse an RFC 3339 timestamp that carries an offset; raises ValueError otherwise."""
    moment = datetime.fromisoformat(text.replace("z", "Z"))
    if moment.tzinfo is None:
        raise ValueError("timestamp needs a UTC offset")
    return to_ms(moment.astimezone(UTC))
