"""The ledger calls the executor and reconciler helpers make: what they need of LedgerClient, as protocols.

The helpers depend on these, not on the client class, so client.py can import them without a cycle.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from effect_ledger.client.approvals import Approvals
from effect_ledger.client.models import (
    ClaimResult,
    Diagnostics,
    Evidence,
    NotAppliedReason,
    OperationView,
    Receipt,
)
from effect_ledger.client.retry import RetryPolicy


class ExecutorCalls(Protocol):
    """claim, submit, heartbeat and complete, and the retry policy heartbeats derive theirs from."""

    @property
    def retry(self) -> RetryPolicy: ...

    async def claim(
        self,
        operation_id: str,
        *,
        tool: str,
        tool_version: str,
        intent: Any = ...,
        intent_digest: str | None = None,
        lease_seconds: int | None = None,
        client_nonce: str | None = None,
        approval_note: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> ClaimResult: ...

    @property
    def approvals(self) -> Approvals: ...

    async def submit(
        self,
        operation_id: str,
        token: str,
        *,
        effect_ref: str | None = None,
        lease_seconds: int | None = None,
    ) -> OperationView: ...

    async def heartbeat(
        self,
        operation_id: str,
        token: str,
        *,
        lease_seconds: int | None = None,
        retry: RetryPolicy | None = None,
    ) -> OperationView: ...

    async def complete(
        self,
        operation_id: str,
        token: str,
        outcome: str,
        *,
        receipt: Receipt | None = None,
        reason: NotAppliedReason | None = None,
        diagnostics: Diagnostics | None = None,
    ) -> OperationView: ...


class ReconcilerCalls(Protocol):
    """Listing operations across pages, and resolve."""

    def iter_operations(self, **filters: Any) -> AsyncIterator[OperationView]: ...

    async def resolve(
        self,
        operation_id: str,
        outcome: str,
        evidence: Evidence,
        *,
        receipt: Receipt | None = None,
        reason: NotAppliedReason | None = None,
    ) -> OperationView: ...
