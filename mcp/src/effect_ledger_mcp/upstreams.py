"""The upstream MCP servers: each opened once at start-up, kept for the gateway's life, tools listed once."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx2
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CONNECTION_CLOSED, CallToolResult, PaginatedRequestParams, Tool

from effect_ledger_mcp.config import Config, HttpUpstream, StdioUpstream, Upstream

log = logging.getLogger("effect_ledger_mcp")


class UpstreamGone(Exception):
    """The upstream's connection closed earlier: nothing is sent to it any more."""


@dataclass(kw_only=True)
class UpstreamServer:
    """One open upstream: its session and the tools it listed."""

    name: str
    session: ClientSession
    tools: list[Tool]
    alive: bool = True
    _by_name: dict[str, Tool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._by_name = {tool.name: tool for tool in self.tools}

    def tool(self, name: str) -> Tool | None:
        """The upstream tool of that name, as listed at start-up."""
        return self._by_name.get(name)

    async def call(
        self, name: str, arguments: dict[str, Any], timeout_seconds: float | None
    ) -> CallToolResult:
        """Forward one tools/call; a closed connection marks the upstream gone for later calls."""
        if not self.alive:
            raise UpstreamGone(self.name)
        try:
            return await self.session.call_tool(name, arguments, read_timeout_seconds=timeout_seconds)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self.alive = False
            raise


async def _list_tools(session: ClientSession) -> list[Tool]:
    tools: list[Tool] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


async def _open(stack: AsyncExitStack, name: str, spec: Upstream) -> UpstreamServer:
    if isinstance(spec, StdioUpstream):
        # The child gets our environment (PATH, HOME, ...) with the configured variables over it.
        params = StdioServerParameters(command=spec.command, args=spec.args, env={**os.environ, **spec.env})
        read, write = await stack.enter_async_context(stdio_client(params))
    else:
        assert isinstance(spec, HttpUpstream)
        http = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=spec.headers, timeout=httpx2.Timeout(30, read=300), follow_redirects=True
            )
        )
        read, write = await stack.enter_async_context(streamable_http_client(spec.url, http_client=http))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    tools = await _list_tools(session)
    log.info("upstream_opened server=%s tools=%d", name, len(tools))
    return UpstreamServer(name=name, session=session, tools=tools)


@asynccontextmanager
async def open_upstreams(config: Config) -> AsyncIterator[dict[str, UpstreamServer]]:
    """Open every configured upstream (in this task, as anyio requires) and close them all on exit."""
    async with AsyncExitStack() as stack:
        servers = {}
        for name, spec in config.servers.items():
            servers[name] = await _open(stack, name, spec)
        yield servers
