"""Continuation records at the HTTP edge (API.md section 12): their payloads taken out of an append
before anything else sees the batch, and the `continuation` member of a context answer.

The payload bytes pass through here twice only: into the sealing at append, and out of the one
compatible context answer. They are never logged (no log call here names them) and never kept in
any object a log line, a projection, the console or a session read is built from.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog
from litestar import Request

from effect_ledger.db.journal import SessionSnapshot
from effect_ledger.db.journal_state import Payloads
from effect_ledger.domain.errors import validation_failed
from effect_ledger.domain.journal_continuations import (
    MATCHED_FIELDS,
    KeyRing,
    Wanted,
    decode_payload,
    expiry_of,
    prefix_digest,
    rank,
)
from effect_ledger.http.paging import QueryProblems
from effect_ledger.settings import Settings

CONTEXT_PARAMS = ("max_records", "max_bytes", *MATCHED_FIELDS)
log = structlog.get_logger("effect_ledger.journal")
EPHEMERAL_KEY_ID = "process"  # the key of an app built without JOURNAL_STATE_KEY_FILE


def load_key_ring(settings: Settings) -> KeyRing:
    """The key ring of JOURNAL_STATE_KEY_FILE (`serve` creates one in the data directory when unset).
    An app built without one (embedded in another program) seals with a key of this process only: its
    payloads stop opening when the process ends (reported `unreadable`), and each append that seals
    with it logs a warning saying so."""
    if settings.journal_state_key_file:
        return KeyRing.parse(Path(settings.journal_state_key_file).expanduser().read_text())
    return KeyRing.parse(KeyRing.new_line(EPHEMERAL_KEY_ID))


def key_ring_of(request: Request[Any, Any, Any]) -> KeyRing:
    """The process's key ring."""
    ring: KeyRing = request.app.state.journal_state_keys
    return ring


def take_payloads(records: list[dict[str, Any]], ring: KeyRing) -> Payloads | None:
    """Take each continuation's payload out of its record (which is stored with `"payload": null`),
    decoded; 422 for a payload that is not base64 or over 64 KiB, or an unreadable expires_at."""
    taken: dict[int, bytes] = {}
    errors: list[tuple[str, str]] = []
    for index, record in enumerate(records):
        if record["type"] != "continuation":
            continue
        raw = decode_payload(record["payload"])
        record["payload"] = None  # from here on, the record holds no state
        if raw is None:
            errors.append((f"records[{index}].payload", "must be base64 of at most 64 KiB"))
        if expiry_of(record) is None:
            errors.append((f"records[{index}].expires_at", "must be an RFC 3339 timestamp with an offset"))
        if raw is not None:
            taken[index] = raw
    if errors:
        raise validation_failed(errors)
    if not taken:
        return None
    if ring.active == EPHEMERAL_KEY_ID:
        log.warning("journal_state_key_ephemeral", setting="EFFECT_LEDGER_JOURNAL_STATE_KEY_FILE")
    return Payloads(ring, taken)


def wanted_from(q: QueryProblems, values: Sequence[str | None]) -> Wanted | None:
    """The four fields a continuation must match; all four or none (a 422 names the missing ones)."""
    named = dict(zip(MATCHED_FIELDS, values, strict=True))
    if not any(named.values()):
        return None
    missing = [name for name, value in named.items() if not value]
    for name in missing:
        q.errors.append((name, "is required with the other continuation fields"))
    if missing:
        return None
    return Wanted(**{name: str(value) for name, value in named.items()})


class Continuations:
    """The continuation records of one snapshot, judged for one query at the database clock."""

    def __init__(self, snapshot: SessionSnapshot, wanted: Wanted | None) -> None:
        self.wanted = wanted
        self.records = [(seq, r) for seq, _, r in snapshot.records if r["type"] == "continuation"]
        self.others = [(seq, r) for seq, _, r in snapshot.records if r["type"] != "continuation"]
        stored = [r for _, _, r in snapshot.records]
        self._digests: dict[int, str] = {}
        self._stored = stored
        self.compatible: list[int] = []
        self.refused: list[dict[str, Any]] = []

    def current_prefix(self, covers_to_seq: int) -> str:
        """The digest of records 1..covers_to_seq as stored now."""
        if covers_to_seq not in self._digests:
            self._digests[covers_to_seq] = prefix_digest(self._stored[:covers_to_seq])
        return self._digests[covers_to_seq]

    def candidates(self, now: datetime) -> list[tuple[int, str]]:
        """Compatible continuations, newest first, with the digest their payload is sealed to."""
        self.compatible, self.refused = rank(self.records, self.wanted, now, self.current_prefix)
        by_seq = dict(self.records)
        return [(seq, str(by_seq[seq]["prefix_digest"])) for seq in self.compatible]

    def answer(self, handed: tuple[int, bytes] | None, unreadable: Sequence[int]) -> dict[str, Any]:
        """The context answer's `continuation` and `omitted.continuations` members (only what applies:
        a session without continuations, asked for none, answers as before)."""
        members: dict[str, Any] = {}
        omitted = list(self.refused)
        for seq in self.compatible:
            if handed is not None and seq == handed[0]:
                continue
            # a compatible one not handed back: a newer one was, or its payload cannot be opened
            omitted.append({"seq": seq, "reason": "unreadable" if seq in unreadable else "superseded"})
        if self.wanted is not None:
            members["continuation"] = None if handed is None else self._view(*handed)
        if self.records or self.wanted is not None:
            members["omitted_continuations"] = sorted(omitted, key=lambda o: int(o["seq"]))
        return members

    def _view(self, seq: int, payload: bytes) -> dict[str, Any]:
        record = dict(self.records)[seq]
        return {"seq": seq, **record, "payload": base64.b64encode(payload).decode("ascii")}
