"""The write path's outcome codes, one enumeration for the SQL and the Python, and the answers to them.

The decision is taken once, where the row is locked: in the server-side functions of
alembic/functions/ (docs/write-path.md). Each returns one of these words; Python only builds the
answer from it: problem details, `Retry-After`, `mismatched`. tests/unit/test_outcomes.py checks
that the words here are exactly the words the SQL functions can answer.
"""

from __future__ import annotations

from enum import StrEnum

from effect_ledger.domain.errors import Refusal
from effect_ledger.domain.model import Binding, Operation


class OutcomeCode(StrEnum):
    """Every outcome a write-path function (ledger.claim, submit, heartbeat, complete, resolve, sweep)
    can answer. Refusals are also problem codes (domain/errors.PROBLEMS)."""

    # what was done
    CREATED = "created"
    NEW_ATTEMPT = "new_attempt"
    REPLAY = "replay"
    REUSE_RECEIPT = "reuse_receipt"
    SUBMITTED = "submitted"
    EXTENDED = "extended"
    COMPLETED = "completed"
    RESOLVED = "resolved"
    EXPIRED = "expired"
    UNCHANGED = "unchanged"
    # refusals (problem codes)
    NOT_FOUND = "not_found"
    VALIDATION_FAILED = "validation_failed"
    STALE_CLAIM = "stale_claim"
    INTENT_CONFLICT = "intent_conflict"
    OPERATION_IN_PROGRESS = "operation_in_progress"
    OUTCOME_UNKNOWN = "outcome_unknown"
    INVALID_TRANSITION = "invalid_transition"
    CONFLICTING_OUTCOME = "conflicting_outcome"
    # ledger.claim only: the row was purged three times under us (answered as retryable 503)
    VANISHED = "vanished"
    # ledger.claim under an approval policy (API.md section 15): nothing created or changed
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_DENIED = "approval_denied"


_BY_WORD = {code.value: code for code in OutcomeCode}


def outcome_code(word: str) -> OutcomeCode:
    """`OutcomeCode(word)` by one dict lookup (the enum's own constructor costs several times more,
    on every write); an unknown word raises the same ValueError."""
    code = _BY_WORD.get(word)
    return OutcomeCode(word) if code is None else code


REFUSALS = frozenset(
    {
        OutcomeCode.NOT_FOUND,
        OutcomeCode.VALIDATION_FAILED,
        OutcomeCode.STALE_CLAIM,
        OutcomeCode.INTENT_CONFLICT,
        OutcomeCode.OPERATION_IN_PROGRESS,
        OutcomeCode.OUTCOME_UNKNOWN,
        OutcomeCode.INVALID_TRANSITION,
        OutcomeCode.CONFLICTING_OUTCOME,
        OutcomeCode.APPROVAL_REQUIRED,  # answered by db/ledger.claim with the request's view
        OutcomeCode.APPROVAL_DENIED,
    }
)


def operation_refusal(code: str, detail: str, op: Operation, retry_after: int | None = None) -> Refusal:
    """A 409-family refusal that carries the operation it is about."""
    return Refusal(code, detail, {"operation": op}, retry_after)


def _invalid_transition_detail(call: str, op: Operation) -> str:
    status = op.effective_status
    if call == "submit" and status == "submitted":
        return "The operation was submitted with another effect_ref."
    if call == "complete" and status == "pending":
        return "Only a submitted operation can become unknown."
    if call == "resolve":
        return "Only an unknown operation can be resolved."
    return f"A {status} operation does not accept {call}."


def refusal_for(call: str, code: OutcomeCode, op: Operation, binding: Binding | None = None) -> Refusal:
    """The answer to a refusal the database decided for `call` on `op` (the row it returned)."""
    if code is OutcomeCode.INTENT_CONFLICT:
        assert binding is not None  # only a claim is refused for its binding
        return Refusal(
            code,
            "The operation ID is bound to a different principal, tool, version or intent.",
            {"mismatched": op.binding.mismatched(binding)},
        )
    if code is OutcomeCode.OPERATION_IN_PROGRESS:
        detail = "A live lease holds this operation; retry after it expires."
        return operation_refusal(code, detail, op, op.retry_after_seconds())
    if code is OutcomeCode.OUTCOME_UNKNOWN:
        if call == "claim":
            detail = "The outcome of this operation is unknown: reconcile it, do not repeat it."
        else:
            detail = "The outcome is unknown: reconcile, do not repeat."
        return operation_refusal(code, detail, op)
    if code is OutcomeCode.STALE_CLAIM:
        return operation_refusal(code, "The claim token is not the current attempt's.", op)
    if code is OutcomeCode.CONFLICTING_OUTCOME:
        detail = "A different outcome is already recorded; the disagreement was recorded."
        return operation_refusal(code, detail, op)
    if code is OutcomeCode.INVALID_TRANSITION:
        return operation_refusal(code, _invalid_transition_detail(call, op), op)
    raise ValueError(f"{code} is answered by its caller, not from a row")
