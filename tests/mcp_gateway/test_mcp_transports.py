"""`effect-ledger-mcp` as a process: over stdio (killed and restarted mid-call) and over streamable HTTP.

The gateway runs as `python -m effect_ledger_mcp` (what the console script runs) in front of the counter
upstream over stdio; the official MCP client drives it through real JSON-RPC framing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client, ClientSession, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from effect_ledger_mcp.identity import OPERATION_META, REPLAYED_META
from support import mcp_upstream
from support.auth import token
from support.mcp_gateway import (
    MCP_SRC,
    gateway_client,
    ledger_get,
    new_tenant,
    operations,
    stdio_upstream,
    write_config,
)
from support.server import Service, free_port

pytestmark = pytest.mark.timeout(120)
POLICY = {
    "default": "wrap",
    "tools": {
        "up__slow": {"timeout_seconds": 60},
        "up__lookup": {"mode": "pass"},
        "up__secret": {"mode": "deny"},
        "up__charge": {"volatile": ["note"], "inject": {"idempotency_key": "{operation_id}"}},
    },
}


def gateway_env() -> dict[str, str]:
    """This environment, with the gateway's source importable (the tests run it from mcp/src)."""
    paths = [str(MCP_SRC), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def gateway_command(config: Path, *extra: str) -> list[str]:
    """The installed console script beside this interpreter (`pip install --no-deps -e ./mcp`), else the
    module it runs."""
    script = Path(sys.executable).with_name("effect-ledger-mcp")
    program = [str(script)] if script.exists() else [sys.executable, "-m", "effect_ledger_mcp"]
    return [*program, *extra[:1], "--config", str(config), *extra[1:]]


def processes_mentioning(text: str) -> list[int]:
    """The pids whose command line contains `text` (a path unique to this test)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def wait_for(predicate: Any, seconds: float = 20) -> None:
    with anyio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 - polls a file another process writes
            await asyncio.sleep(0.05)


async def test_over_stdio_a_gateway_killed_after_forwarding_never_runs_the_call_twice(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    count_file = tmp_path / "executions.jsonl"
    tenant = new_tenant()
    config = write_config(
        tmp_path,
        ledger_url=mcp_ledger.base_url,
        tenant=tenant,
        servers={"up": stdio_upstream(count_file)},
        policy=POLICY,
    )
    command = gateway_command(config, "serve")
    params = StdioServerParameters(command=command[0], args=command[1:], env=gateway_env())
    try:
        async with Client(params, mode="legacy") as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            assert "up__charge" in names and "up__secret" not in names
            first = await client.call_tool("up__charge", {"amount": 4, "note": "a"})
            second = await client.call_tool("up__charge", {"amount": 4, "note": "b"})
            assert first.is_error is False and second.meta is not None and second.meta[REPLAYED_META] is True
            assert len(mcp_upstream.executions(count_file, "charge")) == 1

            async def slow_call() -> None:
                with contextlib.suppress(MCPError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await client.call_tool("up__slow", {"seconds": 30})

            async with anyio.create_task_group() as group:
                group.start_soon(slow_call)
                await wait_for(lambda: len(mcp_upstream.executions(count_file, "slow")) == 1)
                gateway = [pid for pid in processes_mentioning(str(config)) if pid != os.getpid()]
                assert len(gateway) == 1, gateway
                os.kill(gateway[0], signal.SIGKILL)  # after forwarding: the upstream is running the tool
        # Restarted, asked the same: the ledger holds the submitted attempt, so nothing runs again.
        async with Client(params, mode="legacy") as client:
            again = await client.call_tool("up__slow", {"seconds": 30})
            assert again.is_error is True and again.structured_content is not None
            assert again.structured_content["code"] == "operation_in_progress"
            assert again.structured_content["retry"] is True
            assert len(mcp_upstream.executions(count_file, "slow")) == 1
        slow_ops = [op for op in await operations(ledger, tenant) if op["tool"] == "up__slow"]
        assert [(op["status"], op["attempt"]) for op in slow_ops] == [("submitted", 1)]
    finally:
        kill_all(processes_mentioning(str(count_file)) + processes_mentioning(str(config)))


async def test_an_upstream_that_drops_the_connection_mid_call_leaves_the_outcome_unknown(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    count_file = tmp_path / "executions.jsonl"
    try:
        async with gateway_client(tmp_path, mcp_ledger.base_url, policy=POLICY, stdio=True) as gw:
            call = asyncio.ensure_future(gw.call("up__slow", {"seconds": 30}))
            await wait_for(lambda: len(gw.executions("slow")) == 1)
            upstream = processes_mentioning(str(count_file))
            assert len(upstream) == 1, upstream
            os.kill(upstream[0], signal.SIGKILL)
            dropped = await asyncio.wait_for(call, 20)
            assert dropped.is_error is True and dropped.structured_content is not None
            operation_id = dropped.structured_content["operation_id"]
            assert dropped.structured_content == {
                "code": "outcome_unknown",
                "operation_id": operation_id,
                "retry": False,
            }
            stored = await ledger_get(ledger, gw.tenant, f"/v1/operations/{operation_id}")
            assert stored.json()["status"] == "unknown"
            # The upstream is gone: the ledger still answers first (API.md 16's claim rows). The call
            # that dropped is unknown (until round 36: `not_executed`, retryable, before any claim) ...
            again = await gw.call("up__slow", {"seconds": 30})
            assert again.structured_content == {
                "code": "outcome_unknown",
                "operation_id": operation_id,
                "retry": False,
            }, again.structured_content
            # ... and a new one is claimed, never submitted, recorded not applied; nothing runs.
            refused = await gw.call("up__charge", {"amount": 1})
            assert refused.structured_content is not None
            assert (refused.structured_content["code"], refused.structured_content["reason"]) == (
                "not_executed",
                "upstream_gone",
            )
            assert refused.structured_content["retry"] is True
            charge = await ledger_get(
                ledger, gw.tenant, f"/v1/operations/{refused.structured_content['operation_id']}"
            )
            assert (charge.json()["status"], charge.json()["submitted_at"]) == ("not_applied", None)
            assert charge.json()["not_applied_reason"] == {
                "category": "cancelled_before_submit",
                "detail_code": "upstream_gone",
            }
            assert sorted(op["tool"] for op in await operations(ledger, gw.tenant)) == [
                "up__charge",
                "up__slow",
            ]
            assert len(gw.executions()) == 1
    finally:
        kill_all(processes_mentioning(str(count_file)))


@contextlib.asynccontextmanager
async def http_gateway(config: Path, port: int, log: Path) -> AsyncIterator[str]:
    """`effect-ledger-mcp serve --transport http` as a process; yields its /mcp URL once it listens."""
    with log.open("wb") as sink:
        proc = subprocess.Popen(  # noqa: ASYNC220 - started once, waited for below without blocking
            gateway_command(config, "serve", "--transport", "http", "--port", str(port)),
            env=gateway_env(),
            stdout=sink,
            stderr=sink,
        )
    try:
        with anyio.fail_after(30):
            while True:
                assert proc.poll() is None, log.read_text()  # noqa: ASYNC240 - only on failure
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
                await asyncio.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_over_streamable_http_with_the_hosts_bearer_token_as_the_ledger_token(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    count_file = tmp_path / "executions.jsonl"
    file_tenant, host_tenant = new_tenant(), new_tenant()
    config = write_config(
        tmp_path,
        ledger_url=mcp_ledger.base_url,
        tenant=file_tenant,
        servers={"up": stdio_upstream(count_file)},
        policy=POLICY,
        token_from_host=True,
    )
    host_token = token(tenant=host_tenant, sub="agent-7", scope="ledger:execute")
    try:
        async with http_gateway(config, free_port(), tmp_path / "gateway.log") as url:
            async with httpx2.AsyncClient(timeout=10) as anonymous:
                refused = await anonymous.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
                assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
            headers = {"Authorization": f"Bearer {host_token}"}
            async with (
                httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                first = await session.call_tool("up__charge", {"amount": 8, "note": "x"})
                second = await session.call_tool("up__charge", {"amount": 8, "note": "y"})
                assert first.is_error is False and first.structured_content is not None
                assert second.meta is not None and second.meta[REPLAYED_META] is True
                assert second.structured_content == first.structured_content
                operation_id = first.meta[OPERATION_META]["operation_id"] if first.meta else None
                assert first.structured_content["idempotency_key"] == operation_id
                passed = await session.call_tool("up__lookup", {"query": "q"})
                assert passed.is_error is False and OPERATION_META not in (passed.meta or {})
        assert len(mcp_upstream.executions(count_file, "charge")) == 1
        # The host's token decided the tenant and principal; the token file's tenant saw nothing.
        host_ops = await operations(ledger, host_tenant)
        assert [(op["operation_id"], op["principal"], op["status"]) for op in host_ops] == [
            (operation_id, "agent-7", "committed")
        ]
        assert await operations(ledger, file_tenant) == []
    finally:
        kill_all(processes_mentioning(str(count_file)))


def test_tools_prints_every_upstream_tool_with_its_policy_decision(tmp_path: Path) -> None:
    count_file = tmp_path / "executions.jsonl"
    config = write_config(
        tmp_path,
        ledger_url="http://127.0.0.1:9",
        tenant="t1",
        servers={"up": stdio_upstream(count_file)},
        policy=POLICY,
    )
    run = subprocess.run(
        gateway_command(config, "tools"), env=gateway_env(), capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    modes = {line.split("\t")[0]: line.split("\t")[1] for line in run.stdout.splitlines()}
    assert modes["up__charge"] == "wrap" and modes["up__slow"] == "wrap" and modes["up__ephemeral"] == "wrap"
    assert modes["up__lookup"] == "pass" and modes["up__secret"] == "deny"
    assert modes["effect_ledger__status"] == "read-only"
    charge = next(line for line in run.stdout.splitlines() if line.startswith("up__charge\t"))
    assert "volatile=note" in charge and "inject=idempotency_key" in charge
    assert mcp_upstream.executions(count_file) == []  # listing runs nothing


def test_an_invalid_configuration_is_refused_with_its_reason(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"ledger": {"url": "http://x"}, "mcpServers": {"a__b": {"command": "x"}}}')
    run = subprocess.run(
        gateway_command(path, "serve"), env=gateway_env(), capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2 and "a__b" in run.stderr and "not a usable server name" in run.stderr


async def test_over_stdio_in_the_clients_default_mode_the_answers_are_the_same(
    tmp_path: Path, mcp_ledger: Service, ledger: httpx.AsyncClient
) -> None:
    """The official client's default (`mode="auto"`: the 2026-07-28 era where the server offers it)."""
    count_file = tmp_path / "executions.jsonl"
    tenant = new_tenant()
    policy = {"default": "wrap", "tools": {"up__slow": {"timeout_seconds": 0.5}}}
    config = write_config(
        tmp_path,
        ledger_url=mcp_ledger.base_url,
        tenant=tenant,
        servers={"up": stdio_upstream(count_file)},
        policy=policy,
    )
    command = gateway_command(config, "serve")
    params = StdioServerParameters(command=command[0], args=command[1:], env=gateway_env())
    try:
        async with Client(params) as client:
            meta = {"effect-ledger/operation_id": "auto-mode-1"}
            first = await client.call_tool("up__charge", {"amount": 2}, meta=meta)
            second = await client.call_tool("up__charge", {"amount": 2}, meta=meta)
            assert first.is_error is False and first.meta is not None
            assert first.meta[OPERATION_META] == {"operation_id": "auto-mode-1", "status": "committed"}
            assert second.meta is not None and second.meta[REPLAYED_META] is True
            slow = await client.call_tool("up__slow", {"seconds": 3})
            assert (
                slow.structured_content is not None and slow.structured_content["code"] == "outcome_unknown"
            )
            assert slow.structured_content["retry"] is False
            again = await client.call_tool("up__slow", {"seconds": 3})
            assert again.structured_content == slow.structured_content
        assert len(mcp_upstream.executions(count_file, "charge")) == 1
        assert len(mcp_upstream.executions(count_file, "slow")) == 1
        statuses = {op["operation_id"]: op["status"] for op in await operations(ledger, tenant)}
        assert statuses["auto-mode-1"] == "committed" and sorted(statuses.values()) == [
            "committed",
            "unknown",
        ]
    finally:
        kill_all(processes_mentioning(str(count_file)))
