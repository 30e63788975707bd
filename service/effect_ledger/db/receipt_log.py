"""The verifiable receipts log in PostgreSQL (API.md section 14, docs/verifiable-log.md).

- The **integrator** appends each tenant's committed receipts, in feed order, to the tenant's tree:
  leaf data into entry bundles, leaf hashes into level-0 tiles, full tiles hashed into the level
  above. One writer per tenant (the log_state row, locked SKIP LOCKED); as the owner, off the
  executor path: claim/submit/complete/resolve do not change.
- The **checkpointer** asks the signer to sign each tenant's grown tree, at most every
  LOG_CHECKPOINT_SECONDS, handing it the consistency proof (computed from tiles) from the size the
  signer last signed. Before that it re-checks what it can see: the root recomputed from the tiles
  is the integrated root, the new entries hash to the new level-0 tile hashes and their receipt
  digests are the operations' own. Any failure (or the signer's refusal) is a counted, logged refusal;
  the last good checkpoint keeps being served.
- **Rollback**: a tenant whose log is smaller than what the signer signed puts the guard in the
  `log_behind_signer` state: executor writes answer 503 until `effect-ledger log-recover`.
- The **reads** (tiles, checkpoint, proofs) run on the runtime pool, bound to the caller's tenant.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal

import asyncpg
import msgspec
import structlog

from effect_ledger.db.catalogue import sql
from effect_ledger.db.ledger import Ledger
from effect_ledger.db.maintenance import OwnerLink, in_background
from effect_ledger.db.pools import tenant_tx
from effect_ledger.db.reads import chain_verdict
from effect_ledger.domain import merkle, tiles
from effect_ledger.domain.chain import event_holds
from effect_ledger.domain.errors import LedgerError, not_found, validation_failed
from effect_ledger.domain.merkle import NodeReader, leaf_hash
from effect_ledger.domain.model import receipt_digest, receipt_digest_is
from effect_ledger.domain.note import (
    NoteError,
    Verifier,
    note_signed_by,
    parse_checkpoint,
    parse_note,
)
from effect_ledger.domain.receipt_log import LeafFacts, leaf_data, origin_of, proof_file
from effect_ledger.domain.tiles import ENTRIES, TILE_WIDTH, TileKey, TileRef
from effect_ledger.domain.timefmt import format_ts
from effect_ledger.domain.transitions import RECEIPT_CONTENT
from effect_ledger.domain.witness import add_checkpoint_body, parse_witnesses
from effect_ledger.settings import Settings
from effect_ledger.signer import LogSigner, Signed, SignRefused, signer_from_settings

log = structlog.get_logger("effect_ledger.receipt_log")

FEED_BATCH = 1000
# The integrator and the checkpointer run inside serve's workers: their Python work (chains, leaf
# data, digests: ~0.1 ms a receipt) is cut into slices of this many receipts with a yield to the
# event loop between slices, so a batch of a thousand never holds requests for tens of milliseconds.
SLICE = 64
# A pass that found a tenant's log state held by another writer (the checkpointer signing, another
# replica's integrator) comes back after this long, or after the interval when that is shorter.
HELD_RETRY_SECONDS = 0.05
AUDIT_BUNDLES = 4  # bundles of the already signed log re-checked per checkpoint attempt, round robin
IDLE_AUDIT_HORIZON = 3600  # seconds after its last checkpoint during which an idle log is still audited


@dataclass
class LogGuard:
    """What the log knows that the executor path must honour: tenants whose database log is behind
    what the signer signed (a restored backup). While any is, executor writes are refused; and until
    a first pass has compared the database with the signer (`checked`), nothing is known, and they are
    refused too (`log_not_checked`): a worker whose first pass failed (the signer or the database
    unreachable at start-up) must not serve writes on a database that may be a restored backup.
    Where the log is off, background_log marks the guard checked at once."""

    behind: dict[str, tuple[int, int]] = field(default_factory=dict)  # tenant -> (db size, signed size)
    checked: bool = False
    tainted: dict[str, str] = field(default_factory=dict)  # tenant -> the refusal that stops its signing
    audit_cursor: dict[str, int] = field(default_factory=dict)  # tenant -> next leaf the audit checks
    audited_at: dict[str, float] = field(default_factory=dict)  # tenant -> last idle audit (epoch s)
    integrated_after: str = ""  # the last tenant an integration pass took: the next starts after it
    # tenant -> the leaves this process's integrator appended that no checkpoint covers yet: index ->
    # (leaf hash, operation ID, the row version it verified); the checkpointer's short way (Built)
    built: dict[str, Built] = field(default_factory=dict)

    @property
    def refusal(self) -> str | None:
        """Why executor writes are refused now (`log_behind_signer`, `log_not_checked`), else None."""
        if self.behind:
            return "log_behind_signer"
        return None if self.checked else "log_not_checked"

    def audit_range(self, tenant: str, signed_size: int) -> tuple[int, int]:
        """The leaves [start, end) of the signed log the next audit re-checks: AUDIT_BUNDLES whole
        bundles, round robin. A round that reaches the end starts the next one at leaf 0, never in
        the middle of a bundle: until round 18 the cursor stopped at the signed size, and when the log
        had grown since, the next audit began there and skipped the start of that partial bundle (an
        edited leaf 0 of a log signed at 3, then 5, went unchecked when 7 was signed)."""
        start = self.audit_cursor.get(tenant, 0)
        start = 0 if start >= signed_size else start
        end = min(signed_size, start + AUDIT_BUNDLES * TILE_WIDTH)
        self.audit_cursor[tenant] = end if end < signed_size else 0
        return start, end


Refuse = Callable[[str, str], None]  # (reason, tenant)

# A leaf's index -> (its leaf hash, its operation ID, the version (xmin) of the row it was built from).
# The integrator verified that row (its head event, its receipt against that event: _intact_slice) and
# built the leaf from it; while the row is still that version and the entry still hashes to that leaf,
# the checkpointer has nothing to compare again (_check_new_entries). Bounded: past BUILT_MAX leaves a
# tenant's are no longer kept, and the checkpointer compares those in full.
Built = dict[int, tuple[bytes, str, int]]
BUILT_MAX = 200_000


def _no_refusal(reason: str, tenant: str) -> None:
    return


# ---- tiles in the database --------------------------------------------------------------------


async def _fetch_tiles(conn: asyncpg.Connection, tenant: str, keys: set[TileKey]) -> dict[TileKey, bytes]:
    if not keys:
        return {}
    ordered = sorted(keys)
    rows = await conn.fetch(sql("log_tiles_get"), tenant, [k[0] for k in ordered], [k[1] for k in ordered])
    return {(r["level"], r["idx"]): bytes(r["data"]) for r in rows}


async def _computed(
    conn: asyncpg.Connection,
    tenant: str,
    compute: Callable[[NodeReader], Any],
    have: Mapping[TileKey, bytes] = {},
) -> Any:
    """Run a proof or root computation over tiles: a dry run learns which subtree nodes it needs,
    one query fetches their tiles (those not already at hand), the real run reads them."""
    needed: list[tuple[int, int]] = []

    def record(nodes: Sequence[tuple[int, int]]) -> list[bytes]:
        needed.extend(nodes)
        return [bytes(32)] * len(nodes)

    compute(record)
    keys = tiles.node_tiles(needed) - set(have)
    got = {**have, **(await _fetch_tiles(conn, tenant, keys))}
    return compute(lambda nodes: tiles.read_nodes(nodes, got))


class TilesDamaged(Exception):
    """The stored tiles do not hold the tree the log's state says they do (a tile deleted or cut)."""


async def _from_tiles(
    conn: asyncpg.Connection,
    tenant: str,
    compute: Callable[[NodeReader], Any],
    have: Mapping[TileKey, bytes] = {},
) -> Any | None:
    """_computed, or None when a tile it needs is missing or too narrow (deleted or cut in the
    database): a root or a proof that cannot be recomputed matches nothing."""
    try:
        return await _computed(conn, tenant, compute, have)
    except LookupError:
        return None


async def _tile_root(
    conn: asyncpg.Connection, tenant: str, size: int, have: Mapping[TileKey, bytes] = {}
) -> bytes | None:
    """The root of the first `size` leaves from the stored tiles (None: see _from_tiles)."""
    root: bytes | None = await _from_tiles(conn, tenant, lambda read: merkle.tree_root(size, read), have)
    return root


def _digest_of(row: Mapping[str, Any]) -> str | None:
    """The receipt digest a row's leaf carries: its receipt's, or the one a tombstone kept."""
    receipt = row["receipt"]
    return receipt_digest(receipt) if receipt is not None else row["receipt_digest"]


def _digest_is(row: Mapping[str, Any], expected: Any) -> bool:
    """Whether a row's receipt digest (as _digest_of) is `expected`, a leaf's."""
    receipt = row["receipt"]
    if receipt is None:
        return bool((row["receipt_digest"] or "") == expected)
    return type(expected) is str and receipt_digest_is(receipt, expected)


def _facts(tenant: str, row: Mapping[str, Any]) -> LeafFacts:
    digest = _digest_of(row)
    return LeafFacts(
        tenant=tenant,
        operation_id=row["operation_id"],
        principal=row["principal"],
        tool=row["tool"],
        tool_version=row["tool_version"],
        intent_digest=row["intent_digest"],
        attempt=row["attempt"],
        receipt_digest=digest or "",
        chain_hash=row["commit_hash"],
        committed_at=row["resolved_at"],
    )


# ---- integrator -------------------------------------------------------------------------------


async def append_leaves(
    conn: asyncpg.Connection,
    tenant: str,
    size: int,
    data: Sequence[bytes],
    hashes: Sequence[bytes] | None = None,
) -> tuple[int, bytes]:
    """Append leaf data to the tenant's tiles and bundles (inside the caller's locked transaction);
    answers the new size and root. Used by the integrator and by log-recover. `hashes`: the data's
    leaf hashes, when the caller has them."""
    hashes = [leaf_hash(d) for d in data] if hashes is None else hashes
    edge_refs = tiles.edge(size)
    bundle_key = (ENTRIES, size // TILE_WIDTH)
    have = await _fetch_tiles(conn, tenant, {(r.level, r.index) for r in edge_refs} | {bundle_key})
    edge_map = {r.level: have.get((r.level, r.index), b"")[: r.width * 32] for r in edge_refs}
    try:
        changed = tiles.append(size, edge_map, hashes)
    except ValueError as damaged:  # an edge tile narrower than the log's size says: deleted or cut
        raise TilesDamaged(str(damaged)) from None
    entries = tiles.decode_bundle(have.get(bundle_key, b""))[: size % TILE_WIDTH]
    bundle_widths: dict[int, int] = {}  # each written bundle's entries (not decoded again to count)
    index = size
    for item in data:
        entries.append(item)
        index += 1
        if len(entries) == TILE_WIDTH or index == size + len(data):
            bundle = (index - 1) // TILE_WIDTH
            changed[(ENTRIES, bundle)] = tiles.encode_bundle(entries)
            bundle_widths[bundle] = len(entries)
            if len(entries) == TILE_WIDTH:
                entries = []
    new_size = size + len(data)
    root = await _tile_root(conn, tenant, new_size, changed)
    if root is None:
        raise TilesDamaged(f"the tiles of a log of size {size} lack nodes of its tree")
    rows = []
    for (level, idx), blob in sorted(changed.items()):
        width = bundle_widths[idx] if level == ENTRIES else len(blob) // 32
        rows.append((tenant, level, idx, width, blob))
    await conn.executemany(sql("log_tile_put"), rows)
    await conn.execute(sql("log_advance"), tenant, new_size, root)
    return new_size, root


def _slices(items: Sequence[Any]) -> list[Sequence[Any]]:
    return [items[i : i + SLICE] for i in range(0, len(items), SLICE)]


@dataclass(slots=True)
class _Verdicts:
    """A batch's verdicts: the operations intact, and those purged into tombstones between the batch's
    read and the second read of an operation whose head was not the usual one (_judged_again: two
    statements, each with its own snapshot)."""

    intact: set[str] = field(default_factory=set)
    purged: set[str] = field(default_factory=set)


async def _intact_receipts(
    conn: asyncpg.Connection, tenant: str, rows: Sequence[Mapping[str, Any]]
) -> _Verdicts:
    """The operations of a batch whose chain head is the row's and records its stored receipt: the
    committing event's receipt, by its actor, that event's hash the row's commit_hash (the hash the
    leaf records; a later `discrepancy` event moves the head, not the commit), its own hash recomputed.
    The head commits to every event before it (its prev_hash, and theirs): the leaf's chain_hash binds
    the whole history, which /verify and any auditor recompute. A tombstone has no events left to
    compare: its kept digest and commit hash are taken as they are. A receipt the purge turns into a
    tombstone after the batch read it is judged as read (its row and head come from one snapshot, and
    the leaf built from them is the one the tombstone would give: the same digest and commit hash),
    unless its head was not the usual one: then the second read finds the tombstone, and the next pass
    logs it. One slice of operations at a time."""
    checked = _Verdicts()
    for part in _slices(rows):
        await _intact_slice(conn, tenant, part, checked)
        await asyncio.sleep(0)
    return checked


async def _intact_slice(
    conn: asyncpg.Connection, tenant: str, rows: Sequence[Mapping[str, Any]], checked: _Verdicts
) -> None:
    """Each row checked against the head event log_batch read with it, in the same snapshot
    (_head_records_receipt); an operation whose head is not the usual one (a discrepancy after the
    commit, a purge base, or an edit) is judged again with its row read anew and its whole chain
    recomputed (_judged_again)."""
    doubtful = []
    for row in rows:
        if row["receipt"] is None:  # a tombstone: its kept digest and commit hash are taken as they are
            checked.intact.add(row["operation_id"])
        elif _head_records_receipt(row):
            checked.intact.add(row["operation_id"])
        else:
            doubtful.append(row)
    if doubtful:
        await _judged_again(conn, tenant, doubtful, checked)


def _head_records_receipt(row: Mapping[str, Any]) -> bool:
    """Whether a committed row's head event (log_batch reads it into the row, under the event's own
    column names) is the usual one, on a chain no purge cut: the row's chain head at the row's attempt,
    the event that recorded the row's receipt (_records_receipt: into committed, by the receipt's
    recorder, its hash the commit hash), its hash recomputed from its own fields and prev_hash
    (event_holds reads the row's `attempt`, the operation's, which must be the head's)."""
    return (
        row["hash"] is not None  # an operation without events has no head
        and row["purged_seq"] is None
        and row["hash"] == row["op_hash"]
        and row["head_attempt"] == row["attempt"]
        and _records_receipt(row, (row,))
        and event_holds(row, format_ts(row["at"]))
    )


def _records_receipt(row: Mapping[str, Any], chain: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the row's stored receipt is the one its chain recorded: the last event *into* committed
    (a `discrepancy` event, committed -> committed, records a conflicting report after it, and carries
    no receipt), by the receipt's recorder, that event's hash the row's commit_hash (the leaf's)."""
    events = [
        e
        for e in chain
        if e["seq"] is not None and e["to_status"] == "committed" and e["from_status"] != "committed"
    ]
    if not events:
        return False
    recorded = (events[-1]["data"] or {}).get("receipt") or {}
    stored = row["receipt"]
    return (
        all(stored.get(k) == recorded.get(k) for k in RECEIPT_CONTENT)
        and stored.get("recorded_by") == events[-1]["actor"]
        and events[-1]["hash"] == row["commit_hash"]
    )


async def _judged_again(
    conn: asyncpg.Connection, tenant: str, rows: Sequence[Mapping[str, Any]], checked: _Verdicts
) -> None:
    """The operations whose events did not lead to the head their rows were read with: their rows and
    events read again together. Purged since the batch read them (for the first time or again: an ID
    purged, claimed anew and committed, round 24): the next pass reads the tombstone. Otherwise
    intact when the chain now holds from the new read's head (an event appended since, such as a
    `discrepancy`), else left out of `intact`: refused, an edit. A row that stays half purged, its body
    kept, is checked as it is on the next pass, and refused."""
    chains: dict[str, list[Mapping[str, Any]]] = {}
    for row in await conn.fetch(sql("log_batch_chains"), tenant, [r["operation_id"] for r in rows]):
        chains.setdefault(row["operation_id"], []).append(row)
    for chain in chains.values():  # each chain by seq (an operation without events has one row, seq NULL)
        if len(chain) > 1:
            chain.sort(key=itemgetter("seq"))
    for row in rows:
        chain = chains.get(row["operation_id"], [])
        if chain and row["purged_seq"] != chain[0]["purged_seq"]:
            checked.purged.add(row["operation_id"])
        elif chain and chain_verdict(chain).ok and _records_receipt(row, chain):
            checked.intact.add(row["operation_id"])


async def integrate_tenant(
    conn: asyncpg.Connection,
    tenant: str,
    batch_size: int,
    refuse: Refuse = _no_refusal,
    built: Built | None = None,
) -> int | None:
    """Position the tenant's new receipts on the feed, then append the next batch to its log; answers
    how many leaves were appended (None when another writer, an integrator or the checkpointer, holds
    the tenant's log state). `built`: where the appended leaves are recorded once committed (Built)."""
    async with conn.transaction():
        await conn.fetchrow(sql("tenant_context"), tenant)
        last = await conn.fetchval(sql("feed_lock"), tenant)
        await conn.fetchval(sql("feed_assign"), tenant, last, FEED_BATCH)
    async with conn.transaction():
        await conn.fetchrow(sql("tenant_context"), tenant)
        await conn.execute(sql("log_open"), tenant)
        state = await conn.fetchrow(sql("log_lock"), tenant)
        if state is None:
            return None
        size = int(state["size"])
        rows = await conn.fetch(sql("log_batch"), tenant, size, batch_size)
        checked = await _intact_receipts(conn, tenant, rows)
        data: list[bytes] = []
        salts = os.urandom(32 * len(rows))  # one system call a batch, not one a leaf
        for k, row in enumerate(rows):
            if row["feed_position"] != size + 1 + k:  # the feed is gap-free; stop at anything else: a
                # position whose committed operation is gone (deleted in the database, or a tombstone
                # expired before the log had it) stops the log for good, so it is a refusal (alerted on)
                refuse("feed_gap", tenant)
                log.error("log_feed_gap", tenant=tenant, expected=size + 1 + k, found=row["feed_position"])
                break
            if row["operation_id"] in checked.purged:  # the next pass logs its tombstone: no edit
                log.info(
                    "log_batch_met_a_purge", tenant=tenant, operation_id=row["operation_id"], index=size + k
                )
                break
            if row["operation_id"] not in checked.intact:  # edited before it was logged: never logged
                refuse("receipt_mismatch", tenant)
                log.error(
                    "log_receipt_refused", tenant=tenant, operation_id=row["operation_id"], index=size + k
                )
                break
            data.append(leaf_data(_facts(tenant, row), size + k, salts[32 * k : 32 * k + 32]))
            if k % SLICE == SLICE - 1:
                await asyncio.sleep(0)
        if not data:
            return 0
        hashes = [leaf_hash(d) for d in data]
        try:
            await append_leaves(conn, tenant, size, data, hashes)
        except TilesDamaged:  # nothing written yet; refused (and counted) each pass until repaired
            refuse("root_mismatch", tenant)
            log.error("log_tiles_damaged", tenant=tenant, size=size)
            return 0
    if built is not None and len(built) + len(data) <= BUILT_MAX:  # committed: the leaves are the log's
        # the first len(data) rows built the data, in order (a pass that stopped early left the rest)
        for k, (digest, row) in enumerate(zip(hashes, rows, strict=False)):
            built[size + k] = (digest, row["operation_id"], row["row_version"])
    return len(data)


Pass = Literal["full", "held", "done"]

# Tenants an integration pass takes at most, round robin (round 24: an unordered LIMIT gave the same
# ones every pass, and more tenants with receipts than this, some of them stuck behind the signer or
# refused, would have starved the rest).
TENANTS_A_PASS = 1000


async def integrate(
    conn: asyncpg.Connection, batch_size: int, guard: LogGuard, refuse: Refuse = _no_refusal
) -> Pass:
    """One integration pass over every tenant with receipts to log (tenants behind the signer wait
    for log-recover: their positions would collide with signed leaves). Answers `full` when a tenant
    filled its whole batch (more of its receipts may be waiting: the next pass should not wait),
    `held` when a tenant's log state was held by another writer (its receipts wait: the next pass
    soon, HELD_RETRY_SECONDS), else `done`. Until round 14 a held tenant counted as caught up, and the
    integrator slept a whole interval after meeting the checkpointer's lock."""
    found = await _across_tenants(conn, "log_tenants_to_integrate", TENANTS_A_PASS, guard.integrated_after)
    tenants = [r["tenant_id"] for r in found]
    if len(tenants) == TENANTS_A_PASS:  # more may wait: the next pass starts after the last one here
        guard.integrated_after = tenants[-1]
    full = held = False
    for tenant in tenants:
        if tenant in guard.behind:
            continue
        appended = await integrate_tenant(
            conn, tenant, batch_size, refuse, guard.built.setdefault(tenant, {})
        )
        # full: its batch, or as many as one pass positions on the feed (FEED_BATCH), whichever is less
        held |= appended is None
        full |= appended is not None and appended >= min(batch_size, FEED_BATCH)
    return "full" if full else "held" if held else "done"


# ---- checkpointer -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogConfig:
    origin_prefix: str
    checkpoint_seconds: int


class _Checked(msgspec.Struct, gc=False):
    """What the checkpointer compares of a leaf with its operation's row (other members are skipped
    unread; a leaf that is no JSON object fails to decode, an entry mismatch)."""

    operation_id: Any = None
    index: Any = None
    receipt_digest: Any = None
    chain_hash: Any = None
    committed_at: Any = None  # read only when the operation's row is gone


_decode_entry = msgspec.json.Decoder(_Checked).decode


# The shortest life a committed operation's row can have under any configuration: the purge makes it a
# tombstone RETENTION_DAYS (at least 1) after its last change, and the tombstone expires TOMBSTONE_DAYS
# (at least RETENTION_DAYS) after the same last change (tombstone_operations leaves updated_at alone):
# one day, at RETENTION_DAYS = TOMBSTONE_DAYS = 1. Settings can change (an operator raising
# TOMBSTONE_DAYS must not make yesterday's expiries look like deletions), so the floors decide; an hour
# less for the distance between this process's clock and the database's, which the purge judges by.
# Until round 24 it was two days, and an expiry under the shortest settings was refused as a deletion.
MIN_ROW_AGE = timedelta(days=1) - timedelta(hours=1)


def _may_have_expired(leaf: _Checked) -> bool:
    """Whether a logged operation whose row is gone can have left by its tombstone's expiry: never
    within MIN_ROW_AGE of its commit. A row gone sooner was deleted: the operation was dropped (and
    its ID could execute again)."""
    try:
        committed = datetime.fromisoformat(str(leaf.committed_at))
    except ValueError:
        return False
    if committed.tzinfo is None:
        return False
    return committed < datetime.now(UTC) - MIN_ROW_AGE


def _position_of(leaf: _Checked) -> int | None:
    """The feed position a leaf names (its index + 1), None when it names none."""
    index = leaf.index
    return index + 1 if type(index) is int else None


async def _check_new_entries(
    conn: asyncpg.Connection, tenant: str, old: int, new: int, built: Built | None = None
) -> str | None:
    """The entries appended since the signed size must hash to the level-0 tile hashes, and each
    leaf's receipt digest must still be its operation's (a row gone before its tombstone could have
    expired: `receipt_missing`); the first failure's reason, else None.

    The short way (round 31): an entry that is the leaf this process's integrator built (`built`: the
    same leaf hash), whose operation row is still the version the integrator verified and whose feed
    position is the leaf's (log_rows_changed), is its operation's: the leaf was built from that row.
    Every other entry, and every one whose row changed since, is decoded and compared in full."""
    first, last = old // TILE_WIDTH, (new - 1) // TILE_WIDTH
    keys = {(lvl, n) for n in range(first, last + 1) for lvl in (ENTRIES, 0)}
    got = await _fetch_tiles(conn, tenant, keys)

    known = built or {}
    short: list[tuple[str, int, int, bytes]] = []  # (operation ID, row version, feed position, entry)
    full: list[bytes] = []
    for n in range(first, last + 1):
        try:
            entries = tiles.decode_bundle(got.get((ENTRIES, n), b""))
        except ValueError:
            return "entry_mismatch"
        hashes = got.get((0, n), b"")
        await asyncio.sleep(0)  # a bundle (256 entries) at a time
        for i, entry in enumerate(entries):
            index = n * TILE_WIDTH + i
            if not old <= index < new:
                continue
            digest = leaf_hash(entry)
            if hashes[i * 32 : i * 32 + 32] != digest:
                return "entry_mismatch"
            ours = known.get(index)
            if ours is not None and ours[0] == digest:
                short.append((ours[1], ours[2], index + 1, entry))
            else:
                full.append(entry)
    if len(short) + len(full) != new - old:
        return "entry_mismatch"
    for part in _slices(short):
        ids, versions, positions = [s[0] for s in part], [s[1] for s in part], [s[2] for s in part]
        changed = {
            r["operation_id"]
            for r in await conn.fetch(sql("log_rows_changed"), tenant, ids, versions, positions)
        }
        full.extend(s[3] for s in part if s[0] in changed)
        await asyncio.sleep(0)
    leaves: list[_Checked] = []
    for entry in full:
        try:
            leaves.append(_decode_entry(entry))  # msgspec, three members: 5x json.loads' whole leaf
        except ValueError:  # msgspec.DecodeError (and ValidationError) is one
            return "entry_mismatch"
    for part in _slices(leaves):
        ids = [str(leaf.operation_id) for leaf in part]
        current = {r["operation_id"]: r for r in await conn.fetch(sql("log_receipts_of"), tenant, ids)}
        for leaf in part:
            row = current.get(leaf.operation_id)
            if row is not None and row["feed_position"] != _position_of(leaf):
                # the ID's row is another use of it: the logged one expired (its feed position went
                # with it) and the ID was claimed anew (API.md section 9a); until round 24 it was
                # compared with the leaf, and the tenant was never signed again
                row = None
            if row is None:
                if _may_have_expired(leaf):
                    continue  # an expired tombstone: nothing left to compare
                return "receipt_missing"
            if leaf.chain_hash != row["commit_hash"] or not _digest_is(row, leaf.receipt_digest):
                return "receipt_mismatch"
        await asyncio.sleep(0)
    return None


async def checkpoint_tenant(
    conn: asyncpg.Connection,
    tenant: str,
    signer: LogSigner,
    config: LogConfig,
    signed: Signed | None,
    refuse: Refuse,
    guard: LogGuard | None = None,
    again: bool = False,
) -> int | None:
    """Ask the signer to sign the tenant's integrated tree; answers the signed size, or None. `again`:
    the tree is the one the signer signed last (`signed`), and the database has no checkpoint of it.

    Checked first: the root from the tiles is the integrated root; the new entries (and, round
    robin, AUDIT_BUNDLES bundles of the signed part) hash to their level-0 tile hashes and carry
    their operations' receipt digests. A mismatch found once keeps the tenant unsigned (until the
    process restarts and its audit finds the data repaired)."""
    guard = guard or LogGuard()
    origin = origin_of(config.origin_prefix, tenant)
    old = signed or Signed(0, merkle.EMPTY_ROOT)
    async with conn.transaction():
        await conn.fetchrow(sql("tenant_context"), tenant)
        state = await conn.fetchrow(sql("log_lock"), tenant)
        if state is None:
            return None
        size, root = int(state["size"]), bytes(state["root"])
        if size < old.size or (size == old.size and not again):
            return None
        reason = guard.tainted.get(tenant)
        if reason is None and await _tile_root(conn, tenant, size) != root:
            reason = "root_mismatch"
        if reason is None:
            reason = await _check_new_entries(
                conn, tenant, old.size, size, _built_after(guard, tenant, old.size)
            )
        if reason is None and old.size > 0:
            start, end = guard.audit_range(tenant, old.size)
            reason = await _check_new_entries(conn, tenant, start, end)
        proof: list[bytes] | None = None
        if reason is None:  # None: a tile of the signed part is gone (the new part's were read above)
            proof = await _from_tiles(conn, tenant, lambda r: merkle.consistency_proof(old.size, size, r))
            reason = "root_mismatch" if proof is None else None
        if reason is not None:
            guard.tainted[tenant] = reason
        if proof is not None:  # every check passed
            try:
                note = await signer.sign(origin, size, root, proof)
            except SignRefused as refused:
                reason = refused.reason
                if reason in RACED and await _signed_meanwhile(signer, origin, old):
                    # another replica's checkpointer signed after this pass read the signer's state:
                    # the proof was from an older size. No refusal (it was counted and alerted on until
                    # round 24, in every deployment of more than one replica); the next pass starts
                    # from the new state, and a database that is really not an extension is refused then
                    log.info("log_checkpoint_raced", tenant=tenant, size=size, read_size=old.size)
                    return None
        if reason is not None:
            refuse(reason, tenant)
            log.warning(
                "log_checkpoint_refused", tenant=tenant, reason=reason, size=size, signed_size=old.size
            )
            return None
        await conn.execute(sql("log_checkpoint_put"), tenant, size, root, note)
        await conn.execute(sql("log_signed"), tenant, size)
    _built_after(guard, tenant, size)
    return size


def _built_after(guard: LogGuard, tenant: str, size: int) -> Built:
    """The tenant's built leaves, those a checkpoint of `size` covers forgotten (in place: an
    integration pass may be adding to the same dict meanwhile)."""
    built = guard.built.get(tenant)
    if built is None:
        return {}
    for index in [index for index in built if index < size]:
        del built[index]
    return built


# The signer's refusals that a stale read of its state explains.
RACED = frozenset({"inconsistent", "log_behind_signer"})


async def _signed_meanwhile(signer: LogSigner, origin: str, read: Signed) -> bool:
    """Whether the signer's state for `origin` moved on from what the pass read."""
    now = (await signer.states()).get(origin)
    return now is not None and (now.size, now.root) != (read.size, read.root)


async def audit_idle(
    conn: asyncpg.Connection,
    tenant: str,
    row: Mapping[str, Any],
    config: LogConfig,
    guard: LogGuard,
    refuse: Refuse,
    now: float,
    signed: Signed,
) -> None:
    """A log that did not grow is audited all the same, at most every LOG_CHECKPOINT_SECONDS while it
    was signed within the last hour: the root from its tiles against the root the signer signed (its
    own state, outside the database: since round 18, not the database's `log_state.root`, which an
    edit of a leaf could have rewritten along with its tile hashes), and AUDIT_BUNDLES bundles (round
    robin) against their tiles and receipts. What it finds is a refusal, and the tenant stays
    unsigned."""
    signed_at = row["signed_at"]
    if tenant in guard.tainted or signed_at is None or now - signed_at.timestamp() > IDLE_AUDIT_HORIZON:
        return
    if now - guard.audited_at.get(tenant, 0.0) < config.checkpoint_seconds:
        return
    guard.audited_at[tenant] = now
    size, root = signed.size, signed.root
    async with conn.transaction():
        await conn.fetchrow(sql("tenant_context"), tenant)
        reason = None
        if await _tile_root(conn, tenant, size) != root:
            reason = "root_mismatch"
        else:
            start, end = guard.audit_range(tenant, size)
            reason = await _check_new_entries(conn, tenant, start, end)
    if reason is not None:
        guard.tainted[tenant] = reason
        refuse(reason, tenant)
        log.warning("log_audit_failed", tenant=tenant, reason=reason, size=size)


async def behind_signer(
    conn: asyncpg.Connection, states: Mapping[str, Signed], origin_prefix: str
) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    """Every tenant's log state, and the tenants whose database log is smaller than what the signer
    signed for them: tenant -> (database size, signed size)."""
    rows = {r["tenant_id"]: r for r in await _across_tenants(conn, "log_states")}
    prefix = origin_prefix + "/"
    behind: dict[str, tuple[int, int]] = {}
    for origin, done in states.items():
        if not origin.startswith(prefix):
            continue
        tenant = origin[len(prefix) :]
        db_size = int(rows[tenant]["size"]) if tenant in rows else 0
        if db_size < done.size:
            behind[tenant] = (db_size, done.size)
    return rows, behind


async def watch_guard(
    conn: asyncpg.Connection,
    signer: LogSigner,
    config: LogConfig,
    guard: LogGuard,
    refuse: Refuse = _no_refusal,
) -> tuple[dict[str, Signed], dict[str, Any], dict[str, tuple[int, int]]]:
    """Put the tenants whose database log is behind what the signer signed in the guard (a tenant newly
    behind is refused and logged once); answers the signer's states, every tenant's log state and the
    tenants behind. The first part of every checkpointer pass, and all a worker does when the log runs
    in its own process."""
    states = await signer.states()
    rows, behind = await behind_signer(conn, states, config.origin_prefix)
    for tenant, sizes in behind.items():
        if tenant not in guard.behind:
            refuse("log_behind_signer", tenant)
            log.error("log_behind_signer", tenant=tenant, db_size=sizes[0], signed_size=sizes[1])
    guard.behind = behind
    guard.checked = True
    return states, rows, behind


async def checkpoint(
    conn: asyncpg.Connection,
    signer: LogSigner,
    config: LogConfig,
    guard: LogGuard,
    refuse: Refuse = _no_refusal,
) -> list[tuple[str, int]]:
    """One checkpointer pass: find tenants behind the signer (the guard), sign every grown tree
    whose last checkpoint is older than LOG_CHECKPOINT_SECONDS. Answers (tenant, size) signed."""
    states, rows, behind = await watch_guard(conn, signer, config, guard, refuse)
    prefix = config.origin_prefix + "/"
    signed: list[tuple[str, int]] = []
    now = time.time()
    for tenant, row in rows.items():
        if tenant in behind or row["size"] == 0:
            continue
        done = states.get(prefix + tenant)
        if done is not None and row["size"] == done.size and (row["signed_size"] or 0) < done.size:
            # the tree the signer signed last, with no checkpoint of it in the database: log-recover
            # rebuilt it from mirrored bundles (or the process stopped between the signature and its
            # commit). Signed again (the same tree: an empty consistency proof), so that the recovered
            # receipts are provable without waiting for a new commit (until round 24 they waited)
            size = await checkpoint_tenant(conn, tenant, signer, config, done, refuse, guard, again=True)
            if size is not None:
                signed.append((tenant, size))
            continue
        if done is not None and row["size"] <= done.size:  # idle, by the signer's own state
            await audit_idle(conn, tenant, row, config, guard, refuse, now, done)
            continue
        last = row["signed_at"]
        if last is not None and now - last.timestamp() < config.checkpoint_seconds:
            continue
        size = await checkpoint_tenant(conn, tenant, signer, config, done, refuse, guard)
        if size is not None:
            signed.append((tenant, size))
    return signed


# ---- reads (runtime pool, the caller's tenant) ---------------------------------------------------


class LogTampered(Exception):
    """Stored log data no longer matches what was logged (an edit in the database): a 500, logged."""


def not_yet_logged(retry_after: int, cosigned: bool = False) -> LedgerError:
    """409 not_yet_logged; `cosigned`: the receipt is in a signed checkpoint, but in none that the
    witnesses' quorum has cosigned yet."""
    detail = (
        "The receipt is in a signed checkpoint, but not yet in one the witnesses' quorum has cosigned."
        if cosigned
        else "The receipt is committed but not yet in a signed checkpoint."
    )
    return LedgerError("not_yet_logged", detail, retry_after=retry_after)


@dataclass(frozen=True, slots=True)
class CheckpointView:
    size: int
    root: bytes
    note: str  # the log's signed note with the collected cosignature lines that verify
    cosigned_by: tuple[str, ...]  # the configured witnesses those lines are from


async def latest_checkpoint(ledger: Ledger, tenant: str, witnesses: Witnesses) -> CheckpointView | None:
    """The tenant's latest signed checkpoint with the cosignatures of `witnesses` that verify."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "log_checkpoint") as (conn, _):
        row = await conn.fetchrow(sql("log_latest_checkpoint"), tenant)
    if row is None:
        return None
    cosignatures, names = witnessed(row["note"], row["cosignatures"] or "", witnesses)
    return CheckpointView(int(row["size"]), bytes(row["root"]), row["note"] + cosignatures, names)


async def read_tile(ledger: Ledger, tenant: str, ref: TileRef) -> bytes | None:
    """A tile or entry bundle as c2sp.org/tlog-tiles serves it: a full one only once full, a partial
    one of width W as the first W hashes (or entries) of the stored one."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "log_tile") as (conn, _):
        got = await _fetch_tiles(conn, tenant, {(ref.level, ref.index)})
    blob = got.get((ref.level, ref.index))
    if blob is None:
        return None
    if ref.level == ENTRIES:
        entries = tiles.decode_bundle(blob)
        if len(entries) < ref.width or (not ref.partial and len(entries) != TILE_WIDTH):
            return None
        return tiles.encode_bundle(entries[: ref.width])
    if not ref.partial:
        return blob if len(blob) == tiles.FULL_TILE_BYTES else None
    return tiles.tile_prefix(blob, ref.width)


# How many of a tenant's newest checkpoints a proof looks through for one its witnesses' quorum cosigned.
COSIGNED_LOOKBACK = 64


def witnessed(note: str, lines: str, witnesses: Witnesses) -> tuple[str, tuple[str, ...]]:
    """Of the cosignature lines kept for a checkpoint's `note`, those that verify against a configured
    witness's key (one a witness), and those witnesses' names. A line that does not verify (written
    into the database by hand, or by a witness no longer configured) is never served: a verifier that
    knows the key name rejects a note with a bad signature of that key (golang.org/x/mod/sumdb/note's
    Open does), so one such line would make the whole checkpoint unverifiable."""
    kept = [(w.name, found[0]) for w in witnesses.items if (found := _cosignatures(note, lines, w.key))]
    return "".join(line for _, line in kept), tuple(name for name, _ in kept)


async def proof_of(
    ledger: Ledger, tenant: str, operation_id: str, retry_after: int, witnesses: Witnesses
) -> str:
    """The tlog-proof@v1 file of a committed operation against the newest checkpoint that holds it and
    that the witnesses' quorum cosigned (API.md section 14: "the cosigned checkpoint it proves
    against"); with no witnesses, the newest checkpoint. A receipt in no such checkpoint yet (not
    signed yet, or signed in checkpoints the quorum has not cosigned yet) is `not_yet_logged`: a proof
    against an uncosigned checkpoint is one the auditors' `--quorum` refuses."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "log_proof") as (conn, _):
        found = await conn.fetchrow(sql("log_position"), tenant, operation_id)
        if found is None:
            raise not_found()
        position = found["feed_position"]
        if position is None:
            raise not_yet_logged(retry_after)  # committed, not yet on the feed
        covering = await conn.fetch(
            sql("log_checkpoints_covering"), tenant, position, COSIGNED_LOOKBACK, witnesses.quorum > 0
        )
        row, cosignatures = None, ""
        for candidate in covering:
            cosignatures, names = witnessed(candidate["note"], candidate["cosignatures"] or "", witnesses)
            if len(names) >= witnesses.quorum:
                row = candidate
                break
        if row is None:  # in no checkpoint yet, or in none the quorum cosigned yet
            signed = bool(covering)
            if not signed and witnesses.quorum > 0:  # only cosigned ones were read: is it signed at all?
                latest = await conn.fetchrow(sql("log_latest_checkpoint"), tenant)
                signed = latest is not None and int(latest["size"]) >= int(position)
            raise not_yet_logged(retry_after, cosigned=signed)
        index = int(position) - 1
        size = int(row["size"])
        bundle = (await _fetch_tiles(conn, tenant, {(ENTRIES, index // TILE_WIDTH)})).get(
            (ENTRIES, index // TILE_WIDTH)
        )
        try:
            leaf: bytes | None = tiles.decode_bundle(bundle or b"")[index % TILE_WIDTH]
        except (ValueError, IndexError):  # the signed leaf's bundle is gone, cut short or unreadable
            leaf = None
        proof = await _from_tiles(conn, tenant, lambda read: merkle.inclusion_proof(index, size, read))
        signed_root = _signed_root(row["note"])
        # One check for every edit after logging (the entry, a tile on its path, a root rewritten to
        # match them): the leaf and its path must lead to the root the checkpoint's note signs. Until
        # round 18 only the entry was compared with its level-0 tile (a second read of that tile), and a
        # leaf rewritten with its tile hashes was served with a proof no verifier accepts.
        if (
            leaf is None
            or proof is None
            or not merkle.verify_inclusion(index, size, leaf_hash(leaf), proof, signed_root)
        ):
            log.error("log_proof_mismatch", tenant=tenant, index=index)
            raise LogTampered("the stored log no longer proves this entry")
    return proof_file(leaf, index, proof, row["note"] + cosignatures)


def _signed_root(note: str) -> bytes:
    """The root a stored checkpoint's note signs (b"" when the note no longer parses: it proves
    nothing then either)."""
    try:
        return parse_checkpoint(parse_note(note).text).root
    except NoteError:
        return b""


async def consistency_of(
    ledger: Ledger, tenant: str, old: int, new: int | None = None
) -> tuple[list[bytes], int]:
    """RFC 9162 consistency proof from size `old` to a signed checkpoint's size `new` (by default the
    latest one's, which may have grown since the caller read a checkpoint), and the size it proves to.

    Checked before it is served, as proof_of's: with the root of the first `old` leaves from the
    tiles, the proof must lead to the root the target checkpoint's note signs. Tiles rewritten after
    signing (however consistently with each other) give a 500 and `log_proof_mismatch`, not a proof
    no verifier accepts."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "log_consistency") as (conn, _):
        latest = await conn.fetchrow(sql("log_latest_checkpoint"), tenant)
        if latest is None:  # nothing signed yet: the empty tree is consistent with itself only
            if old != 0 or new not in (None, 0):
                raise validation_failed([("from", "must be 0: no checkpoint is signed yet")])
            return [], 0
        row = latest if new is None else await conn.fetchrow(sql("log_checkpoint_at"), tenant, new)
        if row is None:
            size = int(latest["size"])
            raise validation_failed([("to", f"must be the size of a signed checkpoint (at most {size})")])
        target = int(row["size"])
        if old < 0 or old > target:
            raise validation_failed([("from", f"must be from 0 to the proof's target size {target}")])
        proof = await _from_tiles(conn, tenant, lambda read: merkle.consistency_proof(old, target, read))
        old_root = await _tile_root(conn, tenant, old)
        if (
            proof is None
            or old_root is None
            or not merkle.verify_consistency(old, target, old_root, _signed_root(row["note"]), proof)
        ):
            log.error("log_proof_mismatch", tenant=tenant, size=target, since=old)
            raise LogTampered("the stored log no longer proves the checkpoint's consistency")
    return proof, target


# ---- the background task of `serve` -----------------------------------------------------------------


_ELSEWHERE = [False]  # set by serve's supervisor before it forks: one process of its own runs the log


def log_runs_elsewhere() -> None:
    """From now on (and in every process forked from now on) background_log only watches the guard:
    the integrator and the checkpointer run in the log process (LOG_OWN_PROCESS, http.prefork)."""
    _ELSEWHERE[0] = True


def own_log_process(settings: Settings) -> bool:
    """Whether `serve` runs the log in a process of its own: LOG_OWN_PROCESS under the ledger server."""
    return (
        settings.log_enabled
        and settings.log_own_process
        and bool(settings.database_url)
        and settings.http_server == "ledger"
    )


@asynccontextmanager
async def background_log(
    settings: Settings, guard: LogGuard, refuse: Refuse = _no_refusal, *, guard_only: bool | None = None
) -> AsyncIterator[None]:
    """The integrator and the checkpointer inside `serve` (LOG_ENABLED), on an owner connection each.
    The first checkpointer pass (which finds a database behind the signer) runs before serving.

    `guard_only` (by default: whether the log runs in a process of its own, see log_runs_elsewhere):
    only the guard is kept, by a watch_guard pass before serving and then every second, on one owner
    connection; refusals are the log process's to count."""
    if not settings.log_enabled or not settings.database_url:
        guard.checked = True  # no log: nothing to be behind
        yield
        return
    signer = signer_from_settings(settings)
    config = LogConfig(settings.log_origin, settings.log_checkpoint_seconds)
    if _ELSEWHERE[0] if guard_only is None else guard_only:
        async with _watching_guard(settings, signer, config, guard):
            yield
        return
    witnesses = witness_config(settings)
    integrating, checkpointing = OwnerLink(settings), OwnerLink(settings)
    witnessing = OwnerLink(settings)
    unsent: list[tuple[str, int]] = []  # checkpoints signed, not yet offered to the witnesses
    missed = WitnessRetries()  # checkpoints a witness did not cosign, offered again until it does

    async def offer(conn: asyncpg.Connection, tenant: str, size: int) -> None:
        missed.offered(tenant, size, await submit_to_witnesses(conn, config, witnesses, tenant, size))

    async def checkpoint_pass() -> None:
        try:
            conn = await checkpointing.get()
            signed = await checkpoint(conn, signer, config, guard, refuse)
            if witnesses.items:
                unsent.extend(signed)
        except Exception as exc:  # a blip, a failover: the next pass retries on a new connection
            checkpointing.drop()
            log.warning("log_checkpoint_failed", exception_type=type(exc).__name__)

    async def witness_loop() -> None:
        # Apart from the checkpoints (since round 24): a witness that does not answer holds up its own
        # offers, 5 s each, not the next checkpoint of every tenant. Its first pass offers every
        # tenant's latest checkpoint (each to the witnesses that have not cosigned it): one a witness
        # missed before a restart is not left uncosigned until the tenant's log grows again.
        seeded = False
        while True:
            try:
                conn = await witnessing.get()
                if not seeded:
                    unsent.extend(await latest_signed(conn))
                    seeded = True
                while unsent:  # a witness that does not answer is logged, not raised
                    await offer(conn, *unsent[0])
                    del unsent[0]
                for tenant, size in missed.due():
                    await offer(conn, tenant, size)
            except Exception as exc:
                witnessing.drop()
                log.warning("log_witness_pass_failed", exception_type=type(exc).__name__)
            await asyncio.sleep(min(1.0, settings.log_checkpoint_seconds / 2))

    async def integrate_loop() -> None:
        # A pass that filled a batch is followed by the next at once (a backlog, after a restart or a
        # burst, is logged at the integrator's speed, not at one batch per interval); one that met a
        # tenant held by another writer comes back shortly; the interval is the wait between passes
        # that found the log caught up.
        interval = settings.log_integrate_interval_ms / 1000
        waits = {"full": 0.0, "held": min(HELD_RETRY_SECONDS, interval), "done": interval}
        while True:
            outcome: Pass = "done"
            try:
                outcome = await integrate(await integrating.get(), settings.log_batch_size, guard, refuse)
            except Exception as exc:
                integrating.drop()
                log.warning("log_integrate_failed", exception_type=type(exc).__name__)
            await asyncio.sleep(waits[outcome])

    async def checkpoint_loop() -> None:
        while True:
            await asyncio.sleep(min(1.0, settings.log_checkpoint_seconds / 2))
            await checkpoint_pass()

    # The first pass (it finds a database behind the signer) before serving; what it signs goes to the
    # witnesses from the witness loop, so that a witness slow to answer does not hold up the start.
    await checkpoint_pass()
    loops = [integrate_loop(), checkpoint_loop()] + ([witness_loop()] if witnesses.items else [])
    try:
        async with in_background(*loops):
            yield
    finally:
        integrating.drop()
        checkpointing.drop()
        witnessing.drop()


@asynccontextmanager
async def _watching_guard(
    settings: Settings, signer: LogSigner, config: LogConfig, guard: LogGuard
) -> AsyncIterator[None]:
    link = OwnerLink(settings)

    async def watch() -> None:
        try:
            await watch_guard(await link.get(), signer, config, guard)
        except Exception as exc:  # the next pass retries; the guard keeps what it last knew
            link.drop()
            log.warning("log_guard_failed", exception_type=type(exc).__name__)

    async def watch_loop() -> None:
        while True:
            await asyncio.sleep(min(1.0, settings.log_checkpoint_seconds / 2))
            await watch()

    try:
        await watch()
        async with in_background(watch_loop()):
            yield
    finally:
        link.drop()


# ---- witnesses (c2sp.org/tlog-witness) ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Witness:
    url: str
    vkey: str  # as configured (shown to auditors)
    key: Verifier  # parsed once, at configuration

    @property
    def name(self) -> str:
        return self.key.name


@dataclass
class Witnesses:
    items: list[Witness]
    quorum: int
    known: dict[tuple[str, str], int] = field(default_factory=dict)  # (witness url, origin) -> size


def witness_config(settings: Settings) -> Witnesses:
    """LOG_WITNESSES (JSON list of {url, vkey}) and LOG_WITNESS_QUORUM (-1: all of them)."""
    items = [Witness(url, vkey, key) for url, vkey, key in parse_witnesses(settings.log_witnesses)]
    quorum = len(items) if settings.log_witness_quorum < 0 else settings.log_witness_quorum
    return Witnesses(items, quorum)


async def _cosign_one(
    conn: asyncpg.Connection,
    tenant: str,
    witnesses: Witnesses,
    witness: Witness,
    origin: str,
    size: int,
    note: str,
) -> str | None:
    """Submit one checkpoint to one witness (re-sending once from the size a 409 names)."""
    import httpx  # only with witnesses configured: 20 - 45 ms of CPU of every serve process otherwise

    old = witnesses.known.get((witness.url, origin), 0)
    async with httpx.AsyncClient(timeout=5.0) as client:
        for _ in range(2):
            old = min(old, size)
            async with conn.transaction():
                await conn.fetchrow(sql("tenant_context"), tenant)
                proof = await _computed(conn, tenant, functools.partial(merkle.consistency_proof, old, size))
            body = add_checkpoint_body(old, proof, note)
            response = await client.post(witness.url.rstrip("/") + "/add-checkpoint", content=body)
            if response.status_code == 409 and response.text.strip().isdigit():
                old = int(response.text.strip())
                continue
            if response.status_code != 200:
                log.warning(
                    "log_witness_refused", tenant=tenant, witness=witness.name, status=response.status_code
                )
                return None
            witnesses.known[(witness.url, origin)] = size
            return "".join(_cosignatures(note, response.text, witness.key)) or None
    return None


async def submit_to_witnesses(
    conn: asyncpg.Connection, config: LogConfig, witnesses: Witnesses, tenant: str, size: int
) -> int:
    """Offer the tenant's latest checkpoint, of `size`, to every configured witness that has not cosigned
    it yet, and keep the cosignatures that verify beside the ones it had; answers how many witnesses
    still have not cosigned it (0 also when a newer checkpoint superseded it: that one is offered)."""
    if not witnesses.items:
        return 0
    import httpx  # as _cosign_one

    origin = origin_of(config.origin_prefix, tenant)
    async with conn.transaction():
        await conn.fetchrow(sql("tenant_context"), tenant)
        row = await conn.fetchrow(sql("log_latest_checkpoint"), tenant)
    if row is None or row["size"] != size:
        return 0
    note, had = row["note"], row["cosignatures"] or ""
    collected, _ = witnessed(note, had, witnesses)  # lines that do not verify are dropped here
    missing = 0
    for witness in witnesses.items:
        if _cosignatures(note, collected, witness.key):
            continue
        try:
            got = await _cosign_one(conn, tenant, witnesses, witness, origin, size, note)
        except (httpx.HTTPError, NoteError) as exc:
            log.warning(
                "log_witness_unreachable",
                tenant=tenant,
                witness=witness.name,
                exception_type=type(exc).__name__,
            )
            got = None
        if got:
            collected += got
        else:
            missing += 1
    if collected != had:
        async with conn.transaction():
            await conn.fetchrow(sql("tenant_context"), tenant)
            await conn.execute(sql("log_cosignatures_put"), tenant, size, collected)
    count = len(witnesses.items) - missing
    if count < witnesses.quorum:
        log.warning(
            "log_witness_quorum_missed", tenant=tenant, size=size, cosignatures=count, quorum=witnesses.quorum
        )
    return missing


async def _across_tenants(conn: asyncpg.Connection, query: str, *args: Any) -> list[asyncpg.Record]:
    """The rows of a catalogue query that reads across tenants, in the maintenance scope (the integrator's
    tenants to integrate, every tenant's log state)."""
    async with conn.transaction():
        await conn.fetchval(sql("maintenance_scope"), "on")
        rows: list[asyncpg.Record] = await conn.fetch(sql(query), *args)
        await conn.fetchval(sql("maintenance_scope"), "off")
    return rows


async def latest_signed(conn: asyncpg.Connection) -> list[tuple[str, int]]:
    """Every tenant's latest checkpoint in the database, (tenant, size)."""
    states = await _across_tenants(conn, "log_states")
    return [(r["tenant_id"], int(r["signed_size"])) for r in states if r["signed_size"]]


def _cosignatures(note: str, lines: str, key: Verifier) -> list[str]:
    """The lines of `lines` (a witness's answer, or those kept for a checkpoint) that are `key`'s
    valid cosignatures of `note`, each with its newline."""
    found = (line + "\n" for line in lines.splitlines() if line)
    return [line for line in found if note_signed_by(parse_note(note + line), key)]


class WitnessRetries:
    """The checkpoints some witness did not cosign (it was down, slow, or refused), per tenant: offered
    again after RETRY_FIRST_SECONDS, then after twice the wait each time up to RETRY_MAX_SECONDS, until
    every witness has cosigned it or a newer checkpoint of the tenant supersedes it (the newer one is
    offered as it is signed). Without this an idle log kept an uncosigned checkpoint, and proofs against
    it that no quorum accepts, until it grew again."""

    RETRY_FIRST_SECONDS = 1.0
    RETRY_MAX_SECONDS = 60.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._waiting: dict[str, tuple[int, float, float]] = {}  # tenant -> (size, due, wait)

    def offered(self, tenant: str, size: int, missing: int) -> None:
        """Record the outcome of offering `tenant`'s checkpoint of `size`: `missing` witnesses did not
        cosign it."""
        if not missing:
            self._waiting.pop(tenant, None)
            return
        known = self._waiting.get(tenant)
        wait = self.RETRY_FIRST_SECONDS
        if known is not None and known[0] == size:
            wait = min(known[2] * 2, self.RETRY_MAX_SECONDS)
        self._waiting[tenant] = (size, self._clock() + wait, wait)

    def due(self) -> list[tuple[str, int]]:
        """The (tenant, size) checkpoints whose next offer is due."""
        now = self._clock()
        return [(tenant, size) for tenant, (size, due, _) in self._waiting.items() if due <= now]


# ---- rollback recovery (effect-ledger log-recover) ---------------------------------------------------


class RecoveryError(Exception):
    """log-recover cannot proceed; the message says why (nothing was changed)."""


def read_mirror(directory: Path, size: int) -> list[bytes]:
    """The first `size` leaves from a mirror of entry bundles laid out as c2sp.org/tlog-tiles does
    (DIR/tile/entries/N[.p/W]): full bundles, then the partial one of the signed size."""
    leaves: list[bytes] = []
    n = 0
    while len(leaves) < size:
        remaining = size - len(leaves)
        width = min(TILE_WIDTH, remaining)
        candidates = [tiles.TileRef(ENTRIES, n, TILE_WIDTH)]
        if width < TILE_WIDTH:
            candidates.insert(0, tiles.TileRef(ENTRIES, n, width))
        for ref in candidates:
            path = directory / tiles.tile_path(ref)
            if path.is_file():
                leaves.extend(tiles.decode_bundle(path.read_bytes())[:width])
                break
        else:
            raise RecoveryError(f"the mirror lacks entry bundle {tiles.tile_path(candidates[-1])}")
        n += 1
    return leaves[:size]


def _mirror_root(leaves: Sequence[bytes], upto: int) -> bytes:
    store = tiles.append(0, {}, [leaf_hash(leaf) for leaf in leaves[:upto]])
    return merkle.tree_root(upto, lambda nodes: tiles.read_nodes(nodes, store))


async def recover_tenant(
    conn: asyncpg.Connection, tenant: str, signed: Signed, mirror: Sequence[bytes], origin_prefix: str
) -> dict[str, int]:
    """Bring a tenant's database log back to what the signer signed, from mirrored leaves: every
    logged receipt the database lost becomes a committed tombstone again (so its ID answers
    reuse_receipt and is never executed twice), at its logged feed position, and the tiles are
    rebuilt to the signed size and root. One transaction: all of it or nothing."""
    if len(mirror) < signed.size or _mirror_root(mirror, signed.size) != signed.root:
        raise RecoveryError("the mirrored entries do not hash to the root the signer signed")
    counts = {"tombstones": 0, "repositioned": 0, "overwritten": 0, "leaves": 0}
    async with conn.transaction():
        await conn.fetchrow(sql("tenant_context"), tenant)
        await conn.execute(sql("log_open"), tenant)
        state = await conn.fetchrow(sql("log_lock"), tenant)
        if state is None:
            raise RecoveryError("another integrator holds the tenant's log; stop the service's log first")
        db_size, db_root = int(state["size"]), bytes(state["root"])
        if db_size >= signed.size:
            return counts
        if _mirror_root(mirror, db_size) != db_root:
            raise RecoveryError("the database's log is not a prefix of the mirrored log")
        leaves = [json.loads(leaf) for leaf in mirror[db_size : signed.size]]
        wanted = {int(leaf["index"]) + 1: str(leaf["operation_id"]) for leaf in leaves}
        for row in await conn.fetch(sql("log_positioned_between"), tenant, db_size, signed.size):
            if wanted.get(int(row["feed_position"])) != row["operation_id"]:
                await conn.execute(sql("log_unposition"), tenant, row["operation_id"])
                counts["repositioned"] += 1
        for leaf in leaves:
            position = int(leaf["index"]) + 1
            committed_at = datetime.fromisoformat(str(leaf["committed_at"]).replace("Z", "+00:00"))
            op_id = str(leaf["operation_id"])
            existing = await conn.fetchrow(sql("log_operation_state"), tenant, op_id)
            if existing is None:
                await conn.fetchval(
                    sql("log_restore_tombstone"), tenant, op_id, leaf["principal"], leaf["tool"],
                    leaf["tool_version"], leaf["intent_digest"], int(leaf["attempt"]), committed_at,
                    leaf["chain_hash"], leaf["receipt_digest"], position,
                )  # fmt: skip
                counts["tombstones"] += 1
            elif existing["status"] != "committed":
                await conn.execute(
                    sql("log_make_tombstone"),
                    tenant,
                    op_id,
                    leaf["receipt_digest"],
                    position,
                    committed_at,
                    leaf["chain_hash"],
                )
                counts["overwritten"] += 1
            elif existing["feed_position"] != position:
                await conn.execute(sql("log_position_set"), tenant, op_id, position)
                counts["repositioned"] += 1
        await conn.execute(sql("log_feed_catch_up"), tenant, signed.size)
        new_size, root = await append_leaves(conn, tenant, db_size, mirror[db_size : signed.size])
        if (new_size, root) != (signed.size, signed.root):
            raise RecoveryError("the rebuilt log does not reach the signed root")
        await conn.execute(
            sql("log_decision_put"),
            tenant,
            "recovered",
            signed.size,
            db_size,
            "re-created from mirrored entries",
        )
        counts["leaves"] = new_size - db_size
    log.warning("log_recovered", tenant=tenant, signed_size=signed.size, db_size=db_size, **counts)
    return counts


async def accept_loss(
    conn: asyncpg.Connection, signer: LogSigner, origin_prefix: str, tenant: str, reason: str
) -> int:
    """An operator's recorded decision: the tenant's log continues from the database's size. The
    signer's state moves back to it (the loss stays visible: witnesses refuse the fork). Answers the
    number of signed leaves given up."""
    states = await signer.states()
    origin = origin_of(origin_prefix, tenant)
    signed = states.get(origin)
    async with conn.transaction():
        await conn.fetchrow(sql("tenant_context"), tenant)
        await conn.execute(sql("log_open"), tenant)
        state = await conn.fetchrow(sql("log_lock"), tenant)
        if state is None:
            raise RecoveryError("another integrator holds the tenant's log; stop the service's log first")
        db_size, db_root = int(state["size"]), bytes(state["root"])
        if signed is None or db_size >= signed.size:
            return 0
        await signer.accept_loss(origin, db_size, db_root)
        await conn.execute(sql("log_decision_put"), tenant, "accept_loss", signed.size, db_size, reason)
    log.error("log_loss_accepted", tenant=tenant, signed_size=signed.size, db_size=db_size, reason=reason)
    return signed.size - db_size
