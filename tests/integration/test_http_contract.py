"""Authentication, scopes, tenant isolation and problem+json answers for bad input (docs/api.md §3-4)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import jwt
import pytest

from effect_ledger.http.auth import ALL_SCOPES
from support.auth import TEST_SECRET, auth

CLAIM = {"tool": "measure", "tool_version": "1", "intent": {"x": 1}}
PROBLEM_MEMBERS = {"type", "title", "status", "code", "detail"}


def claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {
        "sub": "exec-1",
        "tenant": "t1",
        "scope": " ".join(ALL_SCOPES),
        "iat": now,
        "exp": now + 300,
        "aud": "effect-ledger",
        "iss": "effect-ledger",
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def assert_problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert PROBLEM_MEMBERS <= set(body)
    assert body["code"] == code and body["status"] == status
    assert body["type"] == f"urn:effect-ledger:problem:{code}"
    return body


async def test_missing_token_is_401_with_www_authenticate(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/operations/op/claim", json=CLAIM)
    assert_problem(r, 401, "unauthenticated")
    assert r.headers["www-authenticate"] == "Bearer"


def _rsa_token() -> str:
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return jwt.encode(claims(), key, algorithm="RS256")


BAD_TOKENS = {
    "alg_none": lambda: jwt.encode(claims(), None, algorithm="none"),  # type: ignore[arg-type]
    "wrong_secret": lambda: jwt.encode(
        claims(), "another-secret-of-sufficient-length-123456", algorithm="HS256"
    ),
    "expired": lambda: jwt.encode(claims(exp=int(time.time()) - 5), TEST_SECRET, algorithm="HS256"),
    "wrong_audience": lambda: jwt.encode(claims(aud="someone-else"), TEST_SECRET, algorithm="HS256"),
    "wrong_issuer": lambda: jwt.encode(claims(iss="someone-else"), TEST_SECRET, algorithm="HS256"),
    "no_tenant": lambda: jwt.encode(claims(tenant=None), TEST_SECRET, algorithm="HS256"),
    "empty_tenant": lambda: jwt.encode(claims(tenant=""), TEST_SECRET, algorithm="HS256"),
    "no_iat": lambda: jwt.encode(claims(iat=None), TEST_SECRET, algorithm="HS256"),
    "no_exp": lambda: jwt.encode(claims(exp=None), TEST_SECRET, algorithm="HS256"),
    "no_sub": lambda: jwt.encode(claims(sub=None), TEST_SECRET, algorithm="HS256"),
    "hs512": lambda: jwt.encode(claims(), TEST_SECRET, algorithm="HS512"),
    "rs256_when_hs256": _rsa_token,
    "garbage": lambda: "not-a-jwt",
    "oversized": lambda: jwt.encode(claims(pad="x" * 10000), TEST_SECRET, algorithm="HS256"),
}


@pytest.mark.parametrize("name", sorted(BAD_TOKENS))
async def test_bad_tokens_are_401(client: httpx.AsyncClient, name: str) -> None:
    headers = {"Authorization": f"Bearer {BAD_TOKENS[name]()}"}
    r = await client.post("/v1/operations/op/claim", json=CLAIM, headers=headers)
    body = assert_problem(r, 401, "unauthenticated")
    assert r.headers["www-authenticate"] == "Bearer"
    assert "eyJ" not in body["detail"]


async def test_missing_scope_is_403(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/operations/op/claim", json=CLAIM, headers=auth(scope="ledger:audit"))
    assert_problem(r, 403, "forbidden")
    r = await client.get("/v1/operations/op", headers=auth(scope="diagnostics:write"))
    assert_problem(r, 403, "forbidden")


async def test_another_tenants_operation_is_indistinguishable_from_nothing(client: httpx.AsyncClient) -> None:
    granted = await client.post("/v1/operations/shared-id/claim", json=CLAIM, headers=auth("t1"))
    token = granted.json()["claim"]["token"]
    foreign = await client.get("/v1/operations/shared-id", headers=auth("t2"))
    missing = await client.get("/v1/operations/never-claimed", headers=auth("t2"))
    assert_problem(foreign, 404, "not_found")
    assert foreign.json() == missing.json()
    # t1's token is useless in t2, and the same ID in t2 is a separate, new operation
    r = await client.post("/v1/operations/shared-id/submit", json={"token": token}, headers=auth("t2"))
    assert_problem(r, 404, "not_found")
    r = await client.post("/v1/operations/shared-id/claim", json=CLAIM, headers=auth("t2"))
    assert r.status_code == 201 and r.json()["claim"]["attempt"] == 1


async def test_unknown_route_and_wrong_method_are_problems(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/v2/nothing", headers=auth()), 404, "not_found")
    r = await client.get("/v1/operations/op/claim", headers=auth())
    assert_problem(r, 405, "method_not_allowed")
    assert "POST" in r.headers["allow"]


@pytest.mark.parametrize(
    ("content", "status", "code"),
    [
        (b"{not json", 400, "malformed_request"),
        (b"[1, 2]", 400, "malformed_request"),
        (b'"a string"', 400, "malformed_request"),
        (b"\xff\xfe\x00", 400, "malformed_request"),
        (b'{"tool": "t", "tool_version": "1", "intent": 1, "extra": true}', 422, "validation_failed"),
        (b'{"tool": 5, "tool_version": "1", "intent": 1}', 422, "validation_failed"),
        (b'{"tool_version": "1", "intent": 1}', 422, "validation_failed"),
        (b'{"tool": "t", "tool_version": "1"}', 422, "validation_failed"),
        (
            b'{"tool": "t", "tool_version": "1", "intent": 1, "intent_digest": "sha256:' + b"a" * 64 + b'"}',
            422,
            "validation_failed",
        ),
        (b'{"tool": "t", "tool_version": "1", "intent_digest": "md5:abc"}', 422, "validation_failed"),
        (b'{"tool": "t", "tool_version": "1", "intent": 1, "lease_seconds": 0}', 422, "validation_failed"),
        (b'{"tool": "t", "tool_version": "1", "intent": 1, "lease_seconds": 3601}', 422, "validation_failed"),
        (b'{"tool": "t", "tool_version": "1", "intent": 1, "lease_seconds": true}', 422, "validation_failed"),
        (
            b'{"tool": "t", "tool_version": "1", "intent": 1, "client_nonce": "short"}',
            422,
            "validation_failed",
        ),
        (
            b'{"tool": "t", "tool_version": "1", "intent": ' + b"[" * 5000 + b"]" * 5000 + b"}",
            422,
            "validation_failed",
        ),
    ],
)
async def test_bad_bodies(
    client: httpx.AsyncClient, content: bytes, status: int, code: str, db_url: str
) -> None:
    r = await client.post(
        "/v1/operations/op-bad/claim", content=content, headers={**auth(), "content-type": "application/json"}
    )
    assert_problem(r, status, code)
    assert (await client.get("/v1/operations/op-bad", headers=auth())).status_code == 404


async def test_validation_errors_name_the_field(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/operations/op/claim", json={**CLAIM, "surprise": 1}, headers=auth())
    assert assert_problem(r, 422, "validation_failed")["errors"] == [
        {"field": "surprise", "problem": "unknown field"}
    ]
    r = await client.post("/v1/operations/op/claim", json={**CLAIM, "lease_seconds": "30"}, headers=auth())
    errors = r.json()["errors"]
    assert [e["field"] for e in errors] == ["lease_seconds"]


async def test_invalid_operation_id_is_422(client: httpx.AsyncClient) -> None:
    r = await client.post(f"/v1/operations/{'a' * 201}/claim", json=CLAIM, headers=auth())
    assert assert_problem(r, 422, "validation_failed")["errors"][0]["field"] == "operation_id"
    r = await client.post("/v1/operations/bad%20id/claim", json=CLAIM, headers=auth())
    assert_problem(r, 422, "validation_failed")


async def test_body_over_256_kib_is_413_before_parsing(client: httpx.AsyncClient) -> None:
    body = b'{"tool": "t", "tool_version": "1", "intent": "' + b"x" * (300 * 1024) + b'"}'
    r = await client.post(
        "/v1/operations/op/claim", content=body, headers={**auth(), "content-type": "application/json"}
    )
    assert_problem(r, 413, "payload_too_large")


async def test_intent_over_64_kib_is_422(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/operations/op/claim", json={**CLAIM, "intent": "x" * (65 * 1024)}, headers=auth()
    )
    assert assert_problem(r, 422, "validation_failed")["errors"][0]["field"] == "intent"


async def test_intent_digest_is_accepted_instead_of_intent(client: httpx.AsyncClient) -> None:
    digest = "sha256:" + "ab" * 32
    body = {"tool": "t", "tool_version": "1", "intent_digest": digest}
    r = await client.post("/v1/operations/op-d/claim", json=body, headers=auth())
    assert r.status_code == 201 and r.json()["operation"]["intent_digest"] == digest
