"""Input at the edges of what the API accepts: each a clear 4xx with its stable code and nothing
written, never a 500 (found in review, round 24; each case was a 500 `internal` with an incident, or
was accepted against API.md, before it)."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import httpx
import jwt
import pytest

from effect_ledger.settings import Settings
from support.auth import TEST_SECRET, auth
from support.ledger import AUDITOR, CLAIM, RECONCILER, get, owner


def cursor(kind: str, moment: str) -> str:
    """A cursor as the lists write them (base64url of [kind, key time, key ID]), forged."""
    raw = json.dumps([kind, moment, ""], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


async def test_an_operation_id_with_a_final_newline_is_no_operation_id(
    client: httpx.AsyncClient, db_url: str
) -> None:
    """`op%0A` in a path: Python's `$` matched before the final newline, so the fast path sent the claim
    on and the database's check answered 500; a diagnostics report naming `op\\n` was stored."""
    r = await client.post("/v1/operations/op-nl%0A/claim", json=CLAIM, headers=auth())
    assert (r.status_code, r.json()["code"]) == (422, "validation_failed"), r.text
    assert [e["field"] for e in r.json()["errors"]] == ["operation_id"]
    r = await client.get("/v1/operations/op-nl%0A", headers=auth())
    assert (r.status_code, r.json()["code"]) == (422, "validation_failed"), r.text
    report = {"operation_id": "op-nl\n", "phase": "connect", "cause": "timeout"}
    r = await client.post("/v1/diagnostics", json=report, headers=auth(scope="diagnostics:write"))
    assert (r.status_code, r.json()["code"]) == (422, "validation_failed"), r.text
    async with owner(db_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM diagnostics.incidents") == 0
        assert await conn.fetchval("SELECT count(*) FROM ledger.operations") == 0


@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"])
async def test_a_cursor_past_the_calendar_in_utc_is_a_bad_cursor(
    client: httpx.AsyncClient, moment: str
) -> None:
    for path, kind, who in (
        ("/v1/operations", "operations", RECONCILER),
        ("/v1/diagnostics/access-log", "access_log", AUDITOR),
    ):
        r = await get(client, path, {"cursor": cursor(kind, moment)}, **who)
        assert (r.status_code, r.json()["code"]) == (422, "validation_failed"), (path, r.text)
        assert [e["field"] for e in r.json()["errors"]] == ["cursor"]


async def test_a_feed_position_past_a_bigint_and_a_limit_of_thousands_of_digits_are_422(
    client: httpx.AsyncClient,
) -> None:
    r = await get(client, "/v1/receipts", {"after": "9" * 20}, **AUDITOR)
    assert (r.status_code, r.json()["code"]) == (422, "validation_failed"), r.text
    assert [e["field"] for e in r.json()["errors"]] == ["after"]
    assert (await get(client, "/v1/receipts", {"after": str(2**63 - 1)}, **AUDITOR)).status_code == 200
    for path, who in (("/v1/operations", RECONCILER), ("/v1/receipts", AUDITOR)):
        r = await get(client, path, {"limit": "1" * 5000}, **who)
        assert (r.status_code, r.json()["code"]) == (422, "validation_failed"), (path, r.text[:200])
        assert [e["field"] for e in r.json()["errors"]] == ["limit"]


def signed(**changes: Any) -> dict[str, str]:
    settings = Settings()
    now = int(time.time())
    claims: dict[str, Any] = {
        "sub": "exec-1",
        "tenant": "t1",
        "scope": "ledger:execute ledger:reconcile",
        "iat": now,
        "exp": now + 600,
        "aud": settings.jwt_audience,
        "iss": settings.jwt_issuer,
    }
    claims.update(changes)
    return {"Authorization": "Bearer " + jwt.encode(claims, TEST_SECRET, algorithm="HS256")}


@pytest.mark.parametrize("claim", ["iat", "exp"])
async def test_a_time_claim_written_as_a_string_of_digits_is_401(
    client: httpx.AsyncClient, claim: str
) -> None:
    """NumericDate is a JSON number; PyJWT accepts a string of digits, and the service's TTL check then
    subtracted a string: a 500 with an incident, on every repeat."""
    now = int(time.time())
    headers = signed(**{claim: str(now if claim == "iat" else now + 600)})
    for r in (
        await client.get("/v1/operations/op-1", headers=headers),
        await client.post("/v1/operations/op-1/claim", json=CLAIM, headers=headers),  # the fast path
    ):
        assert (r.status_code, r.json()["code"]) == (401, "unauthenticated"), r.text
        assert r.headers["www-authenticate"] == "Bearer"
    assert (await client.get("/v1/operations/op-1", headers=signed())).status_code == 404
