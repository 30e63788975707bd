"""The bench's HTTP floors (effect_ledger_bench/httpfloor.py) against real PostgreSQL: the lean mode (the
bench's "Python HTTP floor" row) writes the lean yardstick's rows and refuses what its statements'
guards refuse; the repository mode answers through the service's own executor functions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import httpx

from effect_ledger.settings import Settings
from effect_ledger_bench.catalogue import lean_queries
from effect_ledger_bench.httpfloor import FloorProcess
from effect_ledger_bench.workload import claim_body, claim_path, complete_body, submit_body


@asynccontextmanager
async def floor_client(url: str, mode: str) -> AsyncIterator[httpx.AsyncClient]:
    floor = FloorProcess(url, 2, mode)
    await floor.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://{floor.host}:{floor.port}", timeout=30) as http:
            yield http
    finally:
        await floor.stop()


async def test_the_lean_floor_writes_the_yardsticks_rows(db_url: str) -> None:
    owner = await asyncpg.connect(db_url)
    try:
        await owner.execute(lean_queries()["lean_schema"])
        async with floor_client(db_url, "lean") as http:
            claimed = await http.post(
                claim_path("f-1", "claim"), json=claim_body("f-1", "nonce-0123456789abcdef")
            )
            assert claimed.status_code == 201
            token = claimed.json()["claim"]["token"]
            again = await http.post(
                claim_path("f-1", "claim"), json=claim_body("f-1", "nonce-0123456789abcdef")
            )
            assert again.status_code == 409  # the insert's ON CONFLICT DO NOTHING
            wrong = await http.post(claim_path("f-1", "submit"), json=submit_body("not-the-token", "f-1"))
            assert wrong.status_code == 409  # the update's token guard
            assert (
                await http.post(claim_path("f-1", "submit"), json=submit_body(token, "f-1"))
            ).status_code == 200
            done = await http.post(claim_path("f-1", "complete"), json=complete_body(token, "f-1"))
            assert done.status_code == 200
        row = await owner.fetchrow(
            "SELECT status, chain_seq, receipt->>'external_ref' AS ref FROM lean.operations WHERE operation_id = 'f-1'"
        )
        kinds = await owner.fetch("SELECT kind FROM lean.events WHERE operation_id = 'f-1' ORDER BY seq")
        assert (row["status"], row["chain_seq"], row["ref"]) == ("committed", 3, "rcpt-f-1")
        assert [k["kind"] for k in kinds] == ["claimed", "submitted", "completed"]
    finally:
        await owner.execute("DROP SCHEMA lean CASCADE")
        await owner.close()


async def test_the_repository_floor_answers_as_the_service(settings: Settings) -> None:
    assert settings.database_url is not None
    async with floor_client(settings.database_url, "repository") as http:
        claimed = await http.post(
            claim_path("r-1", "claim"), json=claim_body("r-1", "nonce-0123456789abcdef")
        )
        assert claimed.status_code == 201 and claimed.json()["action"] == "execute"
        view = claimed.json()["operation"]
        assert (view["operation_id"], view["status"]) == ("r-1", "pending")
        token = claimed.json()["claim"]["token"]
        submitted = await http.post(claim_path("r-1", "submit"), json=submit_body(token, "r-1"))
        assert submitted.status_code == 200 and submitted.json()["status"] == "submitted"
        done = await http.post(claim_path("r-1", "complete"), json=complete_body(token, "r-1"))
        assert done.status_code == 200 and done.json()["status"] == "committed"
        assert done.json()["receipt"]["external_ref"] == "rcpt-r-1"
        replayed = await http.post(
            claim_path("r-1", "claim"), json=claim_body("r-1", "nonce-0123456789abcdef")
        )
        assert replayed.status_code == 200 and replayed.json()["action"] == "reuse_receipt"
