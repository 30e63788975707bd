"""`serve` under its own HTTP/1.1 server (EFFECT_LEDGER_HTTP_SERVER=ledger, http/server.py), over real
sockets: keep-alive, HTTP/1.0 and `Connection: close`, pipelining in order, chunked and oversize bodies,
the header limit, idle and slow-request timeouts, `Expect: 100-continue`, a client gone mid-request,
graceful shutdown with a request in flight, two workers, and a worker's death."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from test_shutdown import sigterm_during_a_request, two_workers

from support.auth import auth
from support.serve_process import Served, alive, kill_quietly, spawned_workers, start_serve
from support.server import free_port
from support.waiting import until

pytestmark = pytest.mark.slow

MAX_BODY = 4096
KEEP_ALIVE = 2
REQUEST_TIMEOUT = 2
CLAIM = {"tool": "t", "tool_version": "1", "intent": {"n": 1}, "lease_seconds": 60}
AUTH = auth()["Authorization"]

Answer = tuple[int, dict[str, str], bytes]


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    running = await start_serve(
        tmp_path_factory.mktemp("own-server"),
        http_server="ledger",
        background_sweep="false",
        max_body_bytes=str(MAX_BODY),
        http_keep_alive_seconds=str(KEEP_ALIVE),
        http_request_timeout_seconds=str(REQUEST_TIMEOUT),
    )
    try:
        yield running
    finally:
        await kill_quietly(running)


class Client:
    """One raw TCP connection: bytes out, HTTP/1.1 answers parsed back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, served: Served) -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self, within: float = 20) -> Answer:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), within)
        status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
        version, status, _ = status_line.split(" ", 2)
        assert version == "HTTP/1.1"
        headers: dict[str, str] = {}
        for line in lines:
            name, _, value = line.partition(":")
            assert name.lower() not in headers, f"header {name} twice"
            headers[name.lower()] = value.strip()
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                body += chunk[:-2]
        elif int(status) in (100, 204, 304):
            body = b""
        else:
            body = await self.reader.readexactly(int(headers["content-length"]))
        return int(status), headers, body

    async def closed(self, within: float = 10) -> bool:
        """Whether the server closes the connection within `within` s (nothing more arrives)."""
        rest = await asyncio.wait_for(self.reader.read(), within)
        assert rest == b"", rest
        return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


def request(method: str, path: str, body: bytes | None = None, *extra: str, version: str = "1.1") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "host: 127.0.0.1", f"authorization: {AUTH}", *extra]
    if body is not None:
        lines += ["content-type: application/json", f"content-length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def claim(operation: str) -> bytes:
    return request("POST", f"/v1/operations/{operation}/claim", json.dumps(CLAIM).encode())


def problem(answer: Answer) -> tuple[int, str, str]:
    status, headers, body = answer
    assert headers["content-type"] == "application/problem+json"
    document = json.loads(body)
    assert (
        document["status"] == status and document["type"] == f"urn:effect-ledger:problem:{document['code']}"
    )
    return status, document["code"], headers.get("connection", "")


async def status_of(served: Served, operation: str) -> int:
    async with httpx.AsyncClient(base_url=served.base_url, headers=auth(), timeout=20) as http:
        return (await http.get(f"/v1/operations/{operation}")).status_code


async def test_keep_alive_serves_several_requests_on_one_connection(served: Served) -> None:
    client = await Client.open(served)
    try:
        for n in range(3):
            await client.send(claim(f"ka-{n}"))
            status, headers, body = await client.answer()
            assert status == 201, body
            assert "connection" not in headers
            assert json.loads(body)["claim"]["token"]
        await client.send(request("GET", "/livez"))
        status, headers, _ = await client.answer()
        assert status == 200 and headers["date"].endswith(" GMT")
    finally:
        await client.close()


async def test_http_10_and_connection_close_close_after_the_answer(served: Served) -> None:
    for raw in (request("GET", "/livez", version="1.0"), request("GET", "/livez", None, "connection: close")):
        client = await Client.open(served)
        try:
            await client.send(raw)
            status, headers, _ = await client.answer()
            assert (status, headers["connection"]) == (200, "close")
            assert await client.closed()
        finally:
            await client.close()


async def test_pipelined_requests_are_answered_in_order_one_after_the_other(served: Served) -> None:
    client = await Client.open(served)
    try:
        # the second claim of one ID sees the first: 201, then 409 in progress; the read in between
        await client.send(claim("pipe-1") + request("GET", "/v1/operations/pipe-1") + claim("pipe-1"))
        first, second, third = [await client.answer() for _ in range(3)]
        assert first[0] == 201
        assert second[0] == 200 and json.loads(second[2])["status"] == "pending"
        assert problem(third) == (409, "operation_in_progress", "")
    finally:
        await client.close()


async def test_a_chunked_body_is_read_whole(served: Served) -> None:
    body = json.dumps(CLAIM).encode()
    head = request("POST", "/v1/operations/chunked-1/claim", None, "content-type: application/json")
    chunked = head[:-2] + b"transfer-encoding: chunked\r\n\r\n"
    parts = [body[:10], body[10:25], body[25:]]
    client = await Client.open(served)
    try:
        await client.send(chunked)
        for part in parts:  # in separate writes, as a streaming client sends them
            await client.send(b"%x\r\n%s\r\n" % (len(part), part))
            await asyncio.sleep(0.05)
        await client.send(b"0\r\n\r\n")
        status, _, answer = await client.answer()
        assert status == 201, answer
        assert await status_of(served, "chunked-1") == 200
        await client.send(request("GET", "/livez"))  # the connection stays usable
        assert (await client.answer())[0] == 200
    finally:
        await client.close()


async def test_an_oversize_body_is_refused_with_413_and_nothing_is_written(served: Served) -> None:
    padded = json.dumps({**CLAIM, "intent": {"pad": "x" * MAX_BODY}}).encode()
    assert len(padded) > MAX_BODY
    # a declared length far over the limit, of which only the start is sent: refused early, and closed
    head = request("POST", "/v1/operations/big-1/claim", padded)[: -len(padded)]
    client = await Client.open(served)
    try:
        await client.send(head.replace(b"content-length: %d" % len(padded), b"content-length: 10000000"))
        await client.send(padded)
        answer = await client.answer()
        assert problem(answer) == (413, "payload_too_large", "close")
        assert await client.closed()
    finally:
        await client.close()
    # chunked, over the limit, sent to its end: refused. The app refuses once it has read past the
    # limit; whether the server had read the body's last chunk by the time the answer was written is a
    # race with the sender (on a busy machine the rest may still be in flight). Either way the rule of
    # http/server.py holds exactly: read to its end, the connection stays usable; not, the answer says
    # `Connection: close` and the connection closes (no reset).
    head = request("POST", "/v1/operations/big-2/claim", None, "content-type: application/json")
    client = await Client.open(served)
    try:
        await client.send(head[:-2] + b"transfer-encoding: chunked\r\n\r\n")
        for start in range(0, len(padded), 1000):
            part = padded[start : start + 1000]
            await client.send(b"%x\r\n%s\r\n" % (len(part), part))
        await client.send(b"0\r\n\r\n")
        answer = await client.answer()
        status, code, connection = problem(answer)
        assert (status, code) == (413, "payload_too_large") and connection in ("", "close"), answer
        if connection == "close":
            assert await client.closed()
        else:
            await client.send(request("GET", "/livez"))
            assert (await client.answer())[0] == 200
    finally:
        await client.close()
    assert await status_of(served, "big-1") == 404
    assert await status_of(served, "big-2") == 404


async def test_headers_over_the_limit_are_refused_with_431(served: Served) -> None:
    for extra in (["x-big: " + "a" * 17000], [f"x-n{n}: v" for n in range(101)]):
        client = await Client.open(served)
        try:
            await client.send(request("GET", "/livez", None, *extra))
            assert problem(await client.answer()) == (431, "headers_too_large", "close")
            assert await client.closed()
        finally:
            await client.close()
    client = await Client.open(served)  # just under: served
    try:
        await client.send(request("GET", "/livez", None, *[f"x-n{n}: v" for n in range(90)]))
        assert (await client.answer())[0] == 200
    finally:
        await client.close()
    refused = [line for line in served.log().splitlines() if '"http_refused"' in line]
    assert [json.loads(line)["code"] for line in refused].count("headers_too_large") == 2  # one per refusal


async def test_a_request_that_is_not_http_is_refused_with_400(served: Served) -> None:
    client = await Client.open(served)
    try:
        await client.send(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\nNOT HTTP AT ALL\r\n\r\n")
        assert (await client.answer())[0] == 200  # the request before the garbage is answered first
        assert problem(await client.answer()) == (400, "malformed_request", "close")
        assert await client.closed()
    finally:
        await client.close()


async def test_an_idle_connection_closes_after_the_keep_alive_time(served: Served) -> None:
    client = await Client.open(served)
    try:
        await client.send(request("GET", "/livez"))
        assert (await client.answer())[0] == 200
        started = asyncio.get_running_loop().time()
        assert await client.closed(within=KEEP_ALIVE + 15)
        waited = asyncio.get_running_loop().time() - started
        assert KEEP_ALIVE - 0.5 <= waited <= KEEP_ALIVE + 12, (
            waited
        )  # not before; the bound is for a broken build
    finally:
        await client.close()


async def test_a_slow_request_is_answered_408_and_closed(served: Served) -> None:
    client = await Client.open(served)
    try:
        await client.send(b"GET /livez HTTP/1.1\r\nhost: x\r\n")  # the head never ends (slow loris)
        for _ in range(3):
            await asyncio.sleep(0.5)
            await client.send(b"x-more: 1\r\n")
        assert problem(await client.answer(within=REQUEST_TIMEOUT + 5)) == (408, "request_timeout", "close")
        assert await client.closed()
    finally:
        await client.close()


async def test_expect_100_continue_is_answered_before_the_body_is_sent(served: Served) -> None:
    body = json.dumps(CLAIM).encode()
    raw = request("POST", "/v1/operations/expect-1/claim", body, "expect: 100-continue")
    head, payload = raw[: -len(body)], body
    client = await Client.open(served)
    try:
        await client.send(head)
        assert (await client.answer())[0] == 100  # before any byte of the body
        await client.send(payload)
        status, _, answer = await client.answer()
        assert status == 201, answer
    finally:
        await client.close()


async def test_a_client_gone_mid_body_creates_nothing_and_the_server_carries_on(served: Served) -> None:
    body = json.dumps(CLAIM).encode()
    head = request("POST", "/v1/operations/gone-1/claim", None, "content-type: application/json")
    client = await Client.open(served)
    await client.send(head[:-2] + b"transfer-encoding: chunked\r\n\r\n")
    await client.send(b"%x\r\n%s\r\n" % (10, body[:10]))  # the app is reading: it waits for more
    await asyncio.sleep(0.3)
    client.writer.transport.abort()  # gone
    await asyncio.sleep(0.5)
    # the same with a length, cut before the body is complete (the app is never called)
    client = await Client.open(served)
    await client.send(request("POST", "/v1/operations/gone-2/claim", body)[:-5])
    await asyncio.sleep(0.3)
    client.writer.transport.abort()
    assert await status_of(served, "gone-1") == 404
    assert await status_of(served, "gone-2") == 404

    def summaries() -> list[tuple[str, int]]:
        lines = [json.loads(line) for line in served.log().splitlines() if line.startswith("{")]
        return [
            (line["operation_id"], line["status"])
            for line in lines
            if line.get("event") == "request" and str(line.get("operation_id")).startswith("gone-")
        ]

    # a summary line is written just after its answer is sent: wait for the last read's
    await until(summaries, "the summary lines of the gone- requests", holds=lambda found: len(found) >= 3)
    assert summaries() == [
        ("gone-1", 500),  # the app saw http.disconnect mid-body (Litestar: 500, as under granian's ASGI)
        ("gone-1", 404),  # status_of's reads
        ("gone-2", 404),  # gone-2 never reached the app: its body was not complete
    ]
    client = await Client.open(served)
    try:
        await client.send(request("GET", "/livez"))
        assert (await client.answer())[0] == 200
    finally:
        await client.close()


async def test_sigterm_lets_the_in_flight_request_finish(tmp_path: Path) -> None:
    served = await start_serve(
        tmp_path, http_server="ledger", lock_timeout_ms="15000", background_sweep="false"
    )
    try:
        await sigterm_during_a_request(served)
    finally:
        await kill_quietly(served)


async def test_two_workers_share_the_embedded_database_and_their_metrics(tmp_path: Path) -> None:
    served = await start_serve(
        tmp_path, "--workers", "2", http_server="ledger", pool_size="3", background_sweep="false"
    )
    try:
        await two_workers(served)
    finally:
        await kill_quietly(served)


async def test_a_dead_worker_is_replaced(tmp_path: Path) -> None:
    served = await start_serve(tmp_path, "--workers", "2", http_server="ledger", background_sweep="false")
    try:
        before = spawned_workers(served.proc.pid)
        assert len(before) == 2
        os.kill(before[0], signal.SIGKILL)
        await until(
            lambda: asyncio.to_thread(spawned_workers, served.proc.pid),
            "a new worker in the dead one's place",
            holds=lambda pids: len(pids) == 2 and before[0] not in pids,
            within=30,
        )
        after = spawned_workers(served.proc.pid)
        assert before[1] in after and alive(before[1])
        async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as http:
            await until(lambda: http.get("/readyz"), "ready", holds=lambda r: r.status_code == 200)
            answers = [(await http.get("/livez")).status_code for _ in range(20)]
        assert answers == [200] * 20
        assert '"event":"worker_died"' in served.log().replace(" ", "")
        served.proc.send_signal(signal.SIGTERM)
        assert await served.wait() == 0, served.log()[-3000:]
        assert not any(alive(pid) for pid in after)
    finally:
        await kill_quietly(served)


async def test_a_worker_replaced_while_the_database_is_down_is_tried_again_until_it_is_back(
    tmp_path: Path,
) -> None:
    """The database goes down, then the only worker dies: its replacement cannot start (its lifespan
    opens the pools, waiting DATABASE_STARTUP_WAIT_SECONDS for the database). The supervisor stays up,
    logs each failed start and tries again with a growing pause; once the database is back a
    replacement starts and serves. Until round 18 the first failed replacement stopped the whole server
    (exit 1), as a failed first start does."""
    from effect_ledger.db.migrate import migrate
    from effect_ledger.settings import Settings
    from support.processes import ScratchPostgres

    pg = ScratchPostgres()
    url = await asyncio.to_thread(pg.start)
    served: Served | None = None
    try:
        await migrate(Settings(database_url=url))
        served = await start_serve(
            tmp_path,
            http_server="ledger",
            background_sweep="false",
            database_url=url,
            log_enabled="false",
            # a replacement's own wait for the database: 1 s, then it fails
            database_startup_wait_seconds="1",
        )
        [worker] = spawned_workers(served.proc.pid)
        await asyncio.to_thread(pg.down)
        os.kill(worker, signal.SIGKILL)

        def failed_starts() -> list[dict[str, object]]:
            lines = [json.loads(x) for x in served.log().splitlines() if x.startswith("{")]
            return [x for x in lines if x.get("event") == "worker_restart_failed"]

        tried = await until(
            lambda: asyncio.to_thread(failed_starts),
            "two failed restarts",
            holds=lambda f: len(f) >= 2,
            within=60,
        )
        assert [(x["failed_starts"], x["retry_in_s"]) for x in tried[:2]] == [(1, 2.0), (2, 4.0)]
        assert served.proc.returncode is None and "worker_start_failed" not in served.log()
        await asyncio.to_thread(pg.up)
        async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as http:
            await until(
                lambda: http.get("/readyz"), "ready again", holds=lambda r: r.status_code == 200, within=60
            )
            claim = await http.post(
                "/v1/operations/back-1/claim", json=CLAIM, headers={"Authorization": AUTH}
            )
        assert claim.status_code == 201, claim.text
        served.proc.send_signal(signal.SIGTERM)
        assert await served.wait() == 0, served.log()[-3000:]
    finally:
        if served is not None:
            await kill_quietly(served)
        await asyncio.to_thread(pg.stop)


async def test_a_port_taken_before_serve_listens_is_left_for_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tests' servers: a free port is chosen, not reserved. When another process takes it first,
    serve exits saying so and support.serve_process starts it again on another port."""
    import socket

    import support.serve_process

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1], free_port()])
        monkeypatch.setattr(support.serve_process, "free_port", lambda: next(ports))
        served = await start_serve(tmp_path, background_sweep="false", log_enabled="false")
        try:
            assert served.port != taken.getsockname()[1]
            first = (tmp_path / f"serve.port-{taken.getsockname()[1]}-taken.log").read_text()
            assert f"cannot listen on 127.0.0.1:{taken.getsockname()[1]}: [Errno 98]" in first
            assert "cannot listen" not in served.log()
            async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as http:
                assert (await http.get("/readyz")).status_code == 200
        finally:
            await kill_quietly(served)
