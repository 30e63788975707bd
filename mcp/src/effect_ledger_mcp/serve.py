"""The two transports of `effect-ledger-mcp serve`: stdio (one host) and streamable HTTP."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Literal

import uvicorn
from mcp.server.stdio import stdio_server

from effect_ledger_mcp.config import Config
from effect_ledger_mcp.gateway import Gateway
from effect_ledger_mcp.upstreams import open_upstreams

log = logging.getLogger("effect_ledger_mcp")
Transport = Literal["stdio", "http"]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def require_bearer(app: ASGIApp) -> ASGIApp:
    """With ledger.token_from_host, an HTTP request without a bearer token is refused (401) before MCP."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            scheme, _, credentials = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
            if scheme.lower() != "bearer" or not credentials.strip():
                body = json.dumps({"error": "unauthenticated", "detail": "a bearer token is required"})
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body.encode()})
                return
        await app(scope, receive, send)

    return guarded


async def serve(config: Config, transport: Transport, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Open every upstream once, then serve the gateway until the host goes away (stdio) or a signal."""
    async with open_upstreams(config) as upstreams, Gateway.ledger_client(config) as ledger:
        gateway = Gateway(config, upstreams, ledger)
        server = gateway.server()
        log.info("gateway_ready transport=%s tools=%d", transport, len(gateway.exposed))
        if transport == "stdio":
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
            return
        app: ASGIApp = server.streamable_http_app(host=host)
        if config.ledger.token_from_host:
            app = require_bearer(app)
        uvicorn_config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
        await uvicorn.Server(uvicorn_config).serve()
