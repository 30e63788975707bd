"""Reads for reconcilers and auditors: keyset pages of operations, receipts and the access log, and
chain verification. Every page is ordered by an immutable key, so rows changing underneath never
make a page repeat or skip an item."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from effect_ledger.db.catalogue import sql
from effect_ledger.db.ledger import Ledger, row_to_operation
from effect_ledger.db.pools import tenant_tx
from effect_ledger.domain.chain import GENESIS_HASH
from effect_ledger.domain.errors import not_found
from effect_ledger.domain.model import UNKNOWN, Operation
from effect_ledger.domain.timefmt import format_ts
from effect_ledger.domain.verification import ChainVerdict, verify_chain

T = TypeVar("T")
Key = tuple[datetime, str]
# Bounds that stand for "no bound" so that every query keeps one shape (and one plan).
BEFORE_ALL: Key = (datetime(1, 1, 2, tzinfo=UTC), "")
END_OF_TIME = datetime(9999, 12, 30, tzinfo=UTC)
VERIFY_PREFETCH = 1000
FEED_BATCH = 1000  # positions handed out per sequencing transaction


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page and the key of its last item when more follow (None: this is the last page)."""

    items: list[T]
    next_key: Key | None


@dataclass(frozen=True, slots=True)
class FeedPage:
    """One page of the receipts feed: (operation, position) items and the position to continue after
    when more follow (None: nothing more right now)."""

    items: list[tuple[Operation, int]]
    next_after: int | None


@dataclass(frozen=True, slots=True)
class TenantVerdict:
    """Whole-tenant verification: events checked and the first bad chain (operation and seq)."""

    checked: int
    first_bad_operation_id: str | None
    first_bad_seq: int | None


def _page(rows: Sequence[T], limit: int, key: Any) -> Page[T]:
    """Cut the look-ahead row off; its presence is what says another page exists."""
    items = list(rows[:limit])
    return Page(items, key(items[-1]) if len(rows) > limit and items else None)


async def list_operations(
    ledger: Ledger,
    tenant: str,
    *,
    status: str | None,
    tool: str | None,
    updated_before: datetime | None,
    after: Key | None,
    limit: int,
) -> Page[Operation]:
    """The reconciler list, oldest first by (created_at, operation_id); status is the effective one."""
    start = after or BEFORE_ALL
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "list") as (conn, db_now):
        args = (tenant, start[0], start[1], tool, updated_before, db_now, limit + 1)
        if status is None:
            rows = await conn.fetch(sql("list_operations"), *args)
        elif status == UNKNOWN:
            rows = await conn.fetch(sql("list_unknown_operations"), *args)
        else:
            rows = await conn.fetch(sql("list_operations_by_status"), *args, status)
    return _page([row_to_operation(r) for r in rows], limit, lambda op: (op.created_at, op.operation_id))


async def sequence_receipts(ledger: Ledger, tenant: str) -> int:
    """Give feed positions to the tenant's committed operations that have none yet; returns how many.

    Its own short transaction, two round trips, serialised per tenant by the counter row's lock
    (docs/retention-and-feed.md argues why a follower then never misses a receipt).
    """
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "feed_sequence") as (conn, _):
        last = await conn.fetchval(sql("feed_lock"), tenant)
        assigned: int = await conn.fetchval(sql("feed_assign"), tenant, last, FEED_BATCH)
    return assigned


async def list_receipts(
    ledger: Ledger,
    tenant: str,
    *,
    since: datetime | None,
    until: datetime | None,
    tool: str | None,
    principal: str | None,
    after: int | None,
    limit: int,
) -> FeedPage:
    """Committed operations after position `after`, in position order; since inclusive, until exclusive.
    Positions are handed out first, so everything committed before this call is on the feed."""
    await sequence_receipts(ledger, tenant)
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "receipts") as (conn, _):
        rows = await conn.fetch(
            sql("list_receipts"),
            tenant,
            after or 0,
            since or BEFORE_ALL[0],
            until or END_OF_TIME,
            tool,
            principal,
            limit + 1,
        )
    items = [(row_to_operation(r), int(r["feed_position"])) for r in rows[:limit]]
    return FeedPage(items, items[-1][1] if len(rows) > limit and items else None)


def access_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """An access-log row as auditors see it."""
    return {
        "access_id": row["access_id"],
        "at": format_ts(row["at"]),
        "incident": row["incident_id"],
        "principal": row["principal"],
        "purpose": row["purpose"],
    }


async def list_access_log(
    ledger: Ledger, tenant: str, *, since: datetime | None, after: Key | None, limit: int
) -> Page[Mapping[str, Any]]:
    """Who read which incident, when and why, oldest first by (at, access_id)."""
    start = after or BEFORE_ALL
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "access_log") as (conn, _):
        rows = await conn.fetch(
            sql("list_access_log"), tenant, start[0], start[1], since or BEFORE_ALL[0], limit + 1
        )
    return _page(rows, limit, lambda row: (row["at"], row["access_id"]))


def chain_verdict(rows: Sequence[Mapping[str, Any]]) -> ChainVerdict:
    """One operation's chain recomputed from its operation_chain rows (also used by the receipts log);
    a purged one from the point the purge cut it at. The rows are hashed as they are (each `at`
    rendered as the API shows it): no event view is built per row."""
    head = rows[0]
    events = [r for r in rows if r["seq"] is not None]
    return verdict_from(head, events, head["op_status"], head["op_attempt"], head["op_hash"])


def verdict_from(
    row: Mapping[str, Any], events: Sequence[Mapping[str, Any]], status: str, attempt: int, head_hash: str
) -> ChainVerdict:
    """Database event rows (in seq order) recomputed from the base `row` names (`purged_seq` and
    `purged_hash` when a purge cut the chain, else genesis) to a head recording `status` and `attempt`
    whose hash is `head_hash`."""
    purged = row["purged_seq"] is not None
    return verify_chain(
        events,
        status,
        attempt,
        base_seq=row["purged_seq"] if purged else 0,
        base_hash=row["purged_hash"] if purged else GENESIS_HASH,
        head_hash=head_hash,
        format_at=format_ts,
    )


async def verify_operation(ledger: Ledger, tenant: str, operation_id: str) -> ChainVerdict:
    """Recompute one operation's chain; not_found when the tenant has no such operation."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "verify") as (conn, _):
        rows = await conn.fetch(sql("operation_chain"), tenant, operation_id)
    if not rows:
        raise not_found()
    return chain_verdict(rows)


async def verify_tenant(ledger: Ledger, tenant: str) -> TenantVerdict:
    """Recompute every chain of the tenant, streamed in operation order; stop at the first bad one."""
    checked = 0
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "verify") as (conn, _):
        chain: list[Mapping[str, Any]] = []
        async for row in conn.cursor(sql("tenant_chains"), tenant, prefetch=VERIFY_PREFETCH):
            if chain and row["operation_id"] != chain[0]["operation_id"]:
                verdict = chain_verdict(chain)
                checked += verdict.checked
                if not verdict.ok:
                    return TenantVerdict(checked, chain[0]["operation_id"], verdict.first_bad_seq)
                chain = []
            chain.append(row)
        if chain:
            verdict = chain_verdict(chain)
            checked += verdict.checked
            if not verdict.ok:
                return TenantVerdict(checked, chain[0]["operation_id"], verdict.first_bad_seq)
    return TenantVerdict(checked, None, None)
