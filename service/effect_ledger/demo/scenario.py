"""Chapter 15's lost measurement receipt, end to end through the client: executor, reconciler, auditor.

Two measurements are taken through a fake external measurement service. The first succeeds. The
second is applied by the service, but its answer does not arrive before the executor's timeout, after
the effect was submitted: the ledger records it as unknown. A retry is refused (outcome_unknown), the
reconciler looks the request up in the measurement service and resolves it from that evidence, a new
claim hands back the receipt without measuring again, and the auditor verifies both hash chains.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from effect_ledger.client import (
    Effect,
    LedgerClient,
    OperationView,
    OutcomeUnknown,
    Receipt,
    Verdict,
    committed,
    unresolved,
)

TENANT = "northstar"
EXECUTOR, RECONCILER, AUDITOR, MEASURE_SVC = "exec-1", "reconciler-1", "auditor-1", "measure-svc"
EXECUTOR_TIMEOUT_S = 0.25


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Timeline:
    """Prints each step as it happens, and keeps the expectations to check at the end."""

    out: TextIO = sys.stdout
    checks: list[tuple[str, bool]] = field(default_factory=list)

    def header(self) -> None:
        """The column titles."""
        self._line("time (UTC)", "actor", "action", "status", "attempt")
        self._line("-" * 12, "-" * 12, "-" * 64, "-" * 9, "-" * 7)

    def add(self, actor: str, action: str, view: OperationView | None = None) -> None:
        """One step: who did what, and the operation's status and attempt as the ledger then reported."""
        status = view.status if view is not None else "-"
        attempt = str(view.attempt) if view is not None else "-"
        self._line(_now().strftime("%H:%M:%S.%f")[:12], actor, action, status, attempt)

    def expect(self, what: str, held: bool) -> None:
        """Record one expectation of the scenario."""
        self.checks.append((what, held))

    def verdict(self) -> bool:
        """Print every expectation; True when all held."""
        print("\nexpectations:", file=self.out)
        for what, held in self.checks:
            print(f"  [{'ok' if held else 'FAILED'}] {what}", file=self.out)
        failed = sum(1 for _, held in self.checks if not held)
        if failed:
            print(f"\nresult: {failed} of {len(self.checks)} expectations FAILED", file=self.out)
        else:
            print(f"\nresult: all {len(self.checks)} expectations held", file=self.out)
        return failed == 0

    def _line(self, at: str, actor: str, action: str, status: str, attempt: str) -> None:
        print(f"{at:<12}  {actor:<12}  {action:<64}  {status:<9}  {attempt}", file=self.out, flush=True)


class MeasurementService:
    """The external system: it applies every request it receives and can be asked what it did."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.executions: Counter[str] = Counter()
        self._done: dict[str, dict[str, Any]] = {}

    async def measure(self, request_id: str, prototype: str, *, answer_delay_s: float = 0) -> dict[str, Any]:
        """Take a measurement; the answer may take `answer_delay_s` to come back."""
        self.executions[prototype] += 1
        value = {"prototype": prototype, "metric": "latency_ms", "value": {"A": 41.7, "B": 38.2}[prototype]}
        record = {"measurement_id": f"msr-{prototype.lower()}-0001", "value": value, "observed_at": _now()}
        self._done[request_id] = record
        self.timeline.add(MEASURE_SVC, f"measure prototype {prototype} for {request_id}: {value['value']} ms")
        await asyncio.sleep(answer_delay_s)  # the answer travels back (slowly, for prototype B)
        return record

    async def find(self, request_id: str) -> dict[str, Any] | None:
        """Read-only lookup by the executor's request ID: what was measured, if anything."""
        return self._done.get(request_id)


def _receipt(record: dict[str, Any]) -> Receipt:
    return Receipt(
        external_ref=record["measurement_id"], result=record["value"], observed_at=record["observed_at"]
    )


async def run_scenario(base_url: str, tokens: dict[str, str], timeline: Timeline) -> None:
    """The scenario; every expectation is recorded on the timeline."""
    from effect_ledger.demo.approval_step import APPROVER, run_approval_step
    from effect_ledger.demo.journal_trace import ORCHESTRATOR, CompositionTrace

    service = MeasurementService(timeline)
    async with (
        LedgerClient(base_url, tokens[EXECUTOR]) as executor,
        LedgerClient(base_url, tokens[RECONCILER]) as reconciler,
        LedgerClient(base_url, tokens[AUDITOR]) as auditor,
        LedgerClient(base_url, tokens[ORCHESTRATOR]) as orchestrator,
        LedgerClient(base_url, tokens[APPROVER]) as approver,
    ):
        timeline.header()
        trace = CompositionTrace(orchestrator, timeline, service.executions)
        await trace.request_a()
        await trace.result_a(await _measure_a(executor, service, timeline))
        await trace.request_b()
        await _measure_b_times_out(executor, service, timeline)
        await trace.reopen_branch()
        await _retry_b_is_refused(executor, timeline)
        await _reconcile(reconciler, service, timeline)
        await _claim_b_again(executor, timeline)
        await trace.answer_b_from_receipt()
        await trace.reopen_comparison()
        await _audit(auditor, timeline)
        await run_approval_step(executor, approver, timeline, EXECUTOR)
    timeline.expect(
        "the measurement service ran each measurement exactly once (A: 1, B: 1)",
        service.executions == Counter({"A": 1, "B": 1}),
    )


def _measurement(executor: LedgerClient, prototype: str) -> Effect:
    """The guarded effect of measuring one prototype: its ID and intent are the same on every try."""
    intent = {"prototype": prototype, "metric": "latency_ms", "window_s": 5}
    operation_id = f"measurement-{prototype.lower()}"
    return executor.effect(operation_id, tool="measure", tool_version="2.1.0", intent=intent)


async def _measure_a(
    executor: LedgerClient, service: MeasurementService, timeline: Timeline
) -> dict[str, Any]:
    async with _measurement(executor, "A") as effect:
        timeline.add(EXECUTOR, "claim measurement-a -> execute", effect.operation)
        view = await effect.submitted(effect_ref="req-a-1")
        timeline.add(EXECUTOR, "submit measurement-a (effect_ref req-a-1), then send it", view)
        record = await service.measure("req-a-1", "A")
        effect.commit(_receipt(record))
    final = effect.operation
    timeline.add(EXECUTOR, f"commit measurement-a with receipt {record['measurement_id']}", final)
    timeline.expect(
        "measurement-a committed on attempt 1 with its receipt",
        final is not None
        and final.status == "committed"
        and final.attempt == 1
        and final.receipt is not None
        and final.receipt.external_ref == "msr-a-0001",
    )
    return dict(record["value"])


async def _measure_b_times_out(
    executor: LedgerClient, service: MeasurementService, timeline: Timeline
) -> None:
    timed_out = False
    effect = _measurement(executor, "B")
    try:
        async with effect:
            timeline.add(EXECUTOR, "claim measurement-b -> execute", effect.operation)
            view = await effect.submitted(effect_ref="req-b-1")
            timeline.add(EXECUTOR, "submit measurement-b (effect_ref req-b-1), then send it", view)
            async with asyncio.timeout(EXECUTOR_TIMEOUT_S):
                record = await service.measure("req-b-1", "B", answer_delay_s=30)
            effect.commit(_receipt(record))
    except TimeoutError:
        timed_out = True
    final = effect.operation
    incident = final.incident if final is not None else None
    timeline.add(EXECUTOR, f"no answer within {EXECUTOR_TIMEOUT_S} s after submit -> record unknown", final)
    timeline.add(EXECUTOR, f"diagnostics stored as incident {incident}")
    timeline.expect(
        "measurement-b timed out after submission and was recorded unknown, not not_applied",
        timed_out and final is not None and final.status == "unknown" and final.not_applied_reason is None,
    )


async def _retry_b_is_refused(executor: LedgerClient, timeline: Timeline) -> None:
    body_ran = False
    refused: OutcomeUnknown | None = None
    try:
        async with _measurement(executor, "B"):
            body_ran = True
    except OutcomeUnknown as exc:
        refused = exc
    timeline.add(
        EXECUTOR,
        "retry measurement-b -> refused: 409 outcome_unknown",
        refused.operation if refused else None,
    )
    timeline.expect(
        "the retry of measurement-b was refused with outcome_unknown and did not run",
        refused is not None and refused.code == "outcome_unknown" and not body_ran,
    )


async def _reconcile(reconciler: LedgerClient, service: MeasurementService, timeline: Timeline) -> None:
    unknown = [op async for op in reconciler.iter_operations(status="unknown")]
    listed = ", ".join(op.operation_id for op in unknown) or "none"
    timeline.add(RECONCILER, f"list unknown operations -> {listed}")

    async def lookup(op: OperationView) -> Verdict:
        found = await service.find(op.effect_ref or "")
        where = f"look up {op.effect_ref} in the measurement service"
        if found is None:
            timeline.add(RECONCILER, f"{where} -> not found", op)
            return unresolved(lookup_ref=op.effect_ref)
        timeline.add(RECONCILER, f"{where} -> found {found['measurement_id']}", op)
        return committed(_receipt(found), lookup_ref=found["measurement_id"])

    report = await reconciler.reconcile(lookup, source="measurement-service")
    view = await reconciler.get_operation("measurement-b")
    timeline.add(RECONCILER, "resolve measurement-b as committed, from that evidence", view)
    timeline.expect(
        "the reconciler found exactly measurement-b unknown and resolved it as committed",
        [op.operation_id for op in unknown] == ["measurement-b"]
        and report.committed == ["measurement-b"]
        and report.seen == 1
        and view.status == "committed"
        and view.resolved_by == RECONCILER,
    )


async def _claim_b_again(executor: LedgerClient, timeline: Timeline) -> None:
    body_measured = False
    async with _measurement(executor, "B") as effect:
        if effect.receipt is None:
            body_measured = True  # would run the measurement again: the expectation below fails
        receipt = effect.receipt
    reused = receipt.external_ref if receipt is not None else None
    timeline.add(EXECUTOR, f"claim measurement-b again -> reuse_receipt {reused}", effect.operation)
    timeline.expect(
        "claiming measurement-b again returned the reconciled receipt without measuring",
        receipt is not None
        and receipt.external_ref == "msr-b-0001"
        and receipt.recorded_by == RECONCILER
        and not body_measured,
    )


async def _audit(auditor: LedgerClient, timeline: Timeline) -> None:
    chains_ok = True
    for operation_id in ("measurement-a", "measurement-b"):
        events = await auditor.events(operation_id)
        verdict = await auditor.verify(operation_id)
        history = " > ".join(str(e.to_status) for e in events)
        view = await auditor.get_operation(operation_id)
        timeline.add(AUDITOR, f"{operation_id} history: {history}", view)
        timeline.add(AUDITOR, f"verify {operation_id}: {verdict.checked} events, ok={verdict.ok}", view)
        intact = verdict.ok and verdict.first_bad_seq is None and verdict.checked == len(events)
        chains_ok = chains_ok and intact
        if operation_id == "measurement-b":
            timeline.expect(
                "measurement-b's events: claimed, submitted, completed (unknown), resolved",
                [(e.kind, e.to_status) for e in events]
                == [
                    ("claimed", "pending"),
                    ("submitted", "submitted"),
                    ("completed", "unknown"),
                    ("resolved", "committed"),
                ],
            )
        timeline.expect(f"{operation_id} stayed on attempt 1", view.attempt == 1)
    timeline.expect("the auditor verified both hash chains", chains_ok)
