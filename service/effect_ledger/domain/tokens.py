"""Claim tokens: random fencing tokens, stored only as hashes, recoverable only with the client's nonce."""

from __future__ import annotations

import base64
import hashlib

TOKEN_PREFIX = "clt_"  # noqa: S105 - a prefix, not a secret
TOKEN_BYTES = 32


def encode_token(raw: bytes) -> str:
    """The token as the claimant sees it: a prefix that log redaction recognises, then base64url."""
    return TOKEN_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_token(token: str) -> bytes | None:
    """The raw bytes of a well-formed token, or None."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    body = token[len(TOKEN_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (ValueError, TypeError):
        return None
    return raw if len(raw) == TOKEN_BYTES else None


def token_hash(token: str) -> bytes:
    """What the database stores and compares: SHA-256 of the token text."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def nonce_hash(nonce: str) -> bytes:
    """The stored form of a client nonce: enough to recognise a retried claim, not to recover it."""
    return hashlib.sha256(b"effect-ledger/nonce\0" + nonce.encode("utf-8")).digest()


SALT_BYTES = 16


def _pad(nonce: str, tenant: str, operation_id: str, salt: bytes) -> bytes:
    material = "\0".join((tenant, operation_id, salt.hex(), nonce)).encode("utf-8")
    return hashlib.sha256(b"effect-ledger/seal\0" + material).digest()


def seal(raw: bytes, nonce: str, tenant: str, operation_id: str, salt: bytes) -> bytes:
    """The salt, then the token XOR a pad only the nonce's holder can rebuild: a lost answer can be
    replayed, and the token itself is never stored. The random salt (one per granted attempt) makes
    every attempt's pad different without the attempt number, which only the database knows."""
    return salt + _xor(raw, _pad(nonce, tenant, operation_id, salt))


def unseal(sealed: bytes, nonce: str, tenant: str, operation_id: str) -> bytes:
    """Inverse of seal (XOR with the same pad)."""
    salt, body = sealed[:SALT_BYTES], sealed[SALT_BYTES:]
    return _xor(body, _pad(nonce, tenant, operation_id, salt))


def _xor(data: bytes, pad: bytes) -> bytes:
    """`data` XOR `pad` (equal lengths), byte for byte; as integers, not a generator over the bytes."""
    if len(data) != len(pad):
        raise ValueError("data and pad differ in length")
    return (int.from_bytes(data) ^ int.from_bytes(pad)).to_bytes(len(data))
