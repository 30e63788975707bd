"""Journal ownership, projection replay against every ledger state, context selection, deletion,
retention, metrics and content-free logs, over HTTP against real PostgreSQL (API.md section 12)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx
import pytest

from effect_ledger.db.maintenance import purge
from effect_ledger.settings import Settings
from support.auth import auth
from support.journal import (
    AUDITOR,
    OTHER_PRINCIPAL,
    OTHER_TENANT,
    WRITER,
    append,
    assistant,
    call,
    new_session,
    read,
    result,
    summary,
    user,
    who,
)
from support.ledger import committed, expire_lease, not_applied, owner, pending, submitted, unknown

pytestmark = pytest.mark.storage  # the Citus lane of .ci/run runs it again on a cluster

SECRET_CONTENT = "the-secret-content-7f3a"


async def test_ownership_matrix_with_byte_identical_404s(client: httpx.AsyncClient) -> None:
    sid = await new_session(client)
    await append(client, sid, 0, [user()])
    deleted = await new_session(client)
    assert (await client.delete(f"/v1/sessions/{deleted}", headers=who(WRITER))).status_code == 204
    missing = "ses_" + "A" * 24
    assert (await read(client, sid)).status_code == 200
    assert (await read(client, sid, AUDITOR)).status_code == 200
    assert (await read(client, sid, AUDITOR, "/projection")).status_code == 200
    assert (await append(client, sid, 1, [assistant("x")], AUDITOR)).status_code == 403
    assert (await client.delete(f"/v1/sessions/{sid}", headers=who(AUDITOR))).status_code == 403
    bodies = set()
    cases = [
        (sid, OTHER_PRINCIPAL),
        (sid, OTHER_TENANT),
        (missing, WRITER),
        (deleted, WRITER),
        ("not-a-session", WRITER),
        ("ses_short", WRITER),
    ]
    for target, caller in cases:
        for path in ("", "/projection", "/context"):
            r = await read(client, target, caller, path)
            assert r.status_code == 404, (target, caller, path)
            bodies.add(r.content)
        r = await append(client, target, 1, [assistant("x")], caller)
        assert r.status_code == 404
        bodies.add(r.content)
        r = await client.delete(f"/v1/sessions/{target}", headers=who(caller))
        assert r.status_code == 404
        bodies.add(r.content)
    assert len(bodies) == 1
    assert json.loads(bodies.pop())["code"] == "not_found"
    assert (await read(client, sid)).json()["revision"] == 1  # nothing the others did changed it


async def test_scopes(client: httpx.AsyncClient) -> None:
    sid = await new_session(client)
    reader = {**WRITER, "scope": "journal:read"}
    executor = {**WRITER, "scope": "ledger:execute"}
    assert (await client.post("/v1/sessions", json={}, headers=who(reader))).status_code == 403
    assert (await append(client, sid, 0, [user()], reader)).status_code == 403
    assert (await read(client, sid, reader)).status_code == 200
    assert (await read(client, sid, executor)).status_code == 403


async def ledger_states(client: httpx.AsyncClient, db_url: str) -> dict[str, str]:
    """One operation per ledger state of API.md section 12's resume rule; call_id -> operation_id."""
    await committed(client, "op-committed")
    await not_applied(client, "op-not-applied")
    await unknown(client, "op-unknown")
    await pending(client, "op-pending-live")
    await pending(client, "op-pending-expired")
    await expire_lease(db_url, "op-pending-expired")
    await submitted(client, "op-submitted-live")
    await submitted(client, "op-submitted-expired")
    await expire_lease(db_url, "op-submitted-expired")
    return {
        "c-absent": "op-absent",
        "c-pending-live": "op-pending-live",
        "c-pending-expired": "op-pending-expired",
        "c-submitted-live": "op-submitted-live",
        "c-submitted-expired": "op-submitted-expired",
        "c-unknown": "op-unknown",
        "c-committed": "op-committed",
        "c-not-applied": "op-not-applied",
    }


EXPECTED = {
    "c-absent": ("absent", "claim_allowed"),
    "c-pending-live": ("pending", "wait"),
    "c-pending-expired": ("pending", "claim_allowed"),
    "c-submitted-live": ("submitted", "wait"),
    "c-submitted-expired": ("unknown", "reconcile"),
    "c-unknown": ("unknown", "reconcile"),
    "c-committed": ("committed", "use_receipt"),
    "c-not-applied": ("not_applied", "claim_allowed"),
}


async def ledger_snapshot(db_url: str) -> list[Any]:
    async with owner(db_url) as conn:
        ops = await conn.fetch("SELECT * FROM ledger.operations ORDER BY tenant_id, operation_id")
        events = await conn.fetch("SELECT * FROM ledger.events ORDER BY tenant_id, operation_id, seq")
    return [dict(r) for r in ops] + [dict(r) for r in events]


async def test_projection_resume_for_every_ledger_state_and_the_ledger_stays_untouched(
    client: httpx.AsyncClient, db_url: str
) -> None:
    links = await ledger_states(client, db_url)
    sid = await new_session(client)
    records = [user()] + [call(cid, operation_id=op) for cid, op in links.items()] + [call("c-none")]
    assert (await append(client, sid, 0, records)).status_code == 200
    before = await ledger_snapshot(db_url)
    answers = [(await read(client, sid, path="/projection")).json() for _ in range(25)]
    assert await ledger_snapshot(db_url) == before  # reading never claims, submits or executes
    first = answers[0]
    assert all(a["digest"] == first["digest"] for a in answers)
    assert first["reducer"] == "effect-ledger.projection/1" and first["revision"] == 10
    assert first["unresolved"] == [*links, "c-none"]
    calls = {c["call_id"]: c for c in first["calls"]}
    for cid, (status, resume) in EXPECTED.items():
        assert calls[cid]["state"] == "unresolved"
        assert calls[cid]["effect"]["status"] == status, cid
        assert calls[cid]["resume"] == resume, cid
    assert calls["c-committed"]["effect"]["receipt"]["external_ref"] == "m-7"
    assert calls["c-committed"]["effect"]["attempt"] == 1
    assert calls["c-absent"]["effect"] == {"status": "absent"}
    assert calls["c-none"]["effect"] is None and calls["c-none"]["resume"] == "no_operation"
    # another tenant's operation of the same ID is absent for this one
    other = await new_session(client, OTHER_TENANT)
    await append(client, other, 0, [user(), call("x", operation_id="op-committed")], OTHER_TENANT)
    seen = (await read(client, other, OTHER_TENANT, "/projection")).json()
    assert (
        seen["calls"][0]["effect"] == {"status": "absent"} and seen["calls"][0]["resume"] == "claim_allowed"
    )


async def test_projection_of_a_completed_exchange(client: httpx.AsyncClient) -> None:
    await committed(client, "m-a")
    sid = await new_session(client)
    await append(
        client,
        sid,
        0,
        [user(), call("c1", operation_id="m-a"), result("c1", output={"v": 2}), assistant("A measures 2")],
    )
    p = (await read(client, sid, path="/projection")).json()
    assert p["messages"] == [
        {"seq": 1, "role": "user", "content": "compare prototypes A and B"},
        {"seq": 4, "role": "assistant", "content": "A measures 2"},
    ]
    [c] = p["calls"]
    assert {k: v for k, v in c.items() if k != "effect"} == {
        "call_id": "c1",
        "name": "measure",
        "seq": 2,
        "operation_id": "m-a",
        "state": "resolved",
        "result_seq": 3,
        "is_error": False,
        "resume": "none",
    }
    assert c["effect"]["status"] == "committed" and p["unresolved"] == []
    # the digest covers messages and calls only, never the ledger's current answer
    await append(client, sid, 4, [user("next")])
    assert (await read(client, sid, path="/projection")).json()["digest"] != p["digest"]


async def test_context_selection_through_the_endpoint(client: httpx.AsyncClient) -> None:
    sid = await new_session(client)
    records = [
        user("u1"),
        call("c1"),
        result("c1"),
        assistant("a1"),
        summary(1, 4, "s"),
        user("u2"),
        call("c2"),
    ]
    assert (await append(client, sid, 0, records)).status_code == 200
    everything = (await read(client, sid, path="/context")).json()
    assert [r["seq"] for r in everything["records"]] == [1, 2, 3, 4, 6, 7]
    assert everything["omitted"] == {"records": 1, "bytes": everything["omitted"]["bytes"]}
    assert everything["unresolved"] == ["c2"] and everything["summarized"] == []
    small = (await read(client, sid, path="/context", max_records=3)).json()
    assert [r["seq"] for r in small["records"]] == [5, 6, 7]
    assert small["summarized"] == [{"from_seq": 1, "to_seq": 4}] and small["omitted"]["records"] == 4
    assert small["revision"] == 7
    too_small = await read(client, sid, path="/context", max_bytes=10)
    assert too_small.status_code == 422 and too_small.json()["code"] == "invalid_history"
    bad = await read(client, sid, path="/context", max_records="-1", other="x")
    assert bad.status_code == 422 and {e["field"] for e in bad.json()["errors"]} == {"max_records", "other"}


async def test_delete_removes_records_and_never_the_ledger(client: httpx.AsyncClient, db_url: str) -> None:
    await committed(client, "m-a")
    sid = await new_session(client)
    await append(client, sid, 0, [user(), call("c1", operation_id="m-a")])
    before = await ledger_snapshot(db_url)
    r = await client.delete(f"/v1/sessions/{sid}", headers=who(WRITER))
    assert r.status_code == 204 and r.content == b""
    assert (await read(client, sid)).status_code == 404
    async with owner(db_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM journal.records") == 0
    assert await ledger_snapshot(db_url) == before


async def test_retention_purges_idle_sessions_with_their_records(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    idle, fresh = await new_session(client), await new_session(client)
    for sid in (idle, fresh):
        await append(client, sid, 0, [user(), assistant("a")])
    async with owner(db_url) as conn:
        await conn.execute(
            "UPDATE journal.sessions SET updated_at = now() - interval '91 days' WHERE session_id = $1", idle
        )
    result_ = await purge(settings)
    assert result_.counts["journal_sessions"] == 1
    assert (await read(client, idle)).status_code == 404
    assert (await read(client, fresh)).json()["revision"] == 2
    longer = await purge(replace(settings, journal_retention_days=400))
    assert longer.counts["journal_sessions"] == 0


async def test_metrics_count_outcomes_and_logs_never_carry_content(
    client: httpx.AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    sid = await new_session(client)
    secret = [
        user(SECRET_CONTENT),
        call("c1", "measure", None, probe=SECRET_CONTENT),
        result("c1", output={"v": SECRET_CONTENT}),
    ]
    await append(client, sid, 0, secret)
    await append(client, sid, 0, [assistant(SECRET_CONTENT)])  # conflict
    await append(client, sid, 3, [result("c9", output=SECRET_CONTENT)])  # causal rejection
    await append(client, sid, 3, [{**assistant(SECRET_CONTENT), "schema": 9}])  # schema rejection
    await append(client, sid, 3, [summary(1, 3, SECRET_CONTENT)])
    for path in ("", "/projection", "/context"):
        assert (await read(client, sid, path=path)).status_code == 200
    await client.delete(f"/v1/sessions/{sid}", headers=who(WRITER))
    out = capsys.readouterr().out
    assert SECRET_CONTENT not in out
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    journal = [line for line in lines if str(line.get("event", "")).startswith("journal_")]
    assert [line["event"] for line in journal] == [
        "journal_create",
        "journal_append",
        "journal_append",
        "journal_append",
        "journal_append",
        "journal_append",
        "journal_load",
        "journal_projection",
        "journal_context",
        "journal_delete",
    ]
    assert [line["outcome"] for line in journal[1:6]] == [
        "ok",
        "revision_conflict",
        "invalid_history",
        "unsupported_schema",
        "ok",
    ]
    assert all(line["session_id"] == sid for line in journal)
    projection = journal[7]
    assert projection["reducer"] == "effect-ledger.projection/1" and projection["revision"] == 4
    text = (await client.get("/metrics")).text
    for outcome, n in (
        ("ok", 2),
        ("revision_conflict", 1),
        ("invalid_history", 1),
        ("unsupported_schema", 1),
    ):
        assert f'effect_ledger_journal_calls_total{{call="append",outcome="{outcome}"}} {n}.0' in text
    assert "effect_ledger_journal_summaries_appended_total 1.0" in text
    assert 'effect_ledger_journal_calls_total{call="projection",outcome="ok"} 1.0' in text


async def test_the_auditor_token_alone_cannot_create(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/sessions", json={}, headers=auth("t1", "aud-1", "ledger:audit"))
    assert r.status_code == 403
