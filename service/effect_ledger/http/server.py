"""`serve`'s own HTTP/1.1 server (EFFECT_LEDGER_HTTP_SERVER=ledger): an asyncio Protocol on uvloop.

One connection is one `Connection` (an asyncio Protocol); httptools (llhttp, in C) parses the bytes,
and each request is one `Exchange` with the ASGI `receive` and `send` of the unchanged app
(`http.app.app_from_env`). What it leaves out against a general server is what costs per request: no
thread hand-over (the parser runs in the event loop's own callback), one task per request, the scope
built once, a body whose `Content-Length` is within `MAX_BODY_BYTES` read whole before the app runs
(one `http.request` message), and an answer of start + one body written with one `transport.write`.
Timeouts cost nothing per request: one ticker per worker, once a second, compares each connection's
phase with the tick it began at. Measured: docs/performance.md, "Issue 20 item 3, round 4".

The rules, each with a test in tests/acceptance/test_own_server.py:
- keep-alive for HTTP/1.1 unless `Connection: close`; HTTP/1.0 closes after each answer;
- pipelined requests are answered in order, one at a time (reading pauses while one waits);
- bodies with `Content-Length` or chunked; a length over `MAX_BODY_BYTES`, or a chunked body, streams
  to the app chunk by chunk (at most HIGH_WATER unread bytes buffered; reading pauses above it), so the
  app's own limit answers 413; a connection whose request body was not read to its end closes after
  the answer;
- the request line and headers over MAX_HEAD_BYTES or MAX_HEADER_FIELDS: 431; a request that cannot
  be parsed: 400; a request not complete `HTTP_REQUEST_TIMEOUT_SECONDS` after its first byte (slow
  loris): 408; each with `Connection: close`, as problem+json;
- an idle connection closes after `HTTP_KEEP_ALIVE_SECONDS`;
- `Expect: 100-continue`: `100 Continue` when the server is about to read the body;
- a client that goes away: the app's `receive` answers `http.disconnect`, its sends are dropped;
- backpressure: while the transport's write buffer is over its high-water mark, `send` waits and the
  connection's reading pauses;
- graceful shutdown (`Worker.shutdown`): no new connections, idle ones closed, requests in flight
  finished within the timeout (their connections closed after the answer), then the rest cut.
"""

from __future__ import annotations

import asyncio
import http
from collections import deque
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote

import httptools
import msgspec
import structlog

from effect_ledger.domain.errors import PROBLEMS

ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]

MAX_HEAD_BYTES = 16 * 1024  # the request line and header fields, without their framing
MAX_HEADER_FIELDS = 100
HIGH_WATER = 64 * 1024  # unread body bytes of a streamed request before reading pauses
LINGER_SECONDS = 2  # after a last answer with bytes unread: how long what still arrives is dropped
LINGER_BYTES = 1024 * 1024  # ... and how much of it

_ASGI_VERSION = {"version": "3.0", "spec_version": "2.3"}
_DISCONNECT = {"type": "http.disconnect"}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CLOSE = b"connection: close\r\n"
_CHUNKED = b"transfer-encoding: chunked\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
_NO_BODY = frozenset(range(100, 200)) | {204, 304}

# why reading is paused: any reason set keeps it paused
_PIPELINE, _BODY, _WRITE, _DONE = 1, 2, 4, 8

log = structlog.get_logger("effect_ledger.http")


def _status_line(code: int) -> bytes:
    try:
        phrase = http.HTTPStatus(code).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {code} {phrase}\r\n".encode("ascii")


STATUS_LINES = {code: _status_line(code) for code in range(100, 600)}


class _Refused(Exception):
    """A request the server answers itself (raised in a parser callback)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def problem_answer(code: str, detail: str) -> bytes:
    """A whole problem+json answer with `Connection: close`, for what the server refuses itself."""
    status, title = PROBLEMS[code]
    body = msgspec.json.encode(
        {
            "type": f"urn:effect-ledger:problem:{code}",
            "title": title,
            "status": status,
            "code": code,
            "detail": detail,
        }
    )
    return b"".join(
        (
            STATUS_LINES[status],
            b"content-type: application/problem+json\r\ncontent-length: ",
            str(len(body)).encode("ascii"),
            b"\r\n",
            _CLOSE,
            b"\r\n",
            body,
        )
    )


class Worker:
    """What one worker process's connections share: the app, its limits, the clock, the open
    connections and the requests in flight."""

    def __init__(
        self,
        app: ASGIApp,
        state: dict[str, Any],
        *,
        max_body_bytes: int,
        keep_alive_seconds: int,
        request_timeout_seconds: int,
    ) -> None:
        self.app = app
        self.state = state  # the lifespan's state, copied into each request's scope
        self.max_body_bytes = max_body_bytes
        self.keep_alive_ticks = keep_alive_seconds
        self.request_timeout_ticks = request_timeout_seconds
        self.loop = asyncio.get_running_loop()
        self.connections: set[Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.tick = 0
        self.date = b""
        self._date_now()

    def _date_now(self) -> None:
        self.date = b"date: " + formatdate(usegmt=True).encode("ascii") + b"\r\n"

    def on_tick(self) -> None:
        """Once a second: the Date header, then every connection's timeouts."""
        self.tick += 1
        self._date_now()
        for connection in list(self.connections):
            connection.check_timeouts(self.tick)

    def shutdown(self) -> None:
        """Stop taking requests: idle connections close now, busy ones after their answer."""
        self.stopping = True
        for connection in list(self.connections):
            connection.shutdown()

    async def drain(self, within: float) -> bool:
        """Wait for the requests in flight, at most `within` s; True when none is left."""
        deadline = self.loop.time() + within
        while self.tasks and self.loop.time() < deadline:
            await asyncio.wait(list(self.tasks), timeout=deadline - self.loop.time())
        return not self.tasks

    def cut(self) -> None:
        """After the drain's timeout: abort every connection, cancel what still runs."""
        for connection in list(self.connections):
            connection.transport.abort()
        for task in list(self.tasks):
            task.cancel()


class Exchange:
    """One request and its answer: the ASGI scope, `receive` and `send`."""

    __slots__ = (
        "begun",
        "body",
        "buffered",
        "complete",
        "connection",
        "continued",
        "delivered",
        "finished",
        "framing",
        "gone",
        "head",
        "headers",
        "keep_alive",
        "scope",
        "started",
        "status",
        "stream",
        "unread",
        "waiter",
    )

    def __init__(
        self, connection: Connection, scope: dict[str, Any], keep_alive: bool, buffered: bool
    ) -> None:
        self.connection = connection
        self.scope = scope
        self.keep_alive = keep_alive
        self.buffered = buffered  # the whole body arrives before the app runs
        self.begun = connection.worker.tick
        self.body: list[bytes] = []
        self.stream: list[bytes] = []  # streamed body chunks the app has not read yet
        self.unread = 0
        self.complete = False  # the request's last byte arrived
        self.delivered = False  # the app has the whole body
        self.continued = False  # `100 Continue` sent, or not needed
        self.started = False
        self.finished = False  # the answer's last byte was written
        self.head = False  # the answer's head was written (a streamed answer)
        self.framing = b""  # how a streamed answer's body is framed: b"chunked", b"length" or b"close"
        self.gone = False  # the client went away
        self.status = 0
        self.headers: Any = ()
        self.waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self.waiter = self.connection.worker.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    async def run(self) -> None:
        """Call the app; answer 500 when it fails (or returns) without an answer."""
        try:
            await self.connection.worker.app(self.scope, self.receive, self.send)
        except Exception as exc:
            log.error("app_failed", exception_type=type(exc).__name__, path=self.scope["path"])
            self._fail()
        else:
            if not self.finished and not self.gone:
                if not self.started:
                    log.error("app_no_answer", path=self.scope["path"])
                self._fail()
        finally:
            if not self.finished:
                self._done()

    def _fail(self) -> None:
        if self.gone or self.finished:
            return  # nobody to tell, or answered already (a failure after the answer is only logged)
        if self.head:  # an answer cut mid-way: the client must see it end
            self.connection.transport.close()
        else:
            self.keep_alive = False
            self.connection.transport.write(problem_answer("internal", "The server failed."))

    async def receive(self) -> Any:  # an ASGI message
        """The body (one message when it was buffered; else chunks as they arrive), then
        `http.disconnect` once the client went away or the answer is complete."""
        if self.buffered:
            if not self.delivered:
                self.delivered = True
                body = self.body
                return {
                    "type": "http.request",
                    "body": body[0] if len(body) == 1 else b"".join(body),
                    "more_body": False,
                }
        else:
            if not self.continued and not self.gone and not self.started:
                self.continued = True
                self.connection.transport.write(_CONTINUE)
            while not self.delivered:
                if self.gone:
                    return _DISCONNECT
                if self.stream or self.complete:
                    return self._chunk()
                await self._wait()
        while not self.gone and not self.finished:
            await self._wait()
        return _DISCONNECT

    def _chunk(self) -> dict[str, Any]:
        stream = self.stream
        body = stream[0] if len(stream) == 1 else b"".join(stream)
        stream.clear()
        self.unread = 0
        self.connection.resume(_BODY)
        if self.complete:
            self.delivered = True
        return {"type": "http.request", "body": body, "more_body": not self.complete}

    async def send(self, message: Any) -> None:  # an ASGI message
        """The answer: start + one body in one write; a body in parts with its length, or chunked."""
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("ASGI flow error: response already started")
            self.started = True
            self.status = message["status"]
            self.headers = message.get("headers", ())
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unsupported ASGI message {kind!r}")
        if not self.started:
            raise RuntimeError("ASGI flow error: response not started")
        if self.finished:
            raise RuntimeError("ASGI flow error: response already finished")
        if self.gone:
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        connection = self.connection
        write = connection.transport.write
        if not self.head:
            head, self.framing = self._head(len(body), more)
            self.head = True
            if self.framing == b"none":  # HEAD, 1xx, 204, 304: no body, whatever the app sent
                write(head)
            elif not more:
                write(head + body)  # the usual case: the whole answer at once
            elif self.framing == b"chunked":
                write(head + b"%x\r\n%s\r\n" % (len(body), body) if body else head)
            else:
                write(head + body)
        elif self.framing == b"chunked":
            if body:
                write(b"%x\r\n%s\r\n" % (len(body), body))
            if not more:
                write(_LAST_CHUNK)
        elif body and self.framing != b"none":
            write(body)
        if not more:
            self._done()
        elif connection.write_paused:
            await connection.drained()

    def _head(self, length: int, more: bool) -> tuple[bytes, bytes]:
        """The status line and headers; how the body is framed (b"none", b"length", b"chunked", b"close")."""
        connection = self.connection
        lines = [STATUS_LINES[self.status]]
        framed = False
        for name, value in self.headers:
            if name == b"content-length" or name == b"transfer-encoding":
                framed = True
            elif name == b"connection" and value.lower() == b"close":
                self.keep_alive = False
                continue
            lines.append(b"%s: %s\r\n" % (name, value))
        if self.status in _NO_BODY or self.scope["method"] == "HEAD":
            framing = b"none"
        elif framed:
            framing = b"length"
        elif not more:
            framing = b"length"
            lines.append(b"content-length: %d\r\n" % length)
        elif self.scope["http_version"] == "1.1":
            framing = b"chunked"
            lines.append(_CHUNKED)
        else:
            framing = b"close"
            self.keep_alive = False  # HTTP/1.0: the body ends where the connection does
        lines.append(connection.worker.date)
        if not self.keep_alive or not self.complete or connection.worker.stopping:
            self.keep_alive = False
            lines.append(_CLOSE)
        head = b"".join(lines)
        if head.count(b"\n") != len(lines) or head.count(b"\r") != len(lines):
            raise RuntimeError("a header name or value holds CR or LF")
        return head + b"\r\n", framing

    def _done(self) -> None:
        self.finished = True
        self.wake()
        self.connection.answered(self)


class Connection(asyncio.Protocol):
    """One client connection: parses requests, runs them one at a time, in order."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.cycle: Exchange | None = None  # the request the app is answering
        self.reading: Exchange | None = None  # the request being parsed (after its head)
        self.pipeline: deque[Exchange] = deque()  # parsed requests waiting for their turn
        self.idle_since: int | None = worker.tick  # no request begun since this tick
        self.begun = 0  # the tick the request being parsed began at
        self.parsing = False  # between a request's first byte and its last
        self.refusal: bytes | None = None  # answered once the requests before it are
        self.paused = 0
        self.write_paused = False
        self.drainers: list[asyncio.Future[None]] = []
        self.lost = False
        self.lingering = False  # answered for the last time; dropping what still arrives
        self.linger_since = 0
        self.lingered = 0
        # the head being parsed
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        self.length: bytes | None = None
        self.chunked = False
        self.expect = False

    # asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.worker.stopping:
            transport.close()
            return
        self.worker.connections.add(self)
        server = transport.get_extra_info("sockname")
        client = transport.get_extra_info("peername")
        self.server = (str(server[0]), int(server[1])) if isinstance(server, tuple) else None
        self.client = (str(client[0]), int(client[1])) if isinstance(client, tuple) else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.worker.connections.discard(self)
        for exchange in (self.cycle, self.reading, *self.pipeline):
            if exchange is not None:
                exchange.gone = True
                exchange.wake()
        self.pipeline.clear()
        self._release_drainers()

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            self.lingered += len(data)
            if self.lingered > LINGER_BYTES:
                self.transport.close()
            return
        if self.refusal is not None:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as failed:
            refused = failed.__context__
            if isinstance(refused, _Refused):
                self.refuse(refused.code, refused.detail)
            else:
                log.error("http_parser_callback_failed", exception_type=type(refused).__name__)
                self.refuse("malformed_request", "The request could not be parsed.")
        except httptools.HttpParserUpgrade:
            # an Upgrade (WebSocket, h2c) the app does not serve: answer the request as sent, then close
            self.pause(_DONE)
            for exchange in (self.cycle, *self.pipeline):
                if exchange is not None:
                    exchange.keep_alive = False
        except httptools.HttpParserError:
            self.refuse("malformed_request", "The request is not valid HTTP/1.1.")

    def eof_received(self) -> bool | None:
        if self.lingering:
            return None  # the client has read the answer and closed: close
        # the client half-closed: answer what it sent (a half-closed client may still read), then close
        reading = self.reading
        if reading is not None and not reading.complete:  # its body will not come
            reading.gone = True
            reading.wake()
        if self.cycle is None and not self.pipeline:
            return None  # close now
        for exchange in (self.cycle, *self.pipeline):
            if exchange is not None:
                exchange.keep_alive = False
        return True

    def pause_writing(self) -> None:
        self.write_paused = True
        self.pause(_WRITE)

    def resume_writing(self) -> None:
        self.write_paused = False
        self._release_drainers()
        self.resume(_WRITE)

    # httptools' side

    def on_message_begin(self) -> None:
        self.idle_since = None
        self.parsing = True
        self.begun = self.worker.tick
        self.url = b""
        self.headers = []
        self.head_bytes = 0
        self.length = None
        self.chunked = False
        self.expect = False

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.head_bytes += len(url)
        if self.head_bytes > MAX_HEAD_BYTES:
            raise _Refused(
                "headers_too_large", f"The request line and headers are over {MAX_HEAD_BYTES} bytes."
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value)
        if self.head_bytes > MAX_HEAD_BYTES or len(self.headers) >= MAX_HEADER_FIELDS:
            raise _Refused(
                "headers_too_large",
                f"The request line and headers are over {MAX_HEAD_BYTES} bytes or {MAX_HEADER_FIELDS} lines.",
            )
        name = name.lower()
        if name == b"content-length":
            self.length = value
        elif name == b"transfer-encoding":
            self.chunked = True
        elif name == b"expect" and value.lower() == b"100-continue":
            self.expect = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        worker = self.worker
        url = self.url
        if url[:1] == b"/" and b"#" not in url:
            raw_path, _, query = url.partition(b"?")
        else:
            parsed = httptools.parse_url(url)  # absolute-form (a proxy's) or asterisk-form
            raw_path, query = parsed.path or b"/", parsed.query or b""
        path = raw_path.decode("latin-1")
        if "%" in path:
            path = unquote(path, encoding="utf-8", errors="surrogateescape")
        version = parser.get_http_version()
        scope = {
            "type": "http",
            "asgi": _ASGI_VERSION,
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": "http",
            "method": parser.get_method().decode("ascii"),
            "root_path": "",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "headers": self.headers,
            "state": worker.state.copy(),
        }
        if self.length is not None:
            length = int(self.length)  # llhttp accepts digits only, and one length
            buffered = length <= worker.max_body_bytes
        else:
            buffered = not self.chunked  # no length, no chunked coding: no body (RFC 9112 6.3)
        keep_alive = version == "1.1" and parser.should_keep_alive() and not worker.stopping
        exchange = Exchange(self, scope, keep_alive, buffered)
        exchange.begun = self.begun
        exchange.continued = not self.expect
        self.reading = exchange
        if not buffered:
            self._enqueue(exchange)  # the app reads the body as it arrives (and may refuse it early)
        elif exchange.continued:
            pass
        elif self.cycle is None:
            exchange.continued = True
            self.transport.write(_CONTINUE)
        # else: `100 Continue` once the answers before it are written (Connection.answered)

    def on_body(self, body: bytes) -> None:
        exchange = self.reading
        assert exchange is not None
        if exchange.buffered:
            exchange.body.append(body)
            return
        if exchange.finished:
            return  # answered already: the connection closes, the rest is not kept
        exchange.stream.append(body)
        exchange.unread += len(body)
        if exchange.unread > HIGH_WATER:
            self.pause(_BODY)
        exchange.wake()

    def on_message_complete(self) -> None:
        exchange = self.reading
        assert exchange is not None
        self.reading = None
        self.parsing = False
        exchange.complete = True
        if exchange.buffered:
            self._enqueue(exchange)
        else:
            exchange.wake()

    # requests in order

    def _enqueue(self, exchange: Exchange) -> None:
        if self.cycle is None:
            self._start(exchange)
        else:
            self.pipeline.append(exchange)
            self.pause(_PIPELINE)

    def _start(self, exchange: Exchange) -> None:
        self.cycle = exchange
        worker = self.worker
        task = worker.loop.create_task(exchange.run())
        worker.tasks.add(task)
        task.add_done_callback(worker.tasks.discard)

    def answered(self, exchange: Exchange) -> None:
        """The answer's last byte is written: the next request, or close, or wait idle."""
        if self.cycle is not exchange:
            return
        self.cycle = None
        transport = self.transport
        if self.lost or transport.is_closing():
            return
        if not exchange.complete or (not exchange.keep_alive and (self.parsing or self.pipeline)):
            self.linger()  # bytes the client sent were not read: a plain close could reset the answer
            return
        if not exchange.keep_alive:
            transport.close()
            return
        if self.pipeline:
            following = self.pipeline.popleft()
            if not self.pipeline:
                self.resume(_PIPELINE)
            self._start(following)
            return
        if self.refusal is not None:
            transport.write(self.refusal)
            self.linger()
            return
        reading = self.reading
        if reading is not None and not reading.continued:
            reading.continued = True
            transport.write(_CONTINUE)
        if not self.parsing:
            self.idle_since = self.worker.tick

    def refuse(self, code: str, detail: str) -> None:
        """Answer a request the server cannot pass on, after those before it; then close."""
        log.info("http_refused", status=PROBLEMS[code][0], code=code)  # the app never saw it: no summary line
        self.pause(_DONE)
        reading, self.reading = self.reading, None
        self.parsing = False
        self.refusal = problem_answer(code, detail)
        if reading is not None:
            reading.gone = True  # a streamed body the app is reading, or will read: it ends here
            reading.wake()
            if reading is self.cycle:
                if reading.started:
                    self.transport.close()  # an answer cut mid-way
                else:
                    self.transport.write(self.refusal)
                    self.linger()
                return
            if reading in self.pipeline:
                self.pipeline.remove(reading)
        if self.cycle is None:
            self.transport.write(self.refusal)
            self.linger()

    def linger(self) -> None:
        """Close after an answer while the client may still be sending (a body not read, a refused
        head): end our side (FIN after the answer), read and drop what still comes for up to
        LINGER_SECONDS or LINGER_BYTES, then close. Closing a socket with unread bytes sends a reset,
        which can destroy the answer before the client has read it."""
        transport = self.transport
        if self.lingering or transport.is_closing():
            return
        self.lingering = True
        self.linger_since = self.worker.tick
        self.idle_since = None
        self.parsing = False
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        if self.paused:
            self.paused = 0
            transport.resume_reading()

    # timeouts and shutdown

    def check_timeouts(self, tick: int) -> None:
        """Called once a second: close an idle connection, refuse a request that takes too long to
        arrive (while this side reads: not while reading waits for an answer or a full buffer)."""
        worker = self.worker
        if self.lingering:
            if tick - self.linger_since > LINGER_SECONDS:
                self.transport.close()
        elif self.idle_since is not None:
            if tick - self.idle_since > worker.keep_alive_ticks:
                self.transport.close()
        elif self.parsing and not self.paused and tick - self.begun > worker.request_timeout_ticks:
            self.refuse("request_timeout", "The request was not complete within the time limit.")

    def shutdown(self) -> None:
        """Graceful shutdown: close when idle, else after the answer in flight."""
        if self.cycle is None:
            self.transport.close()
            return
        self.cycle.keep_alive = False
        self.pipeline.clear()
        if self.cycle.complete:
            self.pause(_DONE)

    # flow control

    def pause(self, reason: int) -> None:
        if not self.paused and not self.lost and not self.transport.is_closing():
            self.transport.pause_reading()
        self.paused |= reason

    def resume(self, reason: int) -> None:
        if self.paused & reason:
            self.paused &= ~reason
            if not self.paused and not self.lost and not self.transport.is_closing():
                self.transport.resume_reading()

    async def drained(self) -> None:
        if self.lost:
            return
        waiter = self.worker.loop.create_future()
        self.drainers.append(waiter)
        await waiter

    def _release_drainers(self) -> None:
        for waiter in self.drainers:
            if not waiter.done():
                waiter.set_result(None)
        self.drainers.clear()


__all__ = ["MAX_HEADER_FIELDS", "MAX_HEAD_BYTES", "Connection", "Exchange", "Worker", "problem_answer"]
