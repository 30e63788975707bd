"""granian's native interface (RSGI) in front of the unchanged ASGI app: what `serve` runs by default.

Under granian's ASGI interface every request crosses from its Rust runtime into Python as ASGI
messages: a scope dict, a `receive` future for the body, and two `send` calls, each a Rust object and
an awaitable. RSGI hands over the request as one scope object and a protocol: the body is one
awaitable (`await protocol()`), the answer one synchronous call (`protocol.response_bytes`).

This module is a small RSGI -> ASGI adapter in Python, so the app itself is the same object as under
ASGI (`http.app.create_app`): the executor calls are still answered by `http.fastpath` (the same
admission, decoding, `run_*` functions and answers, byte for byte), everything else by Litestar, and
the request telemetry wraps both. What it saves is a thread hand-over per request with a body:
granian's ASGI `receive` passes the body frame by frame and cannot tell that the first frame was the
last, so the app must ask twice, each time for a future that granian's Rust thread resolves and hands
back to the event loop; here a body whose `Content-Length` is within the limit is read in one await.
An answer in one body message (every JSON answer, problem or page) leaves in one `response_bytes`;
an answer in several (static files) through `response_stream`. Request bodies without a length or
over the limit are read chunk by chunk as the app asks, so the app's body limit still stops them
early. After the body, `receive` waits for the client's disconnect. The ASGI lifespan (pools,
background tasks) starts once per worker in `__rsgi_init__` and stops in `__rsgi_del__`, where
granian's ASGI worker runs it. Measured: docs/performance.md, "Issue 20 item 3: the RSGI entry".

Differences from granian's ASGI scope, all outside what the app reads: `raw_path` is the decoded path
percent-encoded again (RSGI passes no raw path: an encoded "/" or a needless escape is not restored),
and a request header whose value is not visible ASCII is not passed on (granian's RSGI headers drop
such values). WebSocket upgrades are refused with 403 (the app serves none). A body read chunk by
chunk (no length, or over the limit) whose client goes away mid-way ends like a complete one
(granian's RSGI chunk iterator yields b"" for the broken stream), so the app answers its truncated
text (400 or 413) to nobody, where granian's ASGI receive says `http.disconnect` (500 to nobody);
a body with a length (every executor call) reports the disconnect under both.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import quote

from granian.rsgi import HTTPProtocol, ProtocolClosed  # type: ignore[attr-defined]  # re-exported names
from granian.rsgi import Scope as RSGIScope
from litestar import Litestar
from litestar.types import Scope

from effect_ledger.http.lifespan import Lifespan, LifespanFailed
from effect_ledger.http.linger import drain
from effect_ledger.settings import Settings

_ASGI_VERSION = {"version": "3.0", "spec_version": "2.3"}
_REQUEST_END = {"type": "http.request", "body": b"", "more_body": False}
_DISCONNECT = {"type": "http.disconnect"}
_PATH_SAFE = "/:@!$&'()*+,;=~"  # RFC 3986 pchar besides unreserved: kept as they were sent
_PLAIN_PATH = re.compile(r"[A-Za-z0-9/:@!$&'()*+,;=~._-]*")  # nothing to encode (every API path)


def _address(text: str) -> tuple[str, int] | None:
    """An RSGI "host:port" (IPv6 in brackets) as ASGI's (host, port)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


class _Exchange:
    """One request's ASGI `receive` and `send`, over one RSGI protocol object."""

    __slots__ = ("chunks", "finished", "gone", "headers", "length", "protocol", "status", "transport")

    def __init__(self, protocol: HTTPProtocol, length: int | None) -> None:
        self.protocol = protocol
        self.length = length  # read in one await when known and within the limit; else chunk by chunk
        self.chunks: Any = None  # the body's chunk iterator, once streaming
        self.finished = False  # the whole body was handed to the app
        self.gone = False  # the client went away while its body was read
        self.status = 0
        self.headers: list[tuple[str, str]] | None = None
        self.transport: Any = None

    async def receive(self) -> Any:  # an ASGI message
        """The body (one message, or its chunks as they arrive), then the client's disconnect."""
        if self.finished:
            if not self.gone:  # granian's disconnect future resolves on a disconnect after this call only
                await self.protocol.client_disconnect()
            return _DISCONNECT
        try:
            if self.length == 0:
                self.finished = True
                return _REQUEST_END
            if self.length is not None:
                body = await self.protocol()
                self.finished = True
                return {"type": "http.request", "body": body, "more_body": False}
            if self.chunks is None:
                self.chunks = self.protocol.__aiter__()
            chunk = await self.chunks.__anext__()
        except StopAsyncIteration:
            chunk = b""
        except ProtocolClosed:  # the client went away mid-body
            self.finished = self.gone = True
            return _DISCONNECT
        if not chunk:  # the stream's end (granian yields b"" last)
            self.finished = True
            return _REQUEST_END
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(self, message: Any) -> None:  # an ASGI message
        """ASGI's response messages as one `response_bytes`, or a stream when the body comes in parts."""
        kind = message["type"]
        if kind == "http.response.start":
            if self.headers is not None:
                raise RuntimeError("ASGI flow error: response already started")
            self.status = message["status"]
            self.headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", ())]
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unsupported ASGI message {kind!r}")
        if self.headers is None:
            raise RuntimeError("ASGI flow error: response not started")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if self.transport is None:
            if self.status == 0:
                raise RuntimeError("ASGI flow error: response already finished")
            if not more:  # the usual case: the whole answer at once
                self.protocol.response_bytes(self.status, self.headers, body)
                self.status = 0
                return
            self.transport = self.protocol.response_stream(self.status, self.headers)
            self.status = 0
        if body:
            try:
                await self.transport.send_bytes(body)
            except ProtocolClosed:  # the client went away; as granian's ASGI send, not an error
                pass
        if not more:
            self.transport = None  # dropping the transport ends the stream

    def close(self) -> None:
        """After the app returned: a started answer without its last body part is ended here."""
        if self.transport is not None:
            self.transport = None
        elif self.headers is not None and self.status:
            self.protocol.response_bytes(self.status, self.headers, b"")
        # Nothing started: granian answers 500 itself when the callback returns without an answer.


class RSGIEntry:
    """The app under RSGI: each request bridged to the ASGI app, its lifespan run once per worker."""

    def __init__(self, app: Litestar, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.state: dict[str, Any] = {}  # the lifespan's state, copied into each request (as granian)
        self._lifespan: Lifespan | None = None
        self._servers: dict[str, tuple[str, int] | None] = {}

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the app's lifespan (pools, background tasks) before the worker serves."""
        self._lifespan = Lifespan(self.app, self.state)
        if not loop.run_until_complete(self._lifespan.startup()):
            # The worker process exits with 1, as granian's ASGI worker does when the startup fails.
            raise LifespanFailed("the app's lifespan startup failed (see the lifespan_failed line)")

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop the lifespan after the worker stopped serving."""
        if self._lifespan is not None:
            loop.run_until_complete(self._lifespan.shutdown())
            self._lifespan = None

    async def __rsgi__(self, scope: RSGIScope, protocol: HTTPProtocol) -> None:
        """One HTTP request, answered by the ASGI app."""
        if scope.proto != "http":  # a WebSocket upgrade: the app serves none (403, as Litestar's close)
            protocol.close(403)  # type: ignore[attr-defined]
            return
        headers = scope.headers
        exchange = _Exchange(protocol, self._length_of(headers, scope.http_version))
        try:
            await self.app(self._asgi_scope(scope, headers), exchange.receive, exchange.send)
            if not exchange.finished:  # answered before the body's end (a 413, a 401): http.linger
                await drain(exchange.receive)
        finally:
            exchange.close()

    def _length_of(self, headers: Any, http_version: str) -> int | None:
        """The body's declared length when it can be read in one await; None: read it in chunks."""
        declared = headers.get("content-length")
        if declared is None:
            # HTTP/1 without a length or chunked coding has no body (RFC 9112 6.3); HTTP/2 may have one.
            if http_version != "2" and "transfer-encoding" not in headers:
                return 0
            return None
        if declared.isdigit() and int(declared) <= self.max_body_bytes:
            return int(declared)
        return None

    def _asgi_scope(self, scope: RSGIScope, headers: Any) -> Scope:
        """The ASGI HTTP scope granian's ASGI interface would pass for this request."""
        server = self._servers.get(scope.server, ())
        if server == ():
            server = self._servers.setdefault(scope.server, _address(scope.server))
        path = scope.path
        return {  # type: ignore[return-value]
            "type": "http",
            "asgi": _ASGI_VERSION,
            "http_version": scope.http_version,
            "server": server,
            "client": _address(scope.client),
            "scheme": scope.scheme,
            "method": scope.method,
            "root_path": "",
            "path": path,
            "raw_path": path.encode() if _PLAIN_PATH.fullmatch(path) else quote(path, _PATH_SAFE).encode(),
            "query_string": scope.query_string.encode("latin-1"),
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()],
            "state": self.state.copy(),
        }


def rsgi_app_from_env() -> RSGIEntry:
    """Factory for granian's RSGI workers: the same app as `http.app.app_from_env`, behind the adapter."""
    from effect_ledger.http.app import create_app

    settings = Settings.from_env()
    return RSGIEntry(create_app(settings), settings.max_body_bytes)


__all__ = ["LifespanFailed", "RSGIEntry", "rsgi_app_from_env"]
