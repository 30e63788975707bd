"""docs/api.md section 9 over real HTTP: report, screening, audited reads, complete(unknown) with diagnostics."""

from __future__ import annotations

import base64
import json
from typing import Any

import asyncpg
import httpx
import pytest
from litestar import Litestar, get
from litestar.testing import AsyncTestClient

from effect_ledger.http.diagnostics import DiagnosticsController
from effect_ledger.http.problems import EXCEPTION_HANDLERS
from support.auth import auth

READ = "diagnostics:read"
WRITE = "diagnostics:write"
NOT_ALLOWED = "is not one of the allowed values"
REPEATED = "repeats a header name (names are case-insensitive)"
PURPOSE = {"purpose": "ticket OPS-1234: timeouts from provider"}
FULL = {
    "operation_id": "op-7",
    "attempt": 2,
    "phase": "first_byte",
    "cause": "rate_limited",
    "http_status": 429,
    "provider": "example-llm",
    "provider_request_id": "req_011CSHoEeqs5C35K2UUqR7Fy",
    "retryable_hint": True,
    "elapsed_ms": 1234,
    "detail_code": "upstream_429",
    "headers": {"Retry-After": "30", "X-RateLimit-Remaining-Tokens": "0", "x-request-id": "abc-123"},
}

# Fake secrets are assembled from pieces, as in tests/unit/test_screening.py.
MIXED = "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zC7"


def _b64url(data: dict[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


JWT = ".".join([_b64url({"alg": "HS256", "typ": "JWT"}), _b64url({"sub": "x"}), "Sfl" + MIXED[:24]])

# (body, field the refusal names)
SENSITIVE: list[Any] = [
    pytest.param({"provider_request_id": "Bearer " + "abcdef123456"}, "provider_request_id", id="bearer"),
    pytest.param({"headers": {"x-request-id": JWT}}, 'headers["x-request-id"]', id="jwt-in-header"),
    pytest.param({"detail_code": "-----BEGIN " + "PRIVATE KEY-----"}, "detail_code", id="pem"),
    pytest.param({"provider": "AKIA" + "IOSFODNN7EXAMPLE"}, "provider", id="aws-key-id"),
    pytest.param({"provider_request_id": "gh" + "p_" + MIXED + "01"}, "provider_request_id", id="github"),
    pytest.param({"provider_request_id": "sk" + "_live_" + MIXED[:24]}, "provider_request_id", id="stripe"),
    pytest.param({"provider_request_id": "sk" + "-proj-" + MIXED}, "provider_request_id", id="openai"),
    pytest.param({"detail_code": "sk" + "-ant-api03-" + MIXED}, "detail_code", id="anthropic"),
    pytest.param({"provider": "AI" + "za" + "SyA-1234567890abcdefghijklmnopqrstu"}, "provider", id="google"),
    pytest.param(
        {"headers": {"request-id": "xo" + "xb-1234567890-" + MIXED[:20]}}, 'headers["request-id"]', id="slack"
    ),
    pytest.param(
        {"provider_request_id": "Qcb0Orv1zh30vL1MPRsbm-diHiMwcLyZvn1arpZv"},
        "provider_request_id",
        id="random-base64url",
    ),
    pytest.param({"detail_code": "password=" + "hunter22"}, "detail_code", id="password-assignment"),
    pytest.param({"provider": "https://svc:" + "hunter22@db.example.com/x"}, "provider", id="url-password"),
    pytest.param(
        {"provider_request_id": "clt_" + base64.urlsafe_b64encode(bytes(range(32))).decode()[:43]},
        "provider_request_id",
        id="claim-token",
    ),
    pytest.param(
        {"headers": {"x-ratelimit-reset": "Basic " + base64.b64encode(b"u:pw").decode()}},
        'headers["x-ratelimit-reset"]',
        id="basic",
    ),
    pytest.param(
        {"cause": "auth", "detail_code": "api_key: " + "a1b2c3d4e5"}, "detail_code", id="api-key-assign"
    ),
]

ORDINARY: list[Any] = [
    pytest.param({"provider_request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"}, id="anthropic-request-id"),
    pytest.param({"provider_request_id": "req_" + "6f0b5a3c2e1d4f7a8b9c0d1e2f3a4b5c"}, id="openai-req-id"),
    pytest.param({"provider_request_id": "chatcmpl-" + "B9MHDbslfkBeAs8l4bebGdFOJ6PeG"}, id="completion-id"),
    pytest.param({"headers": {"x-request-id": "550e8400-e29b-41d4-a716-446655440000"}}, id="uuid"),
    pytest.param({"headers": {"request-id": "6f0b5a3c2e1d4f7a8b9c0d1e2f3a4b5c"}}, id="hex-trace-id"),
    pytest.param({"headers": {"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"}}, id="retry-after-date"),
    pytest.param({"headers": {"x-ratelimit-remaining-tokens": "0"}}, id="ratelimit"),
    pytest.param({"provider": "gpt-4o-mini-2024-07-18-fine-tuned-model"}, id="model-slug"),
    pytest.param({"provider": "claude-3-5-sonnet-20241022-v2-bedrock"}, id="model-slug-digits"),
    pytest.param({"detail_code": "invalid_request_error_rate_limit_exceeded"}, id="snake-case-code"),
    pytest.param({"detail_code": "token: expired"}, id="token-word"),
    pytest.param({"detail_code": "max_tokens: 1024"}, id="max-tokens"),
    pytest.param({"detail_code": "missing Bearer token in request"}, id="bearer-in-prose"),
    pytest.param({"provider": "sk-learn-is-a-python-library-for-ml"}, id="sk-slug"),
    pytest.param({"provider": "arn:aws:iam::123456789012:role/ServiceRole"}, id="aws-arn"),
    pytest.param({"operation_id": "op-7", "attempt": 3, "phase": "stream", "cause": "aborted"}, id="plain"),
    pytest.param(FULL, id="every-field"),
]


async def report(client: httpx.AsyncClient, body: Any, **who: str) -> httpx.Response:
    return await client.post("/v1/diagnostics", json=body, headers=auth(**who))


async def read(client: httpx.AsyncClient, incident: str, params: Any = None, **who: str) -> httpx.Response:
    return await client.get(
        f"/v1/diagnostics/{incident}", params=PURPOSE if params is None else params, headers=auth(**who)
    )


async def owner_count(db_url: str, query: str) -> int:
    conn = await asyncpg.connect(db_url)
    try:
        return int(await conn.fetchval(query))
    finally:
        await conn.close()


def test_screening_tables_are_large_enough() -> None:
    assert len(SENSITIVE) >= 15
    assert len(ORDINARY) >= 15


@pytest.mark.parametrize(("body", "field"), SENSITIVE)
async def test_credential_shaped_values_are_refused_and_nothing_is_stored(
    client: httpx.AsyncClient, db_url: str, body: dict[str, Any], field: str
) -> None:
    r = await report(client, body)
    assert r.status_code == 422
    problem = r.json()
    assert problem["code"] == "sensitive_value_rejected"
    assert problem["errors"] == [{"field": field, "problem": "looks like a credential"}]
    for value in _values(body):
        assert value not in r.text  # the value is never echoed
    assert await owner_count(db_url, "SELECT count(*) FROM diagnostics.incidents") == 0


@pytest.mark.parametrize("body", ORDINARY)
async def test_ordinary_values_are_stored(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    r = await report(client, body)
    assert r.status_code == 201, r.text
    incident = r.json()["incident"]
    assert set(r.json()) == {"incident"} and incident.startswith("inc_")
    got = await read(client, incident)
    assert got.status_code == 200
    record = got.json()
    for name, value in body.items():
        expected = {k.lower(): v for k, v in value.items()} if name == "headers" else value
        assert record[name] == expected


def _values(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _values(v)]
    return []


async def test_a_report_reads_back_whole_and_the_read_is_logged(
    client: httpx.AsyncClient, db_url: str
) -> None:
    r = await report(client, FULL, sub="executor-9", scope=WRITE)
    assert r.status_code == 201
    incident = r.json()["incident"]
    got = await read(client, incident, sub="operator-1", scope=READ)
    assert got.status_code == 200
    record = got.json()
    assert record.pop("created_at").endswith("Z")
    assert record == {
        "incident": incident,
        "source": "report",
        "principal": "executor-9",
        "operation_id": "op-7",
        "attempt": 2,
        "phase": "first_byte",
        "cause": "rate_limited",
        "http_status": 429,
        "provider": "example-llm",
        "provider_request_id": "req_011CSHoEeqs5C35K2UUqR7Fy",
        "retryable_hint": True,
        "elapsed_ms": 1234,
        "detail_code": "upstream_429",
        "headers": {"retry-after": "30", "x-ratelimit-remaining-tokens": "0", "x-request-id": "abc-123"},
        "route": None,
        "method": None,
        "exception_type": None,
    }
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch("SELECT * FROM diagnostics.access_log")
    finally:
        await conn.close()
    assert len(rows) == 1
    row = rows[0]
    assert (row["tenant_id"], row["incident_id"], row["principal"], row["purpose"]) == (
        "t1",
        incident,
        "operator-1",
        PURPOSE["purpose"],
    )
    assert row["access_id"].startswith("acc_")


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        pytest.param(
            {"phase": "request", "message": "x"},
            [{"field": "message", "problem": "unknown field"}],
            id="unknown-field",
        ),
        pytest.param({"phase": "teleport"}, [{"field": "phase", "problem": NOT_ALLOWED}], id="phase-enum"),
        pytest.param({"cause": "bad_luck"}, [{"field": "cause", "problem": NOT_ALLOWED}], id="cause-enum"),
        pytest.param(
            {"headers": {"retry-after": "1", "Authorization": "x"}},
            [
                {
                    "field": "headers[1]",
                    "problem": "name is not one of retry-after, request-id, x-request-id, x-ratelimit-*",
                }
            ],
            id="header-name",
        ),
        pytest.param(
            {"headers": {"Cookie": "a=b"}},
            [
                {
                    "field": "headers[0]",
                    "problem": "name is not one of retry-after, request-id, x-request-id, x-ratelimit-*",
                }
            ],
            id="cookie-header",
        ),
        pytest.param(
            {"headers": {"x-ratelimit-": "1"}},
            [
                {
                    "field": "headers[0]",
                    "problem": "name is not one of retry-after, request-id, x-request-id, x-ratelimit-*",
                }
            ],
            id="bare-prefix",
        ),
        pytest.param(
            {"headers": {"Retry-After": "1", "retry-after": "2"}},
            [{"field": "headers[1]", "problem": REPEATED}],
            id="duplicate-header",
        ),
        pytest.param({}, [{"field": "body", "problem": "report at least one diagnostics field"}], id="empty"),
        pytest.param({"http_status": 99}, None, id="status-range"),
        pytest.param({"attempt": 0}, None, id="attempt-range"),
        pytest.param({"elapsed_ms": -1}, None, id="elapsed-negative"),
        pytest.param({"retryable_hint": "yes"}, None, id="hint-type"),
        pytest.param({"headers": {"retry-after": 30}}, None, id="header-value-type"),
        pytest.param({"operation_id": "op 7"}, None, id="operation-id-shape"),
    ],
)
async def test_only_the_allow_list_is_accepted(
    client: httpx.AsyncClient, db_url: str, body: dict[str, Any], errors: list[dict[str, str]] | None
) -> None:
    r = await report(client, body)
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "validation_failed"
    if errors is not None:
        assert r.json()["errors"] == errors
    assert await owner_count(db_url, "SELECT count(*) FROM diagnostics.incidents") == 0


async def test_a_body_that_is_not_an_object_is_malformed(client: httpx.AsyncClient) -> None:
    r = await report(client, [FULL])
    assert r.status_code == 400 and r.json()["code"] == "malformed_request"


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        pytest.param({}, "required", id="missing"),
        pytest.param({"purpose": "ab"}, "must be 3-200 characters", id="too-short"),
        pytest.param({"purpose": "   ab   "}, "must be 3-200 characters", id="short-after-trim"),
        pytest.param({"purpose": "x" * 201}, "must be 3-200 characters", id="too-long"),
    ],
)
async def test_a_read_needs_a_purpose(
    client: httpx.AsyncClient, db_url: str, params: dict[str, str], problem: str
) -> None:
    incident = (await report(client, FULL)).json()["incident"]
    r = await read(client, incident, params)
    assert r.status_code == 422
    assert r.json()["code"] == "validation_failed"
    assert r.json()["errors"] == [{"field": "purpose", "problem": problem}]
    assert await owner_count(db_url, "SELECT count(*) FROM diagnostics.access_log") == 0


async def test_another_tenants_incident_reads_exactly_as_a_missing_one(
    client: httpx.AsyncClient, db_url: str
) -> None:
    incident = (await report(client, FULL, tenant="t1")).json()["incident"]
    other = await read(client, incident, tenant="t2")
    missing = await read(client, "inc_" + "Z" * 24, tenant="t2")
    malformed = await read(client, "not-an-incident", tenant="t2")
    assert other.status_code == missing.status_code == malformed.status_code == 404
    assert other.json() == missing.json() == malformed.json()
    assert other.json()["code"] == "not_found"
    varying = {"date": "", "x-request-id": ""}  # per-response values; everything else must match
    assert dict(other.headers) | varying == dict(missing.headers) | varying
    assert await owner_count(db_url, "SELECT count(*) FROM diagnostics.access_log") == 0


async def test_scopes(client: httpx.AsyncClient) -> None:
    assert (await report(client, FULL, scope=READ)).json()["code"] == "forbidden"
    incident = (await report(client, FULL, scope=WRITE)).json()["incident"]
    # A writer cannot read back what it wrote: reads are the operators' alone.
    r = await read(client, incident, scope=WRITE + " ledger:execute ledger:audit")
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    assert (await client.get(f"/v1/diagnostics/{incident}", params=PURPOSE)).status_code == 401
    assert (await read(client, incident, scope=READ)).status_code == 200


async def test_the_access_log_route_is_not_taken_for_an_incident() -> None:
    @get("/v1/diagnostics/access-log", sync_to_thread=False)
    def access_log() -> dict[str, str]:
        return {"route": "access-log"}

    app = Litestar([DiagnosticsController, access_log], exception_handlers=EXCEPTION_HANDLERS)
    async with AsyncTestClient(app) as test_client:
        static = await test_client.get("/v1/diagnostics/access-log", params={"purpose": "audit"})
        assert static.status_code == 200 and static.json() == {"route": "access-log"}
        # Anything else under /v1/diagnostics/ is an incident reference, behind its guard.
        param = await test_client.get("/v1/diagnostics/inc_" + "a" * 24, params={"purpose": "audit"})
        assert param.status_code == 401


async def test_the_served_access_log_is_the_auditors_list(client: httpx.AsyncClient) -> None:
    incident = (await report(client, FULL)).json()["incident"]
    assert (await read(client, incident, sub="operator-1")).status_code == 200
    # diagnostics:read alone does not open the access log (it is ledger:audit's), and the path is
    # never mistaken for an incident reference (which would answer 404 or ask for a purpose).
    denied = await client.get("/v1/diagnostics/access-log", headers=auth(scope=READ))
    assert denied.status_code == 403
    listed = await client.get("/v1/diagnostics/access-log", headers=auth(scope="ledger:audit"))
    assert listed.status_code == 200
    items = listed.json()["items"]
    assert [(i["incident"], i["principal"], i["purpose"]) for i in items] == [
        (incident, "operator-1", PURPOSE["purpose"])
    ]
