"""asyncpg pools: one per role, every connection with timeouts and JSON codecs; tenant transactions.

Load shedding: every tenant transaction is admitted by its pool's `Admission` before it queues for a
connection. When `pool_max_waiting` requests already wait, or the oldest has waited longer than
`pool_shed_wait_ms`, the request is refused at once (503 `unavailable`, Retry-After, incident) instead
of joining a queue whose wait only grows. Reconciler and audit calls run on their own runtime-role
pool (`audit_pool_size`), so an executor flood that fills the runtime pool never starves them.

Failover (db/failover.py): every pool connects with target_session_attrs=read-write through the URL's
host list; a call that finds its server gone or read-only is answered 503 and expires every pool's
connections, so the next calls reconnect to the new primary without a restart.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import asyncpg
import msgspec

from effect_ledger import tracing
from effect_ledger.db import failover
from effect_ledger.db.batching import WriteBatcher
from effect_ledger.db.catalogue import sql
from effect_ledger.db.urls import READER_ROLE, RUNTIME_ROLE, derived_password, writable_url
from effect_ledger.domain.errors import DatabaseUnavailable, validation_failed
from effect_ledger.settings import Settings

# Failures that mean "the database is unreachable, restarting or overloaded": answered 503, retryable.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.InterfaceError,
    # A connection terminated while idle in the pool (pg_terminate_backend, a server restart) can leave
    # asyncpg's protocol waiting for the end of the FATAL error; its next use then raises this rather
    # than ConnectionDoesNotExistError ("cannot switch to state …; another operation is in progress").
    asyncpg.exceptions.InternalClientError,
    asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, crash recovery, query cancelled
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
    asyncpg.exceptions.LockNotAvailableError,  # lock_timeout
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.SerializationError,
    # The server turned read-only under us (a demoted or fenced primary): retry on the new primary.
    asyncpg.exceptions.ReadOnlySQLTransactionError,
)

T = TypeVar("T")

# Values PostgreSQL refuses to store: NUL in text ("invalid byte sequence") and \u0000 in jsonb.
UNSTORABLE: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.CharacterNotInRepertoireError,
    asyncpg.exceptions.UntranslatableCharacterError,
)
_DRIVER_FAILURES = (*UNAVAILABLE, *UNSTORABLE)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release without asyncpg's RESET ALL/UNLISTEN/CLOSE round trip.

    asyncpg rolls back any open transaction before calling this. The service never changes session
    state: the tenant is bound with SET LOCAL (tenancy.bind_setting), which ends with the transaction, and no
    pooled connection LISTENs, holds cursors or takes session advisory locks. Saves a round trip per
    request (measured by the bench: +7-10% throughput).
    """


def _encode_jsonb(value: Any) -> bytes:
    return b"\x01" + msgspec.json.encode(value)  # jsonb's binary format: version 1, then the text


def _decode_jsonb(data: bytes) -> Any:
    return msgspec.json.decode(memoryview(data)[1:])


async def set_json_codecs(conn: asyncpg.Connection) -> None:
    """json and jsonb as Python values by msgspec, in the binary format: asyncpg decodes a composite
    (the write path's `op` answer column) only from fields with binary codecs."""
    await conn.set_type_codec(
        "jsonb", encoder=_encode_jsonb, decoder=_decode_jsonb, schema="pg_catalog", format="binary"
    )
    await conn.set_type_codec(
        "json", encoder=msgspec.json.encode, decoder=msgspec.json.decode, schema="pg_catalog", format="binary"
    )


async def _init_connection(conn: asyncpg.Connection) -> None:
    failover.keep_alive(conn)
    await set_json_codecs(conn)


def server_settings(settings: Settings, application_name: str = "effect-ledger") -> dict[str, str]:
    """The session settings of every connection the service opens (pools and maintenance alike)."""
    return {
        "application_name": application_name,
        "statement_timeout": str(settings.statement_timeout_ms),
        "lock_timeout": str(settings.lock_timeout_ms),
        "idle_in_transaction_session_timeout": str(settings.idle_in_transaction_timeout_ms),
        # Citus hides shard tables from catalogue queries by calling relation_is_a_known_shard() on every
        # pg_class row: asyncpg's introspection of the write path's composite answer (ledger.operations)
        # then took 0.9 s per new connection on a coordinator (25 ms without), and fifty connections opened
        # at once ran into statement_timeout. The service never reads the catalogue for shards; on plain
        # PostgreSQL this is an inert placeholder setting.
        "citus.override_table_visibility": "off",
    }


async def create_role_pool(settings: Settings, role: str, size: int) -> asyncpg.Pool:
    """A pool logged in as `role`: from its own URL when configured, else derived from the owner URL."""
    explicit = settings.runtime_database_url if role == RUNTIME_ROLE else settings.reader_database_url
    kwargs: dict[str, Any] = {}
    if explicit:
        dsn = explicit
    else:
        if not settings.database_url:
            raise ValueError("no database URL configured")
        dsn = settings.database_url
        kwargs = {"user": role, "password": derived_password(settings.database_url, role)}
    pool = await asyncpg.create_pool(
        writable_url(dsn),
        min_size=1,
        max_size=size,
        init=_init_connection,
        reset=_keep_session,
        server_settings=server_settings(settings),
        max_inactive_connection_lifetime=60,
        **kwargs,
    )
    assert pool is not None
    return pool


class Admission:
    """Bounds the queue for one pool's connections: requests beyond the bound are shed at once.

    Fair to quiet tenants: a tenant with fewer requests in flight (queued or holding a connection)
    than its share of the pool (capacity / tenants in flight, rounded up) is admitted even past the
    bounds, so a flood by one tenant fills the queue with its own requests and sheds only them.

    Queued means beyond the free connections: an admitted request waits (in `_waiting`) from its
    arrival until its acquire returns, but the first `capacity - holding` of them are taking a free
    connection, not queuing for one. Until round 22 every waiting request counted, so a burst that
    arrived on an idle pool before the event loop ran the first acquires was shed after
    `max_waiting` requests instead of `capacity + max_waiting` (tests/unit/test_admission.py). With
    natural batching several calls ride one statement and one connection, so `holding` counts calls
    and may exceed the connections in use: free connections are then undercounted, which only ever
    counts more as queued (never sheds more than before).
    """

    def __init__(
        self,
        name: str,
        capacity: int,
        max_waiting: int,
        shed_wait_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.capacity = capacity
        self.max_waiting = max_waiting
        self.shed_wait_seconds = shed_wait_seconds
        self.clock = clock
        self.on_shed: Callable[[str, str], None] = lambda pool, reason: None  # metrics count sheds
        self._waiting: dict[int, float] = {}  # ticket -> when it started waiting, oldest first
        self._holding: set[int] = set()  # tickets that got their connection and have not left
        self._inflight: dict[str, int] = {}  # tenant -> requests queued for or holding a connection
        self._tickets = itertools.count()

    def shed_reason(self, tenant: str) -> str | None:
        """Why `tenant`'s request arriving now would be shed ("queue" or "wait"), or None to admit it."""
        if self.queued >= self.max_waiting:
            reason = "queue"
        elif self._waiting and self.clock() - next(iter(self._waiting.values())) > self.shed_wait_seconds:
            reason = "wait"
        else:
            return None
        tenants = len(self._inflight) + (tenant not in self._inflight)
        share = -(-self.capacity // tenants)  # rounded up: every tenant in flight gets at least one
        return None if self._inflight.get(tenant, 0) < share else reason

    def enter(self, tenant: str) -> int:
        """Admit one request to the queue (its ticket), or raise DatabaseUnavailable (503) at once."""
        reason = self.shed_reason(tenant)
        if reason is not None:
            self.on_shed(self.name, reason)
            raise DatabaseUnavailable(SHED_PHASE, "PoolSaturated")
        ticket = next(self._tickets)
        self._waiting[ticket] = self.clock()
        self._inflight[tenant] = self._inflight.get(tenant, 0) + 1
        return ticket

    def acquired(self, ticket: int, holding: bool = True) -> None:
        """The request stopped waiting: it got its connection (`holding`), or gave up."""
        del self._waiting[ticket]
        if holding:
            self._holding.add(ticket)

    def leave(self, tenant: str, ticket: int) -> None:
        """The request released its connection (or never got one)."""
        self._holding.discard(ticket)
        left = self._inflight[tenant] - 1
        if left:
            self._inflight[tenant] = left
        else:
            del self._inflight[tenant]

    @property
    def queued(self) -> int:
        """Requests waiting for a connection right now, beyond those taking a free one."""
        free = max(0, self.capacity - len(self._holding))
        return max(0, len(self._waiting) - free)


SHED_PHASE = "shed"  # the phase of a request refused before it queued (its incident is only spooled)

# The admission of each open pool (asyncpg pools take no attributes); tenant_tx looks its pool up here.
_ADMISSIONS: dict[int, Admission] = {}


# The write batcher of each open runtime pool (db/batching.py), when batching is on.
_BATCHERS: dict[int, WriteBatcher] = {}


def admit(pool: asyncpg.Pool, admission: Admission) -> None:
    """Bound `pool`'s queue with `admission` until `pool` is closed through Pools.close."""
    _ADMISSIONS[id(pool)] = admission


@dataclass
class Pools:
    """The runtime pool (executors), the audit pool (reconcilers, auditors) and the diagnostics reader."""

    runtime: asyncpg.Pool
    reader: asyncpg.Pool | None
    acquire_timeout: float
    audit: asyncpg.Pool | None = None
    admissions: dict[str, Admission] = field(default_factory=dict)
    server: failover.ServerWatch | None = None  # what the pools saw of the primary (/readyz)

    @classmethod
    async def open(cls, settings: Settings, *, reader: bool = True, audit: bool = True) -> Pools:
        """Open the pools for the configured database, each with its admission bound (none left open
        when one of them cannot be opened)."""
        opened: list[asyncpg.Pool] = []

        async def role_pool(role: str, size: int) -> asyncpg.Pool:
            pool = await create_role_pool(settings, role, size)
            opened.append(pool)
            return pool

        try:
            runtime = await role_pool(RUNTIME_ROLE, settings.pool_size)
            reader_pool = await role_pool(READER_ROLE, settings.reader_pool_size) if reader else None
            audit_pool = await role_pool(RUNTIME_ROLE, settings.audit_pool_size) if audit else None
            batching = settings.write_batch_max > 1
            per_tenant = batching and await _on_citus(runtime)  # one tenant's calls a statement (0025)
        except BaseException:
            for pool in opened:
                pool.terminate()
            raise
        pools = cls(runtime, reader_pool, settings.pool_acquire_timeout_ms / 1000, audit_pool)
        shed_wait = settings.pool_shed_wait_ms / 1000
        for name, pool in (("runtime", runtime), ("audit", audit_pool), ("reader", reader_pool)):
            if pool is not None:
                pools.admissions[name] = Admission(
                    name, pool.get_max_size(), settings.pool_max_waiting, shed_wait
                )
                admit(pool, pools.admissions[name])
        if batching:
            _BATCHERS[id(runtime)] = WriteBatcher(
                runtime,
                pools.acquire_timeout,
                settings.write_concurrency,
                settings.write_batch_max,
                pools.admissions["runtime"],
                per_tenant=per_tenant,
            )
        pools.server = failover.ServerWatch([p for p in (runtime, audit_pool, reader_pool) if p is not None])
        failover.watch(pools.server)
        return pools

    async def close(self) -> None:
        """Close every pool, waiting for connections in use to be released."""
        if self.server is not None:
            failover.unwatch(self.server)
        for pool in (self.runtime, self.audit, self.reader):
            if pool is not None:
                _ADMISSIONS.pop(id(pool), None)
                _BATCHERS.pop(id(pool), None)
                await pool.close()


STARTUP_RETRY_MAX_SECONDS = 2.0
# What a start-up retries: the server unreachable, starting, shutting down or not (yet) writable.
STARTUP_RETRIED: tuple[type[BaseException], ...] = (
    *failover.SERVER_LOST,
    *failover.SERVER_CHANGED,
    TimeoutError,
)


async def open_when_reachable(
    settings: Settings, on_retry: Callable[[BaseException, float], None], **kwargs: Any
) -> Pools:
    """`Pools.open`, retried while the database is unreachable or not yet writable (a worker started
    in the middle of a failover, a database still starting) for up to DATABASE_STARTUP_WAIT_SECONDS,
    with backoff (0.25 s doubling to 2 s); `on_retry(failure, delay)` before each wait. Anything
    else (a wrong password, a missing role) fails at once, as does the last attempt."""
    deadline = time.monotonic() + settings.database_startup_wait_seconds
    delay = 0.25
    while True:
        try:
            return await Pools.open(settings, **kwargs)
        except STARTUP_RETRIED as lost:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            wait = min(delay, left)
            on_retry(lost, wait)
            await asyncio.sleep(wait)
            delay = min(delay * 2, STARTUP_RETRY_MAX_SECONDS)


@asynccontextmanager
async def tenant_tx(
    pool: asyncpg.Pool,
    tenant: str,
    acquire_timeout: float,
    phase: str = "transaction",
    *,
    shed: bool = True,
    snapshot: bool = False,
) -> AsyncIterator[tuple[asyncpg.Connection, datetime]]:
    """A transaction bound to one tenant (RLS), with the database clock; driver failures become 503s.

    The one place the service's requests reach the database: admission (shedding; `shed=False` for
    background writers that must neither be refused nor take a request's place in the queue) and
    the database call's span both happen here. `snapshot`: a read-only REPEATABLE READ transaction, so
    that several reads see one snapshot (the journal's reads and projections).
    """
    with tracing.database_span(phase) as span:
        admission = _ADMISSIONS.get(id(pool)) if shed else None
        async with _transaction(pool, admission, tenant, acquire_timeout, phase, span, snapshot) as bound:
            yield bound


@asynccontextmanager
async def _transaction(
    pool: asyncpg.Pool,
    admission: Admission | None,
    tenant: str,
    acquire_timeout: float,
    phase: str,
    span: tracing.Span,
    snapshot: bool = False,
) -> AsyncIterator[tuple[asyncpg.Connection, datetime]]:
    options: dict[str, Any] = {"isolation": "repeatable_read", "readonly": True} if snapshot else {}
    try:
        async with (
            _connection(pool, admission, tenant, acquire_timeout, span) as conn,
            _transaction_block(conn, options),
        ):
            context = await conn.fetchrow(sql("tenant_context"), tenant)
            yield conn, context["db_now"]
    except UNAVAILABLE as exc:
        await failover.server_lost(pool, exc)
        raise DatabaseUnavailable(phase, type(exc).__name__) from exc
    except UNSTORABLE as exc:
        # valid JSON, but PostgreSQL text and jsonb cannot hold it (U+0000): the caller's value, not a fault
        raise validation_failed([("body", "contains a character the ledger cannot store (U+0000)")]) from exc


@asynccontextmanager
async def _following(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Report a lost server to the pool's watch (which expires the pools), then let the failure through."""
    try:
        yield
    except failover.SERVER_LOST as exc:
        await failover.server_lost(pool, exc)
        raise


async def _to_the_end(call: Awaitable[T]) -> T:
    """Await a write to its end even when the request is cancelled (then re-raise the cancellation).

    A cancelled asyncpg call sends the server a cancel request. A commit waiting for its synchronous
    standby, cancelled, stays committed on the primary alone and becomes visible ("canceling wait for
    synchronous replication"): a retry would then acknowledge a transition the standby may never
    have had, and a failover would lose it. So the statement is never cancelled from here.
    """
    task = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task})
        raise


@asynccontextmanager
async def _transaction_block(conn: asyncpg.Connection, options: dict[str, Any]) -> AsyncIterator[None]:
    """`conn.transaction()`, except that its COMMIT runs to the end even when the request is cancelled
    (see _to_the_end: a cancelled wait for the synchronous standby would make the commit visible)."""
    transaction = conn.transaction(**options)
    await transaction.__aenter__()
    try:
        yield
    except BaseException as exc:
        await transaction.__aexit__(type(exc), exc, exc.__traceback__)  # ROLLBACK
        raise
    await _to_the_end(transaction.__aexit__(None, None, None))  # COMMIT


@asynccontextmanager
async def _connection(
    pool: asyncpg.Pool, admission: Admission | None, tenant: str, acquire_timeout: float, span: tracing.Span
) -> AsyncIterator[asyncpg.Connection]:
    """A pooled connection, admitted first (a shed request never queues)."""
    if admission is None:
        async with pool.acquire(timeout=acquire_timeout) as conn:
            yield conn
        return
    ticket = admission.enter(tenant)
    try:
        acquiring = pool.acquire(timeout=acquire_timeout)
        holding = False
        try:
            conn = await acquiring.__aenter__()
            holding = True
        finally:
            admission.acquired(ticket, holding)
        tracing.set_attributes(span, {"effect_ledger.db.pool": admission.name})
        try:
            yield conn
        finally:
            await acquiring.__aexit__(None, None, None)
    finally:
        admission.leave(tenant, ticket)


@contextmanager
def translated(phase: str) -> Iterator[None]:
    """Translate driver failures once: unreachable or overloaded -> 503, unstorable values -> 422."""
    try:
        yield
    except _DRIVER_FAILURES as exc:
        raise _translation(phase, exc) from exc


def _translation(phase: str, exc: BaseException) -> Exception:
    """What a failure in UNAVAILABLE or UNSTORABLE is answered as (see `translated`)."""
    if isinstance(exc, UNAVAILABLE):
        return DatabaseUnavailable(phase, type(exc).__name__)
    # valid JSON, but PostgreSQL text and jsonb cannot hold it (U+0000): the caller's value, not a fault
    return validation_failed([("body", "contains a character the ledger cannot store (U+0000)")])


async def _on_citus(pool: asyncpg.Pool) -> bool:
    return bool(await pool.fetchval(sql("citus_installed")))


def batcher_of(pool: asyncpg.Pool) -> WriteBatcher | None:
    """The pool's write batcher (None: batching is off, or the pool is not a runtime pool)."""
    return _BATCHERS.get(id(pool))


async def run_write(
    pool: asyncpg.Pool, acquire_timeout: float, phase: str, query: str, *args: Any
) -> asyncpg.Record | None:
    """One write-path function call by its catalogue name ($1 the tenant): through the pool's batcher
    (natural batching, db/batching.py) when it has one, else run_statement. `_following` and
    `translated` are written out for the batcher (one try, no context managers or extra coroutine on
    every write): a lost server is reported to the pool's watch, then every failure translated."""
    batcher = _BATCHERS.get(id(pool))
    if batcher is None:
        return await run_statement(pool, args[0], acquire_timeout, phase, sql(query), *args)
    if tracing.active():
        return await _traced(pool, batcher, phase, query, args)
    try:
        try:
            row: asyncpg.Record | None = await batcher.run(query, args)
        except failover.SERVER_LOST as exc:
            await failover.server_lost(pool, exc)
            raise
    except _DRIVER_FAILURES as exc:
        raise _translation(phase, exc) from exc
    return row


async def _traced(
    pool: asyncpg.Pool, batcher: WriteBatcher, phase: str, query: str, args: tuple[Any, ...]
) -> asyncpg.Record | None:
    """run_write's batched call in the database call's span (tracing on)."""
    with tracing.database_span(phase) as span:
        if batcher.admission is not None:
            tracing.set_attributes(span, {"effect_ledger.db.pool": batcher.admission.name})
        with translated(phase):
            try:
                row: asyncpg.Record | None = await batcher.run(query, args)
                return row
            except failover.SERVER_LOST as exc:
                await failover.server_lost(pool, exc)
                raise


async def run_statement(
    pool: asyncpg.Pool, tenant: str, acquire_timeout: float, phase: str, query: str, *args: Any
) -> asyncpg.Record | None:
    """One statement in autocommit on a pooled connection (the write path): admitted like tenant_tx,
    in the call's span, and exactly one round trip once the statement is prepared on the connection
    (asyncpg caches it; the pool's reset is free, _keep_session). The statement binds the tenant."""
    with tracing.database_span(phase) as span, translated(phase):
        async with (
            _following(pool),
            _connection(pool, _ADMISSIONS.get(id(pool)), tenant, acquire_timeout, span) as conn,
        ):
            row: asyncpg.Record | None = await _to_the_end(conn.fetchrow(query, *args))
            return row
