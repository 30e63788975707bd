"""Audit calls (docs/api.md section 8): events, the receipts feed, chain verification, the access log, and
the database refusing to change events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from effect_ledger.db.catalogue import sql
from effect_ledger.domain.chain import GENESIS_HASH, event_hash
from support.ledger import (
    AUDITOR,
    REASON,
    RECEIPT,
    RECONCILER,
    committed,
    get,
    not_applied,
    owner,
    pending,
    resolve,
    runtime,
    submitted,
    unknown,
)

# Run again on a Citus cluster by the Citus lane of .ci/run (pytest -m storage).
pytestmark = pytest.mark.storage


async def verify(client: httpx.AsyncClient, op: str | None = None, tenant: str = "t1") -> dict[str, Any]:
    r = await get(client, "/v1/audit/verify", {"operation_id": op} if op else None, tenant=tenant, **AUDITOR)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_events_form_a_hash_chain(client: httpx.AsyncClient) -> None:
    await unknown(client, "op-e")
    await resolve(client, "op-e", "committed", receipt=RECEIPT)
    r = await get(client, "/v1/operations/op-e/events", **AUDITOR)
    assert r.status_code == 200
    items = r.json()["items"]
    assert [(e["seq"], e["kind"], e["actor"], e["from_status"], e["to_status"]) for e in items] == [
        (1, "claimed", "exec-1", None, "pending"),
        (2, "submitted", "exec-1", "pending", "submitted"),
        (3, "completed", "exec-1", "submitted", "unknown"),
        (4, "resolved", "rec-1", "unknown", "committed"),
    ]
    prev = GENESIS_HASH
    for event in items:
        assert set(event) == {
            "seq",
            "at",
            "kind",
            "actor",
            "from_status",
            "to_status",
            "attempt",
            "data",
            "prev_hash",
            "hash",
        }
        assert event["prev_hash"] == prev
        assert event["hash"] == event_hash(prev, {**event, "operation_id": "op-e"})
        prev = event["hash"]
    assert (await get(client, "/v1/operations/op-e/events", **RECONCILER)).json() == r.json()
    assert (await get(client, "/v1/operations/op-e/events", scope="ledger:execute")).status_code == 403
    assert (await get(client, "/v1/operations/op-e/events", tenant="t2", **AUDITOR)).status_code == 404
    assert (await get(client, "/v1/operations/op-none/events", **AUDITOR)).status_code == 404


async def test_receipts_feed_lists_committed_operations_by_resolution(client: httpx.AsyncClient) -> None:
    await committed(client, "r-1")
    await committed(client, "r-2", sub="exec-2", tool="probe")
    await unknown(client, "r-3")
    await resolve(client, "r-3", "committed", receipt={"result_digest": "sha256:" + "a" * 64})
    await committed(client, "r-4")
    await not_applied(client, "x-not-applied")
    await unknown(client, "x-unknown")
    await pending(client, "x-pending")
    await committed(client, "other-tenant", tenant="t2")

    def ids(r: httpx.Response) -> list[str]:
        assert r.status_code == 200, r.text
        return [item["operation_id"] for item in r.json()["items"]]

    whole = await get(client, "/v1/receipts", **AUDITOR)
    assert ids(whole) == ["r-1", "r-2", "r-3", "r-4"] and whole.json()["next_cursor"] is None
    items = whole.json()["items"]
    assert [i["resolved_at"] for i in items] == sorted(i["resolved_at"] for i in items)
    assert items[2]["receipt"]["result_digest"] == "sha256:" + "a" * 64 and items[2]["resolved_by"] == "rec-1"
    assert ids(await get(client, "/v1/receipts", {"tool": "probe"}, **AUDITOR)) == ["r-2"]
    assert ids(await get(client, "/v1/receipts", {"principal": "exec-1"}, **AUDITOR)) == ["r-1", "r-3", "r-4"]
    since, until = items[1]["resolved_at"], items[3]["resolved_at"]
    assert ids(await get(client, "/v1/receipts", {"since": since, "until": until}, **AUDITOR)) == [
        "r-2",
        "r-3",
    ]

    pages, cursor = [], None
    while True:
        r = await get(
            client, "/v1/receipts", {"limit": "1", **({"cursor": cursor} if cursor else {})}, **AUDITOR
        )
        pages.append(ids(r))
        cursor = r.json()["next_cursor"]
        if cursor is None:
            break
    assert pages == [["r-1"], ["r-2"], ["r-3"], ["r-4"]]

    r = await get(client, "/v1/receipts", {"since": "last week", "limit": "0"}, **AUDITOR)
    assert r.status_code == 422 and [e["field"] for e in r.json()["errors"]] == ["since", "limit"]
    assert (await get(client, "/v1/receipts", **RECONCILER)).status_code == 403


async def test_verify_holds_then_reports_the_first_edited_seq(client: httpx.AsyncClient, db_url: str) -> None:
    await unknown(client, "v-1")
    await resolve(client, "v-1", "not_applied", reason=REASON)
    await committed(client, "v-2")
    await submitted(client, "v-3")
    await committed(client, "v-other", tenant="t2")
    assert await verify(client, "v-1") == {"ok": True, "checked": 4, "first_bad_seq": None}
    assert await verify(client) == {
        "ok": True,
        "checked": 4 + 2 + 2,
        "first_bad_seq": None,
        "first_bad_operation_id": None,
    }

    async with owner(db_url) as conn:
        # the owner (a superuser here) switches the append-only triggers off, as only an attacker would
        async with conn.transaction():  # SET LOCAL: a Citus coordinator forwards it to the shard's worker
            await conn.execute("SET LOCAL session_replication_role = replica")
            await conn.execute(
                "UPDATE ledger.events SET data = jsonb_set(data, '{effect_ref}', '\"forged\"')"
                " WHERE tenant_id = 't1' AND operation_id = 'v-1' AND seq = 2"
            )
    assert await verify(client, "v-1") == {"ok": False, "checked": 2, "first_bad_seq": 2}
    assert await verify(client, "v-2") == {"ok": True, "checked": 2, "first_bad_seq": None}
    assert await verify(client) == {
        "ok": False,
        "checked": 2,
        "first_bad_seq": 2,
        "first_bad_operation_id": "v-1",
    }
    assert (await verify(client, tenant="t2"))["ok"] is True


async def test_verify_reports_removed_events(client: httpx.AsyncClient, db_url: str) -> None:
    await committed(client, "t-1")
    await submitted(client, "t-2")
    async with owner(db_url) as conn:
        async with conn.transaction():
            await conn.execute("SET LOCAL effect_ledger.purge = 'on'")
            # drop the last event of t-1 (its head no longer records the row's state) and all of t-2's
            await conn.execute("DELETE FROM ledger.events WHERE operation_id = 't-1' AND seq = 2")
            await conn.execute("DELETE FROM ledger.events WHERE operation_id = 't-2'")
    assert await verify(client, "t-1") == {"ok": False, "checked": 1, "first_bad_seq": 2}
    assert await verify(client, "t-2") == {"ok": False, "checked": 0, "first_bad_seq": 1}
    assert await verify(client) == {
        "ok": False,
        "checked": 1,
        "first_bad_seq": 2,
        "first_bad_operation_id": "t-1",
    }


async def test_verify_reports_a_row_that_names_another_chain_head(
    client: httpx.AsyncClient, db_url: str
) -> None:
    """The row's chain_hash (what its receipt and its log leaf name) must be the chain's last hash: an
    edit of the row alone is reported one past the head, like events removed from the end."""
    await committed(client, "h-1")
    await committed(client, "h-2")
    assert (await verify(client, "h-1"))["ok"] is True
    async with owner(db_url) as conn:
        seq = await conn.fetchval("SELECT chain_seq FROM ledger.operations WHERE operation_id = 'h-1'")
        edited = await conn.execute(
            "UPDATE ledger.operations SET chain_hash = repeat('a', 64) WHERE operation_id = 'h-1'"
        )
    assert edited == "UPDATE 1"
    assert await verify(client, "h-1") == {"ok": False, "checked": seq, "first_bad_seq": seq + 1}
    assert await verify(client, "h-2") == {"ok": True, "checked": seq, "first_bad_seq": None}
    assert await verify(client) == {
        "ok": False,
        "checked": seq,
        "first_bad_seq": seq + 1,
        "first_bad_operation_id": "h-1",
    }


async def test_verify_scope_and_validation(client: httpx.AsyncClient) -> None:
    await pending(client, "s-1")
    assert (await get(client, "/v1/audit/verify", {"operation_id": "s-1"}, **RECONCILER)).status_code == 403
    assert (await get(client, "/v1/audit/verify", {"operation_id": "nope"}, **AUDITOR)).status_code == 404
    assert (
        await get(client, "/v1/audit/verify", {"operation_id": "s-1"}, tenant="t2", **AUDITOR)
    ).status_code == 404
    r = await get(client, "/v1/audit/verify", {"operation_id": "bad id!"}, **AUDITOR)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "operation_id"
    r = await get(client, "/v1/audit/verify", {"op": "s-1"}, **AUDITOR)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "op"


STATEMENTS = {
    "UPDATE": "UPDATE ledger.events SET actor = 'mallory' WHERE tenant_id = 't1'",
    "DELETE": "DELETE FROM ledger.events WHERE tenant_id = 't1'",
    "TRUNCATE": "TRUNCATE ledger.events CASCADE",
}


@pytest.mark.parametrize("statement", sorted(STATEMENTS))
async def test_runtime_role_has_no_privilege_to_change_events(
    client: httpx.AsyncClient, db_url: str, statement: str
) -> None:
    await committed(client, "a-1")
    conn = await runtime(db_url)
    try:
        async with conn.transaction():
            await conn.fetchrow(sql("tenant_context"), "t1")
            await conn.execute("SET LOCAL effect_ledger.purge = 'on'")  # the trigger's gate grants nothing
            assert await conn.fetchval("SELECT count(*) FROM ledger.events") == 2
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied"):
                await conn.execute(STATEMENTS[statement])
    finally:
        await conn.close()


@pytest.mark.parametrize("statement", sorted(STATEMENTS))
async def test_triggers_refuse_the_owner_too(client: httpx.AsyncClient, db_url: str, statement: str) -> None:
    await committed(client, "a-2")
    async with owner(db_url) as conn:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match=f"append-only \\({statement} refused"):
            await conn.execute(STATEMENTS[statement])
        if statement == "UPDATE":  # not even in the purge path
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
                async with conn.transaction():
                    await conn.execute("SET LOCAL effect_ledger.purge = 'on'")
                    await conn.execute(STATEMENTS[statement])
        assert await conn.fetchval("SELECT count(*) FROM ledger.events") == 2


async def test_only_the_purge_path_deletes_events(client: httpx.AsyncClient, db_url: str) -> None:
    await committed(client, "a-3")
    async with owner(db_url) as conn:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("SET LOCAL effect_ledger.purge = 'on'")
        assert await conn.execute(STATEMENTS["DELETE"]) == "DELETE 2"
        await tx.rollback()
        # SET LOCAL ended with its transaction: the next DELETE is refused again
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(STATEMENTS["DELETE"])


async def test_access_log_lists_reads_of_the_callers_tenant(client: httpx.AsyncClient, db_url: str) -> None:
    base = datetime(2026, 11, 30, 9, tzinfo=UTC)
    async with owner(db_url) as conn:
        # the diagnostics reader appends these rows; here they are written straight to the table
        await conn.executemany(
            "INSERT INTO diagnostics.access_log (tenant_id, access_id, at, incident_id, principal, purpose)"
            " VALUES ($1, $2, $3, $4, $5, $6)",
            [
                (
                    "t1",
                    f"acc_{i:02d}",
                    base + timedelta(minutes=i // 2),
                    f"inc_{'x' * 16}{i:02d}",
                    "ops-1",
                    f"ticket {i}",
                )
                for i in range(5)
            ]
            + [("t2", "acc_t2", base, "inc_" + "y" * 18, "ops-2", "other")],
        )
    r = await get(client, "/v1/diagnostics/access-log", **AUDITOR)
    assert r.status_code == 200 and r.json()["next_cursor"] is None
    items = r.json()["items"]
    assert [i["access_id"] for i in items] == [f"acc_{i:02d}" for i in range(5)]
    assert items[0] == {
        "access_id": "acc_00",
        "at": "2026-11-30T09:00:00.000Z",
        "incident": "inc_" + "x" * 16 + "00",
        "principal": "ops-1",
        "purpose": "ticket 0",
    }
    pages, cursor = [], None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        r = await get(client, "/v1/diagnostics/access-log", params, **AUDITOR)
        pages.append([i["access_id"] for i in r.json()["items"]])
        cursor = r.json()["next_cursor"]
        if cursor is None:
            break
    assert pages == [["acc_00", "acc_01"], ["acc_02", "acc_03"], ["acc_04"]]
    since = {"since": "2026-11-30T09:01:00Z"}
    r = await get(client, "/v1/diagnostics/access-log", since, **AUDITOR)
    assert [i["access_id"] for i in r.json()["items"]] == ["acc_02", "acc_03", "acc_04"]
    r = await get(client, "/v1/diagnostics/access-log", {"limit": "999"}, **AUDITOR)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "limit"
    for scope in ("ledger:reconcile", "diagnostics:read"):
        assert (await get(client, "/v1/diagnostics/access-log", scope=scope)).status_code == 403
