"""The pool admission's queue bound (db/pools.Admission): requests beyond the free connections and the
queue bound are shed at once; requests taking a free connection are not counted as queued."""

from __future__ import annotations

import pytest

from effect_ledger.db.pools import Admission
from effect_ledger.domain.errors import DatabaseUnavailable

CAPACITY, QUEUE = 2, 3


def admission() -> Admission:
    return Admission("runtime", CAPACITY, QUEUE, shed_wait_seconds=60.0, clock=lambda: 0.0)


def test_a_burst_on_an_idle_pool_admits_the_free_connections_and_the_queue() -> None:
    """Every request arrives before any acquire has returned (one event-loop iteration): the first
    CAPACITY take the free connections, the next QUEUE queue, and only the one after is shed (until
    round 22 the fourth was: the ones taking free connections counted as queued)."""
    a = admission()
    tickets = [a.enter("t1") for _ in range(CAPACITY + QUEUE)]
    assert len(tickets) == CAPACITY + QUEUE and a.queued == QUEUE
    with pytest.raises(DatabaseUnavailable):
        a.enter("t1")


def test_requests_holding_the_connections_leave_only_the_queue() -> None:
    a = admission()
    for ticket in [a.enter("t1") for _ in range(CAPACITY)]:
        a.acquired(ticket)
    assert a.queued == 0
    queued = [a.enter("t1") for _ in range(QUEUE)]
    assert a.queued == QUEUE
    with pytest.raises(DatabaseUnavailable):
        a.enter("t1")
    # one gives up (its acquire timed out): it frees a queue place, not a connection
    a.acquired(queued[0], holding=False)
    a.leave("t1", queued[0])
    assert a.queued == QUEUE - 1
    a.enter("t1")
    with pytest.raises(DatabaseUnavailable):
        a.enter("t1")


def test_a_request_that_leaves_frees_its_connection() -> None:
    a = admission()
    held = [a.enter("t1") for _ in range(CAPACITY)]
    for ticket in held:
        a.acquired(ticket)
    waiting = [a.enter("t1") for _ in range(QUEUE)]
    assert a.queued == QUEUE
    a.leave("t1", held[0])  # its connection is back: the oldest waiting takes it
    assert a.queued == QUEUE - 1
    a.acquired(waiting[0])
    assert a.queued == QUEUE - 1  # it holds now, the other two still queue
    a.enter("t1")
    with pytest.raises(DatabaseUnavailable):
        a.enter("t1")
