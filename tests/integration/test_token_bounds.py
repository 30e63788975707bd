"""API.md section 3 as a hostile caller tries it: tenant and sub bounded in length and characters,
token lifetime bounded by JWT_MAX_TTL_SECONDS; every violation is 401 with WWW-Authenticate: Bearer."""

from __future__ import annotations

import time
from typing import Any

import httpx
import jwt
import pytest

from support.auth import TEST_SECRET

SCOPE = "ledger:execute ledger:reconcile ledger:audit diagnostics:write"
_DROP = object()


def _signed(**changes: Any) -> dict[str, str]:
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
    return {"Authorization": "Bearer " + jwt.encode(claims, TEST_SECRET, algorithm="HS256")}


NOW = int(time.time())
HOSTILE = {
    "tenant_5000_chars": _signed(tenant="t" * 5000),
    "tenant_129_chars": _signed(tenant="t" * 129),
    "tenant_with_nul": _signed(tenant="t1\x00"),
    "tenant_only_nul": _signed(tenant="\x00"),
    "tenant_with_slash": _signed(tenant="t1/t2"),
    "tenant_with_space": _signed(tenant="t 1"),
    "tenant_with_newline": _signed(tenant="t1\nadmin"),
    "tenant_non_ascii": _signed(tenant="tenänt"),
    "tenant_percent": _signed(tenant="t%00"),
    "tenant_empty": _signed(tenant=""),
    "tenant_list": _signed(tenant=["t1"]),
    "tenant_null": _signed(tenant=None),
    "sub_5000_chars": _signed(sub="s" * 5000),
    "sub_with_nul": _signed(sub="exec\x001"),
    "sub_with_quote": _signed(sub='exec"1'),
    "sub_empty": _signed(sub=""),
    "sub_number": _signed(sub=12),
    "lifetime_2_pow_62": _signed(iat=NOW, exp=NOW + 2**62),
    "lifetime_one_second_over": _signed(iat=NOW - 10, exp=NOW - 10 + 86401),
    "iat_far_past": _signed(iat=NOW - 10 * 365 * 86400, exp=NOW + 60),
    "iat_missing": _signed(iat=_DROP),
    "iat_string": _signed(iat="yesterday"),
    "iat_true": _signed(iat=True, exp=NOW + 60),
    "exp_missing": _signed(exp=_DROP),
}
CALLS = [
    ("GET", "/v1/operations/op-1", None),
    ("POST", "/v1/operations/op-1/claim", {"tool": "t", "tool_version": "1", "intent": {}}),
    ("GET", "/v1/receipts", None),
    ("POST", "/v1/diagnostics", {"cause": "timeout"}),
]


@pytest.mark.parametrize("attack", sorted(HOSTILE))
async def test_hostile_claims_are_401(client: httpx.AsyncClient, attack: str) -> None:
    for method, path, body in CALLS:
        r = await client.request(method, path, json=body, headers=HOSTILE[attack])
        assert r.status_code == 401, (attack, path, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["code"] == "unauthenticated"


async def test_the_bounds_themselves_are_accepted(client: httpx.AsyncClient) -> None:
    edge = [
        _signed(tenant="T" * 128, sub="s" * 128),
        _signed(tenant="a.b_c:d@e~f-9", sub="svc:exec@pool~1.a_b-c"),
        _signed(tenant="x", sub="y"),
        _signed(iat=NOW - 5, exp=NOW - 5 + 86400),  # exactly the maximum lifetime
    ]
    for headers in edge:
        r = await client.get("/v1/operations/op-1", headers=headers)
        assert r.status_code == 404, r.text  # authenticated; no such operation


async def test_a_5000_char_tenant_never_becomes_a_tenant(client: httpx.AsyncClient) -> None:
    body = {"tool": "t", "tool_version": "1", "intent": {}}
    r = await client.post("/v1/operations/op-1/claim", json=body, headers=_signed(tenant="t" * 5000))
    assert r.status_code == 401
    r = await client.post("/v1/operations/op-1/claim", json=body, headers=_signed(tenant="t" * 128))
    assert r.status_code == 201
