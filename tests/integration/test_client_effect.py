"""The executor helper `client.effect()` against the real service: every way out of the block is recorded."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import httpx
import pytest

from effect_ledger.client import (
    EffectUsageError,
    LedgerClient,
    NotAppliedReason,
    OperationInProgress,
    OutcomeUnknown,
    Receipt,
)
from effect_ledger.http.auth import ALL_SCOPES
from support.auth import token
from support.server import Service
from support.waiting import until

TOOL: dict[str, Any] = {"tool": "measure", "tool_version": "2.1.0", "intent": {"sensor": "s-1"}}


class CountingTransport(httpx.AsyncBaseTransport):
    """Forwards everything and counts requests by their last path segment."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=100))
        self.calls: Counter[str] = Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.calls[request.url.path.rsplit("/", 1)[-1]] += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def client_for(service: Service, sub: str = "exec-1", **kwargs: Any) -> LedgerClient:
    return LedgerClient(service.base_url, token(sub=sub, scope=" ".join(ALL_SCOPES)), **kwargs)


async def test_committed_effect_is_reused_and_never_run_again(service: Service) -> None:
    runs = 0
    async with client_for(service) as ledger:
        async with ledger.effect("op-c", **TOOL) as effect:
            assert effect.receipt is None and effect.claim is not None and effect.claim.attempt == 1
            runs += 1
            await effect.submitted(effect_ref="req-1")
            effect.commit(Receipt(external_ref="m-1", result={"value": 21.5}))
        assert effect.operation is not None and effect.operation.status == "committed"
        async with ledger.effect("op-c", **TOOL) as again:
            assert again.reused and again.receipt is not None and again.claim is None
            assert again.receipt.external_ref == "m-1" and again.receipt.result == {"value": 21.5}
            with pytest.raises(EffectUsageError):
                await again.submitted(effect_ref="req-2")
            with pytest.raises(EffectUsageError):
                again.commit({"external_ref": "m-2"})
        assert runs == 1
        events = await ledger.events("op-c")
        assert [e.kind for e in events] == ["claimed", "submitted", "completed"]


async def test_exception_before_submit_records_not_applied_other(service: Service) -> None:
    async with client_for(service) as ledger:
        with pytest.raises(ValueError, match="bad input"):
            async with ledger.effect("op-v", **TOOL):
                raise ValueError("bad input")
        view = await ledger.get_operation("op-v")
        assert view.status == "not_applied"
        assert view.not_applied_reason == NotAppliedReason(category="other", detail_code="ValueError")
        async with ledger.effect("op-v", **TOOL) as retry:  # not_applied: a new attempt may run
            assert retry.claim is not None and retry.claim.attempt == 2
            await retry.submitted()
            retry.commit({"external_ref": "m-2"})


async def test_cancellation_before_submit_records_cancelled_before_submit(service: Service) -> None:
    entered = asyncio.Event()
    async with client_for(service) as ledger:

        async def body() -> None:
            async with ledger.effect("op-x", **TOOL):
                entered.set()
                await asyncio.sleep(60)

        task = asyncio.create_task(body())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        view = await ledger.get_operation("op-x")
        assert view.status == "not_applied"
        assert view.not_applied_reason == NotAppliedReason(category="cancelled_before_submit")


async def test_exception_after_submit_leaves_unknown_never_not_applied(service: Service) -> None:
    runs = 0
    async with client_for(service) as ledger:
        with pytest.raises(ConnectionResetError):
            async with ledger.effect("op-u", **TOOL) as effect:
                runs += 1
                await effect.submitted(effect_ref="req-u")
                raise ConnectionResetError("the remote side went away")
        assert effect.operation is not None and effect.operation.status == "unknown"
        assert effect.operation.incident is not None
        incident = await ledger.read_incident(effect.operation.incident, purpose="test the executor helper")
        assert (incident.phase, incident.cause, incident.detail_code) == (
            "tool_execution",
            "unknown",
            "ConnectionResetError",
        )
        assert incident.operation_id == "op-u" and incident.attempt == 1
        view = await ledger.get_operation("op-u")
        assert view.status == "unknown" and view.not_applied_reason is None
        with pytest.raises(OutcomeUnknown, match="do not repeat"):
            async with ledger.effect("op-u", **TOOL):
                runs += 1
        assert runs == 1
        kinds = [(e.kind, e.to_status) for e in await ledger.events("op-u")]
        assert kinds == [("claimed", "pending"), ("submitted", "submitted"), ("completed", "unknown")]


@pytest.mark.parametrize(
    ("cancel", "cause", "detail"), [(False, "timeout", "TimeoutError"), (True, "aborted", "CancelledError")]
)
async def test_timeout_or_cancellation_after_submit_is_unknown_with_its_cause(
    service: Service, cancel: bool, cause: str, detail: str
) -> None:
    submitted = asyncio.Event()
    async with client_for(service) as ledger:

        async def body() -> None:
            async with ledger.effect("op-t", **TOOL) as effect:
                await effect.submitted(effect_ref="req-t")
                submitted.set()
                async with asyncio.timeout(None if cancel else 0.1):
                    await asyncio.sleep(60)

        task = asyncio.create_task(body())
        await submitted.wait()
        if cancel:
            task.cancel()
        with pytest.raises(asyncio.CancelledError if cancel else TimeoutError):
            await task
        view = await ledger.get_operation("op-t")
        assert view.status == "unknown"
        events = await ledger.events("op-t")
        incident = await ledger.read_incident(events[-1].data["incident"], purpose="test the executor helper")
        assert (incident.phase, incident.cause, incident.detail_code) == ("tool_execution", cause, detail)


async def test_leaving_the_block_without_an_outcome(service: Service) -> None:
    async with client_for(service) as ledger:
        async with ledger.effect("op-quiet", **TOOL):
            pass  # decided not to send anything
        view = await ledger.get_operation("op-quiet")
        assert view.status == "not_applied"
        expected = NotAppliedReason(category="other", detail_code="exited_without_submit")
        assert view.not_applied_reason == expected
        async with ledger.effect("op-sent", **TOOL) as effect:
            await effect.submitted(effect_ref="req-s")  # sent, but no receipt was recorded
        assert (await ledger.get_operation("op-sent")).status == "unknown"


async def test_refusal_after_submit_is_not_applied_and_a_receipt_survives_a_later_exception(
    service: Service,
) -> None:
    async with client_for(service) as ledger:
        async with ledger.effect("op-r", **TOOL) as effect:
            await effect.submitted(effect_ref="req-r")
            effect.not_applied("rejected", "quota_exceeded")  # the external system said no
        view = await ledger.get_operation("op-r")
        assert view.status == "not_applied" and view.not_applied_reason is not None
        assert view.not_applied_reason.category == "rejected"
        with pytest.raises(KeyError):
            async with ledger.effect("op-k", **TOOL) as effect:
                await effect.submitted(effect_ref="req-k")
                effect.commit(Receipt(external_ref="m-k"))
                raise KeyError("bookkeeping after the effect failed")
        assert (await ledger.get_operation("op-k")).status == "committed"


async def test_in_progress_raises_and_the_body_never_runs(service: Service) -> None:
    runs = 0
    async with client_for(service) as ledger:
        async with ledger.effect("op-busy", **TOOL) as holder:
            with pytest.raises(OperationInProgress) as busy:
                async with ledger.effect("op-busy", **TOOL):
                    runs += 1
            assert busy.value.retry_after is not None and busy.value.operation is not None
            assert "wait" in str(busy.value)
            await holder.submitted()
            holder.commit({"external_ref": "m-b"})
        assert runs == 0


def _heartbeat_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("effect-ledger heartbeat")]


async def test_heartbeats_keep_a_short_lease_alive_and_stop_on_exit(service: Service) -> None:
    # Bounded by counts, not by the clock: each heartbeat comes at least lease/3 after the one before
    # (asyncio.sleep is a lower bound), so after N accepted ones the lease has moved at least N/3 leases.
    lease = 2
    transport = CountingTransport()
    async with client_for(service, transport=transport) as ledger, client_for(service, sub="exec-1") as rival:
        async with ledger.effect("op-hb", **TOOL, lease_seconds=lease) as effect:
            assert effect.operation is not None and effect.operation.lease_expires_at is not None
            first_expiry = effect.operation.lease_expires_at
            await until(lambda: effect.heartbeats, "three heartbeats", holds=lambda n: n >= 3)
            beats = effect.heartbeats
            await until(lambda: effect.heartbeats, "the next heartbeat", holds=lambda n: n > beats)
            # Just renewed: the lease has about `lease` seconds left, and has outlived its first expiry
            # by a whole lease (4 renewals, each at least lease/3 after the one before: 4/3 leases).
            view = await ledger.get_operation("op-hb")
            assert view.status == "pending" and view.lease_expired is False and effect.lease_lost is None
            assert view.lease_expires_at is not None
            assert (view.lease_expires_at - first_expiry).total_seconds() >= lease
            with pytest.raises(OperationInProgress):  # not a reclaim: the lease is still live
                await rival.claim("op-hb", **TOOL)
            await effect.submitted(effect_ref="req-hb")
            beats = effect.heartbeats
            await until(
                lambda: effect.heartbeats, "two heartbeats after submit", holds=lambda n: n >= beats + 2
            )
            assert (await ledger.get_operation("op-hb")).status == "submitted"
            effect.commit({"external_ref": "m-hb"})
        assert effect.lease_lost is None
        assert (await ledger.get_operation("op-hb")).status == "committed"
        assert _heartbeat_tasks() == []  # stopped on exit: the task is gone, not just quiet
        beats = transport.calls["heartbeat"]
        await asyncio.sleep(lease / 3 + 0.2)  # one interval: a live task would have sent another
        assert transport.calls["heartbeat"] == beats

        with pytest.raises(RuntimeError):
            async with ledger.effect("op-hb2", **TOOL, lease_seconds=lease) as failing:
                await until(lambda: failing.heartbeats, "a heartbeat", holds=lambda n: n >= 1)
                raise RuntimeError("boom")
        assert _heartbeat_tasks() == []  # stopped on the exception path too
        beats = transport.calls["heartbeat"]
        await asyncio.sleep(lease / 3 + 0.2)
        assert transport.calls["heartbeat"] == beats


async def test_the_body_never_runs_twice_for_one_id_across_200_concurrent_calls(service: Service) -> None:
    executions: Counter[str] = Counter()
    ids = [f"race-{n}" for n in range(20)]

    async def run(ledger: LedgerClient, op: str) -> str:
        try:
            async with ledger.effect(op, **TOOL) as effect:
                if effect.receipt is not None:
                    return "receipt"
                executions[op] += 1
                await effect.submitted(effect_ref=f"req-{op}")
                await asyncio.sleep(0.05)  # the effect, in flight
                effect.commit(Receipt(external_ref=f"m-{op}"))
                return "executed"
        except OperationInProgress:
            return "in_progress"
        except OutcomeUnknown:
            return "unknown"

    calls = ids * 10
    random.Random(7).shuffle(calls)
    async with client_for(service, limits=httpx.Limits(max_connections=100)) as ledger:
        outcomes = Counter(await asyncio.gather(*(run(ledger, op) for op in calls)))
        assert sum(outcomes.values()) == 200
        assert executions == Counter({op: 1 for op in ids})
        assert outcomes["executed"] == 20
        assert set(outcomes) <= {"executed", "receipt", "in_progress", "unknown"}
        again = Counter(await asyncio.gather(*(run(ledger, op) for op in calls)))
        assert again == Counter({"receipt": 200}) and sum(executions.values()) == 20
        for op in ids:
            view = await ledger.get_operation(op)
            assert view.status == "committed" and view.attempt == 1


async def test_send_at_once_claims_and_submits_in_one_call(service: Service) -> None:
    transport = CountingTransport()
    async with client_for(service, transport=transport) as ledger:
        async with ledger.effect("op-once", **TOOL, send_at_once=True, effect_ref="req-9") as effect:
            assert effect.is_submitted and effect.operation is not None
            assert (effect.operation.status, effect.operation.effect_ref) == ("submitted", "req-9")
            await effect.submitted(effect_ref="req-9")  # already submitted by the claim: no call
            effect.commit(Receipt(external_ref="m-9"))
        assert effect.operation is not None and effect.operation.status == "committed"
        assert transport.calls == Counter({"claim": 1, "complete": 1})
        events = await ledger.events("op-once")
        assert [(e.kind, e.to_status) for e in events] == [
            ("claimed", "pending"),
            ("submitted", "submitted"),
            ("completed", "committed"),
        ]
        with pytest.raises(RuntimeError, match="lost"):
            async with ledger.effect("op-once-2", **TOOL, send_at_once=True, effect_ref="req-10"):
                raise RuntimeError("connection lost after sending")
        lost = await ledger.get_operation("op-once-2")
        assert lost.status == "unknown"  # submitted by the claim: never not_applied
