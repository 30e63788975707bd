"""approval_required / approval_denied reach the host (API.md sections 15 and 16).

The service on this branch does not answer approvals yet (section 15 is built elsewhere), so this row
alone runs against a real HTTP stub of the ledger that answers every claim as section 15 says; the
rest of the answer table runs against the real service (test_mcp_gateway.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from support.mcp_gateway import gateway_client
from support.server import LoopServer

APPROVAL = {
    "approval_id": "apr_0123456789abcdef",
    "operation_id": "order-9",
    "principal": "mcp-gateway",
    "tool": "up__charge",
    "tool_version": "sha256:" + "0" * 64,
    "intent_digest": "sha256:" + "1" * 64,
    "intent": {"amount": 5},
    "note": None,
    "status": "pending",
    "required": 1,
    "decisions": [],
    "requested_at": "2026-12-01T10:00:00.000Z",
    "expires_at": "2026-12-01T10:15:00.000Z",
    "consumed_by_attempt": None,
}


def stub_ledger(code: str, seen: list[tuple[str, str]]) -> Starlette:
    """A ledger whose every claim answers 403 `code` with the approval member; records each request."""

    async def claim(request: Request) -> JSONResponse:
        seen.append((request.method, request.url.path))
        body = {
            "type": f"urn:effect-ledger:problem:{code}",
            "title": "Approval required" if code == "approval_required" else "Approval denied",
            "status": 403,
            "code": code,
            "detail": "the tool needs an approval for this exact binding",
            "approval": {**APPROVAL, "status": "pending" if code == "approval_required" else "denied"},
        }
        return JSONResponse(body, status_code=403, media_type="application/problem+json")

    async def anything_else(request: Request) -> JSONResponse:
        seen.append((request.method, request.url.path))
        return JSONResponse({"code": "not_found", "status": 404}, status_code=404)

    return Starlette(
        routes=[
            Route("/v1/operations/{operation_id}/claim", claim, methods=["POST"]),
            Route("/{path:path}", anything_else, methods=["GET", "POST"]),
        ]
    )


@pytest.mark.parametrize(("code", "retry"), [("approval_required", True), ("approval_denied", False)])
async def test_an_approval_answer_is_passed_to_the_host_and_nothing_runs(
    tmp_path: Path, code: str, retry: bool
) -> None:
    seen: list[tuple[str, str]] = []
    async with LoopServer(stub_ledger(code, seen), lifespan="off") as stub:
        async with gateway_client(tmp_path, stub.base_url) as gw:
            result = await gw.call(
                "up__charge", {"amount": 5}, meta={"effect-ledger/operation_id": "order-9"}
            )
            assert gw.executions() == []
    assert result.is_error is True
    structured: dict[str, Any] = dict(result.structured_content or {})
    assert structured["code"] == code and structured["operation_id"] == "order-9"
    assert structured["retry"] is retry
    assert structured["approval"]["approval_id"] == "apr_0123456789abcdef"
    assert structured["approval"]["intent"] == {"amount": 5}
    assert seen == [("POST", "/v1/operations/order-9/claim")]  # no submit, no complete: nothing ran
