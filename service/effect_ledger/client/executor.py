"""The executor helper: claim, submit before sending, record the outcome on every way out of the block.

    async with client.effect("op-7", tool="measure", tool_version="2.1.0", intent=intent) as effect:
        if not effect.reused:                    # committed earlier: reuse, do not run the effect
            await effect.submitted(effect_ref=request_id)
            result = await send_the_effect()
            effect.commit(Receipt(external_ref=request_id, result=result))

Leaving the block with an exception before `submitted` records not_applied; after it, unknown (with
diagnostics), because the effect may have applied. A live claim is kept by background heartbeats.

An executor that sends the effect first thing saves a call with `client.effect(..., send_at_once=True,
effect_ref=request_id)`: the claim submits in the same transaction, and the block starts submitted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Mapping
from dataclasses import replace
from types import TracebackType
from typing import Any

from msgspec import convert

from effect_ledger.client.approvals import ApprovalView, Cancelled, EffectCancelled, is_cancelled
from effect_ledger.client.calls import ExecutorCalls
from effect_ledger.client.errors import ApprovalRequired, EffectUsageError, LedgerClientError, LedgerProblem
from effect_ledger.client.models import (
    Category,
    ClaimGrant,
    ClaimResult,
    Diagnostics,
    NotAppliedReason,
    OperationView,
    Receipt,
    RecordedReceipt,
)
from effect_ledger.client.retry import TRANSIENT_STATUSES

MAX_DETAIL_CODE = 100
# Records still being written after their waiter was cancelled again; held so they are not collected.
_IN_FLIGHT: set[asyncio.Task[Any]] = set()


def _cause_of(exc: BaseException) -> str:
    """The diagnostics cause for an exception that left the block after the effect was sent."""
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError is TimeoutError since Python 3.11
        return "timeout"
    if isinstance(exc, asyncio.CancelledError):
        return "aborted"
    return "unknown"


def _class_name(exc: BaseException) -> str:
    return type(exc).__name__[:MAX_DETAIL_CODE]


class Effect:
    """One guarded run of an effect; use it as `async with client.effect(...) as effect:`."""

    def __init__(
        self,
        client: ExecutorCalls,
        operation_id: str,
        claim_body: Mapping[str, Any],
        approval_wait_seconds: float = 0.0,
        cancelled: Cancelled = None,
    ) -> None:
        self.operation_id = operation_id
        self.approval: ApprovalView | None = None  # the last approval request seen while claiming
        self.approval_waits = 0  # decisions waited for
        self.operation: OperationView | None = None  # the latest view the ledger returned
        self.receipt: RecordedReceipt | None = None  # set when the operation was already committed
        self.claim: ClaimGrant | None = None  # set when this block may run the effect
        self.lease_lost: LedgerProblem | None = None  # why heartbeats stopped early, if they did
        self.heartbeats = 0  # heartbeats the ledger accepted
        self._client = client
        self._claim_body = dict(claim_body)
        self._lease_seconds = int(claim_body.get("lease_seconds", 30))
        self._submitted_at: float | None = None
        self._effect_ref: str | None = None
        self._outcome: tuple[str, Receipt | NotAppliedReason] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._approval_wait = approval_wait_seconds
        self._cancelled = cancelled

    @property
    def reused(self) -> bool:
        """Whether the operation was committed before: the body must use `receipt` (None when retention
        purged it: `operation.receipt_digest` remains), and never run the effect."""
        return self.claim is None and self.operation is not None

    @property
    def is_submitted(self) -> bool:
        """Whether `submitted()` succeeded in this block."""
        return self._submitted_at is not None

    async def _claim_with_approval(self) -> ClaimResult:
        """Claim; on approval_required, wait for the decision within the deadline and claim again.
        Cancellation is checked before every claim: after a wait, the next claim could consume the
        approval, so a run cancelled while waiting sends none (section 15, the seed's counterexample)."""
        deadline = time.monotonic() + self._approval_wait
        while True:
            if is_cancelled(self._cancelled):
                raise EffectCancelled(f"{self.operation_id}: cancelled before the claim; nothing ran")
            try:
                return await self._client.claim(self.operation_id, **self._claim_body)
            except ApprovalRequired as needed:
                if type(needed) is not ApprovalRequired or needed.approval_id is None:
                    raise  # denied: do not run it
                if time.monotonic() >= deadline:
                    raise
                self.approval_waits += 1
                waited = await self._client.approvals.wait_for_decision(
                    needed.approval_id, deadline, self._cancelled
                )
                if waited is None and not is_cancelled(self._cancelled):
                    raise  # the deadline passed while it was pending
                self.approval = waited

    async def __aenter__(self) -> Effect:
        # OperationInProgress, OutcomeUnknown, ApprovalRequired/Denied and EffectCancelled propagate
        # from here, so the body never runs.
        result = await self._claim_with_approval()
        self.operation = result.operation
        if result.action == "reuse_receipt":
            self.receipt = result.operation.receipt
            if self.receipt is None and not result.operation.purged:
                raise EffectUsageError("the ledger answered reuse_receipt without a receipt")
            return self
        self.claim = result.claim
        if self.claim is None:
            raise EffectUsageError("the ledger answered execute without a claim")
        if result.operation.status == "submitted":
            # claim-and-submit (send_at_once): the claim itself submitted, so the effect may be sent now
            self._submitted_at = time.monotonic()
            self._effect_ref = result.operation.effect_ref
        self._heartbeat = asyncio.create_task(
            self._keep_lease(), name=f"effect-ledger heartbeat {self.operation_id}"
        )
        return self

    async def submitted(self, effect_ref: str | None = None) -> OperationView:
        """Mark the effect as crossing the boundary; call it before sending the effect, never after."""
        claim = self._granted("submitted")
        if self._submitted_at is not None and effect_ref == self._effect_ref:
            assert self.operation is not None
            return self.operation
        self.operation = await self._client.submit(self.operation_id, claim.token, effect_ref=effect_ref)
        # Only now: if submit failed, the body did not send the effect, so not_applied stays true.
        self._submitted_at = time.monotonic()
        self._effect_ref = effect_ref
        return self.operation

    def commit(self, receipt: Receipt | Mapping[str, Any]) -> None:
        """Record, on leaving the block, that the effect applied with this receipt."""
        self._granted("commit")
        value = receipt if isinstance(receipt, Receipt) else convert(receipt, Receipt, strict=False)
        self._outcome = ("committed", value)

    def not_applied(self, category: Category, detail_code: str | None = None) -> None:
        """Record, on leaving the block, that the external system refused the effect (it did not apply)."""
        self._granted("not_applied")
        self._outcome = ("not_applied", NotAppliedReason(category=category, detail_code=detail_code))

    def _granted(self, call: str) -> ClaimGrant:
        if self.claim is None:
            raise EffectUsageError(
                f"effect.{call}() on a committed operation: use effect.receipt, do not run the effect again"
            )
        return self.claim

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        await self._stop_heartbeats()
        if self.claim is None:
            return False  # a reused receipt: nothing was run, nothing to record
        if exc is None:
            self.operation = await self._shielded(self._record(None))
            return False
        try:
            self.operation = await self._shielded(self._record(exc))
        except LedgerClientError as failure:
            # The body's exception is what the caller must see; the ledger's refusal rides along.
            exc.add_note(f"effect-ledger could not record the outcome of {self.operation_id}: {failure}")
        return False

    def _record(self, exc: BaseException | None) -> Coroutine[Any, Any, OperationView]:
        """The complete() call for the way the block ended."""
        claim = self._granted("exit")
        complete = self._client.complete
        if self._outcome is not None:
            # An explicit outcome wins even over a later exception: a receipt is evidence.
            outcome, value = self._outcome
            if isinstance(value, Receipt):
                return complete(self.operation_id, claim.token, outcome, receipt=value)
            return complete(self.operation_id, claim.token, outcome, reason=value)
        if self._submitted_at is None:
            # Nothing crossed the boundary, so the effect verifiably did not apply.
            if isinstance(exc, asyncio.CancelledError):
                reason = NotAppliedReason(category="cancelled_before_submit")
            else:
                detail = _class_name(exc) if exc is not None else "exited_without_submit"
                reason = NotAppliedReason(category="other", detail_code=detail)
            return complete(self.operation_id, claim.token, "not_applied", reason=reason)
        # Submitted and no receipt: the effect may or may not have applied. Never not_applied.
        diagnostics = Diagnostics(
            operation_id=self.operation_id,
            attempt=claim.attempt,
            phase="tool_execution",
            cause=_cause_of(exc) if exc is not None else "unknown",
            elapsed_ms=int((time.monotonic() - self._submitted_at) * 1000),
            detail_code=_class_name(exc) if exc is not None else "exited_without_outcome",
        )
        return complete(self.operation_id, claim.token, "unknown", diagnostics=diagnostics)

    @staticmethod
    async def _shielded(record: Coroutine[Any, Any, OperationView]) -> OperationView:
        """Finish recording even if the waiting task is cancelled again meanwhile."""
        task = asyncio.ensure_future(record)
        _IN_FLIGHT.add(task)
        task.add_done_callback(_IN_FLIGHT.discard)
        return await asyncio.shield(task)

    async def _keep_lease(self) -> None:
        """Heartbeat every lease/3 seconds until stopped, or until the ledger says the lease is gone."""
        assert self.claim is not None
        interval = self._lease_seconds / 3
        # A heartbeat that cannot get through within one interval gives way to the next one.
        policy = replace(
            self._client.retry,
            deadline_seconds=interval,
            attempt_timeout_seconds=min(self._client.retry.attempt_timeout_seconds, interval),
        )
        while True:
            await asyncio.sleep(interval)
            try:
                self.operation = await self._client.heartbeat(
                    self.operation_id, self.claim.token, lease_seconds=self._lease_seconds, retry=policy
                )
                self.heartbeats += 1
            except LedgerProblem as problem:
                if problem.status in TRANSIENT_STATUSES:
                    continue
                # stale_claim, outcome_unknown, invalid_transition: the lease is no longer ours to keep.
                self.lease_lost = problem
                return
            except LedgerClientError:
                continue  # unreachable for now; two more intervals remain before the lease runs out

    async def _stop_heartbeats(self) -> None:
        task, self._heartbeat = self._heartbeat, None
        if task is None:
            return
        task.cancel()
        # wait() does not raise the heartbeat's own CancelledError, and this task may already be
        # cancelling (the body was cancelled): it still has an outcome to record.
        await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved, so that asyncio does not report it as never retrieved
