"""The gateway as an MCP server: the upstream tools as `server__tool`, `effect_ledger__status`, the policy."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp import MCPError
from mcp.server import Server, ServerRequestContext
from mcp.types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    Tool,
    ToolAnnotations,
)

from effect_ledger.client import LedgerClient, LedgerClientError, LedgerProblem, RetryPolicy
from effect_ledger_mcp import __version__, answers
from effect_ledger_mcp.arguments import ArgumentCheck
from effect_ledger_mcp.config import SEPARATOR, STATUS_TOOL, Config, Decision
from effect_ledger_mcp.execute import Executor, WrappedCall
from effect_ledger_mcp.identity import InvalidOperationId, identify, tool_version
from effect_ledger_mcp.upstreams import UpstreamServer

log = logging.getLogger("effect_ledger_mcp")

# The host's bearer token for this request (HTTP transport with ledger.token_from_host).
HOST_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "effect_ledger_host_token", default=None
)
# Ledger calls fail fast enough for an interactive host: a few attempts within ten seconds.
LEDGER_RETRY = RetryPolicy(maximum_attempts=3, deadline_seconds=10.0, attempt_timeout_seconds=5.0)

STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"operation_id": {"type": "string", "minLength": 1, "maxLength": 200}},
    "required": ["operation_id"],
    "additionalProperties": False,
}


class TokenFile:
    """The ledger token, read from its file again whenever the file changes (so it can be rotated)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._seen: tuple[float, int] | None = None
        self._token: str | None = None

    def __call__(self) -> str | None:
        """The current token, or None when there is no readable, non-empty file."""
        if self.path is None:
            return None
        try:
            stat = self.path.stat()
            if self._seen != (stat.st_mtime, stat.st_size):
                self._token = self.path.read_text(encoding="utf-8").strip() or None
                self._seen = (stat.st_mtime, stat.st_size)
        except OSError:
            return None
        return self._token


def ledger_token(config: Config) -> Callable[[], str]:
    """The ledger token of the current request: the host's (HTTP, `token_from_host`), else the file's."""
    from_file = TokenFile(config.token_path())
    use_host = config.ledger.token_from_host

    def token() -> str:
        return (HOST_TOKEN.get() if use_host else None) or from_file() or ""

    return token


@dataclass(frozen=True, kw_only=True)
class Exposed:
    """One upstream tool as the host sees it."""

    name: str  # server__tool
    server: UpstreamServer
    tool: Tool
    decision: Decision
    version: str
    arguments: ArgumentCheck  # its input schema, compiled once


class Gateway:
    """Routes each tools/call by policy: wrapped through the ledger, passed straight on, or refused."""

    def __init__(self, config: Config, upstreams: dict[str, UpstreamServer], ledger: LedgerClient) -> None:
        self.config = config
        self.ledger = ledger
        self.executor = Executor(ledger)
        self._token = ledger_token(config)
        self.exposed: dict[str, Exposed] = {}
        self.denied: set[str] = set()
        for server in upstreams.values():
            for tool in server.tools:
                name = f"{server.name}{SEPARATOR}{tool.name}"
                decision = config.decide(name)
                if decision.mode == "deny":
                    self.denied.add(name)
                    continue
                self.exposed[name] = Exposed(
                    name=name,
                    server=server,
                    tool=tool,
                    decision=decision,
                    version=tool_version(tool.input_schema),
                    arguments=ArgumentCheck(tool.input_schema),
                )

    @staticmethod
    def ledger_client(config: Config, **kwargs: Any) -> LedgerClient:
        """The ledger client: the host's token where configured and present, else the token file."""
        return LedgerClient(config.ledger.url, ledger_token(config), retry=LEDGER_RETRY, **kwargs)

    def has_token(self) -> bool:
        """Whether a ledger token is at hand for this request."""
        return bool(self._token())

    # -- tools/list ----------------------------------------------------------------------------

    def tools(self) -> list[Tool]:
        """Every exposed upstream tool under its `server__tool` name with its own schemas, plus status."""
        listed = [entry.tool.model_copy(update={"name": entry.name}) for entry in self.exposed.values()]
        listed.append(
            Tool(
                name=STATUS_TOOL,
                title="effect-ledger operation status",
                description="The ledger's view of one operation (status, attempt, receipt) by its ID. "
                "Read-only: it never runs a tool.",
                input_schema=STATUS_SCHEMA,
                annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
            )
        )
        return listed

    async def on_list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        """The MCP handler of tools/list (one page)."""
        return ListToolsResult(tools=self.tools())

    # -- tools/call ----------------------------------------------------------------------------

    async def on_call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams
    ) -> CallToolResult:
        """The MCP handler of tools/call."""
        host_token = _bearer(ctx.request) if self.config.ledger.token_from_host else None
        reset = HOST_TOKEN.set(host_token)
        try:
            return await self.call(params.name, params.arguments, dict(params.meta or {}))
        finally:
            HOST_TOKEN.reset(reset)

    async def call(self, name: str, arguments: dict[str, Any] | None, meta: dict[str, Any]) -> CallToolResult:
        """One tools/call by its exposed name, with the request's `_meta`."""
        if name == STATUS_TOOL:
            return await self._status(arguments or {})
        if name in self.denied:
            return answers.problem("tool_denied", None, retry=False)
        entry = self.exposed.get(name)
        if entry is None:
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {name}")
        if entry.decision.mode == "pass":
            return await entry.server.session.call_tool(
                entry.tool.name, arguments, read_timeout_seconds=entry.decision.timeout_seconds
            )
        try:
            identity = identify(
                server=entry.server.name,
                tool=entry.tool.name,
                arguments=arguments,
                meta=meta,
                config_run_id=self.config.run_id,
                left_out=entry.decision.left_out,
                inject=entry.decision.inject,
            )
        except InvalidOperationId as exc:
            return answers.problem(
                "not_executed", None, retry=False, reason="invalid_operation_id", message=str(exc)
            )
        if not self.has_token():
            return answers.problem(
                "not_executed", identity.operation_id, retry=False, reason="no_ledger_token"
            )
        call = WrappedCall(
            server=entry.server,
            tool=entry.tool.name,
            exposed=entry.name,
            tool_version=entry.version,
            identity=identity,
            decision=entry.decision,
            structured_output=entry.tool.output_schema is not None,
            invalid_arguments=entry.arguments.problem(identity.forwarded),
        )
        return await self.executor.run(call)

    async def _status(self, arguments: dict[str, Any]) -> CallToolResult:
        operation_id = arguments.get("operation_id")
        if not isinstance(operation_id, str) or not operation_id:
            raise MCPError(code=INVALID_PARAMS, message="operation_id: a string is required")
        if not self.has_token():
            return answers.problem("not_executed", operation_id, retry=False, reason="no_ledger_token")
        try:
            # the view exactly as the ledger sent it (its millisecond timestamps, its members), not the
            # client's decoded model encoded again
            view = await self.ledger.get_operation_json(operation_id)
        except LedgerProblem as problem:
            code = str(problem.members.get("code") or problem.code)
            return answers.problem(code, operation_id, retry=code not in ("not_found", "forbidden"))
        except LedgerClientError:
            return answers.problem("not_executed", operation_id, retry=True, reason="ledger_unreachable")
        return answers.view_result(view)

    # -- the MCP server ------------------------------------------------------------------------

    def server(self) -> Server[Any]:
        """A low-level MCP server with this gateway's handlers."""
        return Server(
            "effect-ledger-mcp",
            version=__version__,
            instructions="Tools behind effect-ledger: a repeated call is answered from the ledger, and a "
            "call whose outcome is unknown is reconciled, never run again.",
            on_list_tools=self.on_list_tools,
            on_call_tool=self.on_call_tool,
        )


def _bearer(request: Any) -> str | None:
    """The bearer token of the HTTP request behind this MCP request (None over stdio)."""
    headers: Callable[[str], str | None] | None = getattr(getattr(request, "headers", None), "get", None)
    if headers is None:
        return None
    value = headers("authorization") or ""
    scheme, _, credentials = value.partition(" ")
    return credentials.strip() or None if scheme.lower() == "bearer" else None
