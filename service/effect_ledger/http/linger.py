"""Granian's servers close a connection with the request body unread when the app answered early (a
413 over the body limit, a 401 before the body): the kernel then sends a reset, which can destroy the
answer before the client reads it (httpx: `ReadError` instead of the 413). serve's own server lingers
instead (http.server: `Connection.linger`); under granian the app does it: after the answer, what is
left of the body is read and dropped, within the same bounds (LINGER_BYTES, LINGER_SECONDS).
`DrainUnreadBody` wraps the app for granian's ASGI interface; http.rsgi's entry drains its own
exchange. Until round 20 nothing did, and `test_rsgi_answers_exactly_as_asgi_over_http` lost the 413
of an oversized chunked body in most runs on a quiet machine.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from litestar.types import ASGIApp, Receive, Scope, Send

from effect_ledger.http.server import LINGER_BYTES, LINGER_SECONDS


async def drain(receive: Receive) -> None:
    """Read and drop the rest of a request's body, within LINGER_BYTES and LINGER_SECONDS."""
    left = LINGER_BYTES
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(LINGER_SECONDS):
            while left > 0:
                message = await receive()
                if message["type"] != "http.request":
                    return
                left -= len(message.get("body", b""))
                if not message.get("more_body", False):
                    return


class DrainUnreadBody:
    """ASGI wrapper: after the app's answer, the body the app did not read to its end is drained."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # type: ignore[comparison-overlap]  # the lifespan comes through too
            await self.app(scope, receive, send)
            return
        ended = False

        async def tracked() -> Any:
            nonlocal ended
            message = await receive()
            ended = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, tracked, send)
        if not ended:
            await drain(receive)


def granian_asgi_app_from_env() -> DrainUnreadBody:
    """Factory for granian's ASGI workers: http.app.app_from_env's app, drained."""
    from effect_ledger.http.app import app_from_env

    return DrainUnreadBody(app_from_env())
