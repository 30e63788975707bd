"""The per-operation hash chain over events: each hash covers the event's canonical JSON and prev_hash."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from effect_ledger.domain.canonical import canonical_json

GENESIS_HASH = "0" * 64
HASHED_FIELDS = ("operation_id", "seq", "at", "kind", "actor", "from_status", "to_status", "attempt", "data")


def event_hash(prev_hash: str, event: Mapping[str, Any]) -> str:
    """sha256_hex(prev_hash + "\\n" + JCS(hashed fields)); `at` is the RFC 3339 text the API shows."""
    content = {name: event[name] for name in HASHED_FIELDS}
    return hashlib.sha256(prev_hash.encode("ascii") + b"\n" + canonical_json(content)).hexdigest()


def first_bad_seq(
    events: Iterable[Mapping[str, Any]], base_seq: int = 0, base_hash: str = GENESIS_HASH
) -> tuple[int, int | None]:
    """Walk a chain in seq order from its base (genesis, or the point a purge cut it at); return
    (events checked, first seq whose link or hash is wrong)."""
    prev = base_hash
    checked = 0
    expected_seq = base_seq + 1
    for event in events:
        checked += 1
        if (
            event["seq"] != expected_seq
            or event["prev_hash"] != prev
            or event_hash(prev, event) != event["hash"]
        ):
            return checked, int(event["seq"])
        prev = event["hash"]
        expected_seq += 1
    return checked, None
