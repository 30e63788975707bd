"""Executor calls of docs/api.md section 6: claim, submit, heartbeat, complete, and reading one operation."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.openapi import ResponseSpec
from litestar.params import JSONBody
from msgspec import UNSET

from effect_ledger.db import approvals as approval_repo
from effect_ledger.db import ledger as repo
from effect_ledger.domain.approvals import ApprovalPolicy
from effect_ledger.domain.claims import ClaimRequest
from effect_ledger.domain.errors import not_found
from effect_ledger.domain.model import Binding, Operation, operation_view
from effect_ledger.domain.tokens import nonce_hash
from effect_ledger.domain.transitions import Report, hidden_from
from effect_ledger.http.auth import AUDIT, EXECUTE, RECONCILE, Caller, requires
from effect_ledger.http.context import caller_of, ledger_of, reading_ledger_of
from effect_ledger.http.diagnostics import outcome_incident
from effect_ledger.http.schemas import (
    ClaimBody,
    CompleteBody,
    HeartbeatBody,
    OperationId,
    SubmitBody,
    claim_digest,
    reason_content,
    receipt_content,
    strict,
)

OPERATION_PATH = "/v1/operations/{operation_id:str}"


def view_response(op: Operation, status: int = 200, **extra: Any) -> Response[dict[str, Any]]:
    """The operation view (plus `incident` where one was stored) as a JSON answer."""
    return Response({**operation_view(op), **extra}, status_code=status)


def answer(outcome: repo.Outcome, caller: Caller) -> Response[dict[str, Any]]:
    """A write-path outcome as the API answers it: the view (and incident), or the refusal's problem.
    An executor-only caller without the current attempt's token learns nothing of another principal's
    operation: its stale_claim reads as a missing operation (API.md section 3). The token, not the
    principal, authorises a transition (one round trip leaves no read before it to check the principal)."""
    op, refusal = outcome.operation, outcome.refusal
    stale = refusal is not None and refusal.code == "stale_claim"
    if stale and op is not None and hidden_from(op, caller.principal, caller.reads_tenant):
        raise not_found()
    if outcome.refusal is not None:
        raise outcome.refusal.error()
    assert outcome.operation is not None
    if outcome.incident is not None:
        return view_response(outcome.operation, incident=outcome.incident)
    return view_response(outcome.operation)


def claim_request(operation_id: str, caller: Caller, body: ClaimBody) -> ClaimRequest:
    """The claim command from its body, with the principal from the token."""
    binding = Binding(caller.principal, body.tool, body.tool_version, claim_digest(body))
    nonce = body.client_nonce
    return ClaimRequest(
        operation_id,
        binding,
        body.lease_seconds,
        None if nonce is None else nonce_hash(nonce),
        submit=body.submit is not None,
        effect_ref=None if body.submit is None else body.submit.effect_ref,
    )


def approval_ask(request: Request[Any, Any, Any], tenant: str, body: ClaimBody) -> dict[str, Any] | None:
    """What the approval gate needs when a rule of APPROVAL_POLICY covers the tool; else None."""
    policy: ApprovalPolicy | None = request.app.state.approval_policy
    rule = None if policy is None else policy.rule_for(tenant, body.tool)
    if rule is None:
        return None
    return approval_repo.claim_ask(rule, body.intent, body.intent is not UNSET, body.approval_note)


def observe_approval(
    request: Request[Any, Any, Any], ask: dict[str, Any] | None, result: repo.ClaimResult
) -> None:
    """Count the approval events a gated claim committed: `requested` (the request carries the ID this
    claim proposed) or `consumed` (an attempt was granted through it)."""
    if ask is None or result.approval is None:
        return
    metrics = request.app.state.metrics
    if result.approval["approval_id"] == ask["approval_id"]:
        metrics.approval_event("requested")
    if result.verdict in ("created", "new_attempt"):
        metrics.approval_event("consumed")


def claim_answer(operation_id: str, result: repo.ClaimResult) -> Response[Any]:
    """201 execute (with Location; replayed: Idempotent-Replayed), 200 reuse_receipt, or the refusal
    (approval_required / approval_denied carry the request's view as `approval`)."""
    if result.refusal is not None:
        error = result.refusal.error()
        if result.verdict in repo.APPROVAL_REFUSALS:
            error.extensions["approval"] = result.approval
        raise error
    assert result.operation is not None
    view = operation_view(result.operation)
    if result.verdict == "reuse_receipt":
        return Response({"action": "reuse_receipt", "operation": view}, status_code=200)
    op = result.operation
    claim = {"attempt": op.attempt, "token": result.token, "lease_expires_at": view["lease_expires_at"]}
    headers = {"Location": f"/v1/operations/{operation_id}"}
    if result.verdict == "replay":
        headers["Idempotent-Replayed"] = "true"
    body = {"action": "execute", "operation": view, "claim": claim}
    return Response(body, status_code=201, headers=headers)


class ExecutorController(Controller):
    """Claim an operation ID and move it through its fenced transitions: each call one round trip."""

    path = OPERATION_PATH
    tags = ("executor",)

    @post(
        "/claim",
        guards=[requires(EXECUTE)],
        status_code=201,
        responses={
            200: ResponseSpec(
                dict[str, Any], description="reuse_receipt: committed; the receipt", generate_examples=False
            )
        },
        **strict(ClaimBody),
    )
    async def claim(
        self, request: Request[Any, Any, Any], operation_id: OperationId, data: JSONBody[ClaimBody]
    ) -> Response[Any]:
        """Claim an operation ID (with `submit`, submit it too): 201 execute, 200 reuse_receipt, a problem."""
        caller = caller_of(request)
        req = claim_request(operation_id, caller, data)
        ask = approval_ask(request, caller.tenant, data)
        result = await repo.claim(ledger_of(request), caller.tenant, req, data.client_nonce, ask)
        observe_approval(request, ask, result)
        return claim_answer(operation_id, result)

    @post("/submit", guards=[requires(EXECUTE)], status_code=200, **strict(SubmitBody))
    async def submit(
        self, request: Request[Any, Any, Any], operation_id: OperationId, data: JSONBody[SubmitBody]
    ) -> Response[Any]:
        """pending -> submitted; call it before sending the effect."""
        caller = caller_of(request)
        return answer(
            await repo.submit(
                ledger_of(request),
                caller.tenant,
                operation_id,
                data.token,
                data.effect_ref,
                data.lease_seconds,
            ),
            caller,
        )

    @post("/heartbeat", guards=[requires(EXECUTE)], status_code=200, **strict(HeartbeatBody))
    async def heartbeat(
        self, request: Request[Any, Any, Any], operation_id: OperationId, data: JSONBody[HeartbeatBody]
    ) -> Response[Any]:
        """Extend the current attempt's lease to database now + lease_seconds."""
        caller = caller_of(request)
        return answer(
            await repo.heartbeat(
                ledger_of(request), caller.tenant, operation_id, data.token, data.lease_seconds
            ),
            caller,
        )

    @post("/complete", guards=[requires(EXECUTE)], status_code=200, **strict(CompleteBody))
    async def complete(
        self, request: Request[Any, Any, Any], operation_id: OperationId, data: JSONBody[CompleteBody]
    ) -> Response[Any]:
        """Record committed, not_applied or unknown (a late report from unknown too); complete(unknown)'s
        diagnostics are stored with the transition, and the answer names their incident."""
        caller = caller_of(request)
        incident = outcome_incident(caller, operation_id, data)
        report = Report(
            data.outcome,
            receipt_content(data.receipt, data.outcome),
            reason_content(data.reason, data.outcome),
            incident=None if incident is None else incident.incident_id,
        )
        return answer(
            await repo.complete(
                ledger_of(request),
                caller.tenant,
                operation_id,
                caller.principal,
                data.token,
                report,
                incident,
            ),
            caller,
        )

    @get("/", guards=[requires(EXECUTE, RECONCILE, AUDIT)])
    async def read(self, request: Request[Any, Any, Any], operation_id: OperationId) -> Response[Any]:
        """One operation's view; another tenant's (or, for an executor, another principal's) is not found."""
        caller = caller_of(request)
        op = await repo.get_operation(reading_ledger_of(request), caller.tenant, operation_id)
        if hidden_from(op, caller.principal, caller.reads_tenant):
            raise not_found()
        return view_response(op)
