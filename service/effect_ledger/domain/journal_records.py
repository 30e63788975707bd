"""The journal's record profile (API.md section 12): five record types, strict, versioned by `schema`.

A record is decoded strictly (unknown fields rejected) only after its `schema` version has been read
leniently: a version newer than this service knows is refused, never interpreted as an older one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from effect_ledger.domain.canonical import CanonicalizationError, canonical_json
from effect_ledger.domain.model import OPERATION_ID_PATTERN

NEWEST_SCHEMA = 1  # the newest record schema this service knows
MAX_BATCH = 100
Text = Annotated[str, Meta(min_length=1, max_length=200)]
OperationId = Annotated[str, Meta(pattern=OPERATION_ID_PATTERN)]
SchemaVersion = Annotated[int, Meta(ge=1)]
Seq = Annotated[int, Meta(ge=1, le=2**31 - 1)]


class Message(Struct, tag_field="type", tag="message", forbid_unknown_fields=True):
    """A user or assistant message; `system` is not a journal role."""

    role: Literal["user", "assistant"]
    content: str
    schema: SchemaVersion = 1


class ToolCall(Struct, tag_field="type", tag="tool_call", forbid_unknown_fields=True):
    """A proposed call; `operation_id` links it to the ledger operation that would carry out the effect."""

    call_id: Text
    name: Text
    arguments: Any
    operation_id: OperationId | None = None
    schema: SchemaVersion = 1


class ToolResult(Struct, tag_field="type", tag="tool_result", forbid_unknown_fields=True):
    """The result of a pending call, matched by call_id and name."""

    call_id: Text
    name: Text
    output: Any
    is_error: bool = False
    schema: SchemaVersion = 1


class Covers(Struct, forbid_unknown_fields=True):
    """The seqs a summary stands for, both ends included."""

    from_seq: Seq
    to_seq: Seq


class Summary(Struct, tag_field="type", tag="summary", forbid_unknown_fields=True):
    """A derived record (compaction): replaces nothing, may stand in for what it covers in a context."""

    covers: Covers
    content: str
    summarizer: Text
    omissions: list[str]
    schema: SchemaVersion = 1


class Continuation(Struct, tag_field="type", tag="continuation", forbid_unknown_fields=True):
    """Opaque provider state continuing records 1..covers_to_seq (domain/journal_continuations.py).
    `payload` (base64) is taken out before the record is stored: stored, it reads `null`."""

    provider: Text
    adapter: Text
    account: Text
    model_class: Text
    covers_to_seq: Annotated[int, Meta(ge=0, le=2**31 - 1)]
    expires_at: Annotated[str, Meta(min_length=1, max_length=64)]
    classification: Literal["internal", "confidential", "restricted"]
    payload: Annotated[str, Meta(min_length=1, max_length=90_000)]  # 64 KiB decoded, checked at append
    response_id: Annotated[str, Meta(min_length=1, max_length=512)] | None = None
    schema: SchemaVersion = 1


JournalRecord = Message | ToolCall | ToolResult | Summary | Continuation


class AppendBody(Struct, forbid_unknown_fields=True):
    """POST /v1/sessions/{id}/records, once every record has passed the schema-version check."""

    expected_revision: Annotated[int, Meta(ge=0, le=2**31 - 1)]
    records: Annotated[list[JournalRecord], Meta(min_length=1, max_length=MAX_BATCH)]
    client_nonce: Annotated[str, Meta(min_length=16, max_length=128)] | None = None


def future_schema_indexes(records: Any) -> list[int]:
    """Indexes of the records that name a schema newer than NEWEST_SCHEMA (read before any strict decode)."""
    if not isinstance(records, list):
        return []
    newer = []
    for index, record in enumerate(records):
        version = record.get("schema") if isinstance(record, dict) else None
        if isinstance(version, int) and not isinstance(version, bool) and version > NEWEST_SCHEMA:
            newer.append(index)
    return newer


def stored_form(record: JournalRecord) -> dict[str, Any]:
    """The record as stored and read back: its type first, every default filled in."""
    value = msgspec.to_builtins(record)
    assert isinstance(value, dict)
    return value


def record_bytes(record: dict[str, Any]) -> int:
    """The size the caps and the context budget count: UTF-8 bytes of the record's JCS form."""
    return len(canonical_json(record))


def encode_records(records: Sequence[dict[str, Any]]) -> list[bytes | None]:
    """Each record's JCS form, once; None where a value has none (e.g. an integer beyond 2^53)."""
    encoded: list[bytes | None] = []
    for record in records:
        try:
            encoded.append(canonical_json(record))
        except CanonicalizationError:
            encoded.append(None)
    return encoded


def batch_digest(encoded: Sequence[bytes | None], payloads: str | None = None) -> str | None:
    """The identity of a batch, for recognising a retried append: sha256 of the JCS list, built from the
    records' own JCS forms (a JCS array is its elements' forms, comma-separated, in brackets), and of
    `payloads` (payloads_digest) when the batch carries continuation payloads: the records hold
    `"payload": null`, so without it the same nonce with another payload was a replay, and the new
    state was dropped with a 200."""
    parts = [e for e in encoded if e is not None]
    if len(parts) != len(encoded):
        return None
    body = b"[" + b",".join(parts) + b"]"
    if payloads is not None:
        body += b"\n" + payloads.encode("ascii")
    return "sha256:" + hashlib.sha256(body).hexdigest()


def payloads_digest(by_index: Mapping[int, bytes]) -> str | None:
    """What identifies a batch's continuation payloads (batch index -> decoded bytes): sha256 over each
    index and its payload's sha256, in index order; None for a batch without payloads."""
    if not by_index:
        return None
    lines = "".join(f"{i} {hashlib.sha256(by_index[i]).hexdigest()}\n" for i in sorted(by_index))
    return "sha256:" + hashlib.sha256(lines.encode("ascii")).hexdigest()
