"""Scenario 11: forged, stale and malformed bearer tokens. Every one is a 401 problem, none a 5xx."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from support.auth import TEST_SECRET, token
from support.harness import chaos_settings, scenario, timeout
from support.recording import History, check_answers
from support.server import Service

pytestmark = [pytest.mark.chaos, timeout(60, 300)]

SCOPE = "ledger:execute ledger:reconcile ledger:audit diagnostics:write diagnostics:read"
CALLS = [
    ("GET", "/v1/operations/op-1", None),
    ("POST", "/v1/operations/op-1/claim", {"tool": "t", "tool_version": "1", "intent": {}}),
    ("GET", "/v1/operations?limit=5", None),
    ("POST", "/v1/diagnostics", {"cause": "timeout"}),
]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unsigned(header: dict[str, Any], claims: dict[str, Any], signature: bytes = b"") -> str:
    return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}.{_b64(signature)}"


def _hs256_with(key: bytes, claims: dict[str, Any]) -> str:
    """HS256 by hand, so any bytes (a PEM public key, say) can be the secret."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    signing_input = f"{header}.{_b64(json.dumps(claims).encode())}"
    signature = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


def _claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    claims: dict[str, Any] = {
        "sub": "exec-1",
        "tenant": "t1",
        "scope": SCOPE,
        "iat": now,
        "exp": now + 600,
        "aud": "effect-ledger",
        "iss": "effect-ledger",
    }
    for name, value in changes.items():
        if value is _DROP:
            claims.pop(name)
        else:
            claims[name] = value
    return claims


_DROP = object()


def hs256_attacks(private_pem: bytes) -> dict[str, str | None]:
    """Authorization header values an HS256 service must refuse (None: no header at all)."""
    now = int(time.time())
    good = token("t1", "exec-1", SCOPE)
    head, body, sig = good.split(".")
    forged_body = _b64(json.dumps(_claims(tenant="t2")).encode())

    def signed(claims: dict[str, Any], secret: str = TEST_SECRET) -> str:
        return "Bearer " + jwt.encode(claims, secret, algorithm="HS256")

    return {
        "alg_none": "Bearer " + _unsigned({"alg": "none", "typ": "JWT"}, _claims()),
        "alg_none_uppercase": "Bearer " + _unsigned({"alg": "NONE", "typ": "JWT"}, _claims()),
        "alg_none_with_signature": "Bearer " + _unsigned({"alg": "none"}, _claims(), b"x" * 32),
        "rs256_signed_by_attacker": "Bearer " + jwt.encode(_claims(), private_pem, algorithm="RS256"),
        "hs512_same_secret": "Bearer " + jwt.encode(_claims(), TEST_SECRET, algorithm="HS512"),
        "wrong_secret": signed(_claims(), "another-secret-of-sufficient-length-0123456789abcdef"),
        "tampered_tenant": f"Bearer {head}.{forged_body}.{sig}",
        "signature_stripped": f"Bearer {head}.{body}.",
        "expired": signed(_claims(iat=now - 7200, exp=now - 3600)),
        "issued_in_the_future": signed(_claims(iat=now + 3600, exp=now + 7200)),
        "not_before_in_the_future": signed(_claims(nbf=now + 3600)),
        "wrong_audience": signed(_claims(aud="someone-else")),
        "wrong_issuer": signed(_claims(iss="someone-else")),
        "no_audience": signed(_claims(aud=_DROP)),
        "no_issuer": signed(_claims(iss=_DROP)),
        "no_tenant": signed(_claims(tenant=_DROP)),
        "empty_tenant": signed(_claims(tenant="")),
        "numeric_tenant": signed(_claims(tenant=7)),
        "no_subject": signed(_claims(sub=_DROP)),
        "no_expiry": signed(_claims(exp=_DROP)),
        "no_issued_at": signed(_claims(iat=_DROP)),
        "scope_not_a_string": signed(_claims(scope=["ledger:execute"])),
        "oversized_claims": signed(_claims(pad="x" * 12000)),
        "oversized_garbage": "Bearer " + "A" * 20000,
        "garbage": "Bearer not-a-jwt",
        "garbage_three_parts": "Bearer a.b.c",
        "garbage_base64_json": "Bearer " + _b64(b"{}") + "." + _b64(b"[]") + "." + _b64(b"\x00"),
        "empty_bearer": "Bearer",
        "basic_scheme": "Basic " + _b64(b"exec-1:password"),
        "token_without_scheme": good,
        "no_header": None,
    }


def confusion_attacks(public_pem: bytes) -> dict[str, str]:
    """Against an RS256 service: the public key used as an HMAC secret, and `alg: none`."""
    return {
        "hs256_with_public_key_as_secret": "Bearer " + _hs256_with(public_pem, _claims()),
        "hs256_with_public_key_stripped": "Bearer " + _hs256_with(public_pem.strip(), _claims()),
        "alg_none": "Bearer " + _unsigned({"alg": "none", "typ": "JWT"}, _claims()),
    }


async def _attack(http: httpx.AsyncClient, attacks: dict[str, str | None]) -> list[str]:
    """Send every attack to every call; anything but a proper 401 is a violation."""
    found = []
    for name, value in attacks.items():
        headers = {} if value is None else {"Authorization": value}
        for method, path, body in CALLS:
            r = await http.request(method, path, json=body, headers=headers)
            if (
                r.status_code != 401
                or r.headers.get("www-authenticate") != "Bearer"
                or r.json().get("code") != "unauthenticated"
            ):
                found.append(f"{name}: {method} {path} -> {r.status_code} {r.text[:120]}")
    return found


async def test_token_attacks_are_all_refused_with_401(
    request: pytest.FixtureRequest, db_url: str, tmp_path: Path
) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    public_file = tmp_path / "public.pem"
    public_file.write_bytes(public_pem)
    history = History()
    hs = chaos_settings(db_url)
    rs = chaos_settings(db_url, jwt_algorithm="RS256", jwt_public_key_file=str(public_file))
    attacks = hs256_attacks(private_pem)
    confusion = confusion_attacks(public_pem)
    with scenario(request, "token_attacks") as figures:
        async with (
            Service(hs) as service,
            httpx.AsyncClient(base_url=service.base_url, transport=history.transport(), timeout=30) as http,
        ):
            figures.violations += await _attack(http, attacks)
            control = await http.get("/v1/operations/op-1", headers={"Authorization": f"Bearer {token()}"})
        async with (
            Service(rs) as service,
            httpx.AsyncClient(base_url=service.base_url, transport=history.transport(), timeout=30) as http,
        ):
            figures.violations += await _attack(http, confusion)
            genuine = "Bearer " + jwt.encode(_claims(), private_pem, algorithm="RS256")
            rs_control = await http.get("/v1/operations/op-1", headers={"Authorization": genuine})
        figures.operations = len(history.calls)
        figures.faults = (len(attacks) + len(confusion)) * len(CALLS)
        figures.extra = {"attacks": len(attacks) + len(confusion), "answers": dict(history.statuses())}
        figures.check(check_answers(history, allowed_5xx=frozenset()))
    figures.assert_clean()
    # the controls: a genuine token of each service gets through authentication (404: no such op)
    assert control.status_code == 404 and rs_control.status_code == 404
    assert history.statuses() == {401: figures.faults, 404: 2}
