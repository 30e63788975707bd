"""The database functions of the write path (migration 0005) against the pure domain decisions.

For every state an operation can be in and every command an executor or reconciler can send, the
row is set up directly, the database function runs the command, and the domain's pure decision is
taken on the same row at the clock the function read: both must report the same outcome, leave the
same state, and append the same events, whose chain the Python verifier accepts.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import Any

import asyncpg
import msgspec
import pytest

from effect_ledger.db.catalogue import sql
from effect_ledger.db.ledger import returned_events, row_to_operation
from effect_ledger.domain.canonical import canonical_json
from effect_ledger.domain.chain import GENESIS_HASH, first_bad_seq
from effect_ledger.domain.claims import AttemptMaterial, ClaimRequest, decide_claim
from effect_ledger.domain.model import Binding, Decision, Operation
from effect_ledger.domain.tokens import encode_token, nonce_hash, seal, token_hash
from effect_ledger.domain.transitions import (
    Report,
    decide_complete,
    decide_heartbeat,
    decide_resolve,
    decide_submit,
    decide_sweep,
)
from effect_ledger.domain.verification import verify_chain
from support.database import runtime_connection

# Run again on a Citus cluster by the Citus lane of .ci/run (pytest -m storage).
pytestmark = pytest.mark.storage

TENANT = "t1"
BINDING = Binding("exec-1", "measure", "2.1.0", "sha256:" + "a" * 64)
OTHER = Binding("exec-1", "measure", "2.1.0", "sha256:" + "b" * 64)
TOKEN = encode_token(b"\x01" * 32)
STALE = encode_token(b"\x02" * 32)
NONCE = "nonce-0123456789abcdef"
RECEIPT = {
    "external_ref": "x-1",
    "result_digest": None,
    "result": {"v": 1.5, "s": 'é\n"'},
    "observed_at": None,
}
OTHER_RECEIPT = {**RECEIPT, "external_ref": "x-2"}
REASON = {"category": "rejected", "detail_code": "quota"}
OTHER_REASON = {"category": "other", "detail_code": None}
EVIDENCE = {"source": "provider-api", "lookup_ref": "req-19", "checked_at": "2026-11-30T10:00:00.000Z"}
NEW_MATERIAL = AttemptMaterial(token_hash(encode_token(b"\x03" * 32)), b"\x05" * 48)

# status, seconds from now to the lease end (None: no lease), effect_ref, receipt, reason
STATES: dict[str, tuple[str, float | None, str | None, Any, Any]] = {
    "pending_live": ("pending", 100, None, None, None),
    "pending_expired": ("pending", -100, None, None, None),
    "submitted_live": ("submitted", 100, "ref-0", None, None),
    "submitted_expired": ("submitted", -100, "ref-0", None, None),
    "committed": ("committed", None, "ref-0", {**RECEIPT, "recorded_by": "exec-1", "recorded_at": "t"}, None),
    "not_applied": ("not_applied", None, None, None, REASON),
    "unknown": ("unknown", None, "ref-0", None, None),
    "unknown_swept": ("unknown", -100, "ref-0", None, None),
}


@dataclass(frozen=True)
class Command:
    """One command: the database call (query and arguments) and the same command as a pure decision."""

    name: str
    query: str
    args: Callable[[str], tuple[Any, ...]]
    decide: Callable[[Operation], Decision]


def _jcs(value: Any) -> str | None:
    return None if value is None else canonical_json(value).decode()


def claim_command(name: str, binding: Binding, nonce: str | None, submit: bool) -> Command:
    def args(op_id: str) -> tuple[Any, ...]:
        return (
            TENANT,
            op_id,
            binding.principal,
            binding.tool,
            binding.tool_version,
            binding.intent_digest,
            30,
            None if nonce is None else nonce_hash(nonce),
            NEW_MATERIAL.token_hash,
            NEW_MATERIAL.sealed_token,
            submit,
            "ref-c" if submit else None,
            None,  # no approval policy covers the tool (section 15: tests/integration/test_approvals.py)
        )

    def decide(op: Operation) -> Decision:
        req = ClaimRequest(
            op.operation_id,
            binding,
            30,
            None if nonce is None else nonce_hash(nonce),
            NEW_MATERIAL,
            submit,
            "ref-c" if submit else None,
        )
        return decide_claim(op, req)

    return Command(name, "run_claim", args, decide)


def submit_command(name: str, token: str, effect_ref: str | None, lease: int | None) -> Command:
    return Command(
        name,
        "run_submit",
        lambda op_id: (TENANT, op_id, token_hash(token), effect_ref, lease),
        lambda op: decide_submit(op, token, effect_ref, lease),
    )


def heartbeat_command(name: str, token: str, lease: int | None) -> Command:
    return Command(
        name,
        "run_heartbeat",
        lambda op_id: (TENANT, op_id, token_hash(token), lease),
        lambda op: decide_heartbeat(op, token, lease),
    )


def complete_command(name: str, token: str, report: Report) -> Command:
    return Command(
        name,
        "run_complete",
        lambda op_id: (
            TENANT,
            op_id,
            "exec-1",
            token_hash(token),
            report.outcome,
            _jcs(report.receipt),
            _jcs(report.reason),
            None,
        ),
        lambda op: decide_complete(op, "exec-1", token, report),
    )


def resolve_command(name: str, report: Report) -> Command:
    return Command(
        name,
        "run_resolve",
        lambda op_id: (
            TENANT,
            op_id,
            "rec-1",
            report.outcome,
            _jcs(report.receipt),
            _jcs(report.reason),
            _jcs(report.evidence),
        ),
        lambda op: decide_resolve(op, "rec-1", report),
    )


def sweep_decision(op: Operation) -> Decision:
    change = decide_sweep(op)
    return Decision("expired" if change.events else "unchanged", change)


COMMANDS = [
    claim_command("claim", BINDING, None, False),
    claim_command("claim_other_binding", OTHER, None, False),
    claim_command("claim_same_nonce", BINDING, NONCE, False),
    claim_command("claim_other_nonce", BINDING, "nonce-fedcba9876543210", False),
    claim_command("claim_and_submit", BINDING, None, True),
    claim_command("claim_and_submit_same_nonce", BINDING, NONCE, True),
    submit_command("submit", TOKEN, "ref-1", None),
    submit_command("submit_same_ref", TOKEN, "ref-0", None),
    submit_command("submit_no_ref", TOKEN, None, 60),
    submit_command("submit_stale", STALE, "ref-1", None),
    heartbeat_command("heartbeat", TOKEN, None),
    heartbeat_command("heartbeat_90", TOKEN, 90),
    heartbeat_command("heartbeat_stale", STALE, None),
    complete_command("complete_committed", TOKEN, Report("committed", RECEIPT)),
    complete_command("complete_other_receipt", TOKEN, Report("committed", OTHER_RECEIPT)),
    complete_command("complete_not_applied", TOKEN, Report("not_applied", reason=REASON)),
    complete_command("complete_other_reason", TOKEN, Report("not_applied", reason=OTHER_REASON)),
    complete_command("complete_unknown", TOKEN, Report("unknown")),
    complete_command("complete_stale", STALE, Report("committed", RECEIPT)),
    resolve_command("resolve_committed", Report("committed", RECEIPT, evidence=EVIDENCE)),
    resolve_command("resolve_other_receipt", Report("committed", OTHER_RECEIPT, evidence=EVIDENCE)),
    resolve_command("resolve_not_applied", Report("not_applied", reason=REASON, evidence=EVIDENCE)),
    resolve_command("resolve_unresolved", Report("unresolved", evidence=EVIDENCE)),
    Command("sweep", "run_sweep", lambda op_id: (TENANT, op_id), sweep_decision),
]

STATE_FIELDS = [f.name for f in fields(Operation) if f.name not in ("now", "last_seq", "last_hash")]


@pytest.fixture
async def owner(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(db_url)
    for name in ("jsonb", "json"):
        await conn.set_type_codec(
            name,
            encoder=lambda v: msgspec.json.encode(v).decode(),
            decoder=msgspec.json.decode,
            schema="pg_catalog",
        )
    yield conn
    await conn.close()


async def put_state(owner: asyncpg.Connection, op_id: str, state: str) -> None:
    status, lease, effect_ref, receipt, reason = STATES[state]
    await owner.execute(
        """INSERT INTO ledger.operations (tenant_id, operation_id, principal, tool, tool_version,
               intent_digest, status, attempt, claim_token_hash, client_nonce_hash, sealed_token,
               lease_seconds, lease_expires_at, effect_ref, receipt, not_applied_reason, created_at,
               updated_at, submitted_at, chain_seq, chain_hash)
           SELECT $1, $2, $3, $4, $5, $6, $7, 1, $8, $9, $10, 30,
               date_trunc('milliseconds', clock_timestamp()) + make_interval(secs => $11::float8),
               $12, $13, $14, date_trunc('milliseconds', clock_timestamp()) - interval '1 hour',
               date_trunc('milliseconds', clock_timestamp()) - interval '1 hour',
               CASE WHEN $12::text IS NULL THEN NULL ELSE date_trunc('milliseconds', clock_timestamp()) END,
               0, $15""",
        TENANT,
        op_id,
        BINDING.principal,
        BINDING.tool,
        BINDING.tool_version,
        BINDING.intent_digest,
        status,
        token_hash(TOKEN),
        nonce_hash(NONCE),
        seal(b"\x01" * 32, NONCE, TENANT, op_id, b"\x07" * 16),
        lease,
        effect_ref,
        receipt,
        reason,
        GENESIS_HASH,
    )


async def stored_events(owner: asyncpg.Connection, op_id: str) -> list[dict[str, Any]]:
    rows = await owner.fetch(
        "SELECT * FROM ledger.events WHERE tenant_id = $1 AND operation_id = $2 ORDER BY seq", TENANT, op_id
    )
    from effect_ledger.db.ledger import event_view

    return [{**event_view(r), "operation_id": op_id} for r in rows]


def compare(case: str, before: Operation, row: asyncpg.Record, decision: Decision) -> list[str]:
    """What differs between the database's execution and the pure decision of one case."""
    problems = []
    outcome = row["outcome"]
    if outcome != decision.outcome:
        problems.append(f"{case}: outcome database={outcome} domain={decision.outcome}")
        return problems
    after = row_to_operation(row) if row["operation_id"] is not None else None
    expected = decision.change.state or before
    if after is not None:
        for name in STATE_FIELDS:
            if getattr(after, name) != getattr(expected, name):
                problems.append(
                    f"{case}: {name} database={getattr(after, name)!r} domain={getattr(expected, name)!r}"
                )
    database_events = [
        (e.kind, e.actor, e.from_status, e.to_status, e.attempt, e.data) for e in returned_events(row)
    ]
    domain_events = [
        (e.kind, e.actor, e.from_status, e.to_status, e.attempt, e.data) for e in decision.change.events
    ]
    if database_events != domain_events:
        problems.append(f"{case}: events database={database_events} domain={domain_events}")
    return problems


async def test_every_state_and_command_executes_as_the_domain_decides(
    owner: asyncpg.Connection, db_url: str
) -> None:
    runtime = await runtime_connection(db_url)
    for name in ("jsonb", "json"):
        await runtime.set_type_codec(
            name,
            encoder=lambda v: msgspec.json.encode(v).decode(),
            decoder=msgspec.json.decode,
            schema="pg_catalog",
        )
    problems: list[str] = []
    outcomes: dict[str, set[str]] = {}
    counter = itertools.count()
    try:
        for state, command in itertools.product(STATES, COMMANDS):
            op_id = f"x-{next(counter)}"
            case = f"{state} x {command.name}"
            await put_state(owner, op_id, state)
            before_row = await owner.fetchrow(
                "SELECT *, clock_timestamp() AS db_now FROM ledger.operations WHERE operation_id = $1", op_id
            )
            row = await runtime.fetchrow(sql(command.query), *command.args(op_id))
            before = replace(row_to_operation(before_row), now=row["db_now"])
            decision = command.decide(before)
            problems += compare(case, before, row, decision)
            outcomes.setdefault(row["outcome"], set()).add(case)
            events = await stored_events(owner, op_id)
            if first_bad_seq(events)[1] is not None:
                problems.append(f"{case}: the stored chain does not verify")
    finally:
        await runtime.close()
    assert problems == [], "\n".join(problems)
    # the table reaches every outcome of every function
    assert set(outcomes) == {
        "replay",
        "new_attempt",
        "reuse_receipt",
        "intent_conflict",
        "operation_in_progress",
        "outcome_unknown",
        "submitted",
        "unchanged",
        "stale_claim",
        "invalid_transition",
        "extended",
        "completed",
        "conflicting_outcome",
        "resolved",
        "expired",
    }


async def test_a_new_id_is_created_as_the_domain_decides(owner: asyncpg.Connection, db_url: str) -> None:
    from effect_ledger.domain.claims import decide_first_claim

    runtime = await runtime_connection(db_url)
    for name in ("jsonb", "json"):
        await runtime.set_type_codec(
            name,
            encoder=lambda v: msgspec.json.encode(v).decode(),
            decoder=msgspec.json.decode,
            schema="pg_catalog",
        )
    try:
        for n, command in enumerate(c for c in COMMANDS if c.query == "run_claim"):
            op_id = f"new-{n}"
            row = await runtime.fetchrow(sql(command.query), *command.args(op_id))
            args = command.args(op_id)
            req = ClaimRequest(op_id, Binding(*args[2:6]), 30, args[7], NEW_MATERIAL, args[10], args[11])
            decision = decide_first_claim(req, row["db_now"])
            assert row["outcome"] == decision.outcome == "created"
            assert decision.change.state is not None
            fresh = replace(decision.change.state, now=row["db_now"])
            assert compare(command.name, fresh, row, Decision("created", decision.change)) == []
            events = await stored_events(owner, op_id)
            assert first_bad_seq(events) == (len(decision.change.events), None)
            assert row_to_operation(row).lease_expires_at == fresh.lease_expires_at
            assert fresh.lease_expires_at == fresh.updated_at + timedelta(seconds=30)
    finally:
        await runtime.close()


NASTY = 'q"b\\s/\b\f\n\r\t\x01\x1f\x7f é 漢 😀 \u2028 \ud7ff\ue000'


async def test_chain_hashed_in_sql_verifies_in_python_and_over_the_api(client: Any) -> None:
    """Strings the database escapes itself (to_json) and client JSON it takes as JCS text: the chain
    the functions write verifies with the Python verifier and with GET /v1/audit/verify."""
    from support.auth import auth

    body = {
        "tool": "measure",
        "tool_version": "2.1.0",
        "intent": {"k": NASTY},
        "submit": {"effect_ref": NASTY},
    }
    claimed = await client.post("/v1/operations/op-nasty/claim", json=body, headers=auth())
    assert claimed.status_code == 201, claimed.text
    assert claimed.json()["operation"]["effect_ref"] == NASTY
    token = claimed.json()["claim"]["token"]
    receipt = {
        "external_ref": NASTY,
        "result": {"z": [1e21, 0.1, -0.0, 2**60, 5e-7], "\u20ac": NASTY, "a": None},
    }
    done = await client.post(
        "/v1/operations/op-nasty/complete",
        json={"token": token, "outcome": "committed", "receipt": receipt},
        headers=auth(),
    )
    assert done.status_code == 200, done.text
    events = (await client.get("/v1/operations/op-nasty/events", headers=auth())).json()["items"]
    assert [e["kind"] for e in events] == ["claimed", "submitted", "completed"]
    assert events[1]["data"]["effect_ref"] == NASTY
    verdict_in_python = verify_chain([{**e, "operation_id": "op-nasty"} for e in events], "committed", 1)
    assert (verdict_in_python.ok, verdict_in_python.checked) == (True, 3)
    verdict = await client.get("/v1/audit/verify", params={"operation_id": "op-nasty"}, headers=auth())
    assert verdict.json() == {"ok": True, "checked": 3, "first_bad_seq": None}


async def test_to_json_escapes_strings_exactly_as_jcs(owner: asyncpg.Connection) -> None:
    """Every code point class JCS treats specially, through the function the chain uses."""
    samples = [chr(c) for c in range(0x00 + 1, 0x80)] + [NASTY, "\u00e9", "\U0001f600", "\u2028\u2029", ""]
    for text in samples:
        in_sql = await owner.fetchval("SELECT ledger.jcs_string($1)", text)
        assert in_sql == canonical_json(text).decode(), repr(text)
    assert await owner.fetchval("SELECT ledger.jcs_string(NULL)") == "null"
    stamp = await owner.fetchval("SELECT ledger.ts_text('2026-11-30T10:00:00.123999+02:00'::timestamptz)")
    assert stamp == "2026-11-30T08:00:00.123Z"
