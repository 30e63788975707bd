"""Continuation records (API.md section 12): the prefix they are bound to, the compatibility rules of
context replay, and the sealing of their payload (AES-GCM under a key ring kept outside the database).

A continuation is never decoded, only sealed and handed back: `seal` / `open_sealed` treat the
payload as opaque bytes. The associated data binds a sealed payload to its tenant, session, seq and
prefix digest, so a ciphertext copied onto another row (or another prefix) does not open.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from effect_ledger.domain.canonical import canonical_json
from effect_ledger.domain.timefmt import parse_ts

MAX_PAYLOAD_BYTES = 64 * 1024
MATCHED_FIELDS = ("provider", "adapter", "account", "model_class")
NONCE_BYTES = 12
KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def prefix_digest(records: Sequence[Mapping[str, Any]]) -> str:
    """`sha256:` over the JCS array of the records (in seq order, as stored)."""
    body = b"[" + b",".join(canonical_json(dict(r)) for r in records) + b"]"
    return "sha256:" + hashlib.sha256(body).hexdigest()


def decode_payload(payload: str) -> bytes | None:
    """The payload's bytes (standard base64, padding required), or None when it is not base64 or too big."""
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) <= MAX_PAYLOAD_BYTES else None


def expiry_of(record: Mapping[str, Any]) -> datetime | None:
    """The record's expires_at, or None when it is not an RFC 3339 timestamp with an offset."""
    try:
        return parse_ts(str(record["expires_at"]))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Wanted:
    """What context replay asks a continuation to match (the four fields of the query)."""

    provider: str
    adapter: str
    account: str
    model_class: str


def mismatch(
    record: Mapping[str, Any], wanted: Wanted | None, now: datetime, current_prefix: Callable[[int], str]
) -> str | None:
    """Why a continuation cannot continue this request, in the contract's order (the first field that
    differs, then expiry, then the bound prefix), or None when it is compatible."""
    if wanted is None:
        return "not_requested"
    for name in MATCHED_FIELDS:
        if record.get(name) != getattr(wanted, name):
            return name
    expires = expiry_of(record)
    if expires is None or expires <= now:
        return "expired"
    if record.get("prefix_digest") != current_prefix(int(record["covers_to_seq"])):
        return "prefix"
    return None


def rank(
    continuations: Sequence[tuple[int, Mapping[str, Any]]],
    wanted: Wanted | None,
    now: datetime,
    current_prefix: Callable[[int], str],
) -> tuple[list[int], list[dict[str, Any]]]:
    """(compatible seqs, newest first; every other continuation as {"seq", "reason"}, in seq order)."""
    compatible: list[int] = []
    refused: list[dict[str, Any]] = []
    for seq, record in sorted(continuations, key=lambda c: c[0]):
        reason = mismatch(record, wanted, now, current_prefix)
        if reason is None:
            compatible.append(seq)
        else:
            refused.append({"seq": seq, "reason": reason})
    return sorted(compatible, reverse=True), refused


def associated_data(tenant: str, session_id: str, seq: int, digest: str) -> bytes:
    """What a sealed payload is bound to."""
    return "\x00".join(("effect-ledger.continuation/1", tenant, session_id, str(seq), digest)).encode()


@dataclass(frozen=True, slots=True)
class Sealed:
    """A payload sealed under one key of the ring."""

    key_id: str
    nonce: bytes
    ciphertext: bytes


class KeyRingError(ValueError):
    """The key file is not a valid key ring; the message says which line and why (never a key)."""


class KeyRing:
    """AES-256-GCM keys by ID: the first one seals, every one opens (rotation: add a new first line,
    keep the old ones until every payload sealed with them has expired)."""

    def __init__(self, keys: Sequence[tuple[str, bytes]]) -> None:
        if not keys:
            raise KeyRingError("the key ring holds no key")
        self.active = keys[0][0]
        self._keys = {key_id: AESGCM(key) for key_id, key in keys}

    @classmethod
    def parse(cls, text: str) -> KeyRing:
        """One key a line, `key_id:base64(32 bytes)`; blank lines and `#` comments are skipped."""
        keys: list[tuple[str, bytes]] = []
        for number, line in enumerate(text.splitlines(), start=1):
            entry = line.strip()
            if not entry or entry.startswith("#"):
                continue
            key_id, _, encoded = entry.partition(":")
            if not KEY_ID.fullmatch(key_id):
                raise KeyRingError(f"line {number}: a key ID is 1-64 characters of [A-Za-z0-9._-]")
            try:
                key = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                raise KeyRingError(f"line {number}: the key is not base64") from None
            if len(key) != 32:
                raise KeyRingError(f"line {number}: the key must be 32 bytes (AES-256)")
            keys.append((key_id, key))
        return cls(keys)

    @staticmethod
    def new_line(key_id: str = "k1") -> str:
        """A fresh key ring line (what the embedded mode writes, and what rotation adds on top)."""
        return f"{key_id}:{base64.b64encode(secrets.token_bytes(32)).decode('ascii')}\n"

    def seal(self, payload: bytes, aad: bytes) -> Sealed:
        """Encrypt under the active key with a fresh 96-bit nonce."""
        nonce = secrets.token_bytes(NONCE_BYTES)
        return Sealed(self.active, nonce, self._keys[self.active].encrypt(nonce, payload, aad))

    def open_sealed(self, sealed: Sealed, aad: bytes) -> bytes | None:
        """The payload, or None when its key is no longer in the ring or it does not authenticate."""
        aead = self._keys.get(sealed.key_id)
        if aead is None:
            return None
        try:
            return aead.decrypt(sealed.nonce, sealed.ciphertext, aad)
        except InvalidTag:
            return None
