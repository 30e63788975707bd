"""Scenario: the primary dies under load and its streaming standby is promoted (API section 11).

A primary and a standby on this machine (tests/support/replication.py), the service in this process
on the multi-host URL `primary,standby?target_session_attrs=read-write`, 16 executors in full cycles
(claim, submit, effect at the sink, complete). Mid-run the replication link is held for a moment (a
congested network, a slow standby), then the primary's postmaster is killed with SIGKILL and the
standby promoted. The executors carry on through the switch; afterwards, on the new primary:

- every acknowledged (2xx) claim, submit and completion is there, recorded before its answer, and
  every acknowledged receipt is the one stored: nothing acknowledged was lost;
- no effect ran twice at the sink, every committed operation names its one execution;
- every hash chain verifies; no answer was a 5xx but 503 with Retry-After and an incident;
- writes resumed within 30 s of the promotion; /readyz reported the loss and then the switch;
- the service's own sweeper, cut by the switch, sweeps again on the new primary.

The same run with asynchronous replication is reported beside it (parametrised): there the primary
acknowledges commits the standby never received, and the new primary has lost them. That run asserts
that it did lose acknowledged transitions (the point of synchronous commit) and prints what.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Callable

import asyncpg
import httpx
import pytest

from effect_ledger.db.pools import run_statement, tenant_tx
from effect_ledger.settings import Settings
from support.auth import token
from support.durability import (
    ACKNOWLEDGED,
    ended_at,
    incidents_missing,
    lost_acknowledged,
    writes_resumed_after,
)
from support.harness import (
    LONG,
    TOOL,
    TOOL_VERSION,
    Sink,
    check_effects,
    check_ledger,
    read_state,
    scale,
    scenario,
    timeout,
)
from support.processes import ServiceProcess
from support.recording import History, check_answers
from support.replication import (
    PASSWORD,
    STANDBY_NAME,
    Node,
    ReplicationLink,
    Template,
    make_standby,
    run,
    scratch_root,
    wait_streaming,
)
from support.serve_process import effect_ledger_command
from support.server import Service
from support.waiting import until
from support.workload import ledger_client, reconcile, run_executors

pytestmark = [pytest.mark.chaos, timeout(150, 900)]

EXECUTORS = 16
LEASE_SECONDS = 10
BEFORE_SECONDS = scale(2, 20)  # load before the fault
HOLD_SECONDS = 0.6  # the replication link is held this long before the kill
DETECT_SECONDS = 0.4  # kill to promotion: failure detection (an operator's failoverDelay, shortened)
AFTER_SECONDS = scale(2, 20)  # load after the promotion
RESUME_LIMIT_SECONDS = 30.0


async def sweeper_sweeps(service: Service, node: Node, operation_id: str, within: float = 15) -> float:
    """Submit an operation with a 1 s lease and wait for the service's own background sweep to store it
    `unknown` on `node`; the seconds it took."""
    headers = {"Authorization": f"Bearer {token('t1', 'exec-1', 'ledger:execute')}"}
    body = {"tool": TOOL, "tool_version": TOOL_VERSION, "intent": {"operation": operation_id}}
    started = time.monotonic()
    async with service.client(headers=headers) as http:
        while True:  # the first call after the switch may still meet a connection being replaced
            claimed = await http.post(
                f"/v1/operations/{operation_id}/claim",
                json={**body, "lease_seconds": 1, "submit": {"effect_ref": None}},
            )
            if claimed.status_code != 503:
                break
            await asyncio.sleep(0.2)
    assert claimed.status_code == 201, claimed.text
    conn = await node.owner()
    try:
        while time.monotonic() - started < within:
            status = await conn.fetchval(
                "SELECT status FROM ledger.operations WHERE tenant_id = 't1' AND operation_id = $1",
                operation_id,
            )
            if status == "unknown":
                return time.monotonic() - started
            await asyncio.sleep(0.2)
    finally:
        await conn.close()
    raise AssertionError(f"the background sweep did not sweep {operation_id} within {within} s")


async def every_worker_started(node: Node, workers: int) -> None:
    """Wait until each `serve` worker has reached the end of its start-up on `node`: /readyz answers from
    the first one up, while another may still be starting. Each HTTP worker opens its own pools, then
    the receipts log guard's owner connection; serve's log process, the integrator's and the
    checkpointer's (`effect-ledger-maintenance`: 2 * workers with two workers; a backlog probe's
    connection has that name too, so the count is a floor). The kill then meets serving workers, and
    `before` reads the primary. Until round 20 this wait was what kept the server up: a worker that
    met the kill between its pools and its log connection failed its start-up and exited, and serve's
    supervisor stopped the whole server, as for any of its first workers (its port refused; CI met it
    with this wait, whose count a backlog probe can fill early). The log's loops now open their
    connections themselves and open them again after a failed pass (db.maintenance.OwnerLink)."""
    conn = await node.owner()
    try:
        await until(
            lambda: conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'effect-ledger-maintenance'"
            ),
            f"{workers} workers' receipts-log connections",
            holds=lambda n: n >= 2 * workers,
            within=60,
        )
    finally:
        await conn.close()


async def ready(service: Service) -> httpx.Response:
    async with service.client() as http:
        return await http.get("/readyz")


# The same fault in both modes; the long mode adds a synchronous run killed at a random moment of
# the load, the link never held (commits caught at every stage of their way).
MODES = [("synchronous", True), ("asynchronous", True)] + ([("synchronous", False)] if LONG else [])


@pytest.mark.parametrize(("replication", "hold"), MODES)
async def test_the_standby_promoted_after_the_primary_is_killed_holds_every_acknowledged_transition(
    request: pytest.FixtureRequest, pg_template: Template, replication: str, hold: bool
) -> None:
    sync = replication == "synchronous"
    root = scratch_root()
    primary = pg_template.copy(root, "primary")
    standby = pg_template.copy(root, "standby")
    primary.configure(synchronous_standby_names=STANDBY_NAME if sync else "", synchronous_commit="on")
    history = History()
    try:
        async with ReplicationLink(primary) as link:
            make_standby(standby, link.port)
            await asyncio.to_thread(primary.start)
            await asyncio.to_thread(standby.start)
            await wait_streaming(primary, sync)
            url = (
                f"postgresql://postgres:{PASSWORD}@{primary.address},{standby.address}/effect_ledger"
                "?target_session_attrs=read-write"
            )
            settings = Settings(
                database_url=url,
                background_sweep=True,
                sweep_interval_seconds=1,
                backlog_interval_seconds=0,
                pool_size=12,
                pool_acquire_timeout_ms=2000,
                rate_limit_per_second=0,
                log_level="warning",
                # Asynchronous: the receipts log off. A lost failover whose lost receipts the signer had
                # already signed leaves the database behind the signer, and the guard then stops every
                # executor write until log-recover (API.md section 14; test_receipt_log_trust.py's
                # restored backup): the product working, not what this run measures (what asynchronous
                # replication loses). Until round 20 the guard never saw it: the log's loops kept
                # their dead connection to the old primary. Synchronous: on, and it must not trip.
                log_enabled=sync,
            )
            name = f"failover_{replication}" + ("" if hold else "_unheld")
            with scenario(request, name) as figures:
                async with Sink() as sink, Service(settings) as service:
                    more_ids: Callable[[int], str | None]
                    stop = asyncio.Event()
                    more_ids = lambda n: None if stop.is_set() else f"fo-{n}"  # noqa: E731
                    clients = [ledger_client(service.base_url, history) for _ in range(EXECUTORS)]
                    ids = [f"fo-{n}" for n in range(EXECUTORS)]
                    work = asyncio.create_task(
                        run_executors(
                            clients,
                            sink,
                            "t1",
                            ids,
                            LEASE_SECONDS,
                            120 + BEFORE_SECONDS + AFTER_SECONDS,
                            more_ids,
                        )
                    )
                    try:
                        await asyncio.sleep(BEFORE_SECONDS)
                        before = (await ready(service)).json()["checks"]
                        held_at = time.time()
                        if hold:
                            link.hold()
                            await asyncio.sleep(HOLD_SECONDS)
                        primary.kill9()
                        killed_at = time.time()
                        await link.cut()
                        await asyncio.sleep(DETECT_SECONDS)
                        during = await ready(service)
                        await asyncio.to_thread(standby.promote)
                        promoted_at = time.time()
                        await asyncio.sleep(AFTER_SECONDS)
                        stop.set()
                        tally = await work
                    finally:
                        stop.set()
                        for client in clients:
                            await client.aclose()
                    after = (await ready(service)).json()["checks"]
                    swept_in = await sweeper_sweeps(service, standby, "fo-sweep")
                    reconciled = await reconcile(service.base_url, history, sink)
                    state = await read_state(standby.url())
                lost, details = lost_acknowledged(history, state)
                effects = check_effects(state, sink.executions, settled=True)
                resumed = writes_resumed_after(history, promoted_at)
                statuses = history.statuses()
                acknowledged_while_held = sum(
                    1
                    for c in history.calls
                    if c.outcome == "ok" and c.kind in ACKNOWLEDGED and held_at < ended_at(c) < killed_at
                )
                # of those, the ones sent after the link was held (the others' WAL may have crossed first)
                sent_while_held = sum(
                    1
                    for c in history.calls
                    if c.outcome == "ok"
                    and c.kind in ACKNOWLEDGED
                    and held_at < c.wall
                    and ended_at(c) < killed_at
                )
                figures.operations = len(history.calls)
                figures.faults = 1
                figures.extra = {
                    "effects": len(ids) + 1,
                    "executed": sink.total,
                    "acknowledged": sum(1 for c in history.calls if c.outcome == "ok"),
                    "acknowledged_while_link_held": acknowledged_while_held,
                    "sent_and_acknowledged_while_held": sent_while_held,
                    "lost_claims": lost["claim"],
                    "lost_submits": lost["submit"],
                    "lost_completions": lost["complete"],
                    "changed_receipts": lost["receipt"],
                    "executed_twice": sum(1 for runs in sink.executions.values() if len(runs) > 1),
                    "answers_503": statuses[503],
                    "writes_resumed_s": round(resumed, 2) if resumed is not None else None,
                    "outage_s": round(promoted_at - killed_at + (resumed or 0), 2),
                    "swept_after_switch_s": round(swept_in, 2),
                    "outcomes": dict(tally.outcomes),
                    **reconciled,
                }
                # Both modes: the new primary's history is consistent, and the answers were honest.
                figures.check(check_ledger(state))
                figures.check(check_answers(history))
                figures.check(incidents_missing(history))
                if sync:
                    figures.check(details)
                    figures.check(effects)
            if sync:
                figures.assert_clean()
            else:
                # What asynchronous replication costs: the primary acknowledged while the link was held,
                # and the new primary does not have it (printed above; the run itself is honest).
                assert not figures.violations, figures.violations[:10]
                assert acknowledged_while_held > 0 and sum(lost.values()) > 0, (acknowledged_while_held, lost)
            assert resumed is not None and resumed < RESUME_LIMIT_SECONDS, resumed
            assert before["server"] == primary.address and before["primary_switches"] == 0
            assert during.status_code == 503 and during.json()["checks"]["database"] == "unreachable"
            assert during.json()["checks"]["lost_at"]
            assert after["server"] == standby.address and after["primary_switches"] == 1
            assert after["timeline"] == before["timeline"] + 1 and "lost_at" not in after
            assert statuses[503] > 0  # the switch was felt, and answered honestly
            assert primary.leftover_children() == []  # the killed postmaster's backends exited by themselves
    finally:
        await asyncio.to_thread(standby.stop)
        await asyncio.to_thread(primary.stop)
        shutil.rmtree(root, ignore_errors=True)


async def test_migrate_and_serve_follow_a_multi_host_url_through_a_failover(pg_template: Template) -> None:
    """The CLI as outside programs run it: `effect-ledger migrate` and `serve` (server workers, each with
    its own pools) on a URL naming the standby first; the standby is promoted after the primary dies,
    and the same `serve` process carries on on it, /readyz reporting the switch."""
    root = scratch_root()
    primary = pg_template.copy(root, "primary")
    standby = pg_template.copy(root, "standby")
    primary.configure(synchronous_standby_names=STANDBY_NAME)
    url = (
        f"postgresql://postgres:{PASSWORD}@{standby.address},{primary.address}/effect_ledger"
        "?target_session_attrs=read-write"
    )
    try:
        async with ReplicationLink(primary) as link:
            make_standby(standby, link.port)
            await asyncio.to_thread(primary.start)
            await asyncio.to_thread(standby.start)
            await wait_streaming(primary, sync=True)
            env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_LEDGER_")}
            migrated = await asyncio.to_thread(
                subprocess.run,
                [*effect_ledger_command(), "migrate"],
                env={**env, "EFFECT_LEDGER_DATABASE_URL": url},
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert migrated.returncode == 0, migrated.stdout + migrated.stderr
            headers = {"Authorization": f"Bearer {token('t1', 'exec-1', 'ledger:execute')}"}
            body = {"tool": TOOL, "tool_version": TOOL_VERSION, "intent": {}}
            async with (
                ServiceProcess(url, workers=2, pool_acquire_timeout_ms=1000) as served,
                httpx.AsyncClient(base_url=served.base_url, headers=headers, timeout=10) as http,
            ):
                await every_worker_started(primary, workers=2)
                assert (await http.post("/v1/operations/cli-0/claim", json=body)).status_code == 201
                before = (await http.get("/readyz")).json()["checks"]
                primary.kill9()
                await link.cut()
                refused = await http.post("/v1/operations/cli-1/claim", json=body)
                await asyncio.to_thread(standby.promote)
                promoted = time.monotonic()
                while time.monotonic() - promoted < RESUME_LIMIT_SECONDS:
                    try:
                        answer = await http.post("/v1/operations/cli-1/claim", json=body)
                    except httpx.ConnectError:  # the service itself must stay up through it
                        # from None: the transport's traceback would push serve's log out of CI's view
                        raise AssertionError(f"serve stopped answering: {served.log_tail()}") from None
                    if answer.status_code != 503:
                        break
                    assert answer.json()["code"] == "unavailable" and answer.headers["retry-after"]
                    await asyncio.sleep(0.1)
                resumed = time.monotonic() - promoted
                assert answer.status_code == 201, (answer.status_code, answer.text, served.log_tail())
                # every worker process follows (each has its own pools); /readyz lands on any of them
                checks = [(await http.get("/readyz")).json()["checks"] for _ in range(6)]
                # and so does the receipts log's integrator: a receipt committed on the new primary is
                # logged (leaf 0: cli-0 never committed). Until round 20 the integrator kept its dead
                # connection to the old primary and the log stopped growing until a restart.
                claimed = answer.json()["claim"]["token"]
                receipt = {"outcome": "committed", "receipt": {"external_ref": "after-failover"}}
                for step, extra in (("submit", {}), ("complete", receipt)):
                    done = await http.post(f"/v1/operations/cli-1/{step}", json={"token": claimed, **extra})
                    assert done.status_code == 200, done.text
                logged = await until(
                    lambda: http.get("/v1/operations/cli-1"),
                    "cli-1 in the receipts log",
                    holds=lambda r: r.json()["log_index"] is not None,
                )
            assert logged.json()["log_index"] == 0
            assert refused.status_code == 503 and refused.json()["incident"].startswith("inc_")
            assert resumed < RESUME_LIMIT_SECONDS
            assert before["server"] == primary.address
            assert all(c["server"] == standby.address and c["database"] == "ok" for c in checks), checks
            assert {c["timeline"] for c in checks} == {before["timeline"] + 1}
    finally:
        await asyncio.to_thread(standby.stop)
        await asyncio.to_thread(primary.stop)
        shutil.rmtree(root, ignore_errors=True)


async def test_a_write_waiting_for_its_synchronous_standby_is_never_cancelled_by_the_service(
    pg_template: Template,
) -> None:
    """Why the service never cancels a write statement (db/pools.py `_to_the_end`): a commit cancelled
    while it waits for its synchronous standby stays committed on the primary alone and becomes
    visible, so a retry would acknowledge what a failover then loses. Cancelled from the service, the
    write keeps waiting, invisible, until the standby has it; a plain asyncpg call, cancelled the same
    way, turns visible on the primary while the standby does not have it."""
    root = scratch_root()
    primary = pg_template.copy(root, "primary")
    standby = pg_template.copy(root, "standby")
    primary.configure(synchronous_standby_names=STANDBY_NAME)
    try:
        async with ReplicationLink(primary) as link:
            make_standby(standby, link.port)
            await asyncio.to_thread(primary.start)
            await asyncio.to_thread(standby.start)
            await wait_streaming(primary, sync=True)
            owner = await primary.owner()
            await owner.execute("CREATE TABLE public.scratch (n integer)")
            pool = await asyncpg.create_pool(primary.url(), min_size=2, max_size=2)
            plain = await primary.owner()
            try:
                link.hold()
                insert = "INSERT INTO public.scratch VALUES ($1) RETURNING n"

                async def in_a_transaction() -> None:  # journal appends, diagnostics: tenant_tx's COMMIT
                    async with tenant_tx(pool, "t1", 5.0, "test") as (conn, _):
                        await conn.execute("INSERT INTO public.scratch VALUES (3)")

                guarded = asyncio.create_task(run_statement(pool, "t1", 5.0, "test", insert, 1))
                committing = asyncio.create_task(in_a_transaction())
                unguarded = asyncio.create_task(plain.fetchrow(insert, 2))
                await asyncio.sleep(0.5)
                assert not (
                    guarded.done() or committing.done() or unguarded.done()
                )  # all wait for the standby
                guarded.cancel()
                committing.cancel()
                unguarded.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await unguarded
                await asyncio.sleep(0.5)
                waiting = await owner.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
                )
                visible = {r["n"] for r in await owner.fetch("SELECT n FROM public.scratch")}
                assert not guarded.done() and not committing.done() and waiting == 2
                assert visible == {2}  # the cancelled plain call: visible, yet the standby lacks it
                link.release()
                for task in (guarded, committing):
                    with pytest.raises(asyncio.CancelledError):
                        await asyncio.wait_for(task, 10)  # the cancellation arrives once the write ended
                assert {r["n"] for r in await owner.fetch("SELECT n FROM public.scratch")} == {1, 2, 3}
            finally:
                await pool.close()
                await plain.close()
                await owner.close()
    finally:
        await asyncio.to_thread(standby.stop)
        await asyncio.to_thread(primary.stop)
        shutil.rmtree(root, ignore_errors=True)


def test_a_node_whose_port_was_taken_before_its_first_start_moves_to_another(pg_template: Template) -> None:
    """free_port's ports are ephemeral ones: an outgoing connection may take one before PostgreSQL binds
    it (a CI run's standby failed to start that way). The first start moves to a free port; the log's
    words are in any other failure."""
    import socket

    root = scratch_root()
    node = pg_template.copy(root, "moved")
    taken = node.port
    try:
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", taken))
            squatter.listen()
            node.start()
        assert node.port != taken and node.started
        assert "accepting connections" in run("pg_isready", "-h", "127.0.0.1", "-p", str(node.port))
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)
