"""The MCP gateway (API.md section 16) with the real ledger, a real upstream MCP server and a real MCP client.

Each test has a tenant of its own and an upstream whose tools count their executions in a file; the
client speaks JSON-RPC to the gateway over memory streams (the HTTP and stdio framings have their
own tests in test_mcp_transports.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from effect_ledger.domain.canonical import intent_digest
from effect_ledger_mcp.identity import (
    OPERATION_ID_META,
    OPERATION_META,
    REPLAYED_META,
    RUN_ID_META,
    derive_operation_id,
)
from support.auth import auth
from support.mcp_gateway import gateway_client, ledger_get, new_tenant, operations
from support.server import Service

pytestmark = pytest.mark.timeout(60)

CHARGE_POLICY = {
    "default": "wrap",
    "tools": {
        "up__charge": {"volatile": ["note"], "inject": {"idempotency_key": "{operation_id}"}},
        "up__slow": {"timeout_seconds": 0.5},
        "up__declined": {},
        "up__lookup": {"mode": "pass"},
        "up__sec*": {"mode": "deny"},
    },
}


def op_of(result: Any) -> dict[str, Any]:
    """The gateway's `_meta["effect-ledger/operation"]` of a result."""
    assert result.meta is not None and OPERATION_META in result.meta, result
    return dict(result.meta[OPERATION_META])


async def view(ledger: httpx.AsyncClient, tenant: str, operation_id: str) -> dict[str, Any]:
    response = await ledger_get(ledger, tenant, f"/v1/operations/{operation_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_the_same_call_twice_runs_once_and_the_second_answer_is_replayed(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    async with gateway_client(tmp_path, mcp_ledger.base_url) as gw:
        first = await gw.call("up__charge", {"amount": 5})
        second = await gw.call("up__charge", {"amount": 5})
        assert len(gw.executions("charge")) == 1
        assert first.is_error is False and second.is_error is False
        assert first.structured_content == {"charged": 5, "idempotency_key": ""}
        assert second.structured_content == first.structured_content
        assert second.content == first.content
        assert op_of(first)["status"] == "committed" and REPLAYED_META not in (first.meta or {})
        assert second.meta is not None and second.meta[REPLAYED_META] is True
        operation_id = op_of(first)["operation_id"]
        assert op_of(second) == {"operation_id": operation_id, "status": "committed"}
        stored = await view(ledger, gw.tenant, operation_id)
    assert stored["status"] == "committed" and stored["attempt"] == 1
    assert stored["tool"] == "up__charge" and stored["principal"] == "mcp-gateway"
    assert stored["receipt"]["result"] == {
        "content": [{"type": "text", "text": first.content[0].text}],  # type: ignore[union-attr]
        "structuredContent": {"charged": 5, "idempotency_key": ""},
    }
    assert stored["receipt"]["result_digest"].startswith("sha256:")


async def test_operation_id_intent_and_tool_version_follow_section_16(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    async with gateway_client(tmp_path, mcp_ledger.base_url, policy=CHARGE_POLICY, run_id="run-7") as gw:
        result = await gw.call("up__charge", {"amount": 9, "note": "n", "idempotency_key": "model-made"})
        listed = {tool.name: tool for tool in (await gw.client.list_tools()).tools}
        schema = listed["up__charge"].input_schema
        operation_id = op_of(result)["operation_id"]
        stored = await view(ledger, gw.tenant, operation_id)
    # The volatile and the injected arguments are left out of the derivation and of the intent.
    assert operation_id == derive_operation_id("run-7", "up", "charge", {"amount": 9})
    assert operation_id.startswith("mcp-") and len(operation_id) == 4 + 48
    assert stored["intent_digest"] == intent_digest({"amount": 9})
    assert stored["tool_version"] == intent_digest(schema)
    assert stored["effect_ref"] == operation_id  # what the upstream knows the call by


async def test_only_a_volatile_argument_differs_one_execution_and_the_upstream_sees_the_same_key(
    tmp_path: Path, mcp_ledger: Service
) -> None:
    async with gateway_client(tmp_path, mcp_ledger.base_url, policy=CHARGE_POLICY) as gw:
        first = await gw.call("up__charge", {"amount": 5, "note": "first try", "idempotency_key": "k-1"})
        second = await gw.call("up__charge", {"amount": 5, "note": "retry", "idempotency_key": "k-2"})
        operation_id = op_of(first)["operation_id"]
        assert op_of(second)["operation_id"] == operation_id
        assert second.meta is not None and second.meta[REPLAYED_META] is True
        assert [run["arguments"]["idempotency_key"] for run in gw.executions("charge")] == [operation_id]
        first_key = gw.executions("charge")[0]["arguments"]["idempotency_key"]
    # Another ledger tenant has never seen the call, so it runs there — and the upstream receives the
    # same injected key again: its own deduplication would catch it even past the ledger.
    async with gateway_client(tmp_path, mcp_ledger.base_url, policy=CHARGE_POLICY, tenant=new_tenant()) as gw:
        await gw.call("up__charge", {"amount": 5, "note": "elsewhere", "idempotency_key": "k-3"})
        keys = [run["arguments"]["idempotency_key"] for run in gw.executions("charge")]
    assert keys == [first_key, first_key] == [operation_id, operation_id]


async def test_other_arguments_are_a_new_operation(tmp_path: Path, mcp_ledger: Service) -> None:
    async with gateway_client(tmp_path, mcp_ledger.base_url, policy=CHARGE_POLICY) as gw:
        five = await gw.call("up__charge", {"amount": 5})
        six = await gw.call("up__charge", {"amount": 6})
        assert op_of(five)["operation_id"] != op_of(six)["operation_id"]
        assert [run["arguments"]["amount"] for run in gw.executions("charge")] == [5, 6]
        # The run named in the host's _meta is part of the derivation: another run, another operation.
        other_run = await gw.call("up__charge", {"amount": 5}, meta={RUN_ID_META: "run-2"})
        assert op_of(other_run)["operation_id"] == derive_operation_id("run-2", "up", "charge", {"amount": 5})
        assert len(gw.executions("charge")) == 3


async def test_an_explicit_operation_id_reused_with_other_arguments_is_an_intent_conflict(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    async with gateway_client(tmp_path, mcp_ledger.base_url) as gw:
        meta = {OPERATION_ID_META: "order-77"}
        first = await gw.call("up__charge", {"amount": 5}, meta=meta)
        assert op_of(first) == {"operation_id": "order-77", "status": "committed"}
        again = await gw.call("up__charge", {"amount": 5}, meta=meta)
        assert again.meta is not None and again.meta[REPLAYED_META] is True
        conflict = await gw.call("up__charge", {"amount": 500}, meta=meta)
        assert conflict.is_error is True
        assert conflict.structured_content == {
            "code": "intent_conflict",
            "operation_id": "order-77",
            "retry": False,
            "mismatched": ["intent_digest"],
        }
        assert len(gw.executions("charge")) == 1
        # An operation ID only ever comes from _meta: one in the arguments is just an argument.
        bad = await gw.call("up__charge", {"amount": 5}, meta={OPERATION_ID_META: "no spaces allowed"})
        assert bad.is_error is True and bad.structured_content is not None
        assert bad.structured_content["reason"] == "invalid_operation_id"
        assert len(gw.executions("charge")) == 1
        assert (await view(ledger, gw.tenant, "order-77"))["status"] == "committed"


async def test_a_tool_slower_than_its_timeout_is_unknown_and_never_runs_again(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    async with gateway_client(tmp_path, mcp_ledger.base_url, policy=CHARGE_POLICY) as gw:
        slow = await gw.call("up__slow", {"seconds": 3})
        assert slow.is_error is True
        operation_id = op_of(slow)["operation_id"]
        assert slow.structured_content == {
            "code": "outcome_unknown",
            "operation_id": operation_id,
            "retry": False,
        }
        assert op_of(slow)["status"] == "unknown"
        stored = await view(ledger, gw.tenant, operation_id)
        assert stored["status"] == "unknown" and stored["attempt"] == 1
        for _ in range(2):
            again = await gw.call("up__slow", {"seconds": 3})
            assert again.is_error is True
            assert again.structured_content == {
                "code": "outcome_unknown",
                "operation_id": operation_id,
                "retry": False,
            }
        assert len(gw.executions("slow")) == 1


async def test_a_call_cancelled_after_submit_is_recorded_unknown(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    policy = {"default": "wrap", "tools": {"up__slow": {"timeout_seconds": 30}}}
    async with gateway_client(tmp_path, mcp_ledger.base_url, policy=policy, run_id="cancel") as gw:
        with anyio.move_on_after(1.0) as scope:
            await gw.call("up__slow", {"seconds": 5, "label": "cancel-me"})
        assert scope.cancelled_caught
        operation_id = derive_operation_id("cancel", "up", "slow", {"seconds": 5, "label": "cancel-me"})
        # The host's cancel reaches the gateway as notifications/cancelled; the outcome write is
        # shielded from that cancellation, so the ledger holds unknown (not a live submitted lease).
        status = None
        for _ in range(50):
            status = (await view(ledger, gw.tenant, operation_id))["status"]
            if status == "unknown":
                break
            await asyncio.sleep(0.1)
        assert status == "unknown"
        again = await gw.call("up__slow", {"seconds": 5, "label": "cancel-me"})
        assert again.structured_content == {
            "code": "outcome_unknown",
            "operation_id": operation_id,
            "retry": False,
        }
        assert len(gw.executions("slow")) == 1


async def test_concurrent_identical_calls_run_once(tmp_path: Path, mcp_ledger: Service) -> None:
    policy = {"default": "wrap", "tools": {"up__slow": {"timeout_seconds": 20}}}
    async with gateway_client(tmp_path, mcp_ledger.base_url, policy=policy) as gw:
        results = await asyncio.gather(*(gw.call("up__slow", {"seconds": 1.0}) for _ in range(6)))
        assert len(gw.executions("slow")) == 1
        succeeded = [r for r in results if not r.is_error]
        refused = [r.structured_content for r in results if r.is_error]
        assert len(succeeded) == 1 and len(refused) == 5
        for answer in refused:
            assert (
                answer is not None and answer["code"] == "operation_in_progress" and answer["retry"] is True
            )
            assert answer["retry_after_seconds"] is not None and answer["retry_after_seconds"] > 0
        # Once committed, the same call is a replay.
        later = await gw.call("up__slow", {"seconds": 1.0})
        assert later.meta is not None and later.meta[REPLAYED_META] is True
        assert len(gw.executions("slow")) == 1


async def test_pass_through_tools_touch_no_ledger_row_and_annotations_decide_nothing(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    async with gateway_client(tmp_path, mcp_ledger.base_url, policy=CHARGE_POLICY) as gw:
        first = await gw.call("up__lookup", {"query": "q"})
        second = await gw.call("up__lookup", {"query": "q"})
        assert first.is_error is False and first.content[0].text == "found q"  # type: ignore[union-attr]
        assert OPERATION_META not in (first.meta or {}) and OPERATION_META not in (second.meta or {})
        assert len(gw.executions("lookup")) == 2
        assert await operations(ledger, gw.tenant) == []
    # Without a rule, the default (wrap) holds even for a tool the upstream annotates read-only.
    async with gateway_client(tmp_path, mcp_ledger.base_url, tenant=new_tenant()) as gw:
        listed = {tool.name: tool for tool in (await gw.client.list_tools()).tools}
        assert (
            listed["up__lookup"].annotations is not None and listed["up__lookup"].annotations.read_only_hint
        )
        await gw.call("up__lookup", {"query": "q"})
        await gw.call("up__lookup", {"query": "q"})
        assert len(gw.executions("lookup")) == 3  # 2 passed through above, 1 wrapped here
        assert [op["tool"] for op in await operations(ledger, gw.tenant)] == ["up__lookup"]


async def test_denied_tools_are_not_listed_and_refused(tmp_path: Path, mcp_ledger: Service) -> None:
    async with gateway_client(tmp_path, mcp_ledger.base_url, policy=CHARGE_POLICY) as gw:
        names = [tool.name for tool in (await gw.client.list_tools()).tools]
        assert "up__secret" not in names and "effect_ledger__status" in names and "up__charge" in names
        refused = await gw.call("up__secret", {})
        assert refused.is_error is True and refused.structured_content is not None
        assert refused.structured_content["code"] == "tool_denied"
        assert gw.executions("secret") == []


async def test_with_the_ledger_down_wrapped_tools_are_not_executed(tmp_path: Path) -> None:
    from support.server import free_port

    async with gateway_client(tmp_path, f"http://127.0.0.1:{free_port()}", policy=CHARGE_POLICY) as gw:
        for _ in range(2):
            result = await gw.call("up__charge", {"amount": 5})
            assert result.is_error is True and result.structured_content is not None
            assert result.structured_content["code"] == "not_executed"
            assert result.structured_content["reason"] == "ledger_unreachable"
            assert result.structured_content["retry"] is True
        assert gw.executions("charge") == []
        passed = await gw.call("up__lookup", {"query": "still works"})  # pass needs no ledger
        assert passed.is_error is False and len(gw.executions("lookup")) == 1


async def test_an_upstream_that_rejects_the_call_is_not_applied(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    async with gateway_client(tmp_path, mcp_ledger.base_url) as gw:
        invalid = await gw.call("up__strict", {"value": -1})  # JSON-RPC -32602 from the upstream
        assert invalid.is_error is True and invalid.structured_content is not None
        assert invalid.structured_content["code"] == "not_executed"
        assert invalid.structured_content["reason"] == "invalid_params"
        operation_id = invalid.structured_content["operation_id"]
        stored = await view(ledger, gw.tenant, operation_id)
        assert stored["status"] == "not_applied"
        assert stored["not_applied_reason"] == {"category": "rejected", "detail_code": "invalid_params"}
        # Arguments the tool's own input schema refuses: the SDK's upstream would answer them with an
        # isError result ("Error executing tool strict: …"), which cannot be told from a failed run; the
        # gateway checks the schema itself, records not_applied and sends nothing upstream.
        for refused in ({"value": "not a number"}, {}, {"value": 1.5}):
            answer = await gw.call("up__strict", refused)
            assert answer.is_error is True and answer.structured_content is not None, refused
            assert answer.structured_content["code"] == "not_executed", refused
            assert (
                answer.structured_content["reason"] == "invalid_params" and answer.structured_content["retry"]
            )
            stored = await view(ledger, gw.tenant, answer.structured_content["operation_id"])
            assert stored["status"] == "not_applied" and stored["submitted_at"] is None, refused
            assert stored["not_applied_reason"] == {"category": "validation", "detail_code": "invalid_params"}
        assert "value" in answer.content[0].text  # type: ignore[union-attr]  # says what is wrong
        # the same refused call again: a new attempt, refused again, still nothing sent
        again = await gw.call("up__strict", {"value": 1.5})
        assert again.structured_content is not None and again.structured_content["reason"] == "invalid_params"
        assert (await view(ledger, gw.tenant, again.structured_content["operation_id"]))["attempt"] == 2
        assert gw.executions("strict") == []
        gw.upstream.remove_tool("ephemeral")  # listed at start-up, gone now: "Unknown tool: ephemeral"
        gone = await gw.call("up__ephemeral", {})
        assert gone.is_error is True and gone.structured_content is not None
        assert gone.structured_content["code"] == "not_executed"
        stored = await view(ledger, gw.tenant, gone.structured_content["operation_id"])
        assert stored["not_applied_reason"] == {"category": "rejected", "detail_code": "unknown_tool"}
        assert gw.executions() == []
        # The gateway's own unknown tool is a protocol error, and nothing reaches the ledger.
        with pytest.raises(Exception, match="Unknown tool: up__nothing"):
            await gw.call("up__nothing", {})


async def test_a_tool_error_is_unknown_by_default_or_not_applied_by_policy(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    policy = {"default": "wrap", "tools": {"up__declined": {"on_tool_error": "not_applied"}}}
    async with gateway_client(tmp_path, mcp_ledger.base_url) as gw:
        result = await gw.call("up__declined", {"amount": 1})
        assert result.is_error is True and "card declined" in result.content[0].text  # type: ignore[union-attr]
        assert op_of(result)["status"] == "unknown"
        assert (await view(ledger, gw.tenant, op_of(result)["operation_id"]))["status"] == "unknown"
        again = await gw.call("up__declined", {"amount": 1})
        assert again.structured_content is not None and again.structured_content["code"] == "outcome_unknown"
        assert len(gw.executions("declined")) == 1
    async with gateway_client(tmp_path, mcp_ledger.base_url, policy=policy, tenant=new_tenant()) as gw:
        result = await gw.call("up__declined", {"amount": 1})
        assert result.is_error is True and op_of(result)["status"] == "not_applied"
        stored = await view(ledger, gw.tenant, op_of(result)["operation_id"])
        assert stored["not_applied_reason"] == {"category": "rejected", "detail_code": "tool_error"}
        # not_applied may be claimed again: the call runs again, as a new attempt.
        await gw.call("up__declined", {"amount": 1})
        assert len(gw.executions("declined")) == 3
        assert (await view(ledger, gw.tenant, op_of(result)["operation_id"]))["attempt"] == 2


async def test_a_result_over_16_kib_keeps_its_digest_and_replays_without_running(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    async with gateway_client(tmp_path, mcp_ledger.base_url) as gw:
        first = await gw.call("up__big", {"size": 20_000})
        assert first.is_error is False and len(first.content[0].text) == 20_000  # type: ignore[union-attr]
        stored = await view(ledger, gw.tenant, op_of(first)["operation_id"])
        assert stored["receipt"]["result"] is None and stored["receipt"]["result_digest"].startswith(
            "sha256:"
        )
        second = await gw.call("up__big", {"size": 20_000})
        assert second.meta is not None and second.meta[REPLAYED_META] is True
        assert second.is_error is True  # the result cannot be shown again, and must not be run again
        assert second.structured_content == {
            "code": "committed_result_not_stored",
            "operation_id": op_of(first)["operation_id"],
            "retry": False,
            "result_digest": stored["receipt"]["result_digest"],
        }
        assert len(gw.executions("big")) == 1


async def test_the_status_tool_shows_the_operation_view(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    async with gateway_client(tmp_path, mcp_ledger.base_url) as gw:
        result = await gw.call("up__charge", {"amount": 3})
        operation_id = op_of(result)["operation_id"]
        status = await gw.call("effect_ledger__status", {"operation_id": operation_id})
        assert status.is_error is False and status.structured_content is not None
        assert status.structured_content["operation_id"] == operation_id
        assert status.structured_content["status"] == "committed"
        assert status.structured_content["receipt"]["result"]["structuredContent"]["charged"] == 3
        missing = await gw.call("effect_ledger__status", {"operation_id": "mcp-nothing"})
        assert missing.is_error is True and missing.structured_content is not None
        assert missing.structured_content["code"] == "not_found"
        assert len(gw.executions()) == 1
        # the view exactly as GET /v1/operations/{id} answers it (millisecond timestamps, its members)
        read = await view(ledger, gw.tenant, operation_id)
        shown = status.structured_content
        # log_index may turn from null to the leaf between the two reads (a checkpoint signed between)
        assert {k: v for k, v in shown.items() if k != "log_index"} == {
            k: v for k, v in read.items() if k != "log_index"
        }
        assert "log_index" in shown and shown["log_index"] in (None, read["log_index"])
        assert read["created_at"].endswith("Z") and len(read["created_at"]) == len("2026-12-06T14:00:00.000Z")


async def test_a_reconciled_unknown_call_is_answered_from_the_resolution(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    async with gateway_client(tmp_path, mcp_ledger.base_url, policy=CHARGE_POLICY) as gw:
        reconciler = auth(tenant=gw.tenant, sub="rec-1", scope="ledger:reconcile")
        unknown = await gw.call("up__slow", {"seconds": 3, "label": "a"})
        other = await gw.call("up__slow", {"seconds": 3, "label": "b"})
        committed_id = op_of(unknown)["operation_id"]
        refused_id = op_of(other)["operation_id"]
        evidence = {"source": "upstream-log", "lookup_ref": "job-1", "checked_at": "2026-12-01T10:00:00Z"}
        # The tool declares an output schema, so a replayable receipt carries structuredContent too.
        stored = {
            "content": [{"type": "text", "text": "done (reconciled)"}],
            "structuredContent": {"result": "done (reconciled)"},
        }
        resolved = await ledger.post(
            f"/v1/operations/{committed_id}/resolve",
            json={"outcome": "committed", "receipt": {"result": stored}, "evidence": evidence},
            headers=reconciler,
        )
        assert resolved.status_code == 200, resolved.text
        reason = {"category": "rejected", "detail_code": "never_started"}
        resolved = await ledger.post(
            f"/v1/operations/{refused_id}/resolve",
            json={"outcome": "not_applied", "reason": reason, "evidence": evidence},
            headers=reconciler,
        )
        assert resolved.status_code == 200, resolved.text
        # committed by the reconciler: the next identical call is the reconciler's receipt, not a run
        replayed = await gw.call("up__slow", {"seconds": 3, "label": "a"})
        assert (
            replayed.is_error is False and replayed.meta is not None and replayed.meta[REPLAYED_META] is True
        )
        assert replayed.content[0].text == "done (reconciled)"  # type: ignore[union-attr]
        # not_applied: the call may run again, as attempt 2 (and it times out again here)
        await gw.call("up__slow", {"seconds": 3, "label": "b"})
        assert [run["arguments"]["label"] for run in gw.executions("slow")] == ["a", "b", "b"]
        assert (await view(ledger, gw.tenant, refused_id))["attempt"] == 2


async def test_a_result_holding_u0000_is_committed_with_its_digest_only(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    """U+0000 is valid JSON that PostgreSQL's jsonb cannot hold: the receipt keeps the result's digest
    only, as one over 16 KiB does, and the call is committed. Until round 24 the ledger refused the
    receipt (422), the call stayed submitted and then became unknown, although the gateway had its
    result; a repeat answered operation_in_progress."""
    async with gateway_client(tmp_path, mcp_ledger.base_url) as gw:
        first = await gw.call("up__lookup", {"query": "a\u0000b"})
        assert first.is_error is False and op_of(first)["status"] == "committed"
        stored = await view(ledger, gw.tenant, op_of(first)["operation_id"])
        assert stored["status"] == "committed" and stored["receipt"]["result"] is None
        assert stored["receipt"]["result_digest"].startswith("sha256:")
        second = await gw.call("up__lookup", {"query": "a\u0000b"})
        assert second.meta is not None and second.meta[REPLAYED_META] is True
        assert second.structured_content is not None
        assert second.structured_content["code"] == "committed_result_not_stored"
        assert len(gw.executions("lookup")) == 1
