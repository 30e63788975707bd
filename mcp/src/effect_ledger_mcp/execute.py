"""One wrapped tools/call as an ordinary executor: claim (and submit) → forward → complete.

Round trips to the ledger: one claim that also submits (API.md section 6, `submit`), then one complete.
A claim that does not grant an attempt is answered from the ledger alone, and nothing is sent upstream.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
import time
from dataclasses import dataclass
from typing import Any

import anyio
from mcp import MCPError
from mcp.types import INVALID_PARAMS, METHOD_NOT_FOUND, REQUEST_TIMEOUT, CallToolResult

from effect_ledger.client import (
    Diagnostics,
    LedgerClient,
    LedgerClientError,
    LedgerProblem,
    NotAppliedReason,
    OperationView,
    Receipt,
    SensitiveValueRejected,
    ValidationFailed,
)
from effect_ledger.client.models import Category
from effect_ledger.domain.canonical import CanonicalizationError, canonical_json
from effect_ledger_mcp import answers
from effect_ledger_mcp.config import Decision
from effect_ledger_mcp.identity import Identity
from effect_ledger_mcp.upstreams import UpstreamGone, UpstreamServer

log = logging.getLogger("effect_ledger_mcp")

LEASE_MARGIN_SECONDS = 30  # the lease outlives the upstream timeout by this much: room to record
MAX_RESULT_BYTES = 16 * 1024  # the ledger's limit on a receipt's `result` (JCS bytes)
# A problem of the ledger that means "it cannot answer now": the gateway fails closed on these.
_UNREACHABLE_CODES = {"unavailable", "internal", "rate_limited"}
# MCPServer answers an unknown tool with an isError result instead of a JSON-RPC error.
_UNKNOWN_TOOL_TEXT = re.compile(r"^Unknown tool: ")
# Records still being written after their waiter was cancelled; held so they are not collected.
_IN_FLIGHT: set[asyncio.Task[Any]] = set()


@dataclass(frozen=True, kw_only=True)
class WrappedCall:
    """Everything one wrapped call needs."""

    server: UpstreamServer
    tool: str  # the upstream's own name
    exposed: str  # server__tool, the ledger's `tool`
    tool_version: str
    identity: Identity
    decision: Decision
    structured_output: bool = False  # the tool declares an output schema
    invalid_arguments: str | None = None  # why the tool's input schema refuses them (arguments.py)


def receipt_of(result: CallToolResult) -> Receipt:
    """A committed call's receipt: `{content, structuredContent}` within 16 KiB, and always its digest."""
    document: dict[str, Any] = {
        "content": [
            block.model_dump(by_alias=True, mode="json", exclude_none=True) for block in result.content
        ]
    }
    if result.structured_content is not None:
        document["structuredContent"] = result.structured_content
    try:
        encoded = canonical_json(document)
    except CanonicalizationError:
        # No canonical form (a number JSON cannot carry): keep a digest of the SDK's own encoding.
        encoded = json.dumps(document, sort_keys=True, default=str).encode()
        return Receipt(result_digest="sha256:" + hashlib.sha256(encoded).hexdigest())
    digest = "sha256:" + hashlib.sha256(encoded).hexdigest()
    # U+0000 (which JCS writes as \u0000) is valid JSON that PostgreSQL's jsonb cannot hold: the ledger
    # refuses such a receipt (422), and until round 24 the call stayed submitted, then unknown, although
    # the gateway had its result. Kept as its digest only, as a result over 16 KiB is.
    storable = len(encoded) <= MAX_RESULT_BYTES and not _holds_nul(document)
    return Receipt(result=document if storable else None, result_digest=digest)


def _holds_nul(value: Any) -> bool:
    """Whether a JSON value has U+0000 in a string or a member name."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    return False


def _refusal(exc: BaseException) -> str | None:
    """The detail code when the upstream verifiably did not run the tool, else None."""
    if isinstance(exc, UpstreamGone):
        return "upstream_gone"  # raised before anything was sent
    if isinstance(exc, MCPError) and exc.code == METHOD_NOT_FOUND:
        return "unknown_tool"
    if isinstance(exc, MCPError) and exc.code == INVALID_PARAMS:
        return "invalid_params"
    return None


def _cause(exc: BaseException) -> tuple[str, str]:
    """(diagnostics cause, detail code) of a failure after the call was forwarded."""
    if isinstance(exc, MCPError) and exc.code == REQUEST_TIMEOUT:
        return "timeout", "upstream_timeout"
    if isinstance(exc, TimeoutError):
        return "timeout", "upstream_timeout"
    if isinstance(exc, asyncio.CancelledError | anyio.get_cancelled_exc_class()):
        return "aborted", "gateway_cancelled"
    if isinstance(exc, MCPError):
        return "upstream", f"jsonrpc_{exc.code}"[:100]
    return "unknown", type(exc).__name__[:100]


class Executor:
    """Runs wrapped calls against one ledger."""

    def __init__(self, ledger: LedgerClient) -> None:
        self.ledger = ledger

    async def run(self, call: WrappedCall) -> CallToolResult:
        """The whole answer table of API.md section 16 for one wrapped call."""
        operation_id = call.identity.operation_id
        timeout = call.decision.timeout_seconds
        refused = call.invalid_arguments
        # An upstream whose connection closed is claimed all the same, never submitted: the ledger's
        # answer comes first (a committed ID replays its result, an unknown one is outcome_unknown, a
        # live one in progress: API.md 16's claim rows), and only an attempt it grants is recorded not
        # applied. Until round 36 such a call was refused before the claim, as `not_executed` and
        # retryable, even for an operation that had run.
        gone = not call.server.alive
        sends = refused is None and not gone  # arguments the schema refuses are never submitted
        try:
            claimed = await self.ledger.claim(
                operation_id,
                tool=call.exposed,
                tool_version=call.tool_version,
                intent=call.identity.intent,
                lease_seconds=min(3600, math.ceil(timeout) + LEASE_MARGIN_SECONDS),
                submit=sends,
                effect_ref=call.identity.effect_ref if sends else None,
            )
        except LedgerProblem as problem:
            return self._refused(operation_id, problem)
        except LedgerClientError as failure:
            log.warning("ledger_unreachable operation_id=%s error=%s", operation_id, type(failure).__name__)
            return answers.problem("not_executed", operation_id, retry=True, reason="ledger_unreachable")
        if claimed.action == "reuse_receipt":
            log.info("replayed operation_id=%s", operation_id)
            return answers.replay(claimed.operation, structured_required=call.structured_output)
        assert claimed.claim is not None
        token = claimed.claim.token
        if gone:  # claimed, not submitted, nothing sent upstream: recorded not applied
            return await self._not_sent(
                operation_id, token, "cancelled_before_submit", "upstream_gone", "upstream closed"
            )
        if refused is not None:  # likewise: arguments the tool's schema refuses
            return await self._not_sent(operation_id, token, "validation", "invalid_params", refused)
        started = time.monotonic()
        try:
            result = await call.server.call(call.tool, call.identity.forwarded, timeout)
        except BaseException as exc:
            return await self._failed(call, token, exc, started)
        return await self._answered(call, token, result)

    async def _not_sent(
        self, operation_id: str, token: str, category: Category, detail: str, message: str
    ) -> CallToolResult:
        """A claimed attempt never submitted and nothing sent upstream: recorded not applied (its
        reason `category` and `detail`), answered `not_executed`, retryable."""
        reason = NotAppliedReason(category=category, detail_code=detail)
        view = await self._record(operation_id, token, "not_applied", reason=reason, status_if_lost="pending")
        return answers.problem(
            "not_executed", operation_id, retry=True, status=view, reason=detail, message=message
        )

    def _refused(self, operation_id: str, problem: LedgerProblem) -> CallToolResult:
        """A claim the ledger did not grant: its answer, and nothing sent upstream."""
        code = str(problem.members.get("code") or problem.code)
        status = problem.operation.status if problem.operation is not None else None
        if code == "intent_conflict":
            mismatched = list(problem.members.get("mismatched") or [])
            return answers.problem(code, operation_id, retry=False, status=status, mismatched=mismatched)
        if code == "operation_in_progress":
            return answers.problem(
                code, operation_id, retry=True, status=status, retry_after_seconds=problem.retry_after
            )
        if code == "outcome_unknown":
            return answers.problem(code, operation_id, retry=False, status=status or "unknown")
        if code in ("approval_required", "approval_denied"):
            approval = problem.members.get("approval")
            return answers.problem(code, operation_id, retry=code == "approval_required", approval=approval)
        if code in _UNREACHABLE_CODES:
            log.warning("ledger_unavailable operation_id=%s code=%s", operation_id, code)
            return answers.problem("not_executed", operation_id, retry=True, reason="ledger_unreachable")
        # unauthenticated, forbidden, validation_failed, ...: the ledger refused us; fail closed.
        return answers.problem("not_executed", operation_id, retry=False, reason=code)

    async def _answered(self, call: WrappedCall, token: str, result: CallToolResult) -> CallToolResult:
        operation_id = call.identity.operation_id
        if not result.is_error:
            view = await self._record(
                operation_id, token, "committed", receipt=receipt_of(result), status_if_lost="submitted"
            )
            return answers.with_meta(result, answers.operation_meta(operation_id, view))
        text = next((block.text for block in result.content if block.type == "text"), "")
        if _UNKNOWN_TOOL_TEXT.match(text):
            reason = NotAppliedReason(category="rejected", detail_code="unknown_tool")
            view = await self._record(operation_id, token, "not_applied", reason=reason)
            return answers.problem("not_executed", operation_id, retry=True, status=view, message=text[:200])
        if call.decision.on_tool_error == "not_applied":
            reason = NotAppliedReason(category="rejected", detail_code="tool_error")
            view = await self._record(operation_id, token, "not_applied", reason=reason)
        else:
            diagnostics = self._diagnostics(call, "upstream", "tool_error", None)
            view = await self._record(operation_id, token, "unknown", diagnostics=diagnostics)
        return answers.with_meta(result, answers.operation_meta(operation_id, view))

    async def _failed(
        self, call: WrappedCall, token: str, exc: BaseException, started: float
    ) -> CallToolResult:
        operation_id = call.identity.operation_id
        refusal = _refusal(exc)
        if refusal is not None:
            reason = NotAppliedReason(category="rejected", detail_code=refusal)
            view = await self._record(operation_id, token, "not_applied", reason=reason)
            message = exc.message if isinstance(exc, MCPError) else None
            return answers.problem(
                "not_executed", operation_id, retry=True, status=view, reason=refusal, message=message
            )
        cause, detail = _cause(exc)
        elapsed_ms = int((time.monotonic() - started) * 1000)
        diagnostics = self._diagnostics(call, cause, detail, elapsed_ms)
        view = await self._record(operation_id, token, "unknown", diagnostics=diagnostics)
        log.warning("outcome_unknown operation_id=%s cause=%s detail=%s", operation_id, cause, detail)
        if not isinstance(exc, Exception):
            raise exc  # cancelled: the outcome is written; the cancellation goes on
        return answers.problem("outcome_unknown", operation_id, retry=False, status=view)

    @staticmethod
    def _diagnostics(call: WrappedCall, cause: str, detail: str, elapsed_ms: int | None) -> Diagnostics:
        # No operation_id here: the complete call names the operation, and a derived ID (48 hex) is
        # the shape of an API key, which the ledger's diagnostics screening refuses.
        return Diagnostics(
            phase="tool_execution",
            cause=cause,
            provider=call.server.name[:100],
            detail_code=detail,
            elapsed_ms=elapsed_ms,
        )

    async def _record(
        self,
        operation_id: str,
        token: str,
        outcome: str,
        *,
        receipt: Receipt | None = None,
        reason: NotAppliedReason | None = None,
        diagnostics: Diagnostics | None = None,
        status_if_lost: str = "submitted",
    ) -> str:
        """complete(), shielded from cancellation; returns the status the ledger now holds.

        If the write is lost (the ledger went away), the operation stays submitted and its lease
        expiry makes it unknown: never executable again, reconciled instead."""
        task = asyncio.ensure_future(
            self._complete(
                operation_id, token, outcome, receipt=receipt, reason=reason, diagnostics=diagnostics
            )
        )
        _IN_FLIGHT.add(task)
        task.add_done_callback(_IN_FLIGHT.discard)
        try:
            with anyio.CancelScope(shield=True):
                view: OperationView = await asyncio.shield(task)
        except LedgerClientError as failure:
            log.error(
                "outcome_not_recorded operation_id=%s outcome=%s error=%s",
                operation_id,
                outcome,
                type(failure).__name__,
            )
            return status_if_lost
        return view.status

    async def _complete(
        self,
        operation_id: str,
        token: str,
        outcome: str,
        *,
        receipt: Receipt | None,
        reason: NotAppliedReason | None,
        diagnostics: Diagnostics | None,
    ) -> OperationView:
        try:
            return await self.ledger.complete(
                operation_id, token, outcome, receipt=receipt, reason=reason, diagnostics=diagnostics
            )
        except (SensitiveValueRejected, ValidationFailed):
            if diagnostics is None:
                raise
            # The outcome matters more than its diagnostics: record it without them.
            return await self.ledger.complete(operation_id, token, outcome, receipt=receipt, reason=reason)
