"""Executors and the reconciler, driven through the Python client, as the chaos scenarios run them."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from effect_ledger.client import (
    LedgerClient,
    LedgerClientError,
    LedgerProblem,
    OperationInProgress,
    OutcomeUnknown,
    Receipt,
    RetryPolicy,
    committed,
    not_applied,
)
from effect_ledger.client.models import OperationView
from support.auth import token
from support.harness import TOOL, TOOL_VERSION, Sink, execute_at_sink, sink_receipt
from support.recording import History

T = TypeVar("T")
EXECUTE, RECONCILE = "ledger:execute", "ledger:reconcile"
# Retry through outages of a few seconds (a service restart, a PostgreSQL restart): the contract makes
# every ledger call safe to repeat, so the only cost of a long budget is waiting.
PATIENT = RetryPolicy(
    maximum_attempts=80,
    deadline_seconds=40.0,
    attempt_timeout_seconds=5.0,
    base_delay_ms=50,
    maximum_delay_ms=600,
)


def ledger_client(
    base_url: str,
    history: History,
    tenant: str = "t1",
    sub: str = "exec-1",
    scope: str = EXECUTE,
    retry: RetryPolicy = PATIENT,
    keepalive: bool = True,
) -> LedgerClient:
    """A client whose every request is recorded in `history`."""
    # httpx applies limits to its own transport only, so the recorded one gets them directly
    keep = 20 if keepalive else 0
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=100, max_keepalive_connections=keep))
    return LedgerClient(
        base_url, token(tenant, sub, scope, ttl=3600), retry=retry, transport=history.transport(inner)
    )


@asynccontextmanager
async def executor_clients(
    base_url: str, history: History, count: int, **options: Any
) -> AsyncIterator[list[LedgerClient]]:
    """`count` recorded executor clients (ledger_client's options), all closed when the block ends."""
    clients = [ledger_client(base_url, history, **options) for _ in range(count)]
    try:
        yield clients
    finally:
        for client in clients:
            await client.aclose()


@dataclass
class Tally:
    """How the executors' runs ended, by outcome, and the problems they met on the way."""

    outcomes: Counter[str] = field(default_factory=Counter)
    problems: Counter[str] = field(default_factory=Counter)


async def run_effect(
    client: LedgerClient,
    sink_http: httpx.AsyncClient,
    sink: Sink,
    tenant: str,
    operation_id: str,
    executor: str,
    lease_seconds: int,
) -> str:
    """One guarded run: claim, submit before sending, send to the sink, commit its receipt."""
    async with client.effect(
        operation_id,
        tool=TOOL,
        tool_version=TOOL_VERSION,
        intent={"operation": operation_id},
        lease_seconds=lease_seconds,
    ) as effect:
        if effect.reused:
            return "reused"
        assert effect.claim is not None
        await effect.submitted(effect_ref=operation_id)
        receipt = await execute_at_sink(
            sink_http, sink.url, f"{tenant}/{operation_id}", effect.claim.attempt, executor
        )
        effect.commit(Receipt(external_ref=receipt["external_ref"], result=receipt["result"]))
    return "committed"


async def drive(
    client: LedgerClient,
    sink_http: httpx.AsyncClient,
    sink: Sink,
    tenant: str,
    operation_id: str,
    executor: str,
    lease_seconds: int,
    tally: Tally,
    deadline: float,
) -> str:
    """Keep running one operation until it is committed, or its outcome is the reconciler's to find."""
    while time.monotonic() < deadline:
        try:
            outcome = await run_effect(client, sink_http, sink, tenant, operation_id, executor, lease_seconds)
        except OperationInProgress as problem:
            # our own earlier claim whose answer was lost, or another executor: wait for its lease
            tally.problems[problem.code] += 1
            await asyncio.sleep(min(problem.retry_after or 1.0, float(lease_seconds)) + 0.05)
            continue
        except OutcomeUnknown as problem:
            tally.problems[problem.code] += 1
            outcome = "unknown"
        except LedgerProblem as problem:
            tally.problems[problem.code] += 1
            await asyncio.sleep(0.1)
            continue
        except LedgerClientError as failure:
            tally.problems[type(failure).__name__] += 1
            await asyncio.sleep(0.2)
            continue
        tally.outcomes[outcome] += 1
        return outcome
    tally.outcomes["gave_up"] += 1
    return "gave_up"


async def run_executors(
    clients: list[LedgerClient],
    sink: Sink,
    tenant: str,
    operation_ids: list[str],
    lease_seconds: int,
    deadline_seconds: float,
    more: Callable[[int], str | None] | None = None,
) -> Tally:
    """Each client is one executor taking operations from a shared list until it is empty.

    `more(n)`, when given, is asked for another operation ID once the list is used up (n = IDs so
    far); it returns None when the scenario has had enough, so load lasts as long as the faults do.
    """
    pending = list(reversed(operation_ids))
    issued = len(pending)
    tally = Tally()
    deadline = time.monotonic() + deadline_seconds

    def next_id() -> str | None:
        nonlocal issued
        if pending:
            return pending.pop()
        if more is None:
            return None
        operation_id = more(issued)
        if operation_id is not None:
            operation_ids.append(operation_id)
            issued += 1
        return operation_id

    async def executor(index: int, client: LedgerClient) -> None:
        async with httpx.AsyncClient(timeout=10) as sink_http:
            while (operation_id := next_id()) is not None:
                await drive(
                    client,
                    sink_http,
                    sink,
                    tenant,
                    operation_id,
                    f"executor-{index}",
                    lease_seconds,
                    tally,
                    deadline,
                )

    await asyncio.gather(*(executor(i, c) for i, c in enumerate(clients)))
    return tally


async def run_beside_fault(
    clients: list[LedgerClient],
    sink: Sink,
    operation_ids: list[str],
    lease_seconds: int,
    deadline_seconds: float,
    fault: Callable[[asyncio.Event], Awaitable[T]],
) -> tuple[Tally, T]:
    """Executors of tenant t1 while `fault(done)` injects faults: past `operation_ids` they keep taking
    new IDs (the first one's prefix, then a number) until the fault task ends; then `done` is set and
    the fault task's result returned with the tally."""
    prefix = operation_ids[0].rsplit("-", 1)[0]
    done = asyncio.Event()
    injector = asyncio.create_task(fault(done))
    try:
        tally = await run_executors(
            clients,
            sink,
            "t1",
            operation_ids,
            lease_seconds,
            deadline_seconds,
            more=lambda n: None if injector.done() else f"{prefix}-{n}",
        )
    finally:
        done.set()
        result = await injector
    return tally, result


async def reconcile(base_url: str, history: History, sink: Sink, tenant: str = "t1") -> dict[str, int]:
    """The reconciler's pass once the executors are done: the sink's records are the evidence."""

    async def lookup(op: OperationView) -> Any:
        runs = sink.executions.get(f"{tenant}/{op.operation_id}", [])
        if runs:
            return committed(
                sink_receipt(f"{tenant}/{op.operation_id}", runs[0].attempt), lookup_ref=op.operation_id
            )
        return not_applied("other", "absent_at_sink", lookup_ref=op.operation_id)

    async with ledger_client(base_url, history, tenant, "rec-1", RECONCILE) as client:
        report = await client.reconcile(lookup, source="chaos-sink")
    assert not report.failed, report.failed
    return {"reconciled_committed": len(report.committed), "reconciled_not_applied": len(report.not_applied)}
