"""Query parameters of the paged reads: strict parsing into 422s that name the field, and opaque cursors."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from litestar import Request

from effect_ledger.domain.errors import validation_failed
from effect_ledger.domain.timefmt import parse_ts

DEFAULT_LIMIT = 100
MAX_LIMIT = 500
MAX_TEXT = 200
POSITION_DIGITS = 20  # positions are shown zero-padded, so they also sort as strings
MAX_POSITION = 2**63 - 1  # a bigint: a larger one was a 500 from the database until round 24


def format_position(position: int) -> str:
    """A feed position as the API shows it: opaque, and increasing both as a number and as a string."""
    return str(position).zfill(POSITION_DIGITS)


class QueryProblems:
    """Collects every bad query parameter so that one 422 names them all."""

    def __init__(self, request: Request[Any, Any, Any], allowed: Iterable[str]) -> None:
        self.errors: list[tuple[str, str]] = []
        allowed_names = set(allowed)
        for name in request.query_params:
            if name not in allowed_names:
                self.errors.append((name, "unknown query parameter"))

    def text(self, name: str, value: str | None) -> str | None:
        """A free-text filter; empty means absent."""
        if not value:
            return None
        if len(value) > MAX_TEXT:
            self.errors.append((name, f"must be at most {MAX_TEXT} characters"))
            return None
        return value

    def choice(self, name: str, value: str | None, allowed: Iterable[str]) -> str | None:
        """One of a fixed set of values; empty means absent."""
        if not value:
            return None
        options = tuple(allowed)
        if value not in options:
            self.errors.append((name, "must be one of " + ", ".join(options)))
            return None
        return value

    def timestamp(self, name: str, value: str | None) -> datetime | None:
        """An RFC 3339 timestamp with an offset; empty means absent."""
        if not value:
            return None
        try:
            return parse_ts(value)
        except ValueError:
            self.errors.append((name, "must be an RFC 3339 timestamp with a UTC offset"))
            return None

    def limit(self, value: str | None) -> int:
        """The page size, 1-500, default 100."""
        if not value:
            return DEFAULT_LIMIT
        # at most three digits before int(): Python refuses to convert more than 4,300 (a 500 until
        # round 24)
        if value.isascii() and value.isdigit() and len(value) <= 3 and 1 <= int(value) <= MAX_LIMIT:
            return int(value)
        self.errors.append(("limit", f"must be an integer from 1 to {MAX_LIMIT}"))
        return DEFAULT_LIMIT

    def cursor(self, value: str | None, kind: str) -> tuple[datetime, str] | None:
        """The key a previous page of the same list ended at."""
        if not value:
            return None
        key = decode_cursor(value, kind)
        if key is None:
            self.errors.append(("cursor", "is not a cursor of this list"))
        return key

    def position(self, name: str, value: str | None) -> int | None:
        """A receipts-feed position (as `position` showed it); empty means absent."""
        if not value:
            return None
        if (
            value.isascii()
            and value.isdigit()
            and len(value) <= POSITION_DIGITS
            and 1 <= int(value) <= MAX_POSITION
        ):
            return int(value)
        self.errors.append((name, "is not a position of this feed"))
        return None

    def check(self) -> None:
        """Raise one validation_failed listing every problem found."""
        if self.errors:
            raise validation_failed(self.errors)


def encode_cursor(kind: str, key: tuple[datetime, str] | None) -> str | None:
    """An opaque cursor: base64url (unpadded) of [kind, key time, key id]."""
    if key is None:
        return None
    raw = json.dumps([kind, key[0].isoformat(), key[1]], separators=(",", ":")).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(value: str, kind: str) -> tuple[datetime, str] | None:
    """The key inside a cursor of this kind of list, or None for anything else."""
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        decoded = json.loads(raw)
    except (binascii.Error, ValueError):
        return None
    if not (isinstance(decoded, list) and len(decoded) == 3 and decoded[0] == kind):
        return None
    moment, ident = decoded[1], decoded[2]
    if not isinstance(moment, str) or not isinstance(ident, str) or len(ident) > 1000:
        return None
    try:
        parsed = datetime.fromisoformat(moment)
        # in UTC, where the database compares it: an instant past the calendar there (a forged cursor,
        # `0001-01-01T00:00:00+05:00`) is no cursor, not a 500 from the database (until round 24)
        return (parsed.astimezone(UTC), ident) if parsed.tzinfo is not None else None
    except (ValueError, OverflowError):
        return None
