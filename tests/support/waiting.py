"""Waiting for a state, not for a time: a bounded poll that names what it waited for when it gives up."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def until(
    read: Callable[[], Awaitable[T] | T],
    what: str,
    *,
    holds: Callable[[T], object] = bool,
    within: float = 30,
    every: float = 0.05,
) -> T:
    """Call `read` until `holds` its answer, and return that answer; fail after `within` seconds.

    The bound is a safety net for a broken build, not a timed assertion: keep it far above what a
    loaded machine needs.
    """
    deadline = time.monotonic() + within
    while True:
        answer = read()
        if inspect.isawaitable(answer):
            answer = await answer
        if holds(answer):  # type: ignore[arg-type]
            return answer  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {within} s (last answer: {answer!r})")
        await asyncio.sleep(every)
