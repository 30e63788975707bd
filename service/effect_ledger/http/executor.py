"""Executor calls of API.md section 6: claim, submit, heartbeat, complete, and reading one operation."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, JSONBody

from effect_ledger.db import diagnostics as diagnostics_repo
from effect_ledger.db import ledger as repo
from effect_ledger.domain.claims import ClaimRequest
from effect_ledger.domain.model import Binding, Operation, operation_view
from effect_ledger.domain.tokens import nonce_hash
from effect_ledger.domain.transitions import (
    Decision,
    Report,
    check_owner,
    decide_complete,
    decide_heartbeat,
    decide_submit,
)
from effect_ledger.http.auth import AUDIT, EXECUTE, RECONCILE, requires
from effect_ledger.http.context import caller_of, ledger_of
from effect_ledger.http.diagnostics import outcome_incident
from effect_ledger.http.schemas import (
    ClaimBody,
    CompleteBody,
    HeartbeatBody,
    SubmitBody,
    check_operation_id,
    claim_digest,
    reason_content,
    receipt_content,
    strict_body,
)

OPERATION_PATH = "/v1/operations/{operation_id:str}"


def view_response(op: Operation, status: int = 200, **extra: Any) -> Response[dict[str, Any]]:
    """The operation view (plus `incident` where one was stored) as a JSON answer."""
    return Response({**operation_view(op), **extra}, status_code=status)


class ExecutorController(Controller):
    """Claim an operation ID and move it through its fenced transitions."""

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
    )
    async def claim(
        self, request: Request[Any, Any, Any], operation_id: FromPath[str], data: JSONBody[ClaimBody]
    ) -> Response[Any]:
        """Claim an operation ID: 201 execute, 200 reuse_receipt, or a 409/422 problem."""
        check_operation_id(operation_id)
        data = await strict_body(request, ClaimBody)
        caller = caller_of(request)
        binding = Binding(caller.principal, data.tool, data.tool_version, claim_digest(data))
        nonce = data.client_nonce
        req = ClaimRequest(
            operation_id, binding, data.lease_seconds, None if nonce is None else nonce_hash(nonce)
        )
        result = await repo.claim(ledger_of(request), caller.tenant, req, nonce)
        view = operation_view(result.operation)
        if result.verdict == "reuse_receipt":
            return Response({"action": "reuse_receipt", "operation": view}, status_code=200)
        op = result.operation
        body = {
            "action": "execute",
            "operation": view,
            "claim": {
                "attempt": op.attempt,
                "token": result.token,
                "lease_expires_at": view["lease_expires_at"],
            },
        }
        headers = {"Location": f"/v1/operations/{operation_id}"}
        if result.verdict == "replay":
            headers["Idempotent-Replayed"] = "true"
        return Response(body, status_code=201, headers=headers)

    @post("/submit", guards=[requires(EXECUTE)], status_code=200)
    async def submit(
        self, request: Request[Any, Any, Any], operation_id: FromPath[str], data: JSONBody[SubmitBody]
    ) -> Response[Any]:
        """pending -> submitted; call it before sending the effect."""
        check_operation_id(operation_id)
        data = await strict_body(request, SubmitBody)
        caller = caller_of(request)

        def decide(op: Operation) -> Decision:
            check_owner(op, caller.principal, caller.reads_tenant)
            return Decision(decide_submit(op, data.token, data.effect_ref, data.lease_seconds))

        op = await repo.transition(ledger_of(request), caller.tenant, operation_id, decide, "submit")
        return view_response(op)

    @post("/heartbeat", guards=[requires(EXECUTE)], status_code=200)
    async def heartbeat(
        self, request: Request[Any, Any, Any], operation_id: FromPath[str], data: JSONBody[HeartbeatBody]
    ) -> Response[Any]:
        """Extend the current attempt's lease to database now + lease_seconds."""
        check_operation_id(operation_id)
        data = await strict_body(request, HeartbeatBody)
        caller = caller_of(request)

        def decide(op: Operation) -> Decision:
            check_owner(op, caller.principal, caller.reads_tenant)
            return Decision(decide_heartbeat(op, data.token, data.lease_seconds or op.lease_seconds))

        op = await repo.transition(ledger_of(request), caller.tenant, operation_id, decide, "heartbeat")
        return view_response(op)

    @post("/complete", guards=[requires(EXECUTE)], status_code=200)
    async def complete(
        self, request: Request[Any, Any, Any], operation_id: FromPath[str], data: JSONBody[CompleteBody]
    ) -> Response[Any]:
        """Record committed, not_applied or unknown (a late report from unknown too)."""
        check_operation_id(operation_id)
        data = await strict_body(request, CompleteBody)
        caller = caller_of(request)
        incident = outcome_incident(caller, operation_id, data)
        report = Report(
            data.outcome,
            receipt_content(data.receipt, data.outcome),
            reason_content(data.reason, data.outcome),
            incident=None if incident is None else incident.incident_id,
        )

        def decide(op: Operation) -> Decision:
            check_owner(op, caller.principal, caller.reads_tenant)
            return decide_complete(op, caller.principal, data.token, report)

        if incident is None:
            op = await repo.transition(ledger_of(request), caller.tenant, operation_id, decide, "complete")
            return view_response(op)
        # The diagnostics commit with the transition; the answer names the incident that holds them.
        op, reference = await diagnostics_repo.complete_with_incident(
            ledger_of(request), caller.tenant, operation_id, decide, incident
        )
        return view_response(op) if reference is None else view_response(op, incident=reference)

    @get("/", guards=[requires(EXECUTE, RECONCILE, AUDIT)])
    async def read(self, request: Request[Any, Any, Any], operation_id: FromPath[str]) -> Response[Any]:
        """One operation's view; another tenant's (or, for an executor, another principal's) is not found."""
        check_operation_id(operation_id)
        caller = caller_of(request)
        op = await repo.get_operation(ledger_of(request), caller.tenant, operation_id)
        check_owner(op, caller.principal, caller.reads_tenant)
        return view_response(op)
