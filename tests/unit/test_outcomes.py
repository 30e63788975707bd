"""The write path's outcome codes: one enumeration, exactly the SQL's words; answers built from a row;
and the pure pieces beside them (tokens, the chain, the view). No database."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from effect_ledger.domain.chain import GENESIS_HASH, event_hash, first_bad_seq
from effect_ledger.domain.errors import PROBLEMS
from effect_ledger.domain.model import Binding, Operation, operation_view
from effect_ledger.domain.outcomes import REFUSALS, OutcomeCode, refusal_for
from effect_ledger.domain.tokens import decode_token, encode_token, seal, unseal

FUNCTIONS = Path(__file__).resolve().parents[2] / "alembic" / "functions"
NOW = datetime(2026, 11, 30, 10, 0, 0, 123000, tzinfo=UTC)
BINDING = Binding("exec-1", "measure", "2.1.0", "sha256:" + "a" * 64)
# `outcome := 'word';`, or `outcome := CASE ... END;` whose THEN/ELSE branches are the words
ASSIGNMENT = re.compile(r"\boutcome(?:_code)? := ('\w+';|CASE\b.*?\bEND;)", re.S)
BRANCH = re.compile(r"\b(?:THEN|ELSE) '(\w+)'")


def sql_outcomes() -> dict[str, set[str]]:
    """Per function file, every word its outcome variable is assigned."""
    found: dict[str, set[str]] = {}
    for path in sorted(FUNCTIONS.glob("*.sql")):
        words: set[str] = set()
        for assigned in ASSIGNMENT.findall(path.read_text("utf-8")):
            words |= {assigned.strip("';")} if assigned.startswith("'") else set(BRANCH.findall(assigned))
        if words:
            found[path.name] = words
    return found


def test_the_enumeration_is_exactly_the_words_the_sql_answers() -> None:
    per_file = sql_outcomes()
    assert set(per_file) == {
        "10_claim.sql",
        "20_submit.sql",
        "30_heartbeat.sql",
        "40_complete.sql",
        "50_resolve.sql",
        "60_sweep.sql",
    }
    assert set().union(*per_file.values()) == {code.value for code in OutcomeCode}
    assert per_file["30_heartbeat.sql"] == {
        "not_found",
        "stale_claim",
        "outcome_unknown",
        "invalid_transition",
        "extended",
    }
    assert per_file["60_sweep.sql"] == {"not_found", "expired", "unchanged"}


def test_every_refusal_is_a_problem_code() -> None:
    assert {str(code) for code in REFUSALS} <= set(PROBLEMS)
    assert not {str(code) for code in set(OutcomeCode) - REFUSALS} & set(PROBLEMS)


def op(status: str, lease: float | None, binding: Binding = BINDING) -> Operation:
    return Operation(
        operation_id="op-1",
        binding=binding,
        status=status,
        attempt=1,
        claim_token_hash=b"\x01" * 32,
        client_nonce_hash=None,
        sealed_token=None,
        lease_seconds=30,
        lease_expires_at=None if lease is None else NOW + timedelta(seconds=lease),
        effect_ref=None,
        receipt=None,
        not_applied_reason=None,
        created_at=NOW,
        updated_at=NOW,
        submitted_at=None,
        resolved_at=None,
        resolved_by=None,
        last_seq=1,
        last_hash=GENESIS_HASH,
        now=NOW,
    )


def test_answers_are_built_from_the_code_and_the_row() -> None:
    other = Binding("exec-1", "measure", "2.2.0", "sha256:" + "b" * 64)
    conflict = refusal_for("claim", OutcomeCode.INTENT_CONFLICT, op("pending", 10), other)
    assert (conflict.code, conflict.extensions) == (
        "intent_conflict",
        {"mismatched": ["tool_version", "intent_digest"]},
    )
    held = refusal_for("claim", OutcomeCode.OPERATION_IN_PROGRESS, op("pending", 2.2))
    assert (held.code, held.retry_after) == ("operation_in_progress", 3)
    for code in REFUSALS - {
        OutcomeCode.NOT_FOUND,
        OutcomeCode.VALIDATION_FAILED,
        OutcomeCode.INTENT_CONFLICT,
        OutcomeCode.APPROVAL_REQUIRED,  # a claim's, answered with the request (test_approvals.py)
        OutcomeCode.APPROVAL_DENIED,
    }:
        answer = refusal_for("submit", code, op("submitted", 10))
        assert answer.code == code and answer.extensions["operation"].operation_id == "op-1"
    with pytest.raises(ValueError, match="answered by its caller"):
        refusal_for("claim", OutcomeCode.APPROVAL_REQUIRED, op("pending", 10))
    assert refusal_for("resolve", OutcomeCode.INVALID_TRANSITION, op("pending", 10)).detail == (
        "Only an unknown operation can be resolved."
    )
    with pytest.raises(ValueError, match="not_found"):
        refusal_for("submit", OutcomeCode.NOT_FOUND, op("pending", 10))


def test_view_reports_expired_submitted_as_unknown() -> None:
    view = operation_view(op("submitted", -1))
    assert (view["status"], view["lease_expired"]) == ("unknown", True)
    assert view["created_at"] == "2026-11-30T10:00:00.123Z"


def test_tokens_seal_round_trip_and_are_bound_to_the_attempt() -> None:
    raw = b"\x07" * 32
    sealed = seal(raw, "nonce-0123456789", "t1", "op", b"\x03" * 16)  # each attempt seals with its own salt
    assert raw not in sealed
    assert unseal(sealed, "nonce-0123456789", "t1", "op") == raw
    resealed = seal(raw, "nonce-0123456789", "t1", "op", b"\x04" * 16)  # another attempt: another pad
    assert resealed[16:] != sealed[16:] and unseal(resealed, "nonce-0123456789", "t1", "op") == raw
    assert unseal(sealed, "nonce-9876543210", "t1", "op") != raw  # only the nonce's holder can unseal
    assert unseal(sealed, "nonce-0123456789", "t2", "op") != raw
    assert decode_token(encode_token(raw)) == raw
    assert decode_token("clt_short") is None


def test_chain_detects_an_edit_and_a_gap() -> None:
    events, prev = [], GENESIS_HASH
    for seq in (1, 2, 3):
        event = {
            "operation_id": "op",
            "seq": seq,
            "at": "2026-11-30T10:00:00.000Z",
            "kind": "k",
            "actor": "a",
            "from_status": None,
            "to_status": "pending",
            "attempt": 1,
            "data": {"n": seq},
        }
        event["prev_hash"], event["hash"] = prev, event_hash(prev, event)
        prev = str(event["hash"])
        events.append(event)
    assert first_bad_seq(events) == (3, None)
    events[1] = {**events[1], "data": {"n": 99}}
    assert first_bad_seq(events) == (2, 2)
    assert first_bad_seq([events[0], events[2]]) == (2, 3)
