"""Claim tokens: random fencing tokens, stored only as hashes, recoverable only with the client's nonce."""

from __future__ import annotations

import base64
import hashlib
import hmac

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


def tokens_match(stored_hash: bytes, presented: str) -> bool:
    """Constant-time comparison of a presented token with the stored hash."""
    return hmac.compare_digest(stored_hash, token_hash(presented))


def nonce_hash(nonce: str) -> bytes:
    """The stored form of a client nonce: enough to recognise a retried claim, not to recover it."""
    return hashlib.sha256(b"effect-ledger/nonce\0" + nonce.encode("utf-8")).digest()


def _pad(nonce: str, tenant: str, operation_id: str, attempt: int) -> bytes:
    material = "\0".join((tenant, operation_id, str(attempt), nonce)).encode("utf-8")
    return hashlib.sha256(b"effect-ledger/seal\0" + material).digest()


def seal(raw: bytes, nonce: str, tenant: str, operation_id: str, attempt: int) -> bytes:
    """XOR the token with a pad only the nonce's holder can rebuild, so a lost answer can be replayed."""
    return bytes(a ^ b for a, b in zip(raw, _pad(nonce, tenant, operation_id, attempt), strict=True))


def unseal(sealed: bytes, nonce: str, tenant: str, operation_id: str, attempt: int) -> bytes:
    """Inverse of seal (XOR is its own inverse)."""
    return seal(sealed, nonce, tenant, operation_id, attempt)
