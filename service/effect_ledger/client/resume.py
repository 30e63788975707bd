"""The orchestrator's reopen: load an owned session and say what may happen to each pending call.

`reopen` reads the session and its projection and returns a ResumePlan. It never claims, submits,
executes or appends anything: acting on the plan is the caller's decision, under current policy and
its current token (API.md section 12; the book's 15.16.8: checkpoints are not receipts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from effect_ledger.client.errors import LedgerClientError

if TYPE_CHECKING:
    from effect_ledger.client.client import LedgerClient
    from effect_ledger.client.journal import Projection, ProjectionCall, SessionSnapshot

# How many times reopen reads again when an append lands between its two reads.
REREADS = 3


class SessionMoved(LedgerClientError):
    """The session kept changing while it was being reopened; another writer is active."""


@dataclass(frozen=True)
class PlannedCall:
    """One unresolved call and what the ledger says about its operation now."""

    call_id: str
    name: str
    operation_id: str | None
    status: str | None  # the ledger's effective status, "absent", or None (no operation named)
    receipt: dict[str, Any] | None = None


@dataclass(frozen=True)
class ResumePlan:
    """What may happen next, per call, at one revision — nothing of it has been done."""

    session_id: str
    revision: int
    digest: str
    answer_from_receipt: list[PlannedCall] = field(default_factory=list)  # committed: append its result
    reconcile: list[PlannedCall] = field(default_factory=list)  # outcome unknown: never run it again
    may_claim_again: list[PlannedCall] = field(default_factory=list)  # under current policy only
    wait: list[PlannedCall] = field(default_factory=list)  # a live lease holds it
    no_operation: list[PlannedCall] = field(default_factory=list)  # the journal alone cannot tell
    restored_results: dict[str, Any] = field(default_factory=dict)  # call_id -> output, as journaled
    # provider state (section 12): the compatible continuation (payload base64), else why none is
    continuation: dict[str, Any] | None = None
    continuations_unusable: list[dict[str, Any]] = field(default_factory=list)  # {"seq", "reason"}
    continuation_asked: bool = False

    @property
    def continuation_why_not(self) -> str | None:
        """None when a continuation was handed back; else why not: `not_requested`, `none_recorded`,
        or the reason of the newest continuation (provider, adapter, account, model_class, expired,
        prefix, unreadable). Without one, restart from the neutral records."""
        if self.continuation is not None:
            return None
        if not self.continuation_asked:
            return "not_requested"
        if not self.continuations_unusable:
            return "none_recorded"
        return str(max(self.continuations_unusable, key=lambda c: int(c["seq"]))["reason"])

    @property
    def settled(self) -> bool:
        """True when no call is pending: the next model request can be built from the journal alone."""
        return not (
            self.answer_from_receipt
            or self.reconcile
            or self.may_claim_again
            or self.wait
            or self.no_operation
        )

    def action_of(self, call_id: str) -> str | None:
        """The plan's word for one call (use_receipt, reconcile, claim_allowed, wait, no_operation)."""
        for word, calls in (
            ("use_receipt", self.answer_from_receipt),
            ("reconcile", self.reconcile),
            ("claim_allowed", self.may_claim_again),
            ("wait", self.wait),
            ("no_operation", self.no_operation),
        ):
            if any(c.call_id == call_id for c in calls):
                return word
        return None


def plan_from(snapshot: SessionSnapshot, projection: Projection) -> ResumePlan:
    """The plan for a snapshot and a projection of the same revision."""
    plan = ResumePlan(
        projection.session_id, projection.revision, projection.digest, restored_results=snapshot.results()
    )
    buckets = {
        "use_receipt": plan.answer_from_receipt,
        "reconcile": plan.reconcile,
        "claim_allowed": plan.may_claim_again,
        "wait": plan.wait,
        "no_operation": plan.no_operation,
    }
    for call in projection.calls:
        if call.resume in buckets:
            buckets[call.resume].append(_planned(call))
    return plan


def _planned(call: ProjectionCall) -> PlannedCall:
    effect = call.effect or {}
    return PlannedCall(
        call.call_id, call.name, call.operation_id, effect.get("status"), effect.get("receipt")
    )


async def reopen(
    client: LedgerClient, session_id: str, *, continuation_for: Mapping[str, str] | None = None
) -> ResumePlan:
    """Read the session and its projection at one revision and plan; dispatches nothing. With
    `continuation_for` ({"provider", "adapter", "account", "model_class"}), the plan carries the
    compatible continuation of that revision, or says why none is usable."""
    for _ in range(REREADS):
        snapshot = await client.journal.read(session_id)
        projection = await client.journal.projection(session_id)
        if projection.revision != snapshot.revision:
            continue
        plan = plan_from(snapshot, projection)
        if continuation_for is None:
            return plan
        wanted = dict(continuation_for)
        selection = await client.journal.context(
            session_id,
            provider=wanted["provider"],
            adapter=wanted["adapter"],
            account=wanted["account"],
            model_class=wanted["model_class"],
        )
        if selection.revision != plan.revision:
            continue
        return replace(
            plan,
            continuation=selection.continuation,
            continuations_unusable=list(selection.omitted.continuations),
            continuation_asked=True,
        )
    raise SessionMoved(f"session {session_id} kept changing while it was reopened")
