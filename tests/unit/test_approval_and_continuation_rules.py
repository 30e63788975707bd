"""The pure rules of approvals and continuation records (no database): the policy, effective status by
a clock, the approval events' chain, the continuation mismatch order, and the key ring's sealing."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from effect_ledger.domain.approvals import (
    GENESIS_HASH,
    ApprovalRule,
    approval_event_hash,
    chain_holds,
    effective_status,
    parse_policy,
)
from effect_ledger.domain.errors import LedgerError
from effect_ledger.domain.journal_continuations import (
    KeyRing,
    KeyRingError,
    Wanted,
    associated_data,
    decode_payload,
    mismatch,
    prefix_digest,
    rank,
)
from effect_ledger.domain.journal_history import AppendCommand, Caps, SessionState, decide_append

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
WANTED = Wanted("acme", "py/3", "acct-1", "large")


def test_the_first_matching_rule_of_the_tenant_then_the_default_applies() -> None:
    policy = parse_policy(
        '{"default": [{"tool": "pay.*"}, {"tool": "*", "required": 3}],'
        ' "tenants": {"t1": [{"tool": "pay.refund", "required": 2, "ttl_seconds": 60}]}}'
    )
    assert policy is not None
    assert policy.rule_for("t1", "pay.refund") == ApprovalRule("pay.refund", 2, 60)
    assert policy.rule_for("t1", "pay.charge") == ApprovalRule("pay.*", 1, 900)  # falls back to default
    assert policy.rule_for("t2", "measure") == ApprovalRule("*", 3, 900)
    assert parse_policy(None) is None and parse_policy("  ") is None
    assert parse_policy('{"default": []}') is not None
    assert parse_policy('{"default": []}').rule_for("t1", "x") is None  # type: ignore[union-attr]


@pytest.mark.parametrize("status", ["pending", "approved", "denied"])
def test_a_live_request_past_its_expiry_is_expired(status: str) -> None:
    assert effective_status(status, NOW, NOW) == "expired"
    assert effective_status(status, NOW + timedelta(milliseconds=1), NOW) == status


@pytest.mark.parametrize("status", ["revoked", "consumed", "expired"])
def test_a_finished_request_keeps_its_status(status: str) -> None:
    assert effective_status(status, NOW - timedelta(days=1), NOW) == status


def chain(*kinds: str) -> list[dict[str, Any]]:
    events, prev = [], GENESIS_HASH
    for seq, kind in enumerate(kinds, start=1):
        event = {
            "approval_id": "apr_" + "0" * 32,
            "seq": seq,
            "at": "2026-12-01T10:00:00.000Z",
            "kind": kind,
            "actor": "ap-1",
            "data": {"n": seq},
            "prev_hash": prev,
        }
        event["hash"] = approval_event_hash(prev, event)
        events.append(event)
        prev = event["hash"]
    return events


def test_an_edited_approval_event_breaks_the_chain() -> None:
    events = chain("requested", "approved", "consumed")
    assert chain_holds(events)
    events[1]["actor"] = "mallory"
    assert not chain_holds(events)
    assert not chain_holds(chain("requested", "approved")[1:])  # a cut chain does not start at genesis


def record(**changes: Any) -> dict[str, Any]:
    base = {
        "type": "continuation",
        "provider": "acme",
        "adapter": "py/3",
        "account": "acct-1",
        "model_class": "large",
        "covers_to_seq": 2,
        "expires_at": "2026-12-01T11:00:00Z",
        "prefix_digest": "sha256:p2",
    }
    return {**base, **changes}


def prefix(n: int) -> str:
    return f"sha256:p{n}"


def test_mismatch_reasons_come_in_the_contracts_order() -> None:
    assert mismatch(record(), WANTED, NOW, prefix) is None
    assert mismatch(record(), None, NOW, prefix) == "not_requested"
    # several fields differ: the first one named is the first in the contract's order
    assert mismatch(record(provider="x", model_class="y"), WANTED, NOW, prefix) == "provider"
    assert mismatch(record(adapter="x", account="y"), WANTED, NOW, prefix) == "adapter"
    assert mismatch(record(account="x", expires_at="2020-01-01T00:00:00Z"), WANTED, NOW, prefix) == "account"
    assert mismatch(record(model_class="x", prefix_digest="sha256:no"), WANTED, NOW, prefix) == "model_class"
    assert (
        mismatch(record(expires_at="2026-12-01T10:00:00Z", prefix_digest="z"), WANTED, NOW, prefix)
        == "expired"
    )
    assert mismatch(record(prefix_digest="sha256:other"), WANTED, NOW, prefix) == "prefix"


def test_rank_puts_the_newest_compatible_first() -> None:
    compatible, refused = rank([(3, record()), (7, record()), (5, record(account="z"))], WANTED, NOW, prefix)
    assert compatible == [7, 3] and refused == [{"seq": 5, "reason": "account"}]


def test_prefix_digest_is_the_jcs_array_digest() -> None:
    import hashlib

    records = [{"type": "message", "role": "user", "content": "hi", "schema": 1}]
    body = b'[{"content":"hi","role":"user","schema":1,"type":"message"}]'
    assert prefix_digest(records) == "sha256:" + hashlib.sha256(body).hexdigest()
    assert prefix_digest([]) == "sha256:" + hashlib.sha256(b"[]").hexdigest()


def test_payload_decoding_bounds() -> None:
    assert decode_payload(base64.b64encode(b"x" * 65536).decode()) == b"x" * 65536
    assert decode_payload(base64.b64encode(b"x" * 65537).decode()) is None
    assert decode_payload("not base64!") is None


def test_the_key_ring_seals_with_its_first_key_and_binds_the_place() -> None:
    ring = KeyRing.parse("# rotated 2026-12\n" + KeyRing.new_line("k2") + KeyRing.new_line("k1"))
    aad = associated_data("t1", "ses_x", 5, "sha256:p")
    sealed = ring.seal(b"state", aad)
    assert sealed.key_id == "k2" and b"state" not in sealed.ciphertext and len(sealed.nonce) == 12
    assert ring.open_sealed(sealed, aad) == b"state"
    for elsewhere in (
        ("t2", "ses_x", 5, "sha256:p"),
        ("t1", "ses_y", 5, "sha256:p"),
        ("t1", "ses_x", 6, "sha256:p"),
        ("t1", "ses_x", 5, "sha256:q"),
    ):
        assert ring.open_sealed(sealed, associated_data(*elsewhere)) is None
    assert KeyRing.parse(KeyRing.new_line("k3")).open_sealed(sealed, aad) is None  # its key left the ring
    for bad in ("", "k1", "k 1:AAAA", "k1:not-base64!", "k1:" + base64.b64encode(b"short").decode()):
        with pytest.raises(KeyRingError):
            KeyRing.parse(bad)


def test_continuations_in_the_causal_rules() -> None:
    cont = record(covers_to_seq=1)
    del cont["prefix_digest"]
    call = {
        "type": "tool_call",
        "call_id": "c1",
        "name": "m",
        "arguments": {},
        "operation_id": None,
        "schema": 1,
    }
    accepted = decide_append(SessionState(1), AppendCommand(1, [call, cont]), Caps())
    assert not isinstance(accepted, LedgerError) and accepted.continuations == frozenset({3})  # type: ignore[union-attr]
    beyond = decide_append(SessionState(1), AppendCommand(1, [record(covers_to_seq=2)]), Caps())
    assert isinstance(beyond, LedgerError) and beyond.extensions["errors"][0]["index"] == 0
    summary = {
        "type": "summary",
        "covers": {"from_seq": 1, "to_seq": 2},
        "content": "s",
        "summarizer": "x",
        "omissions": [],
        "schema": 1,
    }
    state = SessionState(2, continuations=frozenset({2}))
    covering = decide_append(state, AppendCommand(2, [summary]), Caps())
    assert isinstance(covering, LedgerError)
    assert covering.extensions["errors"] == [{"index": 0, "problem": "covers a continuation record"}]
    assert not isinstance(decide_append(SessionState(2), AppendCommand(2, [summary]), Caps()), LedgerError)
