"""Approvals (API.md section 15) in the client: the approvers' calls, the review helper, and the wait
an executor's effect() does while its request is pending.

`client.approvals` is an Approvals over the client's connection, token and retry policy. Approvers
list the pending queue and decide; `review(judge)` walks the queue like the reconciler helper walks
unknown operations. An executor never decides: `wait_for_decision` polls its own request (readable
with `ledger:execute`) with exponential backoff and jitter, never a busy loop, until it is no longer
pending, the deadline passes, or the caller cancels.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from msgspec import Struct

from effect_ledger.client.errors import LedgerClientError
from effect_ledger.client.retry import RetryPolicy
from effect_ledger.client.transport import Transport

FIRST_POLL_SECONDS = 0.1
MAX_POLL_SECONDS = 2.0


class ApprovalDecision(Struct, kw_only=True):
    """One approver's decision on a request."""

    by: str
    decision: Literal["approve", "deny"]
    reason: str | None
    at: str


class ApprovalView(Struct, kw_only=True):
    """An approval request as the ledger shows it (API.md section 15)."""

    approval_id: str
    operation_id: str
    principal: str
    tool: str
    tool_version: str
    intent_digest: str
    intent: Any = None
    note: str | None = None
    status: Literal["pending", "approved", "denied", "revoked", "expired", "consumed"]
    required: int
    decisions: list[ApprovalDecision]
    requested_at: str
    expires_at: str
    consumed_by_attempt: int | None = None


class ApprovalPage(Struct, kw_only=True):
    """One page of approval requests."""

    items: list[ApprovalView]
    next_cursor: str | None


class ApprovalEvents(Struct, kw_only=True):
    """A request's hash-chained events."""

    items: list[dict[str, Any]]


class EffectCancelled(LedgerClientError):
    """The caller cancelled while effect() waited for an approval: no claim was sent after it, nothing
    ran, and the approval (if it came) is left unconsumed."""


Cancelled = Callable[[], bool] | asyncio.Event | None


def is_cancelled(cancelled: Cancelled) -> bool:
    """Whether the caller's cancellation signal (an asyncio.Event or a callable) is set."""
    if cancelled is None:
        return False
    if isinstance(cancelled, asyncio.Event):
        return cancelled.is_set()
    return bool(cancelled())


Judge = Callable[[ApprovalView], Awaitable[tuple[Literal["approve", "deny"], str] | None]]


@dataclass
class ReviewReport:
    """What one review pass did: requests approved, denied, and left for a person (judge said None)."""

    approved: list[str] = field(default_factory=list)
    denied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # approval_id -> problem code


class Approvals:
    """The approval calls of one LedgerClient."""

    def __init__(self, client: Transport) -> None:
        self.client = client

    async def page(
        self, *, status: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> ApprovalPage:
        """One page of the tenant's requests, oldest first (scope ledger:approve)."""
        params: dict[str, str | int] = {}
        for name, value in (("status", status), ("limit", limit), ("cursor", cursor)):
            if value is not None:
                params[name] = value
        response = await self.client.request("GET", "/v1/approvals", params=params)
        return self.client.decode(response, ApprovalPage)

    async def pending(self) -> AsyncIterator[ApprovalView]:
        """Every pending request, across pages, oldest first."""
        cursor: str | None = None
        while True:
            page = await self.page(status="pending", cursor=cursor)
            for item in page.items:
                yield item
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def get(self, approval_id: str, *, retry: RetryPolicy | None = None) -> ApprovalView:
        """One request (an executor reads its own)."""
        response = await self.client.request("GET", f"/v1/approvals/{approval_id}", retry=retry)
        return self.client.decode(response, ApprovalView)

    async def decide(
        self, approval_id: str, decision: Literal["approve", "deny"], reason: str | None = None
    ) -> ApprovalView:
        """Approve or deny (never one's own request: 403)."""
        body = {"decision": decision, "reason": reason}
        response = await self.client.request("POST", f"/v1/approvals/{approval_id}/decide", body=body)
        return self.client.decode(response, ApprovalView)

    async def revoke(self, approval_id: str, reason: str | None = None) -> ApprovalView:
        """Revoke a request unless an attempt consumed it."""
        response = await self.client.request(
            "POST", f"/v1/approvals/{approval_id}/revoke", body={"reason": reason}
        )
        return self.client.decode(response, ApprovalView)

    async def events(self, approval_id: str) -> list[dict[str, Any]]:
        """The request's hash-chained events (scope ledger:audit)."""
        response = await self.client.request("GET", f"/v1/approvals/{approval_id}/events")
        return self.client.decode(response, ApprovalEvents).items

    async def review(self, judge: Judge) -> ReviewReport:
        """Walk the pending queue once; `judge` returns (decision, reason), or None to leave a request
        to a person. A refusal (a request decided meanwhile, one's own) is recorded, not raised."""
        from effect_ledger.client.errors import LedgerProblem

        report = ReviewReport()
        async for request in self.pending():
            verdict = await judge(request)
            if verdict is None:
                report.skipped.append(request.approval_id)
                continue
            try:
                await self.decide(request.approval_id, verdict[0], verdict[1])
            except LedgerProblem as problem:
                report.failed[request.approval_id] = problem.code
                continue
            (report.approved if verdict[0] == "approve" else report.denied).append(request.approval_id)
        return report

    async def wait_for_decision(
        self,
        approval_id: str,
        deadline: float,
        cancelled: Cancelled = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> ApprovalView | None:
        """Poll one request until it is no longer pending (its view), or until `deadline` (on `clock`)
        passes or the caller cancels (None). Backoff from 0.1 s, doubling to 2 s, with full jitter
        above half the step; never past the deadline. A task cancellation interrupts the sleep."""
        step = FIRST_POLL_SECONDS
        once = RetryPolicy(maximum_attempts=1, deadline_seconds=5.0)
        while True:
            remaining = deadline - clock()
            if remaining <= 0 or is_cancelled(cancelled):
                return None
            await self._sleep(min(remaining, step * (0.5 + jitter() / 2)), cancelled)
            if is_cancelled(cancelled):
                return None
            view = await self.get(approval_id, retry=once)
            if view.status != "pending":
                return view
            step = min(step * 2, MAX_POLL_SECONDS)

    @staticmethod
    async def _sleep(seconds: float, cancelled: Cancelled) -> None:
        """Sleep, waking early when the caller's event is set."""
        if isinstance(cancelled, asyncio.Event):
            try:
                await asyncio.wait_for(cancelled.wait(), timeout=seconds)
            except TimeoutError:
                pass
            return
        await asyncio.sleep(seconds)
