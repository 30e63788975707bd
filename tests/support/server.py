"""The app served over real loopback HTTP in the test's own event loop."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Literal, Self

import httpx
import uvicorn

from effect_ledger.http.app import create_app
from effect_ledger.settings import Settings
from support.auth import TEST_SECRET


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LoopServer:
    """A uvicorn server running an ASGI app in this event loop, on a free loopback port."""

    def __init__(self, app: Any, *, lifespan: Literal["on", "off"] = "on") -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan=lifespan,
            access_log=False,
            interface="asgi3",  # a bound method's signature would make uvicorn guess ASGI 2
        )
        self.server = uvicorn.Server(config)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self.task is not None:
            await self.task


class Service(LoopServer):
    """The effect-ledger app served for real over loopback HTTP."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        super().__init__(create_app(settings, jwt_secret=TEST_SECRET))

    def client(self, **kwargs: object) -> httpx.AsyncClient:
        """An HTTP client for this service."""
        return httpx.AsyncClient(base_url=self.base_url, timeout=30, **kwargs)  # type: ignore[arg-type]
