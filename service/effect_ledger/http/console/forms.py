"""The resolve form: HTML fields into the API's own ResolveBody, and the API's answers into sentences."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec

from effect_ledger.domain.errors import LedgerError, validation_failed
from effect_ledger.domain.model import Operation
from effect_ledger.http.reconciler import ResolveBody
from effect_ledger.http.schemas import decode_strict

# The form's field names, and the API field each one fills.
RECEIPT_FIELDS = {
    "receipt_external_ref": "external_ref",
    "receipt_result_digest": "result_digest",
    "receipt_result": "result",
    "receipt_observed_at": "observed_at",
}
REASON_FIELDS = {"reason_category": "category", "reason_detail_code": "detail_code"}
EVIDENCE_FIELDS = {
    "evidence_source": "source",
    "evidence_lookup_ref": "lookup_ref",
    "evidence_checked_at": "checked_at",
}
FORM_FIELDS = ("outcome", *RECEIPT_FIELDS, *REASON_FIELDS, *EVIDENCE_FIELDS)

# API field -> the label the form shows for it, so a problem reads "Evidence source: required".
LABELS = {
    "outcome": "Outcome",
    "receipt": "Receipt",
    "receipt.external_ref": "Receipt: external reference",
    "receipt.result_digest": "Receipt: result digest",
    "receipt.result": "Receipt: result (JSON)",
    "receipt.observed_at": "Receipt: observed at",
    "reason": "Reason",
    "reason.category": "Reason: category",
    "reason.detail_code": "Reason: detail code",
    "evidence": "Evidence",
    "evidence.source": "Evidence: source",
    "evidence.lookup_ref": "Evidence: lookup reference",
    "evidence.checked_at": "Evidence: checked at",
    "operation_id": "Operation ID",
    "purpose": "Purpose",
    "body": "Form",
}


def _section(form: Mapping[str, str], names: Mapping[str, str]) -> dict[str, Any] | None:
    """The filled fields of one part of the form (None when the part is left empty)."""
    filled = {api: form[name].strip() for name, api in names.items() if form.get(name, "").strip()}
    return filled or None


def resolve_body(form: Mapping[str, str]) -> ResolveBody:
    """The form as the API's resolve body, decoded by the same strict decoder as a JSON request."""
    receipt = _section(form, RECEIPT_FIELDS)
    if receipt is not None and "result" in receipt:
        try:
            receipt["result"] = json.loads(receipt["result"])
        except ValueError:
            raise validation_failed([("receipt.result", "is not valid JSON")]) from None
    body: dict[str, Any] = {
        "outcome": form.get("outcome", ""),
        "evidence": _section(form, EVIDENCE_FIELDS) or {},
    }
    # A part is sent only when filled in: the API's rules then say which outcome may carry it.
    if receipt is not None:
        body["receipt"] = receipt
    reason = _section(form, REASON_FIELDS)
    if reason is not None:
        body["reason"] = reason
    if not body["outcome"]:
        raise validation_failed([("outcome", "choose committed, not applied or unresolved")])
    return decode_strict(msgspec.json.encode(body), ResolveBody)


def field_problems(error: LedgerError) -> list[tuple[str, str]]:
    """validation_failed's errors as (label, problem) pairs for people."""
    errors = error.extensions.get("errors", [])
    return [(LABELS.get(e["field"], e["field"]), e["problem"]) for e in errors]


def _status_of(error: LedgerError) -> str:
    op = error.extensions.get("operation")
    return op.effective_status if isinstance(op, Operation) else "in another state"


def resolve_message(error: LedgerError) -> str:
    """What a refused resolve means, in a sentence (the problem code is shown beside it)."""
    if error.code == "validation_failed":
        return "The resolution was not recorded: correct the fields below."
    if error.code == "conflicting_outcome":
        return (
            f"Nothing changed: this operation is already {_status_of(error)} with a different outcome or "
            "receipt. Your report was recorded as a discrepancy event in the timeline."
        )
    if error.code == "invalid_transition":
        return (
            f"Only an unknown operation can be resolved; this one is {_status_of(error)}. Wait until its "
            "executor reports or its lease expires."
        )
    if error.code == "forbidden":
        return "Your token lacks the ledger:reconcile scope that resolving needs."
    return error.detail
