"""What the host gets in each row of API.md section 16's answer table, as MCP tool results."""

from __future__ import annotations

import json
from typing import Any

from mcp.types import CallToolResult, TextContent

from effect_ledger.client import OperationView
from effect_ledger_mcp.identity import OPERATION_META, REPLAYED_META

# What the model reads for each code; the structured content carries the same facts for programs.
_SENTENCES = {
    "outcome_unknown": "The outcome of this call is unknown: it may have run. Do not call it again; "
    "the operation will be reconciled.",
    "operation_in_progress": "This call is already running under the same operation; ask again later.",
    "intent_conflict": "This operation ID is bound to other arguments or another tool; nothing was run.",
    "approval_required": "This call needs a person's approval first; nothing was run. Ask again once it "
    "is approved.",
    "approval_denied": "The approval for this call was denied; nothing was run.",
    "not_executed": "The call was not run.",
    "tool_denied": "The gateway's policy does not allow this tool; nothing was run.",
    "not_found": "No such operation.",
}


def operation_meta(operation_id: str, status: str, **extra: Any) -> dict[str, Any]:
    """The `_meta` member that tells the host which ledger operation answered."""
    return {OPERATION_META: {"operation_id": operation_id, "status": status, **extra}}


def with_meta(result: CallToolResult, meta: dict[str, Any]) -> CallToolResult:
    """The upstream's result as it gave it, with the gateway's keys added to its `_meta`."""
    merged = {**(result.meta or {}), **meta}
    return result.model_copy(update={"meta": merged})


def problem(
    code: str,
    operation_id: str | None,
    *,
    retry: bool,
    status: str | None = None,
    message: str | None = None,
    **members: Any,
) -> CallToolResult:
    """An `isError` result with `{"code", "operation_id", "retry", …}` as structured content."""
    structured: dict[str, Any] = {"code": code, "operation_id": operation_id, "retry": retry, **members}
    text = _SENTENCES.get(code, "The call was not run.")
    if message:
        text = f"{text} ({message})"
    if operation_id:
        text = f"{text} [operation {operation_id}]"
    meta = operation_meta(operation_id, status) if operation_id and status else None
    return CallToolResult(
        content=[TextContent(type="text", text=f"effect-ledger: {text}")],
        structured_content=structured,
        is_error=True,
        _meta=meta,
    )


def replay(view: OperationView, *, structured_required: bool = False) -> CallToolResult:
    """The stored result of a committed operation; nothing was sent upstream.

    `structured_required`: the tool declares an output schema, so a stored result without its
    structured content (a reconciler's receipt, say) cannot stand as the tool's result."""
    meta = {**operation_meta(view.operation_id, view.status), REPLAYED_META: True}
    stored = view.receipt.result if view.receipt is not None else None
    usable = isinstance(stored, dict) and isinstance(stored.get("content"), list)
    if usable and structured_required and stored.get("structuredContent") is None:  # type: ignore[union-attr]
        usable = False
    if usable:
        assert isinstance(stored, dict)
        document: dict[str, Any] = {"content": stored["content"], "isError": False, "_meta": meta}
        if stored.get("structuredContent") is not None:
            document["structuredContent"] = stored["structuredContent"]
        return CallToolResult.model_validate(document)
    # Committed, but the receipt keeps only the result's digest (over 16 KiB, or purged by retention).
    # An isError answer, because a result without the tool's structured content would break its
    # output schema; the code and the text say it ran, so the model must not call it again.
    digest = view.receipt.result_digest if view.receipt is not None else view.receipt_digest
    text = (
        "effect-ledger: this call already ran and its effect is committed; the stored receipt keeps "
        f"only the result's digest ({digest}), so the result itself cannot be shown again. Do not call "
        f"it again. [operation {view.operation_id}]"
    )
    structured = {
        "code": "committed_result_not_stored",
        "operation_id": view.operation_id,
        "retry": False,
        "result_digest": digest,
    }
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=True,
        _meta=meta,
    )


def view_result(view: dict[str, Any]) -> CallToolResult:
    """The effect_ledger__status answer: the operation view, as GET /v1/operations/{id} answered it, as
    structured content."""
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(view, sort_keys=True))],
        structured_content=view,
        _meta=operation_meta(view["operation_id"], view["status"]),
    )
