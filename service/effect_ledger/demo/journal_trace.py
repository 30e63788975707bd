"""The seed's composition trace (the book's 15.16.7), told through the run journal of API.md section 12.

An orchestrator keeps the comparison's causal history in a journal session while the executor works
through the ledger. After B's outcome goes unknown, a restarted orchestrator reopens the branch that
holds B's pending call: revision 2, B executed once, and the plan says `reconcile` — reading the
journal never runs the past. Once the reconciler has settled B, reopening the comparison answers B's
call from the ledger's receipt; the completed comparison reopens at revision 5, still two executions,
and the answer is computed from the restored results alone.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from effect_ledger.client import LedgerClient, message, reopen, tool_call, tool_result


class Timeline(Protocol):
    """What the trace needs of the scenario's timeline (scenario.py imports this module, not the reverse)."""

    def add(self, actor: str, action: str) -> None:
        """One step, printed as it happens."""

    def expect(self, what: str, held: bool) -> None:
        """One expectation, checked at the end."""


ORCHESTRATOR = "orchestrator"
REQUEST = "Compare the latency of prototypes A and B."


class CompositionTrace:
    """The orchestrator's side of the scenario: journal appends and reopens, never an effect."""

    def __init__(self, client: LedgerClient, timeline: Timeline, executions: Counter[str]) -> None:
        self.journal = client.journal
        self.client = client
        self.timeline = timeline
        self.executions = executions  # the measurement service's own count, read only
        self.comparison = ""
        self.branch = ""

    async def request_a(self) -> None:
        """Open the comparison: the user's request and the proposed call for A."""
        self.comparison = (await self.journal.create_session({"task": "latency-comparison"})).session_id
        call = tool_call("c-a", "measure", {"prototype": "A"}, "measurement-a")
        done = await self.journal.append(self.comparison, 0, [message("user", REQUEST), call])
        self.timeline.add(
            ORCHESTRATOR, f"comparison: request + call c-a (measurement-a) -> revision {done.revision}"
        )

    async def result_a(self, output: dict[str, Any]) -> None:
        """The executor's answer for A becomes c-a's result."""
        done = await self.journal.append(self.comparison, 2, [tool_result("c-a", "measure", output)])
        self.timeline.add(
            ORCHESTRATOR, f"comparison: result of c-a ({output['value']} ms) -> revision {done.revision}"
        )

    async def request_b(self) -> None:
        """Propose B in the comparison, and in the branch that a crash will leave with B pending."""
        call = tool_call("c-b", "measure", {"prototype": "B"}, "measurement-b")
        done = await self.journal.append(self.comparison, 3, [call])
        self.timeline.add(ORCHESTRATOR, f"comparison: call c-b (measurement-b) -> revision {done.revision}")
        self.branch = (await self.journal.create_session({"task": "measure-b"})).session_id
        branch = await self.journal.append(self.branch, 0, [message("user", "Measure prototype B."), call])
        self.timeline.add(
            ORCHESTRATOR, f"branch: request + call c-b (measurement-b) -> revision {branch.revision}"
        )

    async def reopen_branch(self) -> None:
        """A restarted orchestrator reopens the unknown-effect branch: the plan says reconcile."""
        plan = await reopen(self.client, self.branch)
        action = plan.action_of("c-b")
        self.timeline.add(
            ORCHESTRATOR,
            f"restart: reopen branch, revision {plan.revision}: c-b -> {action}, B ran"
            f" {'once' if self.executions['B'] == 1 else str(self.executions['B']) + ' times'}",
        )
        self.timeline.expect(
            "the unknown-effect branch reopened at revision 2 with B executed once; the plan says reconcile",
            plan.revision == 2
            and action == "reconcile"
            and self.executions["B"] == 1
            and [c.status for c in plan.reconcile] == ["unknown"],
        )

    async def answer_b_from_receipt(self) -> None:
        """Reopen the comparison after reconciliation: B's call is answered from the ledger's receipt."""
        plan = await reopen(self.client, self.comparison)
        receipt = plan.answer_from_receipt[0].receipt if plan.answer_from_receipt else None
        reference = receipt["external_ref"] if receipt else None
        self.timeline.add(
            ORCHESTRATOR,
            f"reopen comparison at revision {plan.revision}: c-b -> {plan.action_of('c-b')} {reference}",
        )
        output = receipt["result"] if receipt else None
        done = await self.journal.append(
            self.comparison, plan.revision, [tool_result("c-b", "measure", output)]
        )
        value = output["value"] if isinstance(output, dict) else None
        self.timeline.add(
            ORCHESTRATOR,
            f"comparison: c-b result from its receipt ({value} ms) -> revision {done.revision}",
        )
        self.timeline.expect(
            "reopening the comparison answered c-b from the reconciled receipt, without executing it",
            plan.revision == 4
            and plan.action_of("c-b") == "use_receipt"
            and reference == "msr-b-0001"
            and self.executions == Counter({"A": 1, "B": 1}),
        )

    async def reopen_comparison(self) -> None:
        """The completed comparison reopens at revision 5; the answer comes from the restored results."""
        plan = await reopen(self.client, self.comparison)
        restored = {r["prototype"]: r["value"] for r in plan.restored_results.values()}
        faster = min(restored, key=restored.__getitem__) if restored else None
        executions = sum(self.executions.values())
        slower = max(restored, key=restored.__getitem__) if restored else None
        answer = f"{faster} is faster ({restored.get(faster)} < {restored.get(slower)} ms)" if faster else "-"
        self.timeline.add(
            ORCHESTRATOR,
            f"reopen comparison at revision {plan.revision}: settled, {executions} executions",
        )
        self.timeline.add(ORCHESTRATOR, f"answer from the restored results: {answer}")
        self.timeline.expect(
            "the completed comparison reopened at revision 5 with the execution count still 2 and the answer"
            " computed from the restored results",
            plan.revision == 5
            and plan.settled
            and executions == 2
            and faster == "B"
            and sorted(plan.restored_results) == ["c-a", "c-b"],
        )
