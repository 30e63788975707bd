"""What the transitions are given (a report) and who may see an operation.

The transitions' rules (submit, heartbeat, complete, resolve, sweep) are executed once, by the
database functions of alembic/functions/; domain/outcomes.py builds the answer from their outcome.
tests/chaos/test_state_machine.py checks them against an independent model of docs/api.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from effect_ledger.domain.model import Operation

# The members of a committed receipt that the executor reports (the database adds recorded_by/_at);
# the receipts log compares a stored receipt with the event that recorded it on these.
RECEIPT_CONTENT = ("external_ref", "result_digest", "result", "observed_at")


@dataclass(frozen=True, slots=True)
class Report:
    """An outcome as reported by an executor (complete) or a reconciler (resolve)."""

    outcome: str
    receipt: dict[str, Any] | None = None
    reason: dict[str, Any] | None = None
    evidence: dict[str, Any] | None = None
    incident: str | None = None


def hidden_from(op: Operation, principal: str, reads_tenant: bool) -> bool:
    """API.md section 3: an executor sees only operations bound to its own principal; any other
    answers exactly as a missing one (it cannot hold the token of another principal's attempt)."""
    return not reads_tenant and op.binding.principal != principal
