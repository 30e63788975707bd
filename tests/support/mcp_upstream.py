"""A real upstream MCP server for the gateway's tests: every tool counts its executions in a file.

In process: `build(count_file)` is an MCPServer (served over streamable HTTP by the tests).
Over stdio: `python tests/support/mcp_upstream.py COUNT_FILE` (only the MCP SDK is needed).
Each execution appends one JSON line `{"tool": …, "arguments": {…}}` to the file before the tool
does anything else, so a count is the number of times a tool body started.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp import MCPError
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import INVALID_PARAMS, ToolAnnotations


def executions(count_file: Path, tool: str | None = None) -> list[dict[str, Any]]:
    """The executions recorded so far (of one tool, or of all)."""
    if not count_file.exists():
        return []
    lines = [json.loads(line) for line in count_file.read_text().splitlines() if line.strip()]
    return [line for line in lines if tool is None or line["tool"] == tool]


def build(count_file: Path) -> MCPServer:
    """The counter server."""
    server = MCPServer("counter", version="1.0.0")

    def count(tool: str, **arguments: Any) -> None:
        with count_file.open("a") as sink:
            sink.write(json.dumps({"tool": tool, "arguments": arguments}) + "\n")

    @server.tool(description="Charge a card; the upstream's own idempotency key rides along.")
    async def charge(amount: int, idempotency_key: str = "", note: str = "") -> dict[str, Any]:
        count("charge", amount=amount, idempotency_key=idempotency_key, note=note)
        return {"charged": amount, "idempotency_key": idempotency_key}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
    async def lookup(query: str) -> str:
        """Read something (the annotations say read-only; the gateway's policy decides anyway)."""
        count("lookup", query=query)
        return f"found {query}"

    @server.tool()
    async def slow(seconds: float, label: str = "") -> str:
        """Take `seconds` to finish."""
        count("slow", seconds=seconds, label=label)
        await anyio.sleep(seconds)
        return "done"

    @server.tool()
    async def declined(amount: int) -> str:
        """The tool reports an error of its own (isError: true)."""
        count("declined", amount=amount)
        raise ToolError("card declined")

    @server.tool()
    async def strict(value: int) -> str:
        """Refuses bad parameters with a JSON-RPC invalid-params error, before doing anything."""
        if value < 0:
            raise MCPError(code=INVALID_PARAMS, message="value must not be negative")
        count("strict", value=value)
        return "ok"

    @server.tool()
    async def ephemeral() -> str:
        """Removed by some tests after the gateway listed it: the upstream then says "Unknown tool"."""
        count("ephemeral")
        return "here"

    @server.tool()
    async def secret() -> str:
        """Denied by the tests' policy: never listed, never run."""
        count("secret")
        return "secret"

    @server.tool()
    async def big(size: int) -> str:
        """A result larger than a receipt may hold (16 KiB)."""
        count("big", size=size)
        return "x" * size

    return server


if __name__ == "__main__":
    build(Path(sys.argv[1])).run()
