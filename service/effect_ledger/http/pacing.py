"""Paced refusals: a caller that keeps sending while over its rate limit gets its 429s slowly.

A 429 is cheap (decided before routing from the token cache), but a flood that ignores it is not: at
thousands of refusals a second the HTTP parsing, the telemetry and the log line of each one take the
CPU that the quiet tenants need. So a worker remembers, per (tenant, principal), until when its last
429 told it to wait (the decision's time + Retry-After). A refusal that comes *before* that time (the
caller did not wait as told, or sends on several connections at once) is **held**: its 429 is sent
after `RATE_LIMIT_PACE_MS` (capped at its Retry-After) by an asyncio sleep in the worker's event loop,
which holds no thread, no database connection and no bucket. A keep-alive flooder with N connections
that sends its next request as soon as an answer arrives is so held to about N / pace requests a second
(plus what its limit admits), whatever its loop does. The first 429 of a caller that waited is
answered at once; a caller within its limit is never held (only refusals are).

At most `RATE_LIMIT_PACE_MAX_HELD` refusals are held per worker at a time; beyond that a 429 is
answered at once (a flood of more connections than that costs what it cost before pacing, never
memory without bound). The held answer carries `Retry-After` = the whole seconds, rounded up and at
least 1, that remain of the decision's Retry-After once the hold is over: the same rule as an
immediate 429, counted from when it is sent.

A caller's repeated refusals are also **quiet in the log**: a 429 that comes before the caller's last
Retry-After ran out (`repeating`) gets its request summary line at debug, not info (the request's scope
says so under REPEATED_KEY; http.telemetry reads it), so a flood writes one info line per caller and
Retry-After window and worker instead of one per request. Every refusal is still counted
(`effect_ledger_rate_limited_total`, and `effect_ledger_rate_limit_paced_total` for the held ones).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

from effect_ledger.domain.errors import LedgerError

REPEATED_KEY = "effect_ledger.repeated_refusal"  # in a request's scope: its 429 repeats one (see above)
REMEMBERED = 4096  # callers whose last Retry-After is remembered per worker (the oldest go first)


class Pacer:
    """One worker's memory of what its refused callers were told, and its held refusals."""

    def __init__(
        self,
        hold_seconds: float,
        max_held: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        on_held: Callable[[], None] = lambda: None,
    ) -> None:
        self.hold_seconds = hold_seconds
        self.max_held = max_held
        self.held = 0  # refusals being held right now
        self._clock = clock
        self._sleep = sleep
        self._on_held = on_held
        self._told: dict[tuple[str, str], float] = {}  # caller -> when its last Retry-After runs out

    def repeating(self, tenant: str, principal: str) -> bool:
        """Whether this caller is back before the Retry-After of its last 429 ran out (read before `pace`,
        which remembers the new one)."""
        told = self._told.get((tenant, principal))
        return told is not None and self._clock() < told

    def hold_for(self, tenant: str, principal: str, retry_after: int) -> float:
        """Seconds to hold this caller's 429 (0: answer at once); remembers what it is told now."""
        now = self._clock()
        key = (tenant, principal)
        told = self._told.pop(key, None)  # popped and set again: the dict stays in order of refusal
        self._told[key] = now + retry_after
        if len(self._told) > REMEMBERED:
            self._forget(now)
        if told is None or now >= told or self.hold_seconds <= 0 or self.held >= self.max_held:
            return 0.0
        return min(self.hold_seconds, float(retry_after))

    async def pace(self, refused: LedgerError, tenant: str, principal: str) -> LedgerError:
        """The 429 to send for `refused`, after holding it when the caller keeps sending."""
        retry_after = refused.retry_after or 1
        hold = self.hold_for(tenant, principal, retry_after)
        if hold <= 0:
            return refused
        self.held += 1
        self._on_held()
        try:
            await self._sleep(hold)
        finally:
            self.held -= 1
        return LedgerError(
            refused.code,
            refused.detail,
            dict(refused.extensions),
            retry_after=max(1, math.ceil(retry_after - hold)),
        )

    def _forget(self, now: float) -> None:
        """Drop the callers whose Retry-After has run out; if that is not enough, the oldest half."""
        self._told = {key: until for key, until in self._told.items() if until > now}
        if len(self._told) > REMEMBERED:
            keys = list(self._told)
            for key in keys[: len(keys) // 2]:
                del self._told[key]
