"""Following a failover without a database: the URL rules, the role passwords, the watch of the pools."""

from __future__ import annotations

import socket
from typing import Any

import asyncpg
import pytest

from effect_ledger.db import failover
from effect_ledger.db.urls import derived_password, hosts, libpq_url, writable_url

MULTI = "postgresql://owner:pw@db1:5432,db2:5433/ledger"


def test_every_url_asks_for_the_writable_server() -> None:
    assert writable_url(MULTI) == MULTI + "?target_session_attrs=read-write"
    socket_url = "postgresql://postgres:@/postgres?host=/tmp/pg%20x&options=-c%20a%3Db"
    assert writable_url(socket_url) == socket_url + "&target_session_attrs=read-write"  # nothing re-encoded
    for kept in ("read-write", "primary"):
        assert writable_url(f"{MULTI}?target_session_attrs={kept}") == f"{MULTI}?target_session_attrs={kept}"
    assert (
        writable_url("postgresql://u@db1/x?target_session_attrs=any")
        == "postgresql://u@db1/x?target_session_attrs=any"
    )
    assert (
        libpq_url("postgres://u:p@db1,db2/x") == "postgresql://u:p@db1,db2/x?target_session_attrs=read-write"
    )


@pytest.mark.parametrize("target", ["read-only", "standby", "prefer-standby", "any"])
def test_a_url_aiming_at_a_standby_is_refused(target: str) -> None:
    with pytest.raises(ValueError, match="writable primary"):
        writable_url(f"{MULTI}?target_session_attrs={target}")


def test_hosts_are_read_as_written() -> None:
    assert hosts(MULTI) == ["db1:5432", "db2:5433"]
    assert hosts("postgresql://u@/x?host=/run/pg") == ["/run/pg"]


def test_role_passwords_do_not_depend_on_the_hosts() -> None:
    """`migrate` against the primary and `serve` against `primary,standby` must derive the same."""
    single = derived_password("postgresql://owner:pw@db1:5432/ledger", "effect_ledger_runtime")
    assert derived_password(MULTI + "?target_session_attrs=read-write", "effect_ledger_runtime") == single
    assert derived_password("postgresql://owner:pw@10.0.0.9/other", "effect_ledger_runtime") == single
    assert derived_password("postgresql://owner:other@db1/ledger", "effect_ledger_runtime") != single
    assert derived_password(MULTI, "effect_ledger_diag_reader") != single


class FakePool:
    def __init__(self) -> None:
        self.generation = 0

    async def expire_connections(self) -> None:
        self.generation += 1


async def test_a_server_no_longer_writable_expires_every_pool_once_per_burst() -> None:
    now = [100.0]
    pools = [FakePool(), FakePool()]
    watch = failover.ServerWatch(pools, clock=lambda: now[0])  # type: ignore[arg-type]
    failover.watch(watch)
    try:
        # one broken connection is remembered (readiness shows lost_at) but replaces nothing else
        await failover.server_lost(pools[0], ConnectionResetError())  # type: ignore[arg-type]
        assert [p.generation for p in pools] == [0, 0] and watch.losses == 1 and watch.lost_at
        # a server that turned read-only: every pool reconnects, once per burst
        await failover.server_lost(pools[0], asyncpg.exceptions.ReadOnlySQLTransactionError())  # type: ignore[arg-type]
        await failover.server_lost(pools[1], asyncpg.exceptions.TargetServerAttributeNotMatched())  # type: ignore[arg-type]
        assert [p.generation for p in pools] == [1, 1] and watch.losses == 3
        now[0] += failover.EXPIRE_INTERVAL_SECONDS
        await failover.server_lost(pools[1], asyncpg.exceptions.CannotConnectNowError())  # type: ignore[arg-type]
        assert [p.generation for p in pools] == [2, 2]
        # busy is not gone: a full pool's timeout, a statement timeout, a lock timeout count nothing
        now[0] += 10
        await failover.server_lost(pools[0], TimeoutError())  # type: ignore[arg-type]
        await failover.server_lost(pools[0], ValueError())  # type: ignore[arg-type]
        assert [p.generation for p in pools] == [2, 2] and watch.losses == 4
    finally:
        failover.unwatch(watch)


def test_the_watch_counts_a_switch_when_another_writable_server_answers() -> None:
    watch = failover.ServerWatch([])
    first = failover.ServerIdentity("127.0.0.1:5432", 1, in_recovery=False, read_only=False)
    watch.observe(first)
    watch.observe(first)
    assert watch.report() == {"primary_switches": 0, "server": "127.0.0.1:5432", "timeline": 1}
    watch.lost_at = "2026-12-01T10:00:00.000Z"
    watch.observe(failover.ServerIdentity("127.0.0.1:5433", 1, in_recovery=True, read_only=True))
    assert watch.current == first and "lost_at" in watch.report()  # a standby ends nothing
    watch.observe(failover.ServerIdentity("127.0.0.1:5433", 2, in_recovery=False, read_only=False))
    shown = watch.report()
    assert shown["primary_switches"] == 1 and shown["server"] == "127.0.0.1:5433" and shown["timeline"] == 2
    assert shown["switched_at"] and "lost_at" not in shown


def test_keepalive_is_on_for_tcp_connections() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()) as sock,
    ):

        class Transport:
            def get_extra_info(self, name: str) -> Any:
                return sock if name == "socket" else None

        class Connection:
            _transport = Transport()

        failover.keep_alive(Connection())  # type: ignore[arg-type]
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == failover.KEEPALIVE_IDLE
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == failover.USER_TIMEOUT_MS


def test_role_passwords_come_from_the_owners_password_wherever_the_url_carries_it() -> None:
    """libpq and asyncpg take the user and password from the query too. Until round 24 only the
    authority's were read: with `?password=`, the role passwords were derived from the user name alone."""
    in_authority = derived_password("postgresql://owner:s3cret@db1/ledger", "effect_ledger_runtime")
    in_query = "postgresql://db1/ledger?user=owner&password=s3cret&sslmode=require"
    assert derived_password(in_query, "effect_ledger_runtime") == in_authority
    assert (
        derived_password("postgresql://owner@db1/ledger?password=s3cret", "effect_ledger_runtime")
        == in_authority
    )
    no_password = derived_password("postgresql://owner@db1/ledger", "effect_ledger_runtime")
    assert (
        derived_password("postgresql://owner@db1/ledger?password=other", "effect_ledger_runtime")
        != no_password
    )
