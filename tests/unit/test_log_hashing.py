"""The receipts log's hashing fast paths (rounds 15, 17 and 30) against the reference: an event's link hash
given field by field, a link checked against its stored hash, a chain walked over database rows, a
receipt's digest and its comparison with a leaf's, a leaf. Same bytes, same verdicts, same
refusals, for arbitrary values (Hypothesis) as for the shapes the ledger writes."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from effect_ledger.domain import chain, model
from effect_ledger.domain.canonical import CanonicalizationError, canonical_json_reference, sorted_encoding
from effect_ledger.domain.chain import (
    GENESIS_HASH,
    HASHED_FIELDS,
    event_hash,
    first_bad_seq,
    link_hash,
    link_holds,
)
from effect_ledger.domain.model import RECEIPT_FIELDS, receipt_digest, receipt_digest_is
from effect_ledger.domain.note import b64
from effect_ledger.domain.receipt_log import LeafFacts, leaf_data
from effect_ledger.domain.timefmt import format_ts
from effect_ledger.domain.verification import verify_chain

any_text = st.text(st.characters(blacklist_categories=()))  # surrogates and astral characters too
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**54), max_value=2**54)
    | st.floats(allow_nan=False, allow_infinity=False)
    | any_text
    | st.sampled_from(["\ud83d\ude00", "\U0001f600", "\ue000", "\x7f", "\u2028", '\x00\x1f\b\\"', "pending"])
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(any_text, children, max_size=3),
    max_leaves=12,
)
# fields that mostly look like the ledger's, sometimes anything at all
texts = st.sampled_from(["op-1", "exec-1", "submitted", "2026-11-30T10:00:30.120Z"]) | values
ints = st.integers(min_value=0, max_value=5) | st.sampled_from([2**53, -(2**53), 2**53 + 1]) | values


def _reference_hash(prev: str, content: dict[str, Any]) -> tuple[str, str]:
    try:
        body = canonical_json_reference(content)
    except CanonicalizationError:
        return "refused", ""
    return "ok", hashlib.sha256(prev.encode("ascii") + b"\n" + body).hexdigest()


def _fast_hash(prev: str, fields: tuple[Any, ...]) -> tuple[str, str]:
    try:
        return "ok", link_hash(prev, *fields)
    except CanonicalizationError:
        return "refused", ""


@given(st.tuples(texts, ints, texts, texts, texts, texts | st.none(), texts, ints, values))
def test_link_hash_is_the_reference_hash(fields: tuple[Any, ...]) -> None:
    content = dict(zip(HASHED_FIELDS, fields, strict=True))
    assert _fast_hash(GENESIS_HASH, fields) == _reference_hash(GENESIS_HASH, content)


def _chain(count: int, data: list[Any]) -> list[dict[str, Any]]:
    """Database-shaped rows (`at` a datetime) of a valid chain."""
    rows, prev = [], GENESIS_HASH
    start = datetime(2026, 11, 30, 10, 0, 30, 120000, tzinfo=UTC)
    for seq in range(1, count + 1):
        row = {
            "operation_id": "op-1",
            "seq": seq,
            "at": start + timedelta(milliseconds=seq * 7),
            "kind": "claimed" if seq == 1 else "submitted",
            "actor": "exec-1",
            "from_status": None if seq == 1 else "pending",
            "to_status": "pending" if seq == 1 else "submitted",
            "attempt": 1,
            "data": data[(seq - 1) % len(data)],
            "prev_hash": prev,
        }
        view = {name: row[name] for name in HASHED_FIELDS} | {"at": format_ts(row["at"])}
        row["hash"] = prev = _reference_hash(prev, view)[1]
        rows.append(row)
    return rows


EDITS = {
    "seq": lambda seq: seq + 1,
    "attempt": lambda attempt: attempt + 1,
    "at": lambda at: at + timedelta(milliseconds=1),
    "data": lambda _: {"edited": True},
}
json_data = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(), children, max_size=3),
    max_leaves=10,
)


@given(
    st.integers(1, 5),
    st.lists(json_data, min_size=1, max_size=5),
    st.integers(0, 5),
    st.sampled_from(HASHED_FIELDS),
)
def test_a_chain_of_rows_gets_the_verdict_of_its_views(
    count: int, data: list[Any], bad: int, field: str
) -> None:
    rows = _chain(count, data)
    expected: tuple[int, int | None] = (count, None)  # the chain as the reference hashed it
    if bad < count:  # one hashed field edited after the fact
        before = rows[bad][field]
        rows[bad][field] = EDITS.get(field, lambda _: "x")(before)
        if rows[bad][field] != before:  # found at the edited event (by the seq it now shows)
            expected = (bad + 1, rows[bad]["seq"])
    views = [{**r, "at": format_ts(r["at"])} for r in rows]
    assert first_bad_seq(rows, format_at=format_ts) == expected
    assert first_bad_seq(views) == expected
    head = rows[-1]
    assert verify_chain(rows, "submitted", 1, head_hash=head["hash"], format_at=format_ts) == verify_chain(
        views, "submitted", 1, head_hash=head["hash"]
    )


def test_the_ledgers_own_event_takes_the_fast_path_and_hashes_as_before() -> None:
    event = {
        "operation_id": "op-7", "seq": 2, "at": "2026-11-30T10:00:30.120Z", "kind": "submitted",
        "actor": "exec-1", "from_status": "pending", "to_status": "submitted", "attempt": 1,
        "data": {"effect_ref": "remote-req-19", "lease_expires_at": "2026-11-30T10:01:00.120Z"},
    }  # fmt: skip
    assert event_hash(GENESIS_HASH, event) == _reference_hash(GENESIS_HASH, event)[1]


OTHER_HASH = "f" * 64


@given(st.tuples(texts, ints, texts, texts, texts, texts | st.none(), texts, ints, json_data | values))
def test_a_link_holds_exactly_when_its_reference_hash_is_the_stored_one(fields: tuple[Any, ...]) -> None:
    # link_holds tries msgspec's sorted text unchecked, then the JCS text: for every value, its verdict
    # is the reference's (a float, an int beyond 2**53 or an astral key: msgspec's text is not the JCS
    # text, the hash differs, and the JCS way must still say the link holds)
    verdict, stored = _reference_hash(GENESIS_HASH, dict(zip(HASHED_FIELDS, fields, strict=True)))
    if verdict == "refused":
        with pytest.raises(CanonicalizationError):
            link_holds(GENESIS_HASH, *fields, expected=OTHER_HASH)
        return
    assert link_holds(GENESIS_HASH, *fields, expected=stored) is True
    assert link_holds(GENESIS_HASH, *fields, expected=OTHER_HASH) is False


def _ledger_event(data: dict[str, Any]) -> tuple[Any, ...]:
    """A submitted event's fields as a database row gives them (`at` rendered), data as given."""
    return ("op-7", 2, "2026-11-30T10:00:30.120Z", "submitted", "exec-1", "pending", "submitted", 1, data)


def test_the_ledgers_own_event_holds_without_its_jcs_text_and_an_edit_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = {"effect_ref": "remote-req-19", "lease_expires_at": "2026-11-30T10:01:00.120Z"}
    stored = link_hash(GENESIS_HASH, *_ledger_event(data))

    def no_jcs(*_: Any) -> str:
        raise AssertionError("the JCS way was taken")

    monkeypatch.setattr(chain, "link_hash", no_jcs)
    assert link_holds(GENESIS_HASH, *_ledger_event(data), expected=stored) is True  # msgspec's text alone
    with pytest.raises(AssertionError, match="JCS way"):  # a mismatch is checked the JCS way
        link_holds(GENESIS_HASH, *_ledger_event(data | {"effect_ref": "remote-req-20"}), expected=stored)


@pytest.mark.parametrize(
    "data",
    [{"amount": 1e21}, {"n": 2**53 + 1}, {"\U0001f600": 1, "\ue000": 2}, {"n": 1.5, "m": -0.0}],
    ids=["float", "big-int", "astral-key", "floats"],
)
def test_data_whose_msgspec_text_is_not_jcs_holds_the_jcs_way(data: dict[str, Any]) -> None:
    assert sorted_encoding(data) != canonical_json_reference(data)  # the premise
    fields = _ledger_event(data)
    reference = _reference_hash(GENESIS_HASH, dict(zip(HASHED_FIELDS, fields, strict=True)))[1]
    assert link_hash(GENESIS_HASH, *fields) == reference
    assert link_holds(GENESIS_HASH, *fields, expected=reference) is True
    edited = _ledger_event({**data, "edited": True})
    assert link_holds(GENESIS_HASH, *edited, expected=reference) is False


receipts = st.dictionaries(st.sampled_from([*RECEIPT_FIELDS, "other"]), values, max_size=7)


@given(receipts)
def test_a_receipt_has_a_leafs_digest_exactly_when_its_reference_digest_is_it(
    receipt: dict[str, Any],
) -> None:
    shown = {name: receipt.get(name) for name in RECEIPT_FIELDS}
    try:
        expected = "sha256:" + hashlib.sha256(canonical_json_reference(shown)).hexdigest()
    except CanonicalizationError:
        with pytest.raises(CanonicalizationError):
            receipt_digest_is(receipt, "sha256:" + OTHER_HASH)
        return
    assert receipt_digest_is(receipt, expected) is True
    assert receipt_digest_is(receipt, "sha256:" + OTHER_HASH) is False


def test_a_stored_receipt_has_its_digest_without_its_jcs_text(monkeypatch: pytest.MonkeyPatch) -> None:
    receipt = {
        "external_ref": "rcpt-1", "result_digest": None, "result": {"n": 1, "ok": True}, "observed_at": None,
        "recorded_by": "exec-1", "recorded_at": "2026-11-30T10:00:30.120Z",
    }  # fmt: skip
    digest = receipt_digest(receipt)

    def no_jcs(*_: Any) -> str:
        raise AssertionError("the JCS way was taken")

    monkeypatch.setattr(model, "receipt_digest", no_jcs)
    assert receipt_digest_is(receipt, digest) is True
    with pytest.raises(AssertionError, match="JCS way"):
        receipt_digest_is(receipt | {"external_ref": "rcpt-2"}, digest)
    with_float = receipt | {"result": {"amount": 1e21}}
    monkeypatch.undo()
    assert receipt_digest_is(with_float, receipt_digest(with_float)) is True


@given(receipts)
def test_receipt_digest_is_the_digest_of_the_shown_receipt(receipt: dict[str, Any]) -> None:
    shown = {name: receipt.get(name) for name in RECEIPT_FIELDS}
    try:
        expected: str | None = "sha256:" + hashlib.sha256(canonical_json_reference(shown)).hexdigest()
    except CanonicalizationError:
        expected = None
    if expected is None:
        with pytest.raises(CanonicalizationError):
            receipt_digest(receipt)
    else:
        assert receipt_digest(receipt) == expected


def test_a_stored_receipt_digest_as_before() -> None:
    receipt = {
        "external_ref": "rcpt-1", "result_digest": None, "result": {"n": 1, "ok": True}, "observed_at": None,
        "recorded_by": "exec-1", "recorded_at": "2026-11-30T10:00:30.120Z",
    }  # fmt: skip
    assert receipt_digest(receipt) == (
        "sha256:" + hashlib.sha256(canonical_json_reference(receipt)).hexdigest()
    )
    assert receipt_digest(None) is None


def _reference_leaf(facts: LeafFacts, index: int, salt: bytes) -> bytes | None:
    """Section 14's leaf object written out, encoded by the reference (None: it refuses)."""
    leaf = {
        "v": 1, "tenant": facts.tenant, "operation_id": facts.operation_id, "index": index,
        "principal": facts.principal, "tool": facts.tool, "tool_version": facts.tool_version,
        "intent_digest": facts.intent_digest, "attempt": facts.attempt, "receipt_digest": facts.receipt_digest,
        "chain_hash": facts.chain_hash, "committed_at": format_ts(facts.committed_at), "salt": b64(salt),
    }  # fmt: skip
    try:
        return canonical_json_reference(leaf)
    except CanonicalizationError:
        return None


@given(
    texts, texts, texts, texts, texts, texts, ints, texts, texts, ints, st.binary(min_size=32, max_size=32)
)
def test_leaf_data_is_the_reference_encoding_of_the_leaf(
    tenant: Any, operation_id: Any, principal: Any, tool: Any, tool_version: Any, intent: Any,
    attempt: Any, receipt: Any, chain: Any, index: Any, salt: bytes,
) -> None:  # fmt: skip
    at = datetime(2026, 12, 6, 4, 30, 1, 234000, tzinfo=UTC)
    facts = LeafFacts(
        tenant, operation_id, principal, tool, tool_version, intent, attempt, receipt, chain, at
    )
    expected = _reference_leaf(facts, index, salt)
    if expected is None:
        with pytest.raises(CanonicalizationError):
            leaf_data(facts, index, salt)
    else:
        assert leaf_data(facts, index, salt) == expected


def test_a_logged_leaf_as_before() -> None:
    at = datetime(2026, 12, 1, 10, 0, 0, 123000, tzinfo=UTC)
    facts = LeafFacts(
        "t1",
        "op-1",
        "exec-1",
        "payments.charge",
        "2",
        "sha256:" + "a" * 64,
        1,
        "sha256:" + "b" * 64,
        "c" * 64,
        at,
    )
    assert leaf_data(facts, 0, bytes(32)) == _reference_leaf(facts, 0, bytes(32))
    pinned = [  # the bytes section 14 defines, whole
        b'{"attempt":1,"chain_hash":"', b"c" * 64, b'","committed_at":"2026-12-01T10:00:00.123Z","index":0,',
        b'"intent_digest":"sha256:', b"a" * 64, b'","operation_id":"op-1","principal":"exec-1",',
        b'"receipt_digest":"sha256:', b"b" * 64, b'","salt":"', b"A" * 43, b'=","tenant":"t1",',
        b'"tool":"payments.charge","tool_version":"2","v":1}',
    ]  # fmt: skip
    assert leaf_data(facts, 0, bytes(32)) == b"".join(pinned)


def test_a_member_msgspec_cannot_write_takes_the_jcs_way_and_is_refused_there() -> None:
    # encode_members answers None for it (not a TypeError out of the fast way): the JCS way refuses
    with pytest.raises(CanonicalizationError, match="unsupported type"):
        link_holds(GENESIS_HASH, *_ledger_event({"a": 1})[:4], object(), *_ledger_event({"a": 1})[5:],
                   expected=OTHER_HASH)  # fmt: skip
    with pytest.raises(CanonicalizationError, match="unsupported type"):
        receipt_digest_is({"external_ref": object(), "result": {}}, "sha256:" + OTHER_HASH)
