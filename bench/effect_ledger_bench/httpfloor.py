"""The Python HTTP floor: the least a single-process Python service can spend on an effect cycle.

A bare HTTP/1.1 server on the event loop the service uses (uvloop when installed), as its own process,
that answers the executor's three calls (the wrk script's claim, submit and complete, same paths and
bodies) with the **lean yardstick's** statements (lean.sql), one statement and one commit per call,
each HTTP connection bound to its own asyncpg connection (no pool, no queue). Per request it does what
no service can skip: read and frame the request, decode its JSON body (msgspec), hash the claim token
and the event's data (SHA-256), run one prepared statement, and write one answer. It does nothing a
real service must add: no authentication, no rules, no chain, no telemetry, no log.

The bench runs it under wrk like the full service (`Bench.http_floor`): its cycles/s against the lean
yardstick's is the most any Python service of this shape reaches on the machine, so it says whether
issue 20's "service >= 0.5 x lean" is reachable in Python at all on it; the service against the floor
is what our own code costs above it.

Run alone: `python -m effect_ledger_bench.httpfloor --url postgresql://... --port 8089` (the lean
tables must exist: `lean.sql`'s `lean_schema`). It prints `ready` on stdout once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from effect_ledger_bench.catalogue import lean_queries
from effect_ledger_bench.procs import tree_cpu_seconds
from effect_ledger_bench.service import free_port
from effect_ledger_bench.workload import PRINCIPAL, TENANT

GENESIS = "0" * 64
_SOURCE = str(Path(__file__).resolve().parents[1])  # the directory this package is imported from
SEALED = hashlib.sha256(b"sealed").digest()


class ClaimBody(msgspec.Struct):
    """The claim's body as the wrk script sends it (the intent kept raw: it is hashed, not read)."""

    tool: str
    tool_version: str
    intent: msgspec.Raw
    lease_seconds: int
    client_nonce: str | None = None


class SubmitBody(msgspec.Struct):
    token: str
    effect_ref: str | None = None


class CompleteBody(msgspec.Struct):
    token: str
    outcome: str
    receipt: msgspec.Raw = msgspec.Raw(b"null")


_CLAIM = msgspec.json.Decoder(ClaimBody)
_SUBMIT = msgspec.json.Decoder(SubmitBody)
_COMPLETE = msgspec.json.Decoder(CompleteBody)
_ENCODE = msgspec.json.Encoder().encode
_REASONS = {200: b"OK", 201: b"Created", 404: b"Not Found", 409: b"Conflict", 500: b"Internal Server Error"}


def _answer(status: int, body: bytes) -> bytes:
    return b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status,
        _REASONS[status],
        len(body),
        body,
    )


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Floor:
    """The statements and the spare database connections of one floor server (the lean mode). Both
    modes answer `open`, `connection` (what an HTTP connection keeps for its calls), `release` and
    `call`."""

    def __init__(self, url: str) -> None:
        self.url = url
        queries = lean_queries()
        self.claim_sql = queries["lean_claim"]
        self.submit_sql = queries["lean_submit"]
        self.complete_sql = queries["lean_complete"]
        self.spare: list[asyncpg.Connection] = []

    async def open(self, connections: int) -> None:
        """`connections` database connections opened up front."""
        self.spare = list(await asyncio.gather(*(asyncpg.connect(self.url) for _ in range(connections))))

    async def connection(self) -> asyncpg.Connection:
        """A database connection for one HTTP connection (a spare one, else a new one)."""
        return self.spare.pop() if self.spare else await asyncpg.connect(self.url)

    def release(self, conn: asyncpg.Connection) -> None:
        """An HTTP connection's database connection, spare again."""
        self.spare.append(conn)

    async def call(self, conn: asyncpg.Connection, op: str, action: bytes, body: bytes) -> bytes:
        """One executor call: its statement, and the answer's bytes."""
        if action == b"claim":
            claim = _CLAIM.decode(body)
            token = os.urandom(16).hex()
            data = '{"lease_expires_at":null}'
            status = await conn.execute(
                self.claim_sql,
                TENANT,
                op,
                PRINCIPAL,
                claim.tool,
                claim.tool_version,
                "sha256:" + hashlib.sha256(claim.intent).hexdigest(),
                hashlib.sha256(token.encode()).digest(),
                hashlib.sha256((claim.client_nonce or "").encode()).digest(),
                SEALED,
                claim.lease_seconds,
                _sha(GENESIS + data),
                data,
                GENESIS,
            )
            if status.endswith(" 1"):
                return _answer(201, b'{"outcome":"created","claim":{"token":"%s"}}' % token.encode())
            return _answer(409, b'{"code":"operation_in_progress"}')
        if action == b"submit":
            submit = _SUBMIT.decode(body)
            data = msgspec.json.encode({"effect_ref": submit.effect_ref}).decode()
            status = await conn.execute(
                self.submit_sql,
                TENANT,
                op,
                submit.effect_ref,
                hashlib.sha256(submit.token.encode()).digest(),
                _sha(data),
                data,
                GENESIS,
            )
        elif action == b"complete":
            complete = _COMPLETE.decode(body)
            receipt = bytes(complete.receipt).decode()
            data = '{"outcome":"committed","receipt":' + receipt + "}"
            status = await conn.execute(
                self.complete_sql,
                TENANT,
                op,
                receipt,
                hashlib.sha256(complete.token.encode()).digest(),
                _sha(data),
                data,
                GENESIS,
            )
        else:
            return _answer(404, b'{"code":"not_found"}')
        if status.endswith(" 1"):
            return _answer(200, b'{"outcome":"%s"}' % action)
        return _answer(409, b'{"code":"invalid_transition"}')


class RepositoryFloor:
    """`--mode repository`: the same HTTP shape, each call through the service's own executor functions
    (http.executor's run_claim, run_submit, run_complete: the strict body, the domain, the write-path
    function through the runtime pool and its natural batching, the answer's view) on a migrated
    database, and nothing of the app around them (no ASGI, Litestar, authentication, admission,
    telemetry or metrics). The gap from the lean floor is our rules and SQL in Python's share; the gap
    to serve, the app around them. Not a bench row: `python -m effect_ledger_bench.httpfloor --mode
    repository` alone, measured from outside (as `interfaceinstr` or a CPU reading)."""

    def __init__(self, url: str) -> None:
        from types import SimpleNamespace

        from effect_ledger.http.auth import EXECUTE, Caller
        from effect_ledger.http.fastpath import ROUTES

        self.url = url
        self.routes = {name.encode(): route for name, route in ROUTES.items()}
        self.caller = Caller(TENANT, PRINCIPAL, frozenset({EXECUTE}))
        self.state = SimpleNamespace(approval_policy=None)  # no approval rule covers the bench's tool
        self.ledger: Any = None
        self.pools: Any = None

    async def open(self, connections: int) -> None:
        """The runtime pool as serve opens it (its size is serve's default, not `connections`)."""
        from effect_ledger.db import ledger as repo
        from effect_ledger.db.pools import Pools
        from effect_ledger.settings import Settings

        settings = Settings(database_url=self.url)
        self.pools = await Pools.open(settings, reader=False, audit=False)
        self.ledger = repo.Ledger(self.pools.runtime, settings.pool_acquire_timeout_ms / 1000)

    async def connection(self) -> Any:
        """Nothing of its own for an HTTP connection: its calls take the pool's, per statement."""
        return self.ledger

    def release(self, conn: Any) -> None:
        return None

    async def call(self, conn: Any, op: str, action: bytes, body: bytes) -> bytes:
        route = self.routes.get(action)
        if route is None:
            return _answer(404, b'{"code":"not_found"}')
        reply = await route.run(self.state, self.ledger, self.caller, op, route.decode(body))
        return _answer(reply.status, _ENCODE(reply.content))


class FloorProtocol(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection: requests framed by Content-Length, answered in order (wrk
    sends the next request of a connection only after the answer to the last)."""

    def __init__(self, floor: Floor | RepositoryFloor) -> None:
        self.floor = floor
        self.buffer = b""
        self.transport: Any = None
        self.conn: Any = None  # what the floor keeps for this connection's calls (Floor.connection)
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.floor.release(self.conn)
            self.conn = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        buffer = self.buffer
        head_end = buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = buffer[:head_end]
        at = head.lower().find(b"\r\ncontent-length:")
        length = 0
        if at >= 0:
            stop = head.find(b"\r\n", at + 2)
            length = int(head[at + 17 : stop if stop > 0 else len(head)])
        end = head_end + 4 + length
        if len(buffer) < end:
            return
        body = buffer[head_end + 4 : end]
        self.buffer = buffer[end:]
        path = head[: head.find(b"\r\n")].split(b" ")[1]
        parts = path.split(b"/")  # b"", b"v1", b"operations", id, action
        self.busy = True
        asyncio.get_running_loop().create_task(self._serve(parts[3].decode(), parts[4], body))

    async def _serve(self, op: str, action: bytes, body: bytes) -> None:
        try:
            if self.conn is None:
                self.conn = await self.floor.connection()
            answer = await self.floor.call(self.conn, op, action, body)
        except Exception as exc:  # a floor: say what failed and carry on
            answer = _answer(500, msgspec.json.encode({"error": repr(exc)}))
        self.busy = False
        if not self.transport.is_closing():
            self.transport.write(answer)
            self._next()


async def serve(url: str, host: str, port: int, connections: int, mode: str = "lean") -> None:
    """Listen until killed, the database connections opened before `ready`."""
    floor = RepositoryFloor(url) if mode == "repository" else Floor(url)
    await floor.open(connections)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FloorProtocol(floor), host, port, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


class FloorProcess:
    """The floor server as a subprocess of the bench, on a free port."""

    def __init__(self, url: str, connections: int, mode: str = "lean") -> None:
        self.host = "127.0.0.1"
        self.port = free_port()
        self.url = url
        self.connections = connections
        self.mode = mode
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self, within: float = 30.0) -> None:
        """Start it and wait for its `ready` line. The child finds this package where this process
        found it (the bench may run from its source tree, not installed: the test suite's does)."""
        path = os.pathsep.join(p for p in (_SOURCE, os.environ.get("PYTHONPATH", "")) if p)
        self._proc = proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "effect_ledger_bench.httpfloor",
            "--url",
            self.url,
            "--port",
            str(self.port),
            "--connections",
            str(self.connections),
            "--mode",
            self.mode,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
        )
        assert proc.stdout is not None and proc.stderr is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), within)
        except TimeoutError:
            line = b""
        if line.strip() != b"ready":
            await self.stop()
            err = await proc.stderr.read()
            raise RuntimeError(f"the HTTP floor did not start: {err.decode(errors='replace')[-2000:]}")

    def cpu_seconds(self) -> float:
        """CPU seconds of the floor's process."""
        assert self._proc is not None
        return tree_cpu_seconds(self._proc.pid)

    async def stop(self) -> None:
        """SIGTERM, and wait for it."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the database with the lean tables")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--connections", type=int, default=16, help="database connections opened up front")
    parser.add_argument(
        "--mode",
        choices=("lean", "repository"),
        default="lean",
        help="lean: the lean yardstick's statements (the bench's row); repository: the service's executor"
        " functions on a migrated database (RepositoryFloor)",
    )
    args = parser.parse_args(argv)
    try:
        import uvloop  # the service's event loop (effect_ledger.http.server)
    except ImportError:  # pragma: no cover - uvloop is the service's dependency
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(serve(args.url, args.host, args.port, args.connections, args.mode))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
