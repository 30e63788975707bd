"""http/server.py's Connection against a recording transport: what each request writes, in what order,
and when reading pauses (backpressure, pipelining) — the parts a socket test cannot time exactly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from effect_ledger.http.server import Connection, Worker


class Transport:
    """Records writes and the reading state, as a uvloop TCP transport would see them."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.reading = True
        self.closed = False
        self.eof = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 8000 if name == "sockname" else 50000)

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        assert self.reading
        self.reading = False

    def resume_reading(self) -> None:
        assert not self.reading
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode()


async def connected(app: Any) -> tuple[Connection, Transport]:
    worker = Worker(app, {"k": 1}, max_body_bytes=1024, keep_alive_seconds=5, request_timeout_seconds=5)
    connection = Connection(worker)
    transport = Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_request_one_write_with_the_scope_built_once() -> None:
    seen: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)
        assert await receive() == {"type": "http.request", "body": b'{"a":1}', "more_body": False}
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"x/y")]})
        await send({"type": "http.response.body", "body": b"done"})

    connection, transport = await connected(app)
    connection.data_received(
        b"POST /v1/a%20b?q=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n" + b'{"a":1}'
    )
    await settle()
    (scope,) = seen
    assert (scope["method"], scope["path"], scope["raw_path"], scope["query_string"]) == (
        "POST",
        "/v1/a b",
        b"/v1/a%20b",
        b"q=1",
    )
    assert scope["headers"] == [(b"host", b"x"), (b"content-length", b"7")]
    assert scope["state"] == {"k": 1} and scope["client"] == ("127.0.0.1", 50000)
    (answer,) = transport.written  # one write
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 201 Created"
    assert lines[1:3] == [b"content-type: x/y", b"content-length: 4"]
    assert lines[3].startswith(b"date: ") and len(lines) == 4
    assert body == b"done" and not transport.closed


async def test_pipelined_requests_run_one_at_a_time_in_order_and_reading_pauses() -> None:
    order: list[str] = []
    gate = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        order.append("start " + scope["path"])
        if scope["path"] == "/1":
            await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["path"].encode()})
        order.append("end " + scope["path"])

    connection, transport = await connected(app)
    connection.data_received(get("/1") + get("/2") + get("/3"))
    await settle()
    assert order == ["start /1"] and not transport.reading  # two waiting: reading paused
    gate.set()
    await settle()
    assert order == ["start /1", "end /1", "start /2", "end /2", "start /3", "end /3"]
    assert [w.rpartition(b"\r\n\r\n")[2] for w in transport.written] == [b"/1", b"/2", b"/3"]
    assert transport.reading


async def test_a_full_write_buffer_pauses_reading_and_holds_a_streamed_answer() -> None:
    sent: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for n in range(3):
            await send({"type": "http.response.body", "body": b"part", "more_body": True})
            sent.append(n)
        await send({"type": "http.response.body", "body": b""})

    connection, transport = await connected(app)
    connection.pause_writing()  # the transport's buffer is over its high-water mark
    assert not transport.reading
    connection.data_received(get("/stream"))
    await settle()
    assert sent == []  # the first part was written, then send waits for the buffer to drain
    assert b"transfer-encoding: chunked" in transport.written[0]
    connection.resume_writing()
    await settle()
    assert sent == [0, 1, 2] and transport.reading
    assert transport.written[-1] == b"0\r\n\r\n"


async def test_a_header_value_with_a_line_break_is_not_written() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 302, "headers": [(b"location", b"/a\r\nx: y")]})
        await send({"type": "http.response.body", "body": b""})

    connection, transport = await connected(app)
    connection.data_received(get("/redirect"))
    await settle()
    (answer,) = transport.written
    assert answer.startswith(b"HTTP/1.1 500 ") and b"x: y" not in answer
    assert b'"code":"internal"' in answer and b"connection: close" in answer


@pytest.mark.parametrize("version", ["1.0", "1.1"])
async def test_a_streamed_answer_to_http_10_ends_with_the_connection(version: str) -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b"})

    connection, transport = await connected(app)
    connection.data_received(f"GET / HTTP/{version}\r\nhost: x\r\n\r\n".encode())
    await settle()
    if version == "1.0":
        assert b"transfer-encoding" not in transport.written[0] and transport.written[1:] == [b"b"]
        assert transport.closed
    else:
        assert transport.written[1:] == [b"1\r\nb\r\n", b"0\r\n\r\n"] and not transport.closed
