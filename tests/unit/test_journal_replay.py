"""Projection and context replay are pure and deterministic, and keep the invariants of API.md section 12
(property tests over random valid histories)."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from effect_ledger.domain.canonical import canonical_json
from effect_ledger.domain.errors import LedgerError
from effect_ledger.domain.journal_context import Selection, select_context
from effect_ledger.domain.journal_projection import REDUCER, projection_jcs, reduce_records
from effect_ledger.domain.journal_records import record_bytes
from support.journal_histories import histories

Record = tuple[int, dict[str, Any]]
budgets = st.one_of(st.none(), st.integers(0, 40))
byte_budgets = st.one_of(st.none(), st.integers(0, 4000))


def result_seq(records: list[Record]) -> dict[str, int]:
    return {r["call_id"]: seq for seq, r in records if r["type"] == "tool_result"}


@settings(max_examples=150, deadline=None)
@given(histories(), st.randoms(use_true_random=False))
def test_projection_is_deterministic_whatever_the_input_order(
    records: list[Record], rnd: random.Random
) -> None:
    shuffled = list(records)
    rnd.shuffle(shuffled)
    first, again = reduce_records(records), reduce_records(shuffled)
    assert first == again
    results = result_seq(records)
    calls = [r for _, r in records if r["type"] == "tool_call"]
    assert [c["call_id"] for c in first.calls] == [c["call_id"] for c in calls]
    assert first.unresolved == [c["call_id"] for c in calls if c["call_id"] not in results]
    for view in first.calls:
        assert view["result_seq"] == results.get(view["call_id"])
        assert view["state"] == ("resolved" if view["call_id"] in results else "unresolved")
    assert len(first.messages) == sum(1 for _, r in records if r["type"] == "message")


def test_projection_digest_is_fixed_for_fixed_records() -> None:
    records: list[Record] = [
        (1, {"type": "message", "role": "user", "content": "hi", "schema": 1}),
        (
            2,
            {
                "type": "tool_call",
                "call_id": "c1",
                "name": "measure",
                "arguments": {},
                "operation_id": "m-a",
                "schema": 1,
            },
        ),
    ]
    view = reduce_records(records)
    assert REDUCER == "effect-ledger.projection/1"
    assert view.digest == reduce_records(list(reversed(records))).digest
    assert view.digest.startswith("sha256:") and len(view.digest) == 71
    assert view.unresolved == ["c1"] and view.operation_ids() == ["m-a"]


def check_selection(
    records: list[Record], chosen: Selection, max_records: int | None, max_bytes: int | None
) -> None:
    by_seq = dict(records)
    kept = set(chosen.seqs)
    size = {seq: record_bytes(r) for seq, r in records}
    results = result_seq(records)
    call_seq = {r["call_id"]: seq for seq, r in records if r["type"] == "tool_call"}
    # no orphaned results, no call without its existing result
    for seq in kept:
        record = by_seq[seq]
        if record["type"] == "tool_result":
            assert call_seq[record["call_id"]] in kept
        if record["type"] == "tool_call" and record["call_id"] in results:
            assert results[record["call_id"]] in kept
    # unresolved calls are always kept
    unresolved = [cid for cid in call_seq if cid not in results]
    assert chosen.unresolved == sorted(unresolved, key=call_seq.__getitem__)
    assert all(call_seq[cid] in kept for cid in unresolved)
    # summaries used stand in for records that are all omitted, and are themselves sent
    used = {(s["from_seq"], s["to_seq"]) for s in chosen.summarized}
    sent_summaries = {
        (r["covers"]["from_seq"], r["covers"]["to_seq"])
        for seq, r in records
        if seq in kept and r["type"] == "summary"
    }
    assert used == sent_summaries and len(used) == len(chosen.summarized)
    for first, last in used:
        assert not any(first <= seq <= last and by_seq[seq]["type"] != "summary" for seq in kept)
    # every omission counted, records and bytes; the budget holds
    assert len(kept) + chosen.omitted_records == len(records)
    assert sum(size[s] for s in kept) + chosen.omitted_bytes == sum(size.values())
    assert max_records is None or len(kept) <= max_records
    assert max_bytes is None or sum(size[s] for s in kept) <= max_bytes
    assert chosen.seqs == sorted(kept)
    # where a summary covers omitted records, it is used in their place: none is left out that would
    # still fit beside what was sent, over records all omitted, overlapping no summary used
    room_records = None if max_records is None else max_records - len(kept)
    room_bytes = None if max_bytes is None else max_bytes - sum(size[s] for s in kept)
    for seq, r in records:
        if r["type"] != "summary" or seq in kept:
            continue
        first, last = r["covers"]["from_seq"], r["covers"]["to_seq"]
        covered = [s for s in range(first, last + 1) if s in by_seq and by_seq[s]["type"] != "summary"]
        if not covered or any(s in kept for s in covered):
            continue
        if any(first <= u_last and u_first <= last for u_first, u_last in used):
            continue
        fits = (room_records is None or room_records >= 1) and (room_bytes is None or room_bytes >= size[seq])
        assert not fits, f"summary {seq} covers omitted records {first}-{last} and fits, but was left out"


@settings(max_examples=300, deadline=None)
@given(histories(), budgets, byte_budgets, st.randoms(use_true_random=False))
def test_context_selection_keeps_the_invariants(
    records: list[Record], max_records: int | None, max_bytes: int | None, rnd: random.Random
) -> None:
    chosen = select_context(records, max_records, max_bytes)
    shuffled = list(records)
    rnd.shuffle(shuffled)
    assert select_context(shuffled, max_records, max_bytes) == chosen  # deterministic
    if isinstance(chosen, LedgerError):
        results = result_seq(records)
        pending = [(seq, r) for seq, r in records if r["type"] == "tool_call" and r["call_id"] not in results]
        too_many = max_records is not None and len(pending) > max_records
        too_big = max_bytes is not None and sum(record_bytes(r) for _, r in pending) > max_bytes
        assert chosen.code == "invalid_history" and (too_many or too_big)
        return
    check_selection(records, chosen, max_records, max_bytes)


@settings(max_examples=150, deadline=None)
@given(histories())
def test_without_bounds_every_authoritative_record_is_sent(records: list[Record]) -> None:
    chosen = select_context(records, None, None)
    assert isinstance(chosen, Selection)
    assert chosen.seqs == [seq for seq, r in records if r["type"] != "summary"]
    assert chosen.summarized == []


def msg(text: str) -> dict[str, Any]:
    """A user message as stored."""
    return {"type": "message", "role": "user", "content": text, "schema": 1}


def summary_of(first: int, last: int) -> dict[str, Any]:
    """A summary of seqs first..last as stored."""
    covers = {"from_seq": first, "to_seq": last}
    return {
        "type": "summary",
        "covers": covers,
        "content": "s",
        "summarizer": "z",
        "omissions": [],
        "schema": 1,
    }


def test_a_summary_stands_in_for_a_range_that_does_not_fit() -> None:
    summary = summary_of(1, 3)
    records: list[Record] = [(1, msg("a")), (2, msg("b")), (3, msg("c")), (4, summary), (5, msg("d"))]
    chosen = select_context(records, 2, None)
    assert isinstance(chosen, Selection)
    assert chosen.seqs == [4, 5] and chosen.summarized == [{"from_seq": 1, "to_seq": 3}]
    assert chosen.omitted_records == 3
    all_fit = select_context(records, 4, None)
    assert isinstance(all_fit, Selection) and all_fit.seqs == [1, 2, 3, 5] and all_fit.summarized == []


def test_a_summary_that_fits_stands_in_behind_a_record_that_does_not() -> None:
    """API.md section 12: "where a summary covers omitted records, the summary is used in their
    place". A newest record that fits, then one too big for the budget, then a summary of the two
    oldest that fits: the summary is sent beside the newest (until round 36 the walk stopped at the
    big record and the summary was omitted with everything older)."""
    summary = summary_of(1, 2)
    records: list[Record] = [(1, msg("a")), (2, msg("b")), (3, summary), (4, msg("x" * 2000)), (5, msg("e"))]
    budget = record_bytes(records[4][1]) + record_bytes(summary)
    chosen = select_context(records, None, budget)
    assert isinstance(chosen, Selection)
    assert chosen.seqs == [3, 5] and chosen.summarized == [{"from_seq": 1, "to_seq": 2}]
    assert chosen.omitted_records == 3  # 1, 2 (summarized) and 4 (did not fit)
    assert chosen.omitted_bytes == sum(record_bytes(records[i][1]) for i in (0, 1, 3))
    one_short = select_context(records, None, budget - 1)
    assert isinstance(one_short, Selection) and one_short.seqs == [5] and one_short.summarized == []


def test_the_fast_projection_encoding_is_jcs_for_every_code_point() -> None:
    points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for start in range(0, len(points), 8192):
        text = "".join(chr(c) for c in points[start : start + 8192])
        body = {"messages": [{"seq": 1, "role": "user", "content": text}], "calls": []}
        assert projection_jcs(body) == canonical_json(body)


@settings(max_examples=200, deadline=None)
@given(histories(), st.lists(st.text(), min_size=1, max_size=5), st.booleans())
def test_the_projection_digest_is_sha256_of_the_jcs_form(
    records: list[Record], texts: list[str], error: bool
) -> None:
    records = [*records]
    base = len(records)
    for i, text in enumerate(texts):  # arbitrary text in contents, names and call IDs
        records.append((base + 3 * i + 1, {"type": "message", "role": "user", "content": text, "schema": 1}))
        records.append(
            (
                base + 3 * i + 2,
                {
                    "type": "tool_call",
                    "call_id": f"{text}-{i}",
                    "name": text or "n",
                    "arguments": {},
                    "operation_id": None,
                    "schema": 1,
                },
            )
        )
        records.append(
            (
                base + 3 * i + 3,
                {
                    "type": "tool_result",
                    "call_id": f"{text}-{i}",
                    "name": text or "n",
                    "output": None,
                    "is_error": error,
                    "schema": 1,
                },
            )
        )
    view = reduce_records(records)
    body = {"messages": view.messages, "calls": view.calls}
    assert view.digest == "sha256:" + hashlib.sha256(canonical_json(body)).hexdigest()
