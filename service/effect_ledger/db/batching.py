"""Natural batching of the write path (issue 20 item 5; docs/write-path.md, "Natural batching").

Each worker keeps at most `write_concurrency` write-path statements in flight. A call arriving while
fewer are in flight and nobody waits goes to PostgreSQL at once, exactly as before: one statement,
one round trip, no added wait. A call arriving while they are all busy waits, and the next statement
to start takes every waiting call of the same function (up to `write_batch_max`) into **one
statement and one commit**: the catalogue's `<name>_batch` statement calls the same function once
per command through `unnest(...) CROSS JOIN LATERAL` (the commands one array of the function's command
type, migration 0020), in a fixed lock order (tenant, operation ID),
so two batches never wait for each other's rows in opposite orders.

Per-command isolation: the functions answer every expected outcome as a value, so a batch fails only
on an unexpected error (a value PostgreSQL cannot store, a deadlock, a timeout). The failed
statement rolled back every command of it; each is then run again alone, side by side on their own
connections and outside the in-flight bound, and answered as soon as it is done. A lost connection
fails every command of the batch (each caller's 503), as it would have failed each alone.

Locks: a batch statement sets its own `lock_timeout` (BATCH_LOCK_TIMEOUT, 50 ms) before its first
call, so one command behind a held row lock fails the batch quickly instead of holding the others;
alone, that command then waits with the connection's own lock_timeout. A statement in flight longer
than STALL_SECONDS (0.1 s) gives its place to the calls queued behind it, and a queued call waits to
be sent at most the pool's acquire timeout (then 503, as a pool wait would).

Admission (pools.Admission) still sees every call: a call is admitted (or shed) when it arrives,
waits as a queued request until its statement starts, and leaves when its answer is in. On Citus
(`per_tenant`, set by db/pools.Pools.open) a batch takes one tenant's calls only, and goes as the
catalogue's `<name>_tenant_batch` statement: a function distributed by that tenant (migration 0025),
which Citus delegates whole to the worker holding the tenant's rows. A statement calling the functions
for several tenants is not delegated: it would run on the coordinator, each call's statements sent to
the workers one by one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from effect_ledger.db import failover
from effect_ledger.db.catalogue import sql

# Failures of the connection or its server (failover.SERVER_LOST, and a timeout): every command of the
# batch fails with it; running them again alone on the same server would only fail again.
CONNECTION_LOST: tuple[type[BaseException], ...] = (*failover.SERVER_LOST, TimeoutError)

# A statement in flight longer than this gives its place to the calls queued behind it.
STALL_SECONDS = 0.1
# A batch statement waits at most this long for a row lock (the batch's own `lock_timeout`, set by the
# statement itself): one command behind a held lock must not hold up the others; the failed batch's
# commands then run alone, each with the connection's own lock_timeout.
BATCH_LOCK_TIMEOUT = "50ms"

# The write-path statements that have a batch form in the catalogue (`<name>_batch`).
BATCHED = frozenset({"run_claim", "run_submit", "run_heartbeat", "run_complete"})


class _Command:
    """One call of `WriteBatcher.run`, from the queue to its answer (a plain slotted class: one is
    built per request)."""

    __slots__ = ("answered", "args", "connected", "deadline", "future", "query", "settled", "taken", "ticket")

    def __init__(
        self,
        query: str,
        args: tuple[Any, ...],
        ticket: int | None,
        future: asyncio.Future[Any],
        deadline: float,
    ) -> None:
        self.query = query  # the single statement's catalogue name
        self.args = args  # its parameters: $1 is the tenant, $2 the operation ID
        self.ticket = ticket  # its admission ticket, while it waits
        self.future = future  # its answer (the caller awaits it)
        self.deadline = deadline  # (loop time) until when it may wait to be sent
        self.taken = False  # a statement carrying it has started
        self.connected = False  # that statement has its connection (the admission's wait is over)
        self.answered = False  # the statement carrying it is over (answered, or failed)
        self.settled: asyncio.Future[None] | None = None  # a cancelled caller waits here for that end

    def connect(self, admission: Any, holding: bool = True) -> None:
        if not self.connected:
            self.connected = True
            if admission is not None:
                admission.acquired(self.ticket, holding)


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
    per_tenant: bool = False  # Citus: a batch holds one tenant's calls (`<name>_tenant_batch`)
    counts: BatchCounts = field(default_factory=BatchCounts)
    _waiting: deque[_Command] = field(default_factory=deque)
    _inflight: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    # One timer for the queue's acquire timeouts, one for the in-flight statements' stall release
    # (each set for the oldest: both queues are in time order), instead of one timer per call.
    _expiry: asyncio.TimerHandle | None = None
    _slots: deque[_Slot] = field(default_factory=deque)  # in-flight statements, oldest first
    _stall_watch: asyncio.TimerHandle | None = None

    async def run(self, query: str, args: tuple[Any, ...]) -> Any:
        """The row of one write-path call (the single statement's row), sent alone or in a batch.

        Per call: one future (no asyncio.wait or shield, no timer: they cost a waiter future, a timer
        and callbacks on every request). A cancelled caller whose call was sent waits for the
        statement's end (pools._to_the_end), then is cancelled."""
        tenant = args[0]
        admission = self.admission
        ticket = admission.enter(tenant) if admission is not None else None
        loop = asyncio.get_running_loop()
        # waiting to be sent is waiting for a connection: bounded like it (_expire_due)
        command = _Command(query, args, ticket, loop.create_future(), loop.time() + self.acquire_timeout)
        try:
            self._waiting.append(command)
            self._start()
            if not command.taken and self._expiry is None:
                self._expiry = loop.call_at(command.deadline, self._expire_due)
            try:
                return await command.future
            except asyncio.CancelledError:
                if not command.taken:  # never sent: it leaves the queue and nothing was written
                    self._waiting.remove(command)
                    raise
                if not command.answered:  # sent: the write runs to its end, then the cancellation goes on
                    command.settled = loop.create_future()
                    await command.settled
                raise
        finally:
            if admission is not None:
                command.connect(admission, holding=False)  # (never connected: its wait ends here)
                admission.leave(tenant, command.ticket)

    def _expire_due(self) -> None:
        """The acquire timeout of the calls still queued, oldest first: each leaves the queue and its
        caller gets the error; the timer is set again for the next oldest (the queue is in arrival
        order, hence in deadline order)."""
        self._expiry = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        waiting = self._waiting
        while waiting and waiting[0].deadline <= now:
            command = waiting.popleft()
            if not command.future.done():
                command.future.set_exception(TimeoutError("no write slot within the acquire timeout"))
        if waiting:
            self._expiry = loop.call_at(waiting[0].deadline, self._expire_due)

    def _start(self) -> None:
        while self._inflight < self.limit and self._waiting:
            batch = self._take()
            self._inflight += 1
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[_Command]:
        """The oldest waiting call and the waiting calls of the same function after it (of the same
        tenant too, when batches are per tenant)."""
        first = self._waiting[0]
        query, tenant = first.query, first.args[0]
        limit = self.max_batch if query in BATCHED else 1
        any_tenant = not self.per_tenant
        batch: list[_Command] = []
        kept: deque[_Command] = deque()
        while self._waiting:
            command = self._waiting.popleft()
            if len(batch) < limit and command.query == query and (any_tenant or command.args[0] == tenant):
                batch.append(command)
            else:
                kept.append(command)
        self._waiting = kept
        for command in batch:
            command.taken = True
        return batch

    async def _send(self, batch: list[_Command]) -> None:
        """One lane: the batch's statement, then, while calls wait and the lane kept its place (no
        stall release), the next batch on **the same connection**: back-to-back statements under load
        cost no release and acquire each (asyncpg's take a task, timers and futures per statement).
        The connection goes back to the pool once nothing waits, when the lane's place was given away,
        when the batch failed, or when the pool's connections were expired (a failover: _Lane.reusable)."""
        loop = asyncio.get_running_loop()
        lane = _Lane(self.pool, self.acquire_timeout)
        cancelled: asyncio.CancelledError | None = None
        slot = self._open_slot(loop)
        try:
            while True:
                answers: list[Any]
                alone = failed = False
                try:
                    answers = await self._execute(batch, lane)
                except _Alone as fallback:  # rolled back whole: each command again alone, below
                    answers, alone = [], True
                    batch = fallback.batch
                except asyncio.CancelledError as exc:  # the service is stopping: the callers hear it too
                    cancelled = exc
                    answers = [exc] * len(batch)
                except Exception as exc:  # every caller gets the failure (its 503)
                    answers, failed = [exc] * len(batch), True
                if alone:
                    await lane.release()
                    slot.release()
                    try:
                        await asyncio.gather(*(self._alone(command) for command in batch))
                    except asyncio.CancelledError as exc:  # stopping: the callers not answered hear it
                        for command in batch:
                            _answer(command, exc)
                        raise
                    return
                for command, answer in zip(batch, answers, strict=True):
                    _answer(command, answer)
                if cancelled is not None or failed or not (slot.held and self._waiting and lane.reusable()):
                    break
                # the place and the connection go on to the next batch (a fresh slot: its own stall clock)
                slot.held = False
                batch = self._take()
                slot = self._open_slot(loop)
        finally:
            await lane.release()
            slot.release()
        if cancelled is not None:
            raise cancelled

    def _open_slot(self, loop: asyncio.AbstractEventLoop) -> _Slot:
        slot = _Slot(self, loop.time())
        self._slots.append(slot)
        if self._stall_watch is None:
            self._stall_watch = loop.call_at(slot.started + STALL_SECONDS, self._release_stalled)
        return slot

    def _release_stalled(self) -> None:
        """Give back the places of statements in flight for STALL_SECONDS or more (and forget the ones
        that ended); the timer is set again for the oldest left."""
        self._stall_watch = None
        now = asyncio.get_running_loop().time()
        slots = self._slots
        while slots and (not slots[0].held or slots[0].started + STALL_SECONDS <= now):
            slots.popleft().release()
        if slots:
            self._stall_watch = asyncio.get_running_loop().call_at(
                slots[0].started + STALL_SECONDS, self._release_stalled
            )

    async def _execute(self, batch: Sequence[_Command], lane: _Lane) -> list[Any]:
        """The batch's answers (rows, in the batch's order); raises _Alone when the batch statement
        failed on something other than the connection (its commands then run again alone)."""
        self.counts.statements += 1
        self.counts.commands += len(batch)
        conn = await lane.connection()
        for command in batch:
            command.connect(self.admission)
        if len(batch) == 1:
            return [await conn.fetchrow(sql(batch[0].query), *batch[0].args)]
        # the fixed lock order: by tenant, then operation ID (stable: one ID's calls keep their order).
        # One array of the function's command type (migration 0020), each command its place and its
        # parameters: asyncpg asks each element of an array whether it is an array itself, so one array
        # of composites costs a few such checks a command where an array per parameter cost ~20.
        order = sorted(range(len(batch)), key=lambda k: (batch[k].args[0], batch[k].args[1]))
        commands = [(k, *batch[k].args) for k in order]
        try:
            if self.per_tenant:  # one tenant's commands (_take), to the function distributed by it
                statement = sql(batch[0].query + "_tenant_batch")
                rows = await conn.fetch(statement, batch[0].args[0], BATCH_LOCK_TIMEOUT, commands)
            else:
                rows = await conn.fetch(sql(batch[0].query + "_batch"), BATCH_LOCK_TIMEOUT, commands)
        except CONNECTION_LOST:
            raise
        except Exception:
            self.counts.fallbacks += 1
            raise _Alone(list(batch)) from None
        by_command = {row["i"]: row for row in rows}
        return [by_command[k] for k in range(len(batch))]

    async def _alone(self, command: _Command) -> Any:
        # Alone and side by side, each on its own connection and outside the in-flight bound (these are
        # retries), each answered as soon as it is done: a command that waits for a row lock waits
        # alone, the others answer at once.
        try:
            async with self.pool.acquire(timeout=self.acquire_timeout) as conn:
                answer: Any = await conn.fetchrow(sql(command.query), *command.args)
        except Exception as exc:  # this command's own failure (a lost connection too), for its caller
            answer = exc
        _answer(command, answer)
        return answer


class _Alone(Exception):  # a signal between two methods, never raised to a caller
    """The batch statement failed and rolled back whole: its commands go again, each alone."""

    def __init__(self, batch: list[_Command]) -> None:
        super().__init__()
        self.batch = batch


class _Lane:
    """The connection one lane holds from the pool across its back-to-back batches: acquired for the
    lane's first statement, given back once (asyncpg's PoolAcquireContext, entered and left by hand)."""

    __slots__ = ("_context", "conn", "pool", "timeout")

    def __init__(self, pool: asyncpg.Pool, timeout: float) -> None:
        self.pool = pool
        self.timeout = timeout
        self._context: Any = None
        self.conn: Any = None

    async def connection(self) -> Any:
        if self.conn is None:
            context = self.pool.acquire(timeout=self.timeout)
            self.conn = await context.__aenter__()
            self._context = context
        return self.conn

    def reusable(self) -> bool:
        """Whether the next batch may run on this connection: it is open and was not expired since it
        was acquired (Pool.expire_connections, a failover: db/failover.py), exactly the test asyncpg's
        release applies before it gives a connection back instead of closing it."""
        conn = self.conn
        if conn is None:
            return True
        try:
            if conn.is_closed():
                return False
        except asyncpg.InterfaceError:  # closed meanwhile: asyncpg took it back and detached the proxy
            return False
        holder = getattr(conn, "_holder", None)  # an asyncpg PoolConnectionProxy's
        return holder is None or holder._generation == holder._pool._generation

    async def release(self) -> None:
        """Give the connection back. A failure here (asyncpg could not reset a broken connection; it
        terminated it) changes no answer: the lane's statements were answered before."""
        context, self._context, self.conn = self._context, None, None
        if context is not None:
            try:
                await context.__aexit__(None, None, None)
            except Exception:  # noqa: S110 - the pool closed the connection itself; nothing to add
                pass


def _answer(command: _Command, answer: Any) -> None:
    command.answered = True
    if command.settled is not None and not command.settled.done():
        command.settled.set_result(None)
    if command.future.done():  # its caller was cancelled (or timed out) meanwhile
        return
    if isinstance(answer, BaseException):
        command.future.set_exception(answer)
    else:
        command.future.set_result(answer)


class _Slot:
    """One in-flight statement's place in the bound, given back once: when it ends, when it has run
    for STALL_SECONDS (a statement waiting for a lock must not hold back the calls queued behind it),
    or when its batch failed and its commands go on alone."""

    __slots__ = ("batcher", "held", "started")

    def __init__(self, batcher: WriteBatcher, started: float) -> None:
        self.batcher = batcher
        self.started = started  # loop time
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.batcher._inflight -= 1
            self.batcher._start()
