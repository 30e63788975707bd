"""A JWKS as the token key file (RS256 / ES256 / EdDSA): a token with a `kid` is checked with that key,
one without with each key in turn (round 24: only the first, so that during a key rotation, two keys
in the set, tokens signed with the second were refused)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jwt.algorithms import OKPAlgorithm

from effect_ledger.domain.errors import LedgerError
from effect_ledger.http.auth import TokenVerifier
from effect_ledger.settings import Settings

OLD, NEW, STRANGER = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()


def jwk(key: Ed25519PrivateKey, kid: str) -> dict[str, Any]:
    return {**json.loads(OKPAlgorithm.to_jwk(key.public_key())), "kid": kid, "alg": "EdDSA"}


def minted(key: Ed25519PrivateKey, kid: str | None = None) -> str:
    settings, now = Settings(), int(time.time())
    claims = {"sub": "exec-1", "tenant": "t1", "scope": "ledger:execute", "iat": now, "exp": now + 600}
    claims |= {"aud": settings.jwt_audience, "iss": settings.jwt_issuer}
    headers = {"kid": kid} if kid else None
    return jwt.encode(claims, key, algorithm="EdDSA", headers=headers)


@pytest.fixture
def verifier(tmp_path: Path) -> TokenVerifier:
    keys = tmp_path / "jwks.json"
    keys.write_text(json.dumps({"keys": [jwk(OLD, "old"), jwk(NEW, "new")]}))
    return TokenVerifier(replace(Settings(), jwt_algorithm="EdDSA", jwt_public_key_file=str(keys)))


@pytest.mark.parametrize(("key", "kid"), [(OLD, None), (NEW, None), (OLD, "old"), (NEW, "new")])
def test_a_token_of_either_key_is_verified(
    verifier: TokenVerifier, key: Ed25519PrivateKey, kid: str | None
) -> None:
    caller = verifier.verify(minted(key, kid))
    assert (caller.tenant, caller.principal) == ("t1", "exec-1")


@pytest.mark.parametrize(("key", "kid"), [(STRANGER, None), (NEW, "old"), (NEW, "unknown")])
def test_a_token_of_no_key_in_the_set_is_401(
    verifier: TokenVerifier, key: Ed25519PrivateKey, kid: str | None
) -> None:
    with pytest.raises(LedgerError) as refused:
        verifier.verify(minted(key, kid))
    assert refused.value.code == "unauthenticated"


def test_a_set_mixing_key_types_verifies_a_token_without_kid_of_its_second_key(tmp_path: Path) -> None:
    """Keys of another type than the algorithm's are left out when the set is read (round 36: an RSA key
    first in the set raised on an EdDSA token instead of failing its signature, and the token of the
    second key was refused), and so is a key marked for encryption."""
    from cryptography.hazmat.primitives.asymmetric import rsa
    from jwt.algorithms import RSAAlgorithm

    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    foreign = {**json.loads(RSAAlgorithm.to_jwk(rsa_key)), "kid": "rsa"}
    keys = tmp_path / "jwks.json"
    keys.write_text(json.dumps({"keys": [foreign, {**jwk(OLD, "enc-only"), "use": "enc"}, jwk(NEW, "new")]}))
    mixed = TokenVerifier(replace(Settings(), jwt_algorithm="EdDSA", jwt_public_key_file=str(keys)))
    assert mixed.verify(minted(NEW)).principal == "exec-1"
    for kid in (None, "enc-only"):  # the encryption key verifies no signature, with or without kid
        with pytest.raises(LedgerError) as refused:
            mixed.verify(minted(OLD, kid))
        assert refused.value.code == "unauthenticated"
    keys.write_text(json.dumps({"keys": [foreign, {**jwk(OLD, "enc-only"), "use": "enc"}]}))
    with pytest.raises(ValueError, match="the JWKS holds no signature key for EdDSA"):
        TokenVerifier(replace(Settings(), jwt_algorithm="EdDSA", jwt_public_key_file=str(keys)))
