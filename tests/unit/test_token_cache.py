"""Verified tokens are remembered until their exp, and only tokens that passed every check."""

from __future__ import annotations

import time

import pytest

from effect_ledger.domain.errors import LedgerError
from effect_ledger.http import auth
from effect_ledger.settings import Settings

SECRET = "token-cache-secret-0123456789abcdefghijklmnopqrstuvwxyz-0123456789"


def verifier() -> auth.TokenVerifier:
    return auth.TokenVerifier(Settings(jwt_secret=SECRET), SECRET)


def test_a_remembered_token_still_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    v = verifier()
    now = int(time.time())
    token = auth.mint_token(SECRET, "t1", "exec-1", "ledger:execute", Settings(), ttl_seconds=60, now=now)
    first = v.verify(token)
    full = []
    fully = v._verify_fully
    monkeypatch.setattr(v, "_verify_fully", lambda t: full.append(t) or fully(t))
    assert v.verify(token) is first and full == []  # from memory: the same caller object
    monkeypatch.setattr(auth.time, "time", lambda: now + 60.0)  # the moment PyJWT calls it expired
    v.verify(token)  # (PyJWT's own clock is real, so the full check still passes here)
    assert full == [token]  # at exp the memory is not trusted: every check runs again


def test_refused_tokens_are_not_remembered_and_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    v = verifier()
    forged = auth.mint_token(
        "another-secret-0123456789abcdefghijklmnopqrstuvwxyz-0123", "t1", "x", "", Settings()
    )
    for _ in range(2):
        with pytest.raises(LedgerError):
            v.verify(forged)
    monkeypatch.setattr(auth, "VERIFIED_TOKENS", 3)
    tokens = [auth.mint_token(SECRET, "t1", f"exec-{n}", "", Settings()) for n in range(5)]
    for token in tokens:
        v.verify(token)
    assert list(v._verified) == tokens[2:]
