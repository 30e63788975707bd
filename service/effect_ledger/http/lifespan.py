"""The app's ASGI lifespan (pools, background tasks), run once per worker by http.rsgi and http.server."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from litestar.types import ASGIApp, Message

_ASGI_VERSION = {"version": "3.0", "spec_version": "2.3"}

log = structlog.get_logger("effect_ledger.http")


class LifespanFailed(RuntimeError):
    """The app's lifespan did not start: the worker must not serve."""


class Lifespan:
    """The ASGI lifespan protocol, driven by the server: `startup()` before serving, `shutdown()` after."""

    def __init__(self, app: ASGIApp, state: dict[str, Any]) -> None:
        self.app = app
        self.state = state
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.started: asyncio.Future[bool] | None = None
        self.stopped: asyncio.Future[bool] | None = None
        self.task: asyncio.Task[None] | None = None

    async def startup(self) -> bool:
        """Run the lifespan's startup; False when it failed."""
        loop = asyncio.get_running_loop()
        self.started, self.stopped = loop.create_future(), loop.create_future()
        self.task = loop.create_task(self._run())
        await self.inbox.put({"type": "lifespan.startup"})  # type: ignore[typeddict-item]
        return await self.started

    async def shutdown(self) -> bool:
        """Run the lifespan's shutdown; False when it failed."""
        assert self.stopped is not None and self.task is not None
        if not self.task.done():
            await self.inbox.put({"type": "lifespan.shutdown"})  # type: ignore[typeddict-item]
        ok = await self.stopped
        self.state.clear()
        return ok

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": _ASGI_VERSION, "state": self.state}
        try:
            await self.app(scope, self.inbox.get, self._send)  # type: ignore[arg-type]
        except Exception as exc:  # Litestar reports failures by message; this is the last resort
            log.error("lifespan_failed", exception_type=type(exc).__name__)
        finally:
            _settle(self.started, False)
            _settle(self.stopped, False)

    async def _send(self, message: Message) -> None:
        kind: str = message["type"]
        if kind in ("lifespan.startup.complete", "lifespan.startup.failed"):
            _settle(self.started, kind.endswith("complete"))
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            _settle(self.stopped, kind.endswith("complete"))


def _settle(future: asyncio.Future[bool] | None, value: bool) -> None:
    if future is not None and not future.done():
        future.set_result(value)


__all__ = ["Lifespan", "LifespanFailed"]
