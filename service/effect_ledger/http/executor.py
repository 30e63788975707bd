"""Executor calls of docs/api.md section 6: claim, submit, heartbeat, complete, and reading one operation."""

from __future__ import annotations

from typing import Any, NamedTuple

from litestar import Controller, Request, Response, get, post
from litestar.openapi import ResponseSpec
from litestar.params import JSONBody
from msgspec import UNSET

from effect_ledger.db import approvals as approval_repo
from effect_ledger.db import ledger as repo
from effect_ledger.db.ledger import Ledger
from effect_ledger.domain.approvals import ApprovalPolicy
from effect_ledger.domain.claims import ClaimRequest
from effect_ledger.domain.errors import not_found
from effect_ledger.domain.model import Binding, Operation, operation_view
from effect_ledger.domain.tokens import nonce_hash
from effect_ledger.domain.transitions import Report, hidden_from
from effect_ledger.http.auth import AUDIT, EXECUTE, RECONCILE, Caller, requires
from effect_ledger.http.context import caller_of, reading_ledger_of, writing_ledger_of
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


class Reply(NamedTuple):
    """An executor call's answer before any framework sees it: status, JSON content, extra headers."""

    status: int
    content: dict[str, Any]
    headers: dict[str, str] | None = None


def view_response(op: Operation, status: int = 200, **extra: Any) -> Response[dict[str, Any]]:
    """The operation view (plus `incident` where one was stored) as a JSON answer."""
    return Response({**operation_view(op), **extra}, status_code=status)


def respond(reply: Reply) -> Response[Any]:
    """A reply as Litestar's response (the routed handlers; the fast path sends replies itself)."""
    return Response(reply.content, status_code=reply.status, headers=reply.headers)


def answer(outcome: repo.Outcome, caller: Caller) -> Reply:
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
    view = operation_view(outcome.operation)
    if outcome.incident is not None:
        view["incident"] = outcome.incident
    return Reply(200, view)


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


def approval_ask(state: Any, tenant: str, body: ClaimBody) -> dict[str, Any] | None:
    """What the approval gate needs when a rule of APPROVAL_POLICY covers the tool; else None."""
    policy: ApprovalPolicy | None = state.approval_policy
    rule = None if policy is None else policy.rule_for(tenant, body.tool)
    if rule is None:
        return None
    return approval_repo.claim_ask(rule, body.intent, body.intent is not UNSET, body.approval_note)


def observe_approval(state: Any, ask: dict[str, Any] | None, result: repo.ClaimResult) -> None:
    """Count the approval events a gated claim committed: `expired` (a request it found past its
    validity), `requested` (the request carries the ID this claim proposed) or `consumed` (an attempt
    was granted through it)."""
    if ask is None or result.approval is None:
        return
    metrics = state.metrics
    for _ in range(result.approvals_expired):
        metrics.approval_event("expired")
    if result.approval["approval_id"] == ask["approval_id"]:
        metrics.approval_event("requested")
    if result.verdict in ("created", "new_attempt"):
        metrics.approval_event("consumed")


def claim_answer(operation_id: str, result: repo.ClaimResult) -> Reply:
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
        return Reply(200, {"action": "reuse_receipt", "operation": view})
    op = result.operation
    claim = {"attempt": op.attempt, "token": result.token, "lease_expires_at": view["lease_expires_at"]}
    headers = {"Location": f"/v1/operations/{operation_id}"}
    if result.verdict == "replay":
        headers["Idempotent-Replayed"] = "true"
    return Reply(201, {"action": "execute", "operation": view, "claim": claim}, headers)


# The four executor calls, shared by the routed handlers below and by http.fastpath (same code, same
# answers): each takes the app's state, the ledger, the verified caller, the operation ID and the strictly
# decoded body.


async def run_claim(state: Any, ledger: Ledger, caller: Caller, operation_id: str, data: ClaimBody) -> Reply:
    """Claim (with `submit`, submit too); gated where a rule of APPROVAL_POLICY (in `state`) covers it."""
    req = claim_request(operation_id, caller, data)
    ask = approval_ask(state, caller.tenant, data)
    result = await repo.claim(ledger, caller.tenant, req, data.client_nonce, ask)
    observe_approval(state, ask, result)
    return claim_answer(operation_id, result)


async def run_submit(
    state: Any, ledger: Ledger, caller: Caller, operation_id: str, data: SubmitBody
) -> Reply:
    """pending -> submitted."""
    outcome = await repo.submit(
        ledger, caller.tenant, operation_id, data.token, data.effect_ref, data.lease_seconds
    )
    return answer(outcome, caller)


async def run_heartbeat(
    state: Any, ledger: Ledger, caller: Caller, operation_id: str, data: HeartbeatBody
) -> Reply:
    """Extend the lease."""
    outcome = await repo.heartbeat(ledger, caller.tenant, operation_id, data.token, data.lease_seconds)
    return answer(outcome, caller)


async def run_complete(
    state: Any, ledger: Ledger, caller: Caller, operation_id: str, data: CompleteBody
) -> Reply:
    """Record the outcome (and complete(unknown)'s diagnostics as an incident)."""
    incident = outcome_incident(caller, operation_id, data)
    report = Report(
        data.outcome,
        receipt_content(data.receipt, data.outcome),
        reason_content(data.reason, data.outcome),
        incident=None if incident is None else incident.incident_id,
    )
    outcome = await repo.complete(
        ledger, caller.tenant, operation_id, caller.principal, data.token, report, incident
    )
    return answer(outcome, caller)


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
        return respond(
            await run_claim(
                request.app.state, writing_ledger_of(request), caller_of(request), operation_id, data
            )
        )

    @post("/submit", guards=[requires(EXECUTE)], status_code=200, **strict(SubmitBody))
    async def submit(
        self, request: Request[Any, Any, Any], operation_id: OperationId, data: JSONBody[SubmitBody]
    ) -> Response[Any]:
        """pending -> submitted; call it before sending the effect."""
        return respond(
            await run_submit(
                request.app.state, writing_ledger_of(request), caller_of(request), operation_id, data
            )
        )

    @post("/heartbeat", guards=[requires(EXECUTE)], status_code=200, **strict(HeartbeatBody))
    async def heartbeat(
        self, request: Request[Any, Any, Any], operation_id: OperationId, data: JSONBody[HeartbeatBody]
    ) -> Response[Any]:
        """Extend the current attempt's lease to database now + lease_seconds."""
        return respond(
            await run_heartbeat(
                request.app.state, writing_ledger_of(request), caller_of(request), operation_id, data
            )
        )

    @post("/complete", guards=[requires(EXECUTE)], status_code=200, **strict(CompleteBody))
    async def complete(
        self, request: Request[Any, Any, Any], operation_id: OperationId, data: JSONBody[CompleteBody]
    ) -> Response[Any]:
        """Record committed, not_applied or unknown (a late report from unknown too); complete(unknown)'s
        diagnostics are stored with the transition, and the answer names their incident."""
        return respond(
            await run_complete(
                request.app.state, writing_ledger_of(request), caller_of(request), operation_id, data
            )
        )

    @get("/", guards=[requires(EXECUTE, RECONCILE, AUDIT)])
    async def read(self, request: Request[Any, Any, Any], operation_id: OperationId) -> Response[Any]:
        """One operation's view; another tenant's (or, for an executor, another principal's) is not found."""
        caller = caller_of(request)
        op = await repo.get_operation(reading_ledger_of(request), caller.tenant, operation_id)
        if hidden_from(op, caller.principal, caller.reads_tenant):
            raise not_found()
        return view_response(op)
