"""The RSGI -> ASGI adapter (http/rsgi.py) against a recording fake of granian's protocol object:
the body in one message or in chunks, the disconnect after it, one `response_bytes` for a whole
answer, a stream for one in parts, the scope granian's ASGI would give, the lifespan once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from granian.rsgi import ProtocolClosed
from litestar import Litestar, get

from effect_ledger.http.rsgi import LifespanFailed, RSGIEntry, _Exchange


class Headers(dict[str, str]):
    """granian's RSGI headers: a mapping with lower-case names (items() keeps repeated names)."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs

    def items(self) -> Any:
        return list(self.pairs)


class Scope:
    proto = "http"
    http_version = "1.1"
    server = "127.0.0.1:8000"
    client = "10.1.2.3:54321"
    scheme = "http"
    method = "GET"
    path = "/v1/x y"
    query_string = "limit=1&after=a%20b"
    authority = None

    def __init__(self, headers: list[tuple[str, str]] | None = None) -> None:
        self.headers = Headers(headers or [])


class Transport:
    def __init__(self, closed: bool = False) -> None:
        self.sent: list[bytes] = []
        self.closed = closed

    async def send_bytes(self, data: bytes) -> None:
        if self.closed:
            raise ProtocolClosed("RSGI transport is closed")
        self.sent.append(data)


class Protocol:
    """Records what the adapter asks of granian."""

    def __init__(self, body: bytes = b"", chunks: list[bytes] | None = None, closed: bool = False) -> None:
        self.body = body
        self.chunks = chunks
        self.calls: list[tuple[Any, ...]] = []
        self.disconnected = asyncio.Event()
        self.transport = Transport(closed)

    async def __call__(self) -> bytes:
        self.calls.append(("read",))
        return self.body

    def __aiter__(self) -> AsyncIterator[bytes]:
        self.calls.append(("iterate",))

        async def chunks() -> AsyncIterator[bytes]:
            for chunk in self.chunks or []:
                yield chunk
            yield b""  # granian yields an empty chunk last

        return chunks()

    async def client_disconnect(self) -> None:
        await self.disconnected.wait()

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.calls.append(("bytes", status, headers, body))

    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> Transport:
        self.calls.append(("stream", status, headers))
        return self.transport


START = {"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"application/json")]}


async def test_a_body_with_its_length_is_one_message_then_the_disconnect() -> None:
    protocol = Protocol(b'{"a":1}')
    exchange = _Exchange(protocol, 7)  # type: ignore[arg-type]
    assert await exchange.receive() == {"type": "http.request", "body": b'{"a":1}', "more_body": False}
    waiting = asyncio.create_task(exchange.receive())
    await asyncio.sleep(0)
    assert not waiting.done()  # after the body, receive waits for the client to go away
    protocol.disconnected.set()
    assert await waiting == {"type": "http.disconnect"}
    assert protocol.calls == [("read",)]


class Gone(Protocol):
    """A client that closed the connection before its body was complete."""

    async def __call__(self) -> bytes:
        raise ProtocolClosed("RSGI transport is closed")


async def test_a_client_gone_mid_body_is_a_disconnect_at_once_and_after() -> None:
    exchange = _Exchange(Gone(), 10)  # type: ignore[arg-type]
    assert await exchange.receive() == {"type": "http.disconnect"}
    # granian's client_disconnect() resolves only on a disconnect after the call (never, here)
    assert await asyncio.wait_for(exchange.receive(), 1) == {"type": "http.disconnect"}


async def test_no_body_is_not_read_from_granian() -> None:
    protocol = Protocol()
    exchange = _Exchange(protocol, 0)  # type: ignore[arg-type]
    assert await exchange.receive() == {"type": "http.request", "body": b"", "more_body": False}
    assert protocol.calls == []


async def test_a_body_without_a_length_arrives_in_its_chunks() -> None:
    protocol = Protocol(chunks=[b"ab", b"cd"])
    exchange = _Exchange(protocol, None)  # type: ignore[arg-type]
    assert [await exchange.receive() for _ in range(3)] == [
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"cd", "more_body": True},
        {"type": "http.request", "body": b"", "more_body": False},
    ]
    assert protocol.calls == [("iterate",)]


async def test_a_whole_answer_leaves_in_one_call_with_text_headers() -> None:
    protocol = Protocol()
    exchange = _Exchange(protocol, 0)  # type: ignore[arg-type]
    await exchange.send(START)  # type: ignore[arg-type]
    assert protocol.calls == []  # nothing leaves before the body
    await exchange.send({"type": "http.response.body", "body": b"{}", "more_body": False})  # type: ignore[arg-type]
    exchange.close()
    assert protocol.calls == [("bytes", 201, [("content-type", "application/json")], b"{}")]
    with pytest.raises(RuntimeError, match="already finished"):
        await exchange.send({"type": "http.response.body", "body": b"again"})  # type: ignore[arg-type]


async def test_an_answer_in_parts_is_streamed_and_ended() -> None:
    protocol = Protocol()
    exchange = _Exchange(protocol, 0)  # type: ignore[arg-type]
    await exchange.send(START)  # type: ignore[arg-type]
    for part, more in ((b"one", True), (b"", True), (b"two", False)):
        await exchange.send({"type": "http.response.body", "body": part, "more_body": more})  # type: ignore[arg-type]
    assert exchange.transport is None  # dropped: granian ends the stream
    exchange.close()
    assert protocol.calls == [("stream", 201, [("content-type", "application/json")])]
    assert protocol.transport.sent == [b"one", b"two"]


async def test_a_stream_to_a_client_gone_away_is_not_an_error() -> None:
    protocol = Protocol(closed=True)
    exchange = _Exchange(protocol, 0)  # type: ignore[arg-type]
    await exchange.send(START)  # type: ignore[arg-type]
    await exchange.send({"type": "http.response.body", "body": b"one", "more_body": True})  # type: ignore[arg-type]
    await exchange.send({"type": "http.response.body", "body": b"two", "more_body": False})  # type: ignore[arg-type]
    assert protocol.transport.sent == []


async def test_a_started_answer_without_its_body_is_ended_empty() -> None:
    protocol = Protocol()
    exchange = _Exchange(protocol, 0)  # type: ignore[arg-type]
    await exchange.send(START)  # type: ignore[arg-type]
    exchange.close()
    assert protocol.calls == [("bytes", 201, [("content-type", "application/json")], b"")]


async def test_nothing_sent_leaves_the_answer_to_granian() -> None:
    protocol = Protocol()
    _Exchange(protocol, 0).close()  # type: ignore[arg-type]
    assert protocol.calls == []  # granian answers 500 when the callback returns without an answer


@pytest.mark.parametrize(
    ("version", "headers", "length"),
    [
        ("1.1", [], 0),  # HTTP/1 without Content-Length or chunked coding: no body
        ("1.1", [("content-length", "12")], 12),
        ("1.1", [("content-length", "100")], 100),
        ("1.1", [("content-length", "101")], None),  # over the limit: chunk by chunk, stopped early
        ("1.1", [("transfer-encoding", "chunked")], None),
        ("2", [], None),  # HTTP/2 may carry a body without a length
    ],
)
def test_which_bodies_are_read_in_one_await(
    version: str, headers: list[tuple[str, str]], length: Any
) -> None:
    entry = RSGIEntry(Litestar(), max_body_bytes=100)
    assert entry._length_of(Headers(headers), version) == length


def test_the_scope_is_the_one_granian_asgi_gives() -> None:
    entry = RSGIEntry(Litestar(), max_body_bytes=100)
    entry.state["from_lifespan"] = 1
    request = Scope([("x-a", "1"), ("x-a", "2"), ("authorization", "Bearer t")])
    scope = entry._asgi_scope(request, request.headers)  # type: ignore[arg-type]
    assert scope == {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("10.1.2.3", 54321),
        "scheme": "http",
        "method": "GET",
        "root_path": "",
        "path": "/v1/x y",
        "raw_path": b"/v1/x%20y",
        "query_string": b"limit=1&after=a%20b",
        "headers": [(b"x-a", b"1"), (b"x-a", b"2"), (b"authorization", b"Bearer t")],
        "state": {"from_lifespan": 1},
    }
    assert scope["state"] is not entry.state  # a copy per request, as granian's ASGI worker does


def test_ipv6_addresses_lose_their_brackets() -> None:
    entry = RSGIEntry(Litestar(), max_body_bytes=100)
    ipv6 = Scope()
    ipv6.client, ipv6.server = "[::1]:40000", "[::]:8000"
    scope = entry._asgi_scope(ipv6, ipv6.headers)  # type: ignore[arg-type]
    assert (scope["client"], scope["server"]) == (("::1", 40000), ("::", 8000))


def test_the_lifespan_starts_once_and_stops_once_per_worker() -> None:
    events: list[str] = []

    @get("/")
    async def hello() -> str:
        return "hi"

    app = Litestar(
        [hello], on_startup=[lambda: events.append("up")], on_shutdown=[lambda: events.append("down")]
    )
    entry = RSGIEntry(app, max_body_bytes=100)
    loop = asyncio.new_event_loop()
    try:
        entry.__rsgi_init__(loop)
        assert events == ["up"]
        protocol = Protocol()
        loop.run_until_complete(entry.__rsgi__(Scope(), protocol))  # type: ignore[arg-type]
        entry.__rsgi_del__(loop)
        entry.__rsgi_del__(loop)  # a second call does nothing
    finally:
        loop.close()
    assert events == ["up", "down"]
    status, _, body = protocol.calls[0][1:]
    assert (status, body) == (404, b'{"status_code":404,"detail":"Not Found"}')  # "/v1/x y" is not "/"


def test_a_failed_startup_stops_the_worker() -> None:
    def fail() -> None:
        raise RuntimeError("no database")

    entry = RSGIEntry(Litestar(on_startup=[fail]), max_body_bytes=100)
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(LifespanFailed):  # the worker process exits with 1
            entry.__rsgi_init__(loop)
    finally:
        loop.close()
