"""The append decision is pure and returns refusals as values: replay, revision, caps, causal rules."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import pytest

from effect_ledger.domain.canonical import canonical_json
from effect_ledger.domain.errors import LedgerError
from effect_ledger.domain.journal_history import (
    Accepted,
    AppendCommand,
    CallEntry,
    Caps,
    Replayed,
    SessionState,
    calls_from_json,
    calls_to_json,
    decide_append,
    unresolved_ids,
)
from effect_ledger.domain.journal_records import (
    AppendBody,
    batch_digest,
    encode_records,
    future_schema_indexes,
    stored_form,
)

USER = {"type": "message", "role": "user", "content": "hi", "schema": 1}
CALL = {
    "type": "tool_call",
    "call_id": "c1",
    "name": "measure",
    "arguments": {},
    "operation_id": None,
    "schema": 1,
}
RESULT = {
    "type": "tool_result",
    "call_id": "c1",
    "name": "measure",
    "output": 1,
    "is_error": False,
    "schema": 1,
}


def test_an_accepted_batch_carries_its_seqs_index_and_digest() -> None:
    decision = decide_append(SessionState(0), AppendCommand(0, [USER, CALL]), Caps())
    assert isinstance(decision, Accepted)
    assert decision.base_revision == 0 and decision.revision == 2
    assert decision.calls == {"c1": CallEntry("measure", 2)}
    assert unresolved_ids(decision.calls) == ["c1"]
    assert calls_from_json(calls_to_json(decision.calls)) == decision.calls


def test_refusals_are_returned_not_raised() -> None:
    state = SessionState(2, {"c1": CallEntry("measure", 2)})
    conflict = decide_append(state, AppendCommand(1, [RESULT]), Caps())
    assert isinstance(conflict, LedgerError) and conflict.code == "revision_conflict"
    assert conflict.extensions == {"revision": 2}
    causal = decide_append(state, AppendCommand(2, [USER]), Caps())
    assert isinstance(causal, LedgerError) and causal.code == "invalid_history"
    capped = decide_append(state, AppendCommand(2, [RESULT, USER]), Caps(max_records=3))
    assert isinstance(capped, LedgerError)
    assert capped.extensions["errors"] == [{"index": 1, "problem": "the session would exceed 3 records"}]


def test_the_batch_that_produced_the_revision_is_replayed_with_its_nonce() -> None:
    first = decide_append(SessionState(0), AppendCommand(0, [USER], b"n" * 32), Caps())
    assert isinstance(first, Accepted)
    after = SessionState(1, first.calls, b"n" * 32, 0, first.digest)
    assert decide_append(after, AppendCommand(0, [USER], b"n" * 32), Caps()) == Replayed(1)
    other = decide_append(after, AppendCommand(0, [USER], b"m" * 32), Caps())
    assert isinstance(other, LedgerError) and other.code == "revision_conflict"


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([{"schema": 2}], [0]),
        ([{"schema": 1}, {"schema": 7}, {"schema": True}], [1]),
        ("x", []),
        ([1, {"schema": "2"}], []),
    ],
)
def test_future_schemas_are_found_before_any_strict_decode(records: Any, expected: list[int]) -> None:
    assert future_schema_indexes(records) == expected


def test_the_stored_form_fills_defaults_and_leads_with_the_type() -> None:
    body = msgspec.convert(
        {
            "expected_revision": 0,
            "records": [{"type": "tool_result", "call_id": "c1", "name": "m", "output": None}],
        },
        AppendBody,
    )
    stored = stored_form(body.records[0])
    assert next(iter(stored)) == "type"
    assert stored == {
        "type": "tool_result",
        "call_id": "c1",
        "name": "m",
        "output": None,
        "is_error": False,
        "schema": 1,
    }


def test_the_batch_digest_is_the_jcs_digest_of_the_list() -> None:
    records = [USER, CALL, {**RESULT, "output": {"b": [1.5, "é"], "a": None}}]
    expected = "sha256:" + hashlib.sha256(canonical_json(records)).hexdigest()
    assert batch_digest(encode_records(records)) == expected


def test_a_value_without_a_jcs_form_is_refused_never_a_crash() -> None:
    deep: Any = []
    for _ in range(70):  # deeper than JCS's nesting bound
        deep = [deep]
    nested = {**CALL, "arguments": deep}
    decision = decide_append(SessionState(0), AppendCommand(0, [USER, nested], b"n" * 32), Caps())
    assert isinstance(decision, LedgerError) and decision.code == "invalid_history"
    assert decision.extensions["errors"] == [{"index": 1, "problem": "has no canonical JSON form"}]
