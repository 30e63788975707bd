"""The token bucket of the per tenant+principal rate limit: pure arithmetic over (tokens, stamp, now)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limit:
    """`rate` tokens per second refill a bucket holding at most `burst`; either 0 switches it off."""

    rate: float
    burst: float

    @property
    def off(self) -> bool:
        """Whether this limit admits everything."""
        return self.rate <= 0 or self.burst <= 0


@dataclass(frozen=True, slots=True)
class Bucket:
    """A bucket's state: `tokens` left at monotonic time `stamp`."""

    tokens: float
    stamp: float

    def full_at(self, limit: Limit) -> float:
        """When the bucket is full again, and so indistinguishable from one never used."""
        return self.stamp + max(0.0, limit.burst - self.tokens) / limit.rate


@dataclass(frozen=True, slots=True)
class Verdict:
    """The bucket after one request, and the whole seconds to wait when it was refused (else None)."""

    bucket: Bucket
    retry_after: int | None


def take(bucket: Bucket | None, limit: Limit, now: float) -> Verdict:
    """Refill `bucket` (None: a fresh, full one) up to `now` and take one token if there is one."""
    if bucket is None:
        tokens = limit.burst
    else:
        elapsed = max(0.0, now - bucket.stamp)  # never negative, whatever the caller's clock did
        tokens = min(limit.burst, bucket.tokens + elapsed * limit.rate)
    if tokens >= 1.0:
        return Verdict(Bucket(tokens - 1.0, now), None)
    # Retry-After in whole seconds, rounded up and at least 1: a retry then finds a token.
    return Verdict(Bucket(tokens, now), max(1, math.ceil((1.0 - tokens) / limit.rate)))
