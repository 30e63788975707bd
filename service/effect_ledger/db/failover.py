"""Following a failover: which driver failures mean "the primary is gone", and what the pools do then.

When the primary dies, is switched over or turns read-only, every pooled connection to it is
useless. A request that meets such a failure is answered 503 `unavailable` (Retry-After, incident)
by the usual translation. A connection that broke is closed, and asyncpg replaces it on the next
acquire through the URL's host list; connections are only ever opened with
target_session_attrs=read-write (urls.writable_url), so a standby not yet promoted is refused at
connect (also a 503) and a promoted one is taken as soon as it accepts writes.

A connection that still works but reaches a server that is no longer the writable primary (it
turned read-only, it is shutting down or recovering from a crash) would go on failing requests one
by one: on those failures (SERVER_CHANGED) every pool's connections are expired at once
(asyncpg's `expire_connections`, at most once a second), so the next request on every pool
reconnects. A single broken connection expires nothing: one backend terminated by an operator is
not a failover, and replacing every connection of every pool for it would only add reconnects.

`ServerWatch` also remembers which server served last (address and timeline) so that /readyz can
report the switch: the server now serving, how often it changed, when the last loss was seen.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

# Failures that say the server behind a connection is gone, going, or no longer the writable primary.
SERVER_LOST: tuple[type[BaseException], ...] = (
    OSError,  # refused, reset, unreachable
    asyncpg.exceptions.PostgresConnectionError,  # the connection broke mid-call
    asyncpg.exceptions.InterfaceError,  # "connection is closed"
    asyncpg.exceptions.InternalClientError,  # a FATAL read while idle; no host matched read-write
    asyncpg.exceptions.AdminShutdownError,  # fast/smart shutdown of the old primary (switchover)
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.CannotConnectNowError,  # starting up, shutting down, in recovery
    asyncpg.exceptions.ReadOnlySQLTransactionError,  # the server turned read-only (demoted, fenced)
)

# Failures that say the server behind a still-open connection is no longer the one to use.
SERVER_CHANGED: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    asyncpg.exceptions.TargetServerAttributeNotMatched,  # reconnecting found no writable host
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.CrashShutdownError,  # another backend crashed: the server is restarting
)

EXPIRE_INTERVAL_SECONDS = 1.0  # one expiry per burst: a switch fails many requests at once


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """The server a pool's connection reached: its address and WAL timeline (a promotion bumps it)."""

    address: str
    timeline: int
    in_recovery: bool
    read_only: bool

    @property
    def writable(self) -> bool:
        """Whether the service can work on it."""
        return not (self.in_recovery or self.read_only)


def identity_of(row: Any) -> ServerIdentity:
    """The identity from a `server_identity` row."""
    address = f"{row['address'] or 'local'}:{row['port'] or ''}".rstrip(":")
    timeline = int(row["timeline"] or 0)
    return ServerIdentity(address, timeline, bool(row["in_recovery"]), bool(row["read_only"]))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class ServerWatch:
    """The pools of one process and what they saw of the primary: losses, switches, the current one."""

    pools: Sequence[asyncpg.Pool]
    clock: Callable[[], float] = time.monotonic
    current: ServerIdentity | None = None
    switches: int = 0
    losses: int = 0
    lost_at: str | None = None  # the first loss of the outage in progress, None once a primary answered
    switched_at: str | None = None
    on_lost: Callable[[str], None] = lambda exception_type: None  # metrics count losses
    _expired_at: float = field(default=float("-inf"))

    async def server_lost(self, exc: BaseException) -> None:
        """A call met a failure in SERVER_LOST: remember it; on SERVER_CHANGED (or a server readiness
        found read-only) also expire every pool's connections, at most once a second."""
        self.losses += 1
        self.lost_at = self.lost_at or _now()
        self.on_lost(type(exc).__name__)
        if not isinstance(exc, SERVER_CHANGED):
            return
        now = self.clock()
        if now - self._expired_at < EXPIRE_INTERVAL_SECONDS:
            return
        self._expired_at = now
        for pool in self.pools:
            await pool.expire_connections()  # bumps the generation: idle and released ones reconnect

    def observe(self, identity: ServerIdentity) -> None:
        """Readiness read the serving server: a writable one ends the outage; another one is a switch."""
        if not identity.writable:
            return
        if self.current is not None and identity != self.current:
            self.switches += 1
            self.switched_at = _now()
        self.current = identity
        self.lost_at = None

    def report(self) -> dict[str, Any]:
        """What /readyz shows about the primary."""
        shown: dict[str, Any] = {"primary_switches": self.switches}
        if self.current is not None:
            shown.update(server=self.current.address, timeline=self.current.timeline)
        if self.switched_at is not None:
            shown["switched_at"] = self.switched_at
        if self.lost_at is not None:
            shown["lost_at"] = self.lost_at
        return shown


# The watch of each open pool (asyncpg pools take no attributes); the translation looks it up here.
_WATCHES: dict[int, ServerWatch] = {}


def watch(watcher: ServerWatch) -> None:
    """Report losses on every pool of `watcher` to it, until `unwatch`."""
    for pool in watcher.pools:
        _WATCHES[id(pool)] = watcher


def unwatch(watcher: ServerWatch) -> None:
    """Stop reporting (the pools are closing)."""
    for pool in watcher.pools:
        _WATCHES.pop(id(pool), None)


async def server_lost(pool: asyncpg.Pool, exc: BaseException) -> None:
    """Tell `pool`'s watch that a call on it met `exc`, when `exc` means the server is lost."""
    watcher = _WATCHES.get(id(pool))
    # TimeoutError is an OSError, but it means "busy" (a full pool, a slow statement), not "gone".
    if watcher is not None and isinstance(exc, SERVER_LOST) and not isinstance(exc, TimeoutError):
        await watcher.server_lost(exc)


# TCP keepalive on every connection: a primary that vanished without a reset (its node or network
# gone) is noticed in about KEEPALIVE_IDLE + KEEPALIVE_INTERVAL x KEEPALIVE_COUNT seconds instead of
# the kernel's retransmission timeout (about 15 minutes), so a call waiting on it fails (503) and its
# pool reconnects. A live primary answers the probes, however long a statement or commit takes.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 10, 5, 3
USER_TIMEOUT_MS = 30_000  # unacknowledged data (or probes) for longer than this: the peer is gone


def keep_alive(conn: asyncpg.Connection) -> None:
    """Turn on TCP keepalive (and a user timeout) on a connection's socket; unix sockets need none."""
    transport = getattr(conn, "_transport", None)  # asyncpg offers no socket options of its own
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
    ):
        if hasattr(socket, option):  # Linux; elsewhere the system defaults apply
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
