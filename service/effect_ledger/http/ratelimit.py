"""The per tenant+principal rate limit (docs/api.md sections 4 and 11), checked right after the token.

One token bucket per (tenant, principal), refilled at `RATE_LIMIT_PER_SECOND` up to
`RATE_LIMIT_BURST`; `RATE_LIMIT_OVERRIDES` gives single tenants other numbers. The check runs in the
auth guard, after the token is verified and before the body is read or any database work is done.

The limit holds over all workers of one `serve`: with `--workers N` the buckets live in one shared
file (`RATE_LIMIT_STORE`, created by `serve`), mapped into every worker's memory and updated under an
exclusive `flock`; a single worker keeps them in a dict. The file is a fixed open-addressing table of
`SHARED_SLOTS` slots keyed by a 128-bit BLAKE2b digest of (tenant, principal): a slot whose bucket
has refilled completely is free again (a full bucket and no bucket behave the same). If all probed
slots are taken by live buckets, the request is admitted and counted (`effect_ledger_rate_limit_overflow`):
a full table must not turn into an outage.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import mmap
import os
import struct
import time
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from effect_ledger.domain.errors import LedgerError
from effect_ledger.domain.ratelimit import Bucket, Limit, take
from effect_ledger.settings import Settings

SHARED_SLOTS = 1 << 16  # 64 Ki live buckets (2.5 MiB), far more principals than one deployment has
_PROBES = 32
_SLOT = struct.Struct("<16sddd")  # key digest, tokens, stamp, full_at
_EMPTY_KEY = bytes(16)
_MEMORY_SWEEP_EVERY = 4096  # the in-process dict drops full buckets after this many new keys


class BucketStore(Protocol):
    """Where buckets live: this process only, or a file shared by every worker."""

    def take(self, key: bytes, limit: Limit, now: float) -> int | None:
        """Take a token from `key`'s bucket; None when admitted, else the Retry-After seconds."""


class MemoryStore:
    """Buckets in a dict: exact for one process."""

    def __init__(self) -> None:
        self._buckets: dict[bytes, tuple[Bucket, float]] = {}
        self._added = 0

    def take(self, key: bytes, limit: Limit, now: float) -> int | None:
        """Take a token from `key`'s bucket; None when admitted, else the Retry-After seconds."""
        found = self._buckets.get(key)
        verdict = take(found[0] if found else None, limit, now)
        self._buckets[key] = (verdict.bucket, verdict.bucket.full_at(limit))
        if found is None:
            self._added += 1
            if self._added % _MEMORY_SWEEP_EVERY == 0:
                self._buckets = {k: v for k, v in self._buckets.items() if v[1] > now}
        return verdict.retry_after


def create_shared_store(path: Path, slots: int = SHARED_SLOTS) -> None:
    """Create (or empty) the shared bucket file before any worker maps it."""
    with path.open("wb") as sink:
        sink.truncate(slots * _SLOT.size)


class SharedStore:
    """Buckets in a file mapped by every worker; each take holds an exclusive flock for microseconds."""

    def __init__(self, path: Path, on_overflow: Callable[[], None] = lambda: None) -> None:
        self._fd = os.open(path, os.O_RDWR)
        size = os.fstat(self._fd).st_size
        if size == 0 or size % _SLOT.size:
            raise ValueError("the rate limit store is not a bucket table; serve creates it")
        self._map = mmap.mmap(self._fd, size)
        self._slots = size // _SLOT.size
        self._on_overflow = on_overflow

    def take(self, key: bytes, limit: Limit, now: float) -> int | None:
        """Take a token from `key`'s bucket; None when admitted, else the Retry-After seconds."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            slot, bucket = self._find(key, now)
            if slot is None:
                self._on_overflow()
                return None
            verdict = take(bucket, limit, now)
            new = verdict.bucket
            _SLOT.pack_into(self._map, slot * _SLOT.size, key, new.tokens, new.stamp, new.full_at(limit))
            return verdict.retry_after
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _find(self, key: bytes, now: float) -> tuple[int | None, Bucket | None]:
        """`key`'s slot and bucket; else the first free slot and None; else (None, None)."""
        start = int.from_bytes(key[:8], "little") % self._slots
        free: int | None = None
        for probe in range(_PROBES):
            slot = (start + probe) % self._slots
            found, tokens, stamp, full_at = _SLOT.unpack_from(self._map, slot * _SLOT.size)
            if found == key:
                return slot, Bucket(tokens, stamp)
            if free is None and (found == _EMPTY_KEY or full_at <= now):
                free = slot
        return free, None

    def close(self) -> None:
        """Unmap and close the file."""
        self._map.close()
        os.close(self._fd)


@lru_cache(maxsize=4096)  # a worker's callers are few; the digest costs more than the bucket's arithmetic
def bucket_key(tenant: str, principal: str) -> bytes:
    """A fixed-size key; never all zeros (that marks an empty slot)."""
    digest = hashlib.blake2b(f"{tenant}\x00{principal}".encode(), digest_size=16).digest()
    return digest if digest != _EMPTY_KEY else b"\x01" + digest[1:]


def parse_overrides(raw: str | None) -> dict[str, Limit]:
    """`RATE_LIMIT_OVERRIDES`: inline JSON or the path of a JSON file, tenant -> {per_second, burst}."""
    if not raw:
        return {}
    text = raw if raw.lstrip().startswith(("{", "[")) else Path(raw).read_text()
    table = json.loads(text)
    if not isinstance(table, dict):
        raise ValueError("RATE_LIMIT_OVERRIDES must be a JSON object of tenant -> limit")
    limits = {}
    for tenant, entry in table.items():
        if not isinstance(entry, dict) or set(entry) - {"per_second", "burst"}:
            raise ValueError(f"RATE_LIMIT_OVERRIDES[{tenant!r}] must be {{'per_second': n, 'burst': n}}")
        rate, burst = entry.get("per_second", 0), entry.get("burst", 0)
        if not all(isinstance(n, int | float) and not isinstance(n, bool) and n >= 0 for n in (rate, burst)):
            raise ValueError(f"RATE_LIMIT_OVERRIDES[{tenant!r}]: numbers ≥ 0 expected")
        limits[tenant] = Limit(float(rate), float(burst))
    return limits


class RateLimiter:
    """Decides, per verified caller, whether a request may proceed."""

    def __init__(
        self,
        default: Limit,
        overrides: Mapping[str, Limit],
        store: BucketStore,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.default = default
        self.overrides = dict(overrides)
        self.store = store
        self.clock = clock  # CLOCK_MONOTONIC is one clock for every process of the machine

    @classmethod
    def from_settings(cls, settings: Settings, on_overflow: Callable[[], None] = lambda: None) -> RateLimiter:
        """The configured limits over the configured store (the shared file when there is one)."""
        default = Limit(float(settings.rate_limit_per_second), float(settings.rate_limit_burst))
        store: BucketStore = (
            SharedStore(Path(settings.rate_limit_store), on_overflow)
            if settings.rate_limit_store
            else MemoryStore()
        )
        return cls(default, parse_overrides(settings.rate_limit_overrides), store)

    def check(self, tenant: str, principal: str) -> None:
        """Take a token for this caller, or raise 429 rate_limited with Retry-After."""
        limit = self.overrides.get(tenant, self.default)
        if limit.off:
            return
        retry_after = self.store.take(bucket_key(tenant, principal), limit, self.clock())
        if retry_after is not None:
            raise LedgerError(
                "rate_limited",
                "Too many requests for this tenant and principal; retry later.",
                retry_after=retry_after,
            )

    def close(self) -> None:
        """Release the shared file, if any."""
        close: Any = getattr(self.store, "close", None)
        if close is not None:
            close()
