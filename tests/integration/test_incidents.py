"""Incident references: 500/503 answers, complete(unknown) with diagnostics, audited-read atomicity."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from effect_ledger.db.diagnostics import IncidentRecorder
from effect_ledger.settings import Settings
from support.auth import auth
from support.ledger import AUDITOR, expire_lease, get
from support.server import Service
from support.waiting import until

CLAIM = {"tool": "measure", "tool_version": "2.1.0", "intent": {"sensor": "s-1"}, "lease_seconds": 30}
PURPOSE = {"purpose": "incident review"}
PROBLEM_MEMBERS = {"type", "title", "status", "code", "detail", "incident"}
DIAGNOSTICS = {
    "phase": "first_byte",
    "cause": "timeout",
    "elapsed_ms": 30000,
    "provider": "example-llm",
    "headers": {"X-Request-Id": "abc-123"},
}


async def owner_query(db_url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(db_url)
    try:
        return await conn.fetch(query, *args)
    finally:
        await conn.close()


async def submitted(client: httpx.AsyncClient, op: str = "op-1") -> str:
    """Claim and submit an operation; its claim token."""
    r = await client.post(f"/v1/operations/{op}/claim", json=CLAIM, headers=auth())
    assert r.status_code == 201
    token: str = r.json()["claim"]["token"]
    body = {"token": token, "effect_ref": "r-1"}
    r = await client.post(f"/v1/operations/{op}/submit", json=body, headers=auth())
    assert r.status_code == 200
    return token


async def complete(client: httpx.AsyncClient, body: dict[str, Any], op: str = "op-1") -> httpx.Response:
    return await client.post(f"/v1/operations/{op}/complete", json=body, headers=auth())


async def read_incident(client: httpx.AsyncClient, incident: str, wait: float = 0.0) -> httpx.Response:
    """GET the incident; with `wait`, keep asking until it resolves (it may still be in the spool)."""
    deadline = asyncio.get_running_loop().time() + wait
    while True:
        r = await client.get(f"/v1/diagnostics/{incident}", params=PURPOSE, headers=auth(sub="operator-1"))
        if r.status_code != 404 or asyncio.get_running_loop().time() > deadline:
            return r
        await asyncio.sleep(0.1)


async def incident_count(db_url: str) -> int:
    return int((await owner_query(db_url, "SELECT count(*) AS n FROM diagnostics.incidents"))[0]["n"])


# ---- complete(unknown) with diagnostics ----------------------------------------------------------


async def test_unknown_with_diagnostics_stores_an_incident_in_the_same_transaction(
    client: httpx.AsyncClient, db_url: str
) -> None:
    token = await submitted(client)
    body = {"token": token, "outcome": "unknown", "diagnostics": DIAGNOSTICS}
    r = await complete(client, body)
    assert r.status_code == 200, r.text
    view = r.json()
    incident = view.pop("incident")
    assert incident.startswith("inc_") and view["status"] == "unknown"
    events = await owner_query(db_url, "SELECT kind, data FROM ledger.events ORDER BY seq")
    assert [e["kind"] for e in events] == ["claimed", "submitted", "completed"]
    assert json.loads(events[-1]["data"])["incident"] == incident
    record = (await read_incident(client, incident)).json()
    assert {
        k: record[k]
        for k in (
            "source",
            "principal",
            "operation_id",
            "attempt",
            "phase",
            "cause",
            "elapsed_ms",
            "provider",
            "headers",
        )
    } == {
        "source": "outcome",
        "principal": "exec-1",
        "operation_id": "op-1",
        "attempt": 1,
        "phase": "first_byte",
        "cause": "timeout",
        "elapsed_ms": 30000,
        "provider": "example-llm",
        "headers": {"x-request-id": "abc-123"},
    }
    # A repeat changes nothing and answers the same, incident included.
    again = await complete(client, body)
    assert again.status_code == 200 and again.json() == r.json()
    assert await incident_count(db_url) == 1


async def test_unknown_without_diagnostics_has_no_incident(client: httpx.AsyncClient, db_url: str) -> None:
    token = await submitted(client)
    r = await complete(client, {"token": token, "outcome": "unknown"})
    assert r.status_code == 200 and "incident" not in r.json()
    assert await incident_count(db_url) == 0


@pytest.mark.parametrize(
    ("extra", "code", "field"),
    [
        pytest.param(
            {"diagnostics": {**DIAGNOSTICS, "provider_request_id": "Bearer " + "abcdef123456"}},
            "sensitive_value_rejected",
            "diagnostics.provider_request_id",
            id="credential",
        ),
        pytest.param(
            {"diagnostics": {**DIAGNOSTICS, "body": "x"}},
            "validation_failed",
            "diagnostics.body",
            id="unknown-field",
        ),
        pytest.param(
            {"diagnostics": {"headers": {"Authorization": "x"}}},
            "validation_failed",
            "diagnostics.headers[0]",
            id="header-name",
        ),
        pytest.param({"diagnostics": {"phase": "warp"}}, "validation_failed", "diagnostics.phase", id="enum"),
        pytest.param(
            {"diagnostics": {**DIAGNOSTICS, "operation_id": "op-2"}},
            "validation_failed",
            "diagnostics.operation_id",
            id="other-operation",
        ),
        pytest.param(
            {"diagnostics": {**DIAGNOSTICS, "attempt": 2}},
            "validation_failed",
            "diagnostics.attempt",
            id="other-attempt",
        ),
        pytest.param({"diagnostics": {}}, "validation_failed", "diagnostics", id="empty"),
    ],
)
async def test_refused_diagnostics_leave_the_operation_untouched(
    client: httpx.AsyncClient, db_url: str, extra: dict[str, Any], code: str, field: str
) -> None:
    token = await submitted(client)
    r = await complete(client, {"token": token, "outcome": "unknown", **extra})
    assert r.status_code == 422, r.text
    assert r.json()["code"] == code
    assert [e["field"] for e in r.json()["errors"]] == [field]
    assert (await client.get("/v1/operations/op-1", headers=auth())).json()["status"] == "submitted"
    assert len(await owner_query(db_url, "SELECT 1 FROM ledger.events")) == 2
    assert await incident_count(db_url) == 0


async def test_diagnostics_ride_only_on_unknown(client: httpx.AsyncClient, db_url: str) -> None:
    token = await submitted(client)
    body = {
        "token": token,
        "outcome": "committed",
        "receipt": {"external_ref": "r-1"},
        "diagnostics": DIAGNOSTICS,
    }
    r = await complete(client, body)
    assert r.status_code == 422
    assert r.json()["errors"] == [
        {"field": "diagnostics", "problem": "only an unknown outcome carries diagnostics"}
    ]
    assert await incident_count(db_url) == 0


async def test_a_stale_token_stores_no_diagnostics(client: httpx.AsyncClient, db_url: str) -> None:
    await submitted(client)
    r = await complete(client, {"token": "clt_" + "A" * 43, "outcome": "unknown", "diagnostics": DIAGNOSTICS})
    assert r.status_code == 409 and r.json()["code"] == "stale_claim"
    assert await incident_count(db_url) == 0


# ---- 500 and 503 answers -------------------------------------------------------------------------


async def test_a_500_answers_only_a_reference_and_the_incident_holds_the_details(
    client: httpx.AsyncClient, db_url: str
) -> None:
    await submitted(client)
    # A fault the service does not expect: the runtime role loses a grant (per database, so only here).
    await owner_query(db_url, "REVOKE SELECT ON ledger.operations FROM effect_ledger_runtime")
    r = await client.get("/v1/operations/op-1", headers=auth())
    assert r.status_code == 500
    problem = r.json()
    assert set(problem) == PROBLEM_MEMBERS
    assert (problem["code"], problem["status"]) == ("internal", 500)
    assert problem["detail"] == "An internal error occurred."
    got = await read_incident(client, problem["incident"], wait=10)
    assert got.status_code == 200
    record = got.json()
    assert {
        k: record[k]
        for k in (
            "source",
            "principal",
            "operation_id",
            "exception_type",
            "route",
            "method",
            "phase",
            "http_status",
        )
    } == {
        "source": "error",
        "principal": "exec-1",
        "operation_id": "op-1",
        "exception_type": "InsufficientPrivilegeError",
        "route": "/v1/operations/{operation_id}",
        "method": "GET",
        "phase": "handler",
        "http_status": 500,
    }
    # Nothing of the driver's message ("permission denied for table operations") was kept.
    assert "permission" not in got.text
    assert "operations" not in json.dumps(record).replace("/v1/operations", "")


def recorder_of(service: Service) -> IncidentRecorder:
    recorder: IncidentRecorder = service.app.state.incidents
    return recorder


async def test_a_503_reference_resolves_once_the_database_is_back(
    service: Service, client: httpx.AsyncClient, db_url: str
) -> None:
    await submitted(client)
    database = urlsplit(db_url).path.lstrip("/")
    owner = await asyncpg.connect(db_url)
    try:
        # The service's roles can no longer connect, and their open connections are cut.
        await owner.execute(f'ALTER DATABASE "{database}" CONNECTION LIMIT 0')
        await owner.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database()"
            " AND usename IN ('effect_ledger_runtime', 'effect_ledger_diag_reader')"
        )
        r = await client.get("/v1/operations/op-1", headers=auth())
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        problem = r.json()
        assert set(problem) == PROBLEM_MEMBERS
        assert (problem["code"], problem["title"]) == ("unavailable", "Service unavailable")
        incident = problem["incident"]
        # The incident could not be written: it waits in the process's spool, not in the table.
        await until(
            lambda: any(i.incident_id == incident for i in recorder_of(service).spool),
            "the incident in the spool",
        )
        assert [i.incident_id for i in recorder_of(service).spool] == [incident]
        assert await owner.fetchval("SELECT count(*) FROM diagnostics.incidents") == 0
        await owner.execute(f'ALTER DATABASE "{database}" CONNECTION LIMIT -1')
    finally:
        await owner.close()
    got = await read_incident(client, incident, wait=15)
    assert got.status_code == 200, got.text
    record = got.json()
    assert record["source"] == "error" and record["http_status"] == 503
    assert (record["route"], record["method"], record["phase"], record["operation_id"]) == (
        "/v1/operations/{operation_id}",
        "GET",
        "read",
        "op-1",
    )
    assert record["exception_type"] in (
        "TooManyConnectionsError",
        "ConnectionDoesNotExistError",
        "AdminShutdownError",
        "InterfaceError",
        "ConnectionResetError",
        "InternalClientError",
    )  # a pooled connection cut while idle
    assert recorder_of(service).spool == type(recorder_of(service).spool)()


# ---- audited reads ---------------------------------------------------------------------------------


async def test_no_read_without_its_access_log_row(client: httpx.AsyncClient, db_url: str) -> None:
    r = await client.post("/v1/diagnostics", json=DIAGNOSTICS, headers=auth())
    incident = r.json()["incident"]
    await owner_query(db_url, "REVOKE INSERT ON diagnostics.access_log FROM effect_ledger_diag_reader")
    refused = await read_incident(client, incident)
    assert refused.status_code == 500
    assert set(refused.json()) == PROBLEM_MEMBERS
    assert "first_byte" not in refused.text and "example-llm" not in refused.text
    assert await owner_query(db_url, "SELECT * FROM diagnostics.access_log") == []
    await owner_query(db_url, "GRANT INSERT ON diagnostics.access_log TO effect_ledger_diag_reader")
    assert (await read_incident(client, incident)).status_code == 200
    rows = await owner_query(db_url, "SELECT incident_id, principal, purpose FROM diagnostics.access_log")
    assert [tuple(r) for r in rows] == [(incident, "operator-1", PURPOSE["purpose"])]
    # The failed read left its own incident, which names the read route and nothing of the record.
    errors = await owner_query(
        db_url, "SELECT route, exception_type FROM diagnostics.incidents WHERE source = 'error'"
    )
    assert [tuple(r) for r in errors] == [("/v1/diagnostics/{incident}", "InsufficientPrivilegeError")]


async def test_concurrent_reads_each_leave_exactly_one_row(client: httpx.AsyncClient, db_url: str) -> None:
    incident = (await client.post("/v1/diagnostics", json=DIAGNOSTICS, headers=auth())).json()["incident"]
    answers = await asyncio.gather(*(read_incident(client, incident) for _ in range(8)))
    assert [a.status_code for a in answers] == [200] * 8
    rows = await owner_query(db_url, "SELECT count(DISTINCT access_id) AS n FROM diagnostics.access_log")
    assert rows[0]["n"] == 8


@pytest.mark.parametrize("how", ["lease ran out", "swept"])
async def test_unknown_reported_with_diagnostics_after_the_lease_ran_out_keeps_them(
    client: httpx.AsyncClient, db_url: str, settings: Settings, how: str
) -> None:
    """API.md section 6: `diagnostics` may ride along with complete(unknown) "and the answer then
    carries `incident`" — also when the operation is unknown already because its lease ran out (swept
    or not). Until round 24 (migration 0024) the answer was 200 without `incident`, and nothing was
    stored. A repeat names the same incident and records nothing more."""
    from effect_ledger.db.maintenance import sweep

    token = await submitted(client, "op-late")
    await expire_lease(db_url, "op-late")
    if how == "swept":
        await sweep(settings)
    before = (await get(client, "/v1/operations/op-late")).json()
    assert (before["status"], before["lease_expired"]) == ("unknown", True)
    report = {"token": token, "outcome": "unknown", "diagnostics": DIAGNOSTICS}
    r = await client.post("/v1/operations/op-late/complete", json=report, headers=auth())
    assert (r.status_code, r.json()["status"]) == (200, "unknown"), r.text
    # API.md section 2: an operation unknown because its lease expired reads `lease_expired: true`;
    # the report with diagnostics changes that no more than one without (until migration 0026 it
    # cleared the lease: false and null)
    lease = (before["lease_expires_at"], True)
    assert (r.json()["lease_expires_at"], r.json()["lease_expired"]) == lease
    after = (await get(client, "/v1/operations/op-late")).json()
    assert (after["lease_expires_at"], after["lease_expired"]) == lease
    incident = r.json()["incident"]
    again = await client.post("/v1/operations/op-late/complete", json=report, headers=auth())
    assert (again.status_code, again.json()["incident"]) == (200, incident)
    assert (again.json()["lease_expires_at"], again.json()["lease_expired"]) == lease
    events = (await get(client, "/v1/operations/op-late/events", **AUDITOR)).json()["items"]
    assert [(e["kind"], e["to_status"]) for e in events][-2:] == [
        ("lease_expired", "unknown"),
        ("completed", "unknown"),
    ]
    assert events[-1]["data"] == {"incident": incident, "outcome": "unknown"}
    rows = await owner_query(
        db_url, "SELECT incident_id, attempt FROM diagnostics.incidents WHERE operation_id = 'op-late'"
    )
    assert [tuple(row) for row in rows] == [(incident, 1)]
    verified = (await get(client, "/v1/audit/verify", {"operation_id": "op-late"}, **AUDITOR)).json()
    assert verified["ok"] is True
