"""A Hypothesis strategy for random valid journal histories, built through the domain's own rules."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from effect_ledger.domain.journal_history import Calls, apply_causal_rules

NAMES = ("measure", "lookup", "write")
Record = tuple[int, dict[str, Any]]


def _candidate(draw: st.DrawFn, calls: Calls, seq: int, n: int) -> dict[str, Any]:
    pending = sorted(cid for cid, c in calls.items() if c.result_seq is None)
    kinds = ["tool_call", "summary"] + (["tool_result"] * 3 if pending else ["message"] * 2)
    kind = draw(st.sampled_from(kinds))
    if kind == "message":
        role = draw(st.sampled_from(["user", "assistant"]))
        return {"type": "message", "role": role, "content": "m" * draw(st.integers(0, 40)), "schema": 1}
    if kind == "tool_call":
        op = draw(st.sampled_from([None, f"op-{n}"]))
        return {
            "type": "tool_call",
            "call_id": f"c{n}",
            "name": draw(st.sampled_from(NAMES)),
            "arguments": {"n": n},
            "operation_id": op,
            "schema": 1,
        }
    if kind == "tool_result":
        cid = draw(st.sampled_from(pending))
        return {
            "type": "tool_result",
            "call_id": cid,
            "name": calls[cid].name,
            "output": "o" * draw(st.integers(0, 40)),
            "is_error": draw(st.booleans()),
            "schema": 1,
        }
    first = draw(st.integers(1, max(seq - 1, 1)))
    last = draw(st.integers(first, max(seq - 1, first)))
    return {
        "type": "summary",
        "covers": {"from_seq": first, "to_seq": last},
        "content": "s",
        "summarizer": "z/1",
        "omissions": [],
        "schema": 1,
    }


@st.composite
def histories(draw: st.DrawFn, max_size: int = 40) -> list[Record]:
    """A history the append rules accept: each record is checked against the ones before it."""
    calls: Calls = {}
    records: list[Record] = []
    for n in range(draw(st.integers(0, max_size))):
        seq = len(records) + 1
        record = _candidate(draw, calls, seq, n)
        if not apply_causal_rules(calls, seq - 1, [record]):  # valid: folded into `calls`
            records.append((seq, record))
    return records
