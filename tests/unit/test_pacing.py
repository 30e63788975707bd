"""http.pacing: which 429s are held, for how long, with which Retry-After, and how many at once."""

from __future__ import annotations

import asyncio

from effect_ledger.domain.errors import LedgerError
from effect_ledger.http import pacing
from effect_ledger.http.pacing import Pacer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def refusal(retry_after: int) -> LedgerError:
    return LedgerError("rate_limited", "Too many requests.", retry_after=retry_after)


def test_a_caller_that_waited_as_told_is_answered_at_once() -> None:
    clock = Clock()
    pacer = Pacer(1.0, 10, clock=clock)
    assert pacer.hold_for("t", "p", 2) == 0.0  # the first 429: at once; told to wait until 1002
    clock.now = 1002.0
    assert pacer.hold_for("t", "p", 2) == 0.0  # came back exactly when told
    clock.now = 1005.0
    assert pacer.hold_for("t", "p", 1) == 0.0


def test_a_caller_back_before_its_retry_after_is_held_up_to_the_cap() -> None:
    clock = Clock()
    pacer = Pacer(1.0, 10, clock=clock)
    assert pacer.hold_for("t", "p", 5) == 0.0
    clock.now = 1000.5
    assert pacer.hold_for("t", "p", 5) == 1.0  # the cap
    long = Pacer(2.5, 10, clock=clock)
    long.hold_for("t", "p", 1)
    assert long.hold_for("t", "p", 1) == 1.0  # never longer than the Retry-After


def test_a_caller_is_repeating_only_before_its_last_retry_after_runs_out() -> None:
    clock = Clock()
    pacer = Pacer(0.0, 10, clock=clock)  # pacing off: refusals are still remembered
    assert not pacer.repeating("t", "p")  # never refused
    assert pacer.hold_for("t", "p", 3) == 0.0  # told to wait until 1003
    clock.now = 1002.9
    assert pacer.repeating("t", "p") and not pacer.repeating("t", "other") and not pacer.repeating("u", "p")
    clock.now = 1003.0
    assert not pacer.repeating("t", "p")  # back when told


def test_callers_are_remembered_apart() -> None:
    clock = Clock()
    pacer = Pacer(1.0, 10, clock=clock)
    pacer.hold_for("t", "p", 1)
    assert pacer.hold_for("t", "q", 1) == 0.0  # another principal of the tenant
    assert pacer.hold_for("u", "p", 1) == 0.0  # the same principal name in another tenant
    assert pacer.hold_for("t", "p", 1) == 1.0


def test_zero_switches_pacing_off() -> None:
    pacer = Pacer(0.0, 10, clock=Clock())
    assert [pacer.hold_for("t", "p", 1) for _ in range(5)] == [0.0] * 5


async def test_a_held_429_waits_and_says_what_remains_of_its_retry_after() -> None:
    clock, slept, counted = Clock(), [], []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds

    pacer = Pacer(1.0, 10, clock=clock, sleep=sleep, on_held=lambda: counted.append(1))
    first = refusal(3)
    assert await pacer.pace(first, "t", "p") is first and slept == []
    held = await pacer.pace(refusal(3), "t", "p")
    assert slept == [1.0] and counted == [1]
    assert (held.code, held.status, held.detail, held.retry_after) == (
        "rate_limited",
        429,
        "Too many requests.",
        2,
    )
    clock.now = 1010.0
    await pacer.pace(refusal(1), "t", "p")  # waited: at once
    one = await pacer.pace(refusal(1), "t", "p")
    assert slept == [1.0, 1.0] and one.retry_after == 1  # at least 1
    assert pacer.held == 0


async def test_at_most_max_held_refusals_wait_at_once_the_rest_are_answered() -> None:
    release = asyncio.Event()

    async def sleep(_: float) -> None:
        await release.wait()

    pacer = Pacer(1.0, 3, clock=Clock(), sleep=sleep)
    first = refusal(1)
    assert await pacer.pace(first, "t", "p") is first
    waiting = [asyncio.create_task(pacer.pace(refusal(1), "t", "p")) for _ in range(3)]
    await asyncio.sleep(0)
    assert pacer.held == 3
    beyond = refusal(1)
    assert await pacer.pace(beyond, "t", "p") is beyond  # over the bound: at once, nothing parked
    assert pacer.held == 3 and not any(task.done() for task in waiting)
    release.set()
    assert [(await task).retry_after for task in waiting] == [1, 1, 1]
    assert pacer.held == 0


def test_the_memory_is_bounded() -> None:
    clock = Clock()
    pacer = Pacer(1.0, 10, clock=clock)
    for n in range(pacing.REMEMBERED + 1):
        pacer.hold_for("t", f"p-{n}", 3600)
    assert len(pacer._told) <= pacing.REMEMBERED
    assert pacer.hold_for("t", f"p-{pacing.REMEMBERED}", 3600) == 1.0  # the newest are kept
    clock.now += 7200  # every Retry-After has run out: all are dropped at the next overflow
    for n in range(pacing.REMEMBERED + 1):
        pacer.hold_for("u", f"p-{n}", 1)
    assert len(pacer._told) <= pacing.REMEMBERED
