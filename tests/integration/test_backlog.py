"""The backlog gauges: unknown outcomes waiting (and the oldest's wait) and purge lateness, across
tenants, read by serve whether or not it runs sweep and purge itself."""

from __future__ import annotations

from dataclasses import replace

import asyncpg
import httpx

from effect_ledger.db.maintenance import Backlog, read_backlog
from effect_ledger.settings import Settings
from support.auth import auth
from support.metrics import scrape
from support.server import Service
from support.waiting import until

CLAIM = {"tool": "t", "tool_version": "1", "intent": {}, "lease_seconds": 600}


async def make(http: httpx.AsyncClient, tenant: str, op: str, outcome: str | None) -> None:
    headers = auth(tenant, "exec-1")
    token = (await http.post(f"/v1/operations/{op}/claim", json=CLAIM, headers=headers)).json()["claim"][
        "token"
    ]
    assert (
        await http.post(f"/v1/operations/{op}/submit", json={"token": token}, headers=headers)
    ).status_code == 200
    if outcome is not None:
        body = {"token": token, "outcome": outcome}
        if outcome == "committed":
            body["receipt"] = {"external_ref": "r"}
        r = await http.post(f"/v1/operations/{op}/complete", json=body, headers=headers)
        assert r.status_code == 200


async def age(db_url: str, sql: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def test_backlog_counts_unknowns_and_purge_lag_across_tenants(settings: Settings, db_url: str) -> None:
    config = replace(settings, backlog_interval_seconds=1, retention_days=30)
    async with Service(config) as service, httpx.AsyncClient(base_url=service.base_url) as http:
        await make(http, "t1", "u-1", "unknown")
        await make(http, "t2", "u-2", None)  # submitted; its lease will have expired: unknown too
        await make(http, "t2", "c-1", "committed")
        await make(http, "t3", "c-2", "committed")
        await age(
            db_url,
            "UPDATE ledger.operations SET updated_at = now() - interval '600 seconds'"
            " WHERE operation_id = 'u-1'",
        )
        await age(
            db_url,
            "UPDATE ledger.operations SET lease_expires_at = now() - interval '60 seconds'"
            " WHERE operation_id = 'u-2'",
        )
        await age(
            db_url,
            "UPDATE ledger.operations SET updated_at = now() - interval '31 days' WHERE operation_id = 'c-1'",
        )
        backlog = await read_backlog(config)
        assert backlog.unknown_waiting == 2
        assert 600 <= backlog.unknown_oldest_seconds < 3600
        assert 86_400 <= backlog.purge_overdue_seconds < 2 * 86_400
        # serve publishes the same numbers (read every second here)
        found = await until(
            lambda: scrape(http),
            "the backlog gauges published",
            holds=lambda found: found[("effect_ledger_unknown_outcomes_waiting", frozenset())] == 2,
            every=0.2,
        )
        assert found[("effect_ledger_unknown_outcome_oldest_age_seconds", frozenset())] >= 600
        assert found[("effect_ledger_purge_overdue_seconds", frozenset())] >= 86_400


async def test_an_empty_ledger_has_no_backlog(settings: Settings) -> None:
    assert await read_backlog(settings) == Backlog(0, 0.0, 0.0)
