"""db.receipt_log.WitnessRetries: when a checkpoint some witness did not cosign is offered again."""

from __future__ import annotations

from effect_ledger.db.receipt_log import WitnessRetries


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_missed_checkpoint_is_offered_again_after_a_doubling_wait_until_every_witness_cosigned() -> None:
    clock = Clock()
    retries = WitnessRetries(clock)
    retries.offered("t1", 5, missing=1)
    assert retries.due() == []
    clock.now = 101.0  # the first wait: 1 s
    assert retries.due() == [("t1", 5)]
    waits = []
    for _ in range(8):  # still missed each time: 2, 4, 8, 16, 32, then 60 s at most
        retries.offered("t1", 5, missing=1)
        start = clock.now
        while not retries.due():
            clock.now += 0.5
        waits.append(clock.now - start)
    assert waits == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    retries.offered("t1", 5, missing=0)  # cosigned at last: forgotten
    clock.now += 1000
    assert retries.due() == []


def test_a_newer_checkpoint_starts_the_wait_again_and_tenants_wait_apart() -> None:
    clock = Clock()
    retries = WitnessRetries(clock)
    retries.offered("t1", 5, missing=2)
    clock.now += 1
    retries.offered("t1", 5, missing=2)  # wait 2 s now
    retries.offered("t1", 9, missing=1)  # a newer checkpoint, missed too: 1 s again
    retries.offered("t2", 3, missing=1)
    clock.now += 1
    assert sorted(retries.due()) == [("t1", 9), ("t2", 3)]
    retries.offered("t1", 9, missing=0)  # superseded or cosigned: 0 missing
    assert retries.due() == [("t2", 3)]
