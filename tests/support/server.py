"""The app in the test's own event loop: in process through httpx's ASGI transport, or over loopback HTTP."""

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


def uvicorn_config(app: Any, lifespan: Literal["on", "off"], **where: Any) -> uvicorn.Config:
    """How every in-loop uvicorn of the tests serves an app."""
    return uvicorn.Config(
        app,
        log_level="warning",
        lifespan=lifespan,
        access_log=False,
        interface="asgi3",  # a bound method's signature would make uvicorn guess ASGI 2
        # longer than httpx's 5 s keep-alive expiry, so the client always drops an idle connection
        # first: with both at 5 s a busy machine let the server close one the client was reusing
        # (httpx.ReadError in a chaos run at load 9, and in test_noisy_neighbour's flood in a suite run)
        timeout_keep_alive=60,
        **where,
    )


class LoopServer:
    """A uvicorn server running an ASGI app in this event loop, on a free loopback port."""

    def __init__(self, app: Any, *, lifespan: Literal["on", "off"] = "on") -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn_config(app, lifespan, host="127.0.0.1", port=self.port))
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


class Lifespan:
    """Runs an ASGI app's lifespan (startup, then shutdown) in this event loop, as a server would."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        self.task = asyncio.create_task(self.app(scope, self.inbox.get, self.outbox.put))
        await self._step("startup")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._step("shutdown")
        assert self.task is not None
        await self.task

    async def _step(self, phase: str) -> None:
        assert self.task is not None
        await self.inbox.put({"type": f"lifespan.{phase}"})
        answer = asyncio.ensure_future(self.outbox.get())
        await asyncio.wait({answer, self.task}, return_when=asyncio.FIRST_COMPLETED)
        if not answer.done():
            answer.cancel()
            self.task.result()  # the app's own error
            raise RuntimeError(f"the app's lifespan ended before {phase} completed")
        message = answer.result()
        if message["type"] != f"lifespan.{phase}.complete":
            raise RuntimeError(f"lifespan {phase}: {message}")


class Service:
    """The effect-ledger app on the test's database, its lifespan run in this event loop.

    `client()` reaches it in process (httpx's ASGI transport: no socket, no server). A test whose point
    is the socket, or that hands a URL to another client, reads `base_url`: the first read serves the
    same app over loopback HTTP (uvicorn on a socket already listening, so nothing waits for it).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = create_app(settings, jwt_secret=TEST_SECRET)
        self.lifespan = Lifespan(self.app)
        self.server: uvicorn.Server | None = None
        self.task: asyncio.Task[None] | None = None
        self._base_url: str | None = None

    async def __aenter__(self) -> Self:
        await self.lifespan.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self.server is not None and self.task is not None:
                self.server.should_exit = True
                await self.task
        finally:
            await self.lifespan.__aexit__(*exc)

    @property
    def base_url(self) -> str:
        """The loopback URL of the app, served from the first read on."""
        if self._base_url is None:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(128)
            self.server = uvicorn.Server(uvicorn_config(self.app, "off"))
            self.task = asyncio.create_task(self.server.serve(sockets=[sock]))
            self._base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self._base_url

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    def client(self, **kwargs: object) -> httpx.AsyncClient:
        """An HTTP client of this service, in process."""
        transport = httpx.ASGITransport(app=self.app)
        return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=30, **kwargs)  # type: ignore[arg-type]
