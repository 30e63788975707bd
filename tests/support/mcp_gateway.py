"""The MCP gateway's test harness: a config on disk, the counter upstream, the gateway, a real MCP client.

Everything that enters an anyio cancel scope (upstream sessions, the client) is entered and left in the
test's own task, as anyio requires: use `async with gateway_client(...) as gw:` inside the test.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from mcp import Client
from mcp.types import CallToolResult

from effect_ledger_mcp.config import load_config
from effect_ledger_mcp.gateway import Gateway
from effect_ledger_mcp.upstreams import open_upstreams
from support import mcp_upstream
from support.auth import auth, token
from support.server import LoopServer

UPSTREAM_SCRIPT = Path(mcp_upstream.__file__).resolve()
MCP_SRC = Path(__file__).resolve().parents[2] / "mcp" / "src"


def new_tenant() -> str:
    """A tenant of its own for one test: its ledger rows are nobody else's."""
    return f"mcp-{uuid.uuid4().hex[:12]}"


@asynccontextmanager
async def counter_upstream(count_file: Path) -> AsyncIterator[tuple[str, Any]]:
    """The counter MCP server in this event loop over streamable HTTP: (its /mcp URL, the MCPServer)."""
    server = mcp_upstream.build(count_file)
    async with LoopServer(server.streamable_http_app()) as running:
        yield f"{running.base_url}/mcp", server


def write_config(
    folder: Path,
    *,
    ledger_url: str,
    tenant: str,
    servers: dict[str, Any],
    policy: dict[str, Any] | None = None,
    run_id: str | None = "run-1",
    token_from_host: bool = False,
) -> Path:
    """The gateway's configuration file and its token file (an executor of `tenant`)."""
    token_file = folder / "ledger.token"
    token_file.write_text(token(tenant=tenant, sub="mcp-gateway", scope="ledger:execute") + "\n")
    token_file.chmod(0o600)
    config = {
        "ledger": {"url": ledger_url, "token_file": token_file.name, "token_from_host": token_from_host},
        "run_id": run_id,
        "mcpServers": servers,
        "policy": policy or {"default": "wrap", "tools": {}},
    }
    path = folder / "gateway.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def stdio_upstream(count_file: Path) -> dict[str, Any]:
    """The `mcpServers` entry that starts the counter server over stdio."""
    return {"command": sys.executable, "args": [str(UPSTREAM_SCRIPT), str(count_file)], "env": {}}


@dataclass
class Harness:
    """A connected MCP client of a running gateway, and what the test needs to check it."""

    client: Client
    gateway: Gateway
    count_file: Path
    tenant: str
    upstream: Any  # the in-process MCPServer (None when the upstream runs over stdio)

    async def call(self, name: str, arguments: dict[str, Any], **kwargs: Any) -> CallToolResult:
        """tools/call through the gateway."""
        return await self.client.call_tool(name, arguments, **kwargs)

    def executions(self, tool: str | None = None) -> list[dict[str, Any]]:
        """What the upstream ran."""
        return mcp_upstream.executions(self.count_file, tool)


async def ledger_get(ledger: httpx.AsyncClient, tenant: str, path: str, **params: Any) -> httpx.Response:
    """GET the ledger as a reconciler of the tenant."""
    return await ledger.get(
        path, params=params, headers=auth(tenant=tenant, sub="rec-1", scope="ledger:reconcile")
    )


async def operations(ledger: httpx.AsyncClient, tenant: str) -> list[dict[str, Any]]:
    """Every operation of the tenant, oldest first."""
    response = await ledger_get(ledger, tenant, "/v1/operations", limit=500)
    assert response.status_code == 200, response.text
    return list(response.json()["items"])


@asynccontextmanager
async def gateway_client(
    tmp_path: Path,
    ledger_url: str,
    *,
    policy: dict[str, Any] | None = None,
    tenant: str | None = None,
    run_id: str | None = "run-1",
    stdio: bool = False,
) -> AsyncIterator[Harness]:
    """The counter upstream (in process over streamable HTTP, or a subprocess over stdio), the gateway
    in process, and an MCP client talking JSON-RPC to it over memory streams (`mode="legacy"`)."""
    tenant = tenant or new_tenant()
    count_file = tmp_path / "executions.jsonl"
    async with AsyncExitStack() as stack:
        servers: dict[str, Any]
        if stdio:
            servers, upstream = {"up": stdio_upstream(count_file)}, None
        else:
            url, upstream = await stack.enter_async_context(counter_upstream(count_file))
            servers = {"up": {"url": url}}
        path = write_config(
            tmp_path,
            ledger_url=ledger_url,
            tenant=tenant,
            servers=servers,
            policy=policy,
            run_id=run_id,
        )
        config = load_config(path)
        upstreams = await stack.enter_async_context(open_upstreams(config))
        ledger = await stack.enter_async_context(Gateway.ledger_client(config))
        gateway = Gateway(config, upstreams, ledger)
        client = await stack.enter_async_context(Client(gateway.server(), mode="legacy"))
        yield Harness(client=client, gateway=gateway, count_file=count_file, tenant=tenant, upstream=upstream)
