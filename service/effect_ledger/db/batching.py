"""Natural batching of the write path (issue 20 item 5; docs/write-path.md, "Natural batching").

Each worker keeps at most `write_concurrency` write-path statements in flight. A call arriving while
fewer are in flight and nobody waits goes to PostgreSQL at once, exactly as before: one statement,
one round trip, no added wait. A call arriving while they are all busy waits, and the next statement
to start takes every waiting call of the same function (up to `write_batch_max`) into **one
statement and one commit**: the catalogue's `<name>_batch` statement calls the same function once
per command through `unnest(...) CROSS JOIN LATERAL`, in a fixed lock order (tenant, operation ID),
so two batches never wait for each other's rows in opposite orders.

Per-command isolation: the functions answer every expected outcome as a value, so a batch fails only
on an unexpected error (a value PostgreSQL cannot store, a deadlock, a timeout). The failed
statement rolled back every command of it; each is then run again alone, in its own transaction, on
the same connection, and gets its own answer or error. A lost connection fails every command of the
batch (each caller's 503), as it would have failed each alone.

Admission (pools.Admission) still sees every call: a call is admitted (or shed) when it arrives,
waits as a queued request until its statement starts, and leaves when its answer is in. On Citus the
batcher is not used: a statement that calls the functions for several tenants is not delegated to one
worker node (db/pools.Pools.open).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from effect_ledger.db.catalogue import sql

# Failures of the connection itself: every command of the batch fails with it (none is retried here).
CONNECTION_LOST: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.InternalClientError,
)

# The write-path statements that have a batch form in the catalogue (`<name>_batch`).
BATCHED = frozenset({"run_claim", "run_submit", "run_heartbeat", "run_complete"})


@dataclass(eq=False)
class _Command:
    query: str  # the single statement's catalogue name
    args: tuple[Any, ...]  # its parameters: $1 is the tenant, $2 the operation ID
    ticket: int | None  # its admission ticket, while it waits
    future: asyncio.Future[Any]
    taken: bool = False  # a statement carrying it has started


@dataclass
class BatchCounts:
    """What the batcher did: statements sent and commands they carried (commands / statements is
    the mean batch size), and batches that failed and ran their commands alone."""

    statements: int = 0
    commands: int = 0
    fallbacks: int = 0


@dataclass
class WriteBatcher:
    """One worker's write-path statements on one pool: at most `limit` in flight, waiting calls of
    one function sent together (see the module's docstring)."""

    pool: asyncpg.Pool
    acquire_timeout: float
    limit: int
    max_batch: int
    admission: Any = None  # pools.Admission (not imported: pools imports this module)
    counts: BatchCounts = field(default_factory=BatchCounts)
    _waiting: deque[_Command] = field(default_factory=deque)
    _inflight: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, query: str, args: tuple[Any, ...]) -> Any:
        """The row of one write-path call (the single statement's row), sent alone or in a batch."""
        tenant = args[0]
        ticket = self.admission.enter(tenant) if self.admission is not None else None
        command = _Command(query, args, ticket, asyncio.get_running_loop().create_future())
        try:
            self._waiting.append(command)
            self._start()
            try:
                return await asyncio.shield(command.future)
            except asyncio.CancelledError:
                if not command.taken:  # never sent: it leaves the queue and nothing was written
                    self._waiting.remove(command)
                    raise
                # sent: the write runs to its end (pools._to_the_end), then the cancellation goes on
                await asyncio.wait({command.future})
                raise
        finally:
            if self.admission is not None:
                if not command.taken:
                    self.admission.acquired(ticket)
                self.admission.leave(tenant)

    def _start(self) -> None:
        while self._inflight < self.limit and self._waiting:
            batch = self._take()
            self._inflight += 1
            task = asyncio.ensure_future(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[_Command]:
        """The oldest waiting call and the waiting calls of the same function after it."""
        query = self._waiting[0].query
        limit = self.max_batch if query in BATCHED else 1
        batch: list[_Command] = []
        kept: deque[_Command] = deque()
        while self._waiting:
            command = self._waiting.popleft()
            if len(batch) < limit and command.query == query:
                batch.append(command)
            else:
                kept.append(command)
        self._waiting = kept
        for command in batch:
            command.taken = True
            if self.admission is not None:
                self.admission.acquired(command.ticket)
        return batch

    async def _send(self, batch: list[_Command]) -> None:
        cancelled: asyncio.CancelledError | None = None
        try:
            async with self.pool.acquire(timeout=self.acquire_timeout) as conn:
                answers = await self._execute(conn, batch)
        except asyncio.CancelledError as exc:  # the service is stopping: the callers hear it too
            cancelled = exc
            answers = [exc] * len(batch)
        except Exception as exc:  # every caller gets the failure (its 503)
            answers = [exc] * len(batch)
        finally:
            self._inflight -= 1
            self._start()
        self._answer(batch, answers)
        if cancelled is not None:
            raise cancelled

    @staticmethod
    def _answer(batch: Sequence[_Command], answers: Sequence[Any]) -> None:
        for command, answer in zip(batch, answers, strict=True):
            if command.future.done():
                continue
            if isinstance(answer, BaseException):
                command.future.set_exception(answer)
            else:
                command.future.set_result(answer)

    async def _execute(self, conn: asyncpg.Connection, batch: Sequence[_Command]) -> list[Any]:
        self.counts.statements += 1
        self.counts.commands += len(batch)
        if len(batch) == 1:
            return [await conn.fetchrow(sql(batch[0].query), *batch[0].args)]
        # the fixed lock order: by tenant, then operation ID (stable: one ID's calls keep their order)
        order = sorted(range(len(batch)), key=lambda k: (batch[k].args[0], batch[k].args[1]))
        columns = [list(column) for column in zip(*(batch[k].args for k in order), strict=True)]
        try:
            rows = await conn.fetch(sql(batch[0].query + "_batch"), order, *columns)
        except CONNECTION_LOST:
            raise
        except Exception:  # rolled back whole; each command again, alone
            self.counts.fallbacks += 1
            return [await _alone(conn, command) for command in batch]
        by_command = {row["i"]: row for row in rows}
        return [by_command[k] for k in range(len(batch))]


async def _alone(conn: asyncpg.Connection, command: _Command) -> Any:
    try:
        return await conn.fetchrow(sql(command.query), *command.args)
    except CONNECTION_LOST:
        raise
    except Exception as exc:  # this command's own failure, for its caller
        return exc
