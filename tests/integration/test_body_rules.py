"""API.md section 4 on every JSON route: 400 malformed_request for a body that is empty, not UTF-8,
not JSON (NaN and Infinity included) or not an object; 422 validation_failed for JSON that is an
object but not an acceptable one (and, where API.md is silent, for nesting deeper than the decoder
follows: the README's choice). Heartbeat's lease_seconds is optional."""

from __future__ import annotations

import httpx
import pytest

from support.auth import auth
from support.ledger import AUDITOR, EVIDENCE, REASON, RECEIPT, call, get, pending, resolve

ROUTES = [
    "/v1/operations/op-b/claim",
    "/v1/operations/op-b/submit",
    "/v1/operations/op-b/heartbeat",
    "/v1/operations/op-b/complete",
    "/v1/operations/op-b/resolve",
    "/v1/diagnostics",
    "/v1/recovery/decide",
]
DEEP = b"[" * 5000 + b"]" * 5000
MALFORMED = {
    "empty": b"",
    "whitespace_only": b"  \r\n\t ",
    "invalid_utf8": b'{"tool": "\xc3\x28"}',
    "latin1_bytes": b'{"tool": "caf\xe9"}',
    "utf16": '{"tool": "t"}'.encode("utf-16"),
    "nan_value": b'{"lease_seconds": NaN}',
    "infinity_value": b'{"lease_seconds": Infinity}',
    "minus_infinity_value": b'{"lease_seconds": -Infinity}',
    "bare_nan": b"NaN",
    "not_json": b"hello",
    "truncated": b'{"tool": ',
    "array": b"[1, 2]",
    "string": b'"x"',
    "number": b"7",
    "null": b"null",
    "true": b"true",
}
UNACCEPTABLE = {
    "empty_object": b"{}",
    "unknown_field": b'{"surprise": 1}',
    "nested_too_deep_as_value": b'{"x": ' + DEEP + b"}",
}


async def _post(client: httpx.AsyncClient, path: str, content: bytes) -> httpx.Response:
    headers = {
        **auth(scope="ledger:execute ledger:reconcile diagnostics:write"),
        "content-type": "application/json",
    }
    return await client.post(path, content=content, headers=headers)


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_malformed_bodies_are_400_on_every_route(client: httpx.AsyncClient, case: str) -> None:
    for path in ROUTES:
        r = await _post(client, path, MALFORMED[case])
        assert (r.status_code, r.json()["code"]) == (400, "malformed_request"), (case, path, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")


@pytest.mark.parametrize("case", sorted(UNACCEPTABLE))
async def test_unacceptable_objects_are_422_on_every_route(client: httpx.AsyncClient, case: str) -> None:
    for path in ROUTES:
        r = await _post(client, path, UNACCEPTABLE[case])
        assert (r.status_code, r.json()["code"]) == (422, "validation_failed"), (case, path, r.text)


async def test_deep_nesting_as_the_whole_body_is_422(client: httpx.AsyncClient) -> None:
    for path in ROUTES:
        r = await _post(client, path, DEEP)
        assert (r.status_code, r.json()["code"]) == (422, "validation_failed"), (path, r.text)


async def test_heartbeat_lease_seconds_is_optional(client: httpx.AsyncClient) -> None:
    token = await pending(client, "op-hb", lease_seconds=120)
    for body in ({"token": token}, {"token": token, "lease_seconds": None}):
        r = await client.post("/v1/operations/op-hb/heartbeat", json=body, headers=auth())
        assert r.status_code == 200, r.text
    r = await client.post(
        "/v1/operations/op-hb/heartbeat", json={"token": token, "lease_seconds": 5}, headers=auth()
    )
    assert r.status_code == 200


EDGE = "9999-12-31T23:59:59-14:00"  # RFC 3339, but 10000-01-01T13:59:59Z: past Python's last year


async def test_a_timestamp_past_the_calendar_in_utc_is_422_not_500(client: httpx.AsyncClient) -> None:
    """A receipt's observed_at, a resolution's evidence.checked_at and a list's since: each a 422
    naming the field (each was a 500 `internal` with an incident until round 24), and nothing written."""
    token = await pending(client, "op-edge")
    receipt = {**RECEIPT, "observed_at": EDGE}
    r = await call(
        client, "op-edge", "complete", {"token": token, "outcome": "committed", "receipt": receipt}
    )
    assert (r.status_code, r.json()["code"]) == (422, "validation_failed"), r.text
    assert r.json()["errors"] == [
        {"field": "receipt.observed_at", "problem": "must be an RFC 3339 timestamp"}
    ]
    assert (await get(client, "/v1/operations/op-edge")).json()["status"] == "pending"
    await call(client, "op-edge", "submit", {"token": token})
    await call(client, "op-edge", "complete", {"token": token, "outcome": "unknown"})
    r = await resolve(
        client, "op-edge", "not_applied", reason=REASON, evidence={**EVIDENCE, "checked_at": EDGE}
    )
    assert (r.status_code, r.json()["code"]) == (422, "validation_failed"), r.text
    assert [e["field"] for e in r.json()["errors"]] == ["evidence.checked_at"]
    assert (await get(client, "/v1/operations/op-edge")).json()["status"] == "unknown"
    r = await get(client, "/v1/receipts", {"since": EDGE}, **AUDITOR)
    assert (r.status_code, r.json()["code"]) == (422, "validation_failed"), r.text
    assert [e["field"] for e in r.json()["errors"]] == ["since"]
