"""The per-operation hash chain over events: each hash covers the event's canonical JSON and prev_hash."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from effect_ledger.domain.canonical import MAX_EXACT_INT, canonical_json, encode_members, sorted_encoding

GENESIS_HASH = "0" * 64
HASHED_FIELDS = ("operation_id", "seq", "at", "kind", "actor", "from_status", "to_status", "attempt", "data")


class _Hashed(msgspec.Struct, gc=False):
    """HASHED_FIELDS in JCS order (sorted), for canonical.encode_members."""

    actor: Any
    at: Any
    attempt: Any
    data: msgspec.Raw
    from_status: Any
    kind: Any
    operation_id: Any
    seq: Any
    to_status: Any


def event_hash(prev_hash: str, event: Mapping[str, Any]) -> str:
    """sha256_hex(prev_hash + "\\n" + JCS(hashed fields)); `at` is the RFC 3339 text the API shows."""
    return link_hash(prev_hash, *(event[name] for name in HASHED_FIELDS))


def link_hash(
    prev_hash: str,
    operation_id: Any,
    seq: Any,
    at: Any,
    kind: Any,
    actor: Any,
    from_status: Any,
    to_status: Any,
    attempt: Any,
    data: Any,
) -> str:
    """event_hash of an event given field by field (HASHED_FIELDS' order): the receipts log recomputes
    every chain it logs from database rows, and building each event's dict cost a third of that."""
    body = None
    # the shapes every event has: canonical.plain_scalar's test written inline for the nine fields (a
    # call per field cost more than the encoding); any other shape takes the whole object's
    # canonical_json below, which is right for every value
    if (
        type(operation_id) is str
        and type(at) is str
        and type(kind) is str
        and type(actor) is str
        and type(to_status) is str
        and (from_status is None or type(from_status) is str)
        and type(seq) is int
        and type(attempt) is int
        and -MAX_EXACT_INT <= seq <= MAX_EXACT_INT
        and -MAX_EXACT_INT <= attempt <= MAX_EXACT_INT
    ):
        raw = msgspec.Raw(canonical_json(data))
        body = encode_members(
            _Hashed(actor, at, attempt, raw, from_status, kind, operation_id, seq, to_status)
        )
    if body is None:  # anything else takes the whole object's canonical_json (which refuses what it must)
        fields = (operation_id, seq, at, kind, actor, from_status, to_status, attempt, data)
        body = canonical_json(dict(zip(HASHED_FIELDS, fields, strict=True)))
    return hashlib.sha256(prev_hash.encode("ascii") + b"\n" + body).hexdigest()


def link_holds(prev_hash: str, *fields: Any, expected: str, row: bool = True) -> bool:
    """Whether an event given field by field (link_hash's arguments) hashes to `expected`: link_hash's
    answer. A database `row`'s is tried first on msgspec's sorted encoding of the event without the
    walk that proves it the JCS text (canonical.sorted_encoding). A match is a match: the hash was taken
    over those very bytes, and the text msgspec writes sorted decodes to the value it was written from
    for every value a database row's data can hold (decoded by msgspec from jsonb: no NaN or infinity,
    the one value msgspec writes as another, null), so the event is the one hashed. Only a mismatch takes
    link_hash's way (the JCS text, which differs from msgspec's for a float, an int beyond 2**53 or a
    key beyond the BMP) before the event is called bad. The receipts log recomputes every chain it
    logs; the walk was a fifth of that (round 30)."""
    operation_id, seq, at, kind, actor, from_status, to_status, attempt, data = fields
    if row and type(data) is dict:  # every event's data; anything else takes link_hash's way
        text = sorted_encoding(data)
        body = None if text is None else encode_members(
            _Hashed(actor, at, attempt, msgspec.Raw(text), from_status, kind, operation_id, seq, to_status)
        )  # fmt: skip
        if body is not None and _sha256(prev_hash.encode("ascii") + b"\n" + body).hexdigest() == expected:
            return True
    return link_hash(prev_hash, *fields) == expected


_sha256 = hashlib.sha256


def event_holds(event: Mapping[str, Any], at: Any, *, row: bool = True) -> bool:
    """Whether an event as stored (a mapping of its fields, its own `prev_hash` and `hash`) hashes to its
    `hash` over its `prev_hash` (link_holds); `at` as hashed (a database row's rendered by the caller)."""
    return link_holds(
        event["prev_hash"], event["operation_id"], event["seq"], at, event["kind"], event["actor"],
        event["from_status"], event["to_status"], event["attempt"], event["data"],
        expected=event["hash"], row=row,
    )  # fmt: skip


def first_bad_seq(
    events: Iterable[Mapping[str, Any]],
    base_seq: int = 0,
    base_hash: str = GENESIS_HASH,
    format_at: Callable[[Any], Any] | None = None,
) -> tuple[int, int | None]:
    """Walk a chain in seq order from its base (genesis, or the point a purge cut it at); return
    (events checked, first seq whose link or hash is wrong). `format_at` renders each event's `at` for
    the hash first (database rows hold a datetime; the API's events the text already), and marks the
    events as database rows (link_holds' `row`)."""
    prev = base_hash
    checked = 0
    expected_seq = base_seq + 1
    rows = format_at is not None  # the API's events: decoded by any JSON reader (NaN, infinity)
    for event in events:
        checked += 1
        seq = event["seq"]
        at = event["at"] if format_at is None else format_at(event["at"])
        if seq != expected_seq or event["prev_hash"] != prev or not event_holds(event, at, row=rows):
            return checked, int(seq)
        prev = event["hash"]
        expected_seq += 1
    return checked, None
