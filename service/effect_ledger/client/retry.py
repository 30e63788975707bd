"""The client's one retry loop: bounded by attempts and one overall deadline, decided by API section 10."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from effect_ledger.client.errors import LedgerProblem, LedgerUnreachable, problem_from_response
from effect_ledger.domain.recovery import MAX_SAFE_INTEGER, RecoveryInput, decide

# 429 and 503 are the ledger's own "come back later" answers; 502 and 504 are what a proxy or load
# balancer in front of it answers while a replica restarts. Nothing else is retried: another 4xx is
# a refusal that a repeat cannot change, and a 500 is a bug that a repeat would only hide.
TRANSIENT_STATUSES = frozenset({429, 502, 503, 504})

Send = Callable[[float], Awaitable[httpx.Response]]


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How long and how often one ledger call may be tried, its first attempt included."""

    maximum_attempts: int = 5
    deadline_seconds: float = 30.0  # for the whole call, waits included; never reset per attempt
    attempt_timeout_seconds: float = 10.0  # one request; capped by what is left of the deadline
    base_delay_ms: int = 100
    maximum_delay_ms: int = 5_000
    minimum_attempt_ms: int = 50  # an attempt is not started with less time than this left
    jitter: Callable[[], float] = field(default=random.random, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, compare=False)

    def deciding(self, attempts: int, elapsed_ms: int, retry_after_ms: int | None) -> int | None:
        """The delay before the next attempt in ms, or None when the policy says stop."""
        decision = decide(
            RecoveryInput(
                attempts=attempts,
                maximum_attempts=self.maximum_attempts,
                minimum_attempt_ms=self.minimum_attempt_ms,
                base_delay_ms=self.base_delay_ms,
                maximum_delay_ms=self.maximum_delay_ms,
                now_ms=elapsed_ms,
                deadline_ms=int(self.deadline_seconds * 1000),
                retry_after_ms=retry_after_ms,
                jitter=self.jitter(),
                # Ledger calls are idempotent by contract (claims carry a client_nonce), so a repeat
                # has no effect beyond the first: the effects are "none" whatever the first try did.
                cause="transient",
                output_visible=False,
                effects="none",
            )
        )
        return decision.delay_ms if decision.action == "retry" else None


async def send_with_retries(policy: RetryPolicy, send: Send) -> httpx.Response:
    """Send until a non-transient answer, or until the attempts or the deadline run out.

    `send(timeout)` performs one request with at most `timeout` seconds. A 2xx answer is returned; an
    error answer is raised as its typed problem; transport failures become LedgerUnreachable.
    """
    started = policy.clock()
    attempts = 0
    while True:
        attempts += 1
        remaining = policy.deadline_seconds - (policy.clock() - started)
        timeout = max(0.001, min(policy.attempt_timeout_seconds, remaining))
        failure: LedgerClientFailure
        retry_after_ms: int | None = None
        try:
            response = await send(timeout)
        except httpx.TransportError as exc:
            failure = LedgerUnreachable(attempts, exc)
            failure.__cause__ = exc
        else:
            if response.is_success:
                return response
            problem = problem_from_response(response)
            problem.attempts = attempts
            if response.status_code not in TRANSIENT_STATUSES:
                raise problem
            failure = problem
            if problem.retry_after is not None:
                retry_after_ms = min(int(problem.retry_after * 1000), MAX_SAFE_INTEGER)
        elapsed_ms = max(0, int((policy.clock() - started) * 1000))
        delay_ms = policy.deciding(attempts, elapsed_ms, retry_after_ms)
        if delay_ms is None:
            raise failure
        await policy.sleep(delay_ms / 1000)


LedgerClientFailure = LedgerProblem | LedgerUnreachable
