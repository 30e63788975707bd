"""Approval requests (docs/api.md section 15): decide and revoke (one round trip each), reads, and the
ask a gated claim passes to ledger.claim. The gate itself runs inside the claim (migration 0011).

Round trips: decide 1, revoke 1; reads (get, list, events) keep their tenant transaction: 4.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import asyncpg

from effect_ledger.db.catalogue import sql
from effect_ledger.db.ledger import Ledger
from effect_ledger.db.pools import run_statement, tenant_tx
from effect_ledger.domain.approvals import LIVE, ApprovalRule, approval_view, view_of
from effect_ledger.domain.errors import LedgerError, not_found
from effect_ledger.domain.timefmt import format_ts


@runtime_checkable
class ApprovalObserver(Protocol):
    """Told of every approval event once committed (metrics: effect_ledger_approvals_total{event})."""

    def approval_event(self, kind: str) -> None:
        """One committed event of `kind` (requested, approved, denied, revoked, expired, consumed)."""


def new_approval_id() -> str:
    """A request's ID: `apr_` + 128 random bits in hex."""
    return "apr_" + secrets.token_hex(16)


def claim_ask(rule: ApprovalRule, intent: Any, intent_given: bool, note: str | None) -> dict[str, Any]:
    """What ledger.claim's gate needs to request an approval: a fresh ID, the rule, the note, and the
    intent for the approvers to read (only when the claim sent it, not just its digest)."""
    ask: dict[str, Any] = {
        "approval_id": new_approval_id(),
        "required": rule.required,
        "ttl_seconds": rule.ttl_seconds,
        "note": note,
    }
    if intent_given:
        ask["intent"] = intent
    return ask


@dataclass(frozen=True, slots=True)
class Decided:
    """What a decide or revoke did: its outcome code and the request's view after it."""

    outcome: str
    view: dict[str, Any] | None
    events: tuple[str, ...] = ()


_REFUSALS = {
    "not_found": ("not_found", "No such approval request."),
    "forbidden": ("forbidden", "The requester cannot decide its own approval request."),
    "conflicting_outcome": ("conflicting_outcome", "This approver already decided otherwise."),
    "invalid_transition": ("invalid_transition", "The approval request does not allow this call now."),
}


def refusal_of(outcome: str) -> LedgerError | None:
    """The problem an outcome answers with, or None when it succeeded."""
    known = _REFUSALS.get(outcome)
    return None if known is None else LedgerError(known[0], known[1])


async def _run(ledger: Ledger, observer: ApprovalObserver | None, call: str, *args: Any) -> Decided:
    row = await run_statement(ledger.pool, args[0], ledger.acquire_timeout, call, sql(call), *args)
    assert row is not None
    kinds = tuple(e["kind"] for e in row["events"] or ())
    if observer is not None:
        for kind in kinds:
            observer.approval_event(kind)
    return Decided(row["outcome"], view_of(row["approval"], row["db_now"]), kinds)


async def decide(
    ledger: Ledger,
    tenant: str,
    approval_id: str,
    actor: str,
    decision: str,
    reason: str | None,
    observer: ApprovalObserver | None = None,
) -> Decided:
    """An approver's decision (approve | deny) on one request. One round trip."""
    return await _run(ledger, observer, "run_approval_decide", tenant, approval_id, actor, decision, reason)


async def revoke(
    ledger: Ledger,
    tenant: str,
    approval_id: str,
    actor: str,
    reason: str | None,
    observer: ApprovalObserver | None = None,
) -> Decided:
    """Revoke one request (unless consumed). One round trip."""
    return await _run(ledger, observer, "run_approval_revoke", tenant, approval_id, actor, reason)


async def get_approval(ledger: Ledger, tenant: str, approval_id: str) -> dict[str, Any]:
    """One request's view; not_found for a missing one or another tenant's. Four round trips."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "read") as (conn, _):
        row = await conn.fetchrow(sql("read_approval"), tenant, approval_id)
    if row is None:
        raise not_found()
    return approval_view(row, row["db_now"])


def _stored_filter(status: str | None) -> tuple[list[str] | None, bool | None]:
    """An effective status as (stored statuses, past expiry?) for list_approvals."""
    if status is None:
        return None, None
    if status == "expired":  # rewritten, or live and past expires_at
        return None, True  # filtered again below: a consumed request past expiry stays consumed
    if status in LIVE:
        return [status], False
    return [status], None


async def list_approvals(
    ledger: Ledger, tenant: str, status: str | None, limit: int, after: tuple[datetime, str] | None
) -> tuple[list[dict[str, Any]], tuple[datetime, str] | None]:
    """A page of the tenant's requests, oldest first, and the key the next page starts after."""
    stored, past = _stored_filter(status)
    key_time, key_id = after if after is not None else (None, None)
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "read") as (conn, _):
        if status == "expired":
            rows = await conn.fetch(
                sql("list_approvals"), tenant, ["expired"], None, key_time, key_id, limit + 1
            )
            rows += await conn.fetch(
                sql("list_approvals"), tenant, sorted(LIVE), True, key_time, key_id, limit + 1
            )
            rows = sorted(rows, key=lambda r: (r["requested_at"], r["approval_id"]))
        else:
            rows = await conn.fetch(sql("list_approvals"), tenant, stored, past, key_time, key_id, limit + 1)
    page = rows[:limit]
    views = [approval_view(r, r["db_now"]) for r in page]
    more = len(rows) > limit
    return views, ((page[-1]["requested_at"], page[-1]["approval_id"]) if more and page else None)


def event_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """An approval event as the API shows it (and as its hash covers it)."""
    return {
        "approval_id": row["approval_id"],
        "seq": row["seq"],
        "at": format_ts(row["at"]),
        "kind": row["kind"],
        "actor": row["actor"],
        "data": row["data"],
        "prev_hash": row["prev_hash"],
        "hash": row["hash"],
    }


async def list_events(ledger: Ledger, tenant: str, approval_id: str) -> Sequence[dict[str, Any]]:
    """One request's events in chain order; not_found when it is not the tenant's. Four round trips."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "read") as (conn, _):
        rows = await conn.fetch(sql("list_approval_events"), tenant, approval_id)
    if not rows:  # every request has its `requested` event
        raise not_found()
    return [event_view(r) for r in rows]


async def expire_due(conn: asyncpg.Connection, batch_size: int) -> int:
    """Maintenance (owner connection): record the expiry of every live request past its validity, with
    its `expired` event, one transaction per tenant. Returns how many expired."""
    async with conn.transaction():
        await conn.fetchval(sql("maintenance_scope"), "on")
        tenants = [r["tenant_id"] for r in await conn.fetch(sql("approval_expiry_tenants"))]
    expired = 0
    for tenant in tenants:
        while True:
            async with conn.transaction():
                n = int(await conn.fetchval(sql("expire_approvals"), tenant, batch_size))
            expired += n
            if n < batch_size:
                break
    return expired


async def purge_intents(conn: asyncpg.Connection) -> int:
    """Retention (owner connection): drop the intents stored for approvers once a request is past its
    validity, consumed or revoked (its digest stays). Returns how many were dropped."""
    async with conn.transaction():
        await conn.fetchval(sql("maintenance_scope"), "on")
        status: str = await conn.execute(sql("purge_approval_intents"))
    return int(status.split()[-1])
