"""The reconciler helper: find every unknown operation and resolve it from a lookup in the effect system.

async def lookup(op: OperationView) -> Verdict:
    found = await measurements.find(request_id=op.effect_ref)   # read-only, authorised lookup
    if found is None:
        return unresolved(lookup_ref=op.effect_ref)
    return committed(Receipt(external_ref=found.id, result=found.value), lookup_ref=found.id)

report = await client.reconcile(lookup, source="measurement-service")
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from msgspec import convert

from effect_ledger.client.calls import ReconcilerCalls
from effect_ledger.client.errors import ConflictingOutcome, LedgerProblem
from effect_ledger.client.models import Category, Evidence, NotAppliedReason, OperationView, Receipt


@dataclass(frozen=True, slots=True)
class Committed:
    """The lookup found the effect applied, with this receipt."""

    receipt: Receipt
    lookup_ref: str | None = None


@dataclass(frozen=True, slots=True)
class NotApplied:
    """The lookup verified that the effect did not apply."""

    reason: NotAppliedReason
    lookup_ref: str | None = None


@dataclass(frozen=True, slots=True)
class Unresolved:
    """The lookup could not tell; the try is recorded and the operation stays unknown."""

    lookup_ref: str | None = None


Verdict = Committed | NotApplied | Unresolved
Lookup = Callable[[OperationView], Awaitable[Verdict]]


def committed(receipt: Receipt | Mapping[str, Any], lookup_ref: str | None = None) -> Committed:
    """A verdict: the effect applied (receipt as a Receipt or its fields)."""
    value = receipt if isinstance(receipt, Receipt) else convert(receipt, Receipt, strict=False)
    return Committed(value, lookup_ref)


def not_applied(
    category: Category, detail_code: str | None = None, lookup_ref: str | None = None
) -> NotApplied:
    """A verdict: the effect verifiably did not apply."""
    return NotApplied(NotAppliedReason(category=category, detail_code=detail_code), lookup_ref)


def unresolved(lookup_ref: str | None = None) -> Unresolved:
    """A verdict: the lookup could not establish the outcome."""
    return Unresolved(lookup_ref)


@dataclass
class ReconcileReport:
    """What one pass did, by operation ID."""

    committed: list[str] = field(default_factory=list)
    not_applied: list[str] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # someone else recorded a different outcome
    failed: dict[str, str] = field(default_factory=dict)  # ID -> the lookup's failure or the ledger's code

    @property
    def seen(self) -> int:
        """How many unknown operations the pass looked at."""
        return (
            len(self.committed)
            + len(self.not_applied)
            + len(self.unresolved)
            + len(self.conflicts)
            + len(self.failed)
        )


async def reconcile_unknown(
    client: ReconcilerCalls, lookup: Lookup, *, source: str, tool: str | None = None, page_size: int = 100
) -> ReconcileReport:
    """Resolve every unknown operation (all pages) with `lookup`; one failure does not stop the pass."""
    report = ReconcileReport()
    seen: set[str] = set()
    async for op in client.iter_operations(status="unknown", tool=tool, limit=page_size):
        # An `unresolved` verdict touches the row, which may move it to a later page of this pass.
        if op.operation_id in seen:
            continue
        seen.add(op.operation_id)
        try:
            verdict = await lookup(op)
        except Exception as exc:  # one broken lookup must not stop the others
            report.failed[op.operation_id] = f"lookup raised {type(exc).__name__}"
            continue
        if not isinstance(verdict, Committed | NotApplied | Unresolved):
            raise TypeError(f"a lookup returns committed(), not_applied() or unresolved(), not {verdict!r}")
        evidence = Evidence(source=source, checked_at=datetime.now(UTC), lookup_ref=verdict.lookup_ref)
        try:
            await _resolve(client, op.operation_id, verdict, evidence)
        except ConflictingOutcome:
            report.conflicts.append(op.operation_id)
            continue
        except LedgerProblem as problem:
            report.failed[op.operation_id] = problem.code
            continue
        _tally(report, op.operation_id, verdict)
    return report


async def _resolve(client: ReconcilerCalls, operation_id: str, verdict: Verdict, evidence: Evidence) -> None:
    if isinstance(verdict, Committed):
        await client.resolve(operation_id, "committed", evidence, receipt=verdict.receipt)
    elif isinstance(verdict, NotApplied):
        await client.resolve(operation_id, "not_applied", evidence, reason=verdict.reason)
    else:
        await client.resolve(operation_id, "unresolved", evidence)


def _tally(report: ReconcileReport, operation_id: str, verdict: Verdict) -> None:
    if isinstance(verdict, Committed):
        report.committed.append(operation_id)
    elif isinstance(verdict, NotApplied):
        report.not_applied.append(operation_id)
    else:
        report.unresolved.append(operation_id)
