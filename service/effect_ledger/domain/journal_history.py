"""The journal's causal rules and caps, and the decision of one append against the session's state.

The session row keeps a compact causal index (call_id -> name, call seq, result seq): enough to check
a batch against the whole history without reading the records back. `decide_append` is pure: it
returns the accepted records with their seqs and the new index, a replay, or a refusal — never raises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from effect_ledger.domain.errors import LedgerError, invalid_history, revision_conflict
from effect_ledger.domain.journal_records import batch_digest, encode_records


@dataclass(frozen=True, slots=True)
class CallEntry:
    """One call of the session: its name, its seq, and its result's seq once it has one."""

    name: str
    seq: int
    result_seq: int | None = None


Calls = dict[str, CallEntry]


def calls_from_json(causal: Mapping[str, Any]) -> Calls:
    """The causal index as stored on the session row ({"calls": {id: [name, seq, result_seq]}})."""
    return {cid: CallEntry(v[0], v[1], v[2]) for cid, v in causal.get("calls", {}).items()}


def calls_to_json(calls: Calls, continuations: Sequence[int] = ()) -> dict[str, Any]:
    """The causal index in its stored form (with the seqs of continuation records, which no summary
    may cover)."""
    index: dict[str, Any] = {"calls": {cid: [c.name, c.seq, c.result_seq] for cid, c in calls.items()}}
    if continuations:
        index["continuations"] = sorted(continuations)
    return index


def continuations_from_json(causal: Mapping[str, Any]) -> frozenset[int]:
    """The seqs of the session's continuation records, as the causal index keeps them."""
    return frozenset(causal.get("continuations", ()))


@dataclass(frozen=True, slots=True)
class Caps:
    """Configurable limits (JOURNAL_MAX_RECORDS, JOURNAL_MAX_RECORD_BYTES)."""

    max_records: int = 1000
    max_record_bytes: int = 16384


@dataclass(frozen=True, slots=True)
class SessionState:
    """What an append is decided against: the locked session row."""

    revision: int
    calls: Calls = field(default_factory=dict)
    last_nonce_hash: bytes | None = None
    last_base_revision: int | None = None
    last_batch_digest: str | None = None
    continuations: frozenset[int] = frozenset()  # seqs of continuation records (no summary covers one)


@dataclass(frozen=True, slots=True)
class AppendCommand:
    """A decoded append: the base revision, the records in stored form, the hashed client_nonce."""

    expected_revision: int
    records: Sequence[dict[str, Any]]
    nonce_hash: bytes | None = None
    payloads: str | None = None  # journal_records.payloads_digest of the continuation payloads taken out


@dataclass(frozen=True, slots=True)
class Accepted:
    """Store `records` at seqs base+1.., move the revision to `revision`, keep the new index."""

    base_revision: int
    revision: int
    records: tuple[dict[str, Any], ...]
    calls: Calls
    digest: str
    summaries: int
    sizes: tuple[int, ...]  # each record's JCS bytes, stored with it
    continuations: frozenset[int] = frozenset()  # every continuation seq of the session, batch included


@dataclass(frozen=True, slots=True)
class Replayed:
    """The same batch with the same client_nonce already produced the current revision."""

    revision: int


AppendDecision = Accepted | Replayed | LedgerError


def decide_append(state: SessionState, cmd: AppendCommand, caps: Caps) -> AppendDecision:
    """The whole append rule of API.md section 12, in its order: replay, revision, caps, causal rules."""
    encoded = encode_records(cmd.records)
    digest = batch_digest(encoded, cmd.payloads)
    if (
        digest is not None
        and cmd.nonce_hash is not None
        and cmd.nonce_hash == state.last_nonce_hash
        and cmd.expected_revision == state.last_base_revision
        and digest == state.last_batch_digest
    ):
        return Replayed(state.revision)
    if cmd.expected_revision != state.revision:
        return revision_conflict(state.revision)
    sizes = [None if e is None else len(e) for e in encoded]
    errors = cap_errors(state.revision, sizes, caps)
    if errors:
        return invalid_history(errors)
    calls = dict(state.calls)
    continuations = set(state.continuations)
    errors = apply_causal_rules(calls, state.revision, cmd.records, continuations)
    if errors:
        return invalid_history(errors)
    summaries = sum(1 for r in cmd.records if r["type"] == "summary")
    revision = state.revision + len(cmd.records)
    assert digest is not None  # every record has a JCS form, or cap_errors refused the batch
    known = tuple(size for size in sizes if size is not None)
    return Accepted(
        state.revision,
        revision,
        tuple(cmd.records),
        calls,
        digest,
        summaries,
        known,
        frozenset(continuations),
    )


def cap_errors(revision: int, sizes: Sequence[int | None], caps: Caps) -> list[tuple[int, str]]:
    """Per-session record count and per-record JCS size; the batch index of each record over a cap."""
    errors: list[tuple[int, str]] = []
    room = caps.max_records - revision
    if len(sizes) > room:
        errors.append((max(room, 0), f"the session would exceed {caps.max_records} records"))
    for index, size in enumerate(sizes):
        if size is None:
            errors.append((index, "has no canonical JSON form"))
        elif size > caps.max_record_bytes:
            errors.append((index, f"is larger than {caps.max_record_bytes} bytes in its JCS form"))
    return errors


def apply_causal_rules(
    calls: Calls,
    revision: int,
    records: Sequence[dict[str, Any]],
    continuations: set[int] | None = None,
) -> list[tuple[int, str]]:
    """Check each record against the history so far and fold it into `calls` and `continuations` (in
    place) when valid. Continuation records stand anywhere; they continue at most the history before
    the batch, and no summary covers one."""
    errors: list[tuple[int, str]] = []
    seen = continuations if continuations is not None else set()
    seq = revision
    for index, record in enumerate(records):
        seq += 1
        if record["type"] == "continuation":
            if record["covers_to_seq"] > revision:
                errors.append((index, "covers_to_seq is beyond the session's revision before the batch"))
            else:
                seen.add(seq)
            continue
        problem = _causal_problem(calls, seq, record)
        if problem is None and record["type"] == "summary":
            first, last = record["covers"]["from_seq"], record["covers"]["to_seq"]
            if any(first <= c <= last for c in seen):
                problem = "covers a continuation record"
        if problem is not None:
            errors.append((index, problem))
            continue
        if record["type"] == "tool_call":
            calls[record["call_id"]] = CallEntry(record["name"], seq)
        elif record["type"] == "tool_result":
            entry = calls[record["call_id"]]
            calls[record["call_id"]] = CallEntry(entry.name, entry.seq, seq)
    return errors


def unresolved_ids(calls: Calls) -> list[str]:
    """The calls without a result, in call order."""
    return [cid for cid, c in sorted(calls.items(), key=lambda kv: kv[1].seq) if c.result_seq is None]


def _causal_problem(calls: Calls, seq: int, record: dict[str, Any]) -> str | None:
    kind = record["type"]
    if kind == "message":
        if any(c.result_seq is None for c in calls.values()):
            return "a message may not follow while a call is unresolved"
    elif kind == "tool_call":
        if record["call_id"] in calls:
            return "call_id is already used in this session"
    elif kind == "tool_result":
        entry = calls.get(record["call_id"])
        if entry is None or entry.result_seq is not None:
            return "no pending call has this call_id"
        if entry.name != record["name"]:
            return "the pending call with this call_id has another name"
    else:
        return _summary_problem(calls, seq, record["covers"]["from_seq"], record["covers"]["to_seq"])
    return None


def _summary_problem(calls: Calls, seq: int, first: int, last: int) -> str | None:
    if first > last:
        return "covers.from_seq is after covers.to_seq"
    if last >= seq:
        return "covers a seq that does not exist yet"
    for entry in calls.values():
        call_in = first <= entry.seq <= last
        if entry.result_seq is None:
            if call_in:
                return "covers an unresolved call"
            continue
        if call_in != (first <= entry.result_seq <= last):
            return "splits a call from its result"
    return None
