"""The claim and transition rules as pure functions: no database, exact verdicts."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from effect_ledger.domain.chain import GENESIS_HASH, event_hash, first_bad_seq
from effect_ledger.domain.claims import (
    AttemptMaterial,
    ClaimRequest,
    decide_claim,
    first_attempt,
    next_attempt,
)
from effect_ledger.domain.model import Binding, Decision, Operation, operation_view
from effect_ledger.domain.tokens import decode_token, encode_token, nonce_hash, seal, token_hash, unseal
from effect_ledger.domain.transitions import (
    Report,
    decide_complete,
    decide_heartbeat,
    decide_resolve,
    decide_submit,
    decide_sweep,
)

NOW = datetime(2026, 11, 30, 10, 0, 0, 123000, tzinfo=UTC)
BINDING = Binding("exec-1", "measure", "2.1.0", "sha256:" + "a" * 64)
TOKEN = encode_token(b"\x01" * 32)
RECEIPT = {"external_ref": "x", "result_digest": None, "result": None, "observed_at": None}
REASON = {"category": "rejected", "detail_code": None}


def request(binding: Binding = BINDING, nonce: str | None = None) -> ClaimRequest:
    return ClaimRequest("op-1", binding, 30, None if nonce is None else nonce_hash(nonce))


def op(status: str = "pending", lease: float | None = 10, **changes: object) -> Operation:
    base = first_attempt(request(), AttemptMaterial(token_hash(TOKEN), None), NOW)
    expires = None if lease is None else NOW + timedelta(seconds=lease)
    return replace(base, status=status, lease_expires_at=expires, **changes)  # type: ignore[arg-type]


def code_of(fn: object, *args: object) -> str:
    """The code of the refusal a decision returns (refusals are values, never raised)."""
    decision = fn(*args)  # type: ignore[operator]
    assert isinstance(decision, Decision) and decision.refusal is not None
    assert decision.outcome == decision.refusal.code
    return decision.refusal.code


@pytest.mark.parametrize(
    ("status", "lease", "verdict"),
    [
        ("committed", None, "reuse_receipt"),
        ("pending", -1, "new_attempt"),
        ("not_applied", None, "new_attempt"),
    ],
)
def test_claim_verdicts(status: str, lease: float | None, verdict: str) -> None:
    assert decide_claim(op(status, lease), request()).outcome == verdict


@pytest.mark.parametrize(
    ("status", "lease", "code"),
    [
        ("pending", 10, "operation_in_progress"),
        ("submitted", 10, "operation_in_progress"),
        ("submitted", -1, "outcome_unknown"),
        ("submitted", 0, "outcome_unknown"),
        ("unknown", None, "outcome_unknown"),
    ],
)
def test_claim_refusals(status: str, lease: float | None, code: str) -> None:
    assert code_of(decide_claim, op(status, lease), request()) == code


def test_binding_is_checked_before_state_and_names_fields() -> None:
    other = Binding("exec-2", "measure", "2.1.0", "sha256:" + "b" * 64)
    refusal = decide_claim(op("committed", None), request(other)).refusal
    assert refusal is not None and refusal.code == "intent_conflict"
    assert refusal.extensions["mismatched"] == ["principal", "intent_digest"]


def test_retry_after_rounds_up_and_is_at_least_one() -> None:
    refusal = decide_claim(op("pending", 2.2), request()).refusal
    assert refusal is not None and refusal.retry_after == 3
    assert op("pending", 0.001).retry_after_seconds() == 1


def test_nonce_replay_only_with_the_same_nonce() -> None:
    held = op("pending", 10, client_nonce_hash=nonce_hash("n" * 16))
    assert decide_claim(held, request(nonce="n" * 16)).outcome == "replay"
    assert code_of(decide_claim, held, request(nonce="m" * 16)) == "operation_in_progress"


def test_next_attempt_resets_outcome_and_increments() -> None:
    change = next_attempt(
        op("not_applied", None, not_applied_reason=REASON), request(), AttemptMaterial(b"\x02" * 32, None)
    )
    assert change.state is not None
    assert (change.state.attempt, change.state.status, change.state.not_applied_reason) == (
        2,
        "pending",
        None,
    )
    assert change.state.lease_expires_at == NOW + timedelta(seconds=30)
    assert [(e.kind, e.from_status, e.to_status, e.attempt) for e in change.events] == [
        ("reclaimed", "not_applied", "pending", 2)
    ]


def test_submit_heartbeat_and_fencing() -> None:
    assert code_of(decide_submit, op(), encode_token(b"\x09" * 32), None, None) == "stale_claim"
    change = decide_submit(op(), TOKEN, "ref", None).change
    assert change.state is not None and change.state.status == "submitted"
    assert decide_submit(change.state, TOKEN, "ref", None).change.state is None  # repeat: nothing changes
    assert decide_submit(change.state, TOKEN, None, None).change.state is None
    assert (
        code_of(decide_submit, op("committed", None, receipt=RECEIPT), TOKEN, None, None)
        == "invalid_transition"
    )
    assert code_of(decide_heartbeat, op("submitted", -1), TOKEN, 30) == "outcome_unknown"
    beat = decide_heartbeat(op("pending", -1), TOKEN, 60).change  # not yet reclaimed: the token is still current
    assert beat.state is not None and beat.state.lease_expires_at == NOW + timedelta(seconds=60)
    assert beat.events == ()


def test_complete_rules() -> None:
    assert code_of(decide_complete, op(), "exec-1", TOKEN, Report("unknown")) == "invalid_transition"
    unknown = decide_complete(op("submitted"), "exec-1", TOKEN, Report("unknown"))
    assert unknown.change.state is not None and unknown.change.state.status == "unknown"
    committed = op("committed", None, receipt={**RECEIPT, "recorded_by": "exec-1", "recorded_at": "t"})
    assert decide_complete(committed, "exec-1", TOKEN, Report("committed", RECEIPT)).change.state is None
    conflict = decide_complete(
        committed, "exec-1", TOKEN, Report("committed", {**RECEIPT, "external_ref": "y"})
    )
    assert conflict.refusal is not None and conflict.refusal.code == "conflicting_outcome"
    assert conflict.change.state is None and [e.kind for e in conflict.change.events] == ["discrepancy"]


def test_expired_submitted_is_materialised_before_a_late_report() -> None:
    late = decide_complete(op("submitted", -5), "exec-1", TOKEN, Report("committed", RECEIPT))
    assert [(e.kind, e.from_status, e.to_status) for e in late.change.events] == [
        ("lease_expired", "submitted", "unknown"),
        ("completed", "unknown", "committed"),
    ]


def test_resolve_rules() -> None:
    assert (
        code_of(decide_resolve, op("pending"), "rec-1", Report("committed", RECEIPT)) == "invalid_transition"
    )
    assert (
        code_of(decide_resolve, op("submitted", 10), "rec-1", Report("committed", RECEIPT))
        == "invalid_transition"
    )
    unresolved = decide_resolve(op("unknown", None), "rec-1", Report("unresolved", evidence={"source": "s"}))
    assert unresolved.change.state is not None and unresolved.change.state.status == "unknown"
    resolved = decide_resolve(op("unknown", None), "rec-1", Report("not_applied", reason=REASON))
    assert resolved.change.state is not None and resolved.change.state.resolved_by == "rec-1"


def test_sweep_only_touches_expired_submitted() -> None:
    assert decide_sweep(op("submitted", 10)).state is None
    assert decide_sweep(op("pending", -10)).state is None
    swept = decide_sweep(op("submitted", -10))
    assert swept.state is not None and swept.state.status == "unknown"


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
