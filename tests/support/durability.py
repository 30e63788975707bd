"""Durability checks over a call history: what was acknowledged, and whether the ledger still holds it.

Shared by the failover and restore scenarios (tests/chaos/test_failover.py, test_restore_drill.py).
"""

from __future__ import annotations

from collections import Counter

from effect_ledger.domain.timefmt import parse_ts
from support.harness import LedgerState
from support.recording import Call, History

ACKNOWLEDGED = {"claim": ("claimed", "reclaimed"), "submit": ("submitted",), "complete": ("completed",)}
CLOCK_SLACK_SECONDS = 0.005  # events carry milliseconds


def ended_at(call: Call) -> float:
    """When the call's answer came (wall clock, as the ledger's timestamps)."""
    assert call.ended is not None
    return float(call.wall + (call.ended - call.started))


def lost_acknowledged(
    history: History, state: LedgerState, answered_before: float | None = None
) -> tuple[Counter[str], list[str]]:
    """Acknowledged transitions the ledger does not hold as acknowledged, by kind, with details.

    An event must be there at the answered attempt and have been recorded before the answer came:
    a claim lost in the failover and then claimed again has an event of the same attempt, but a
    later one. A committed completion's receipt must be the stored one. `answered_before`: only the
    calls answered before that moment (a restore point) count."""
    lost: Counter[str] = Counter()
    details: list[str] = []
    for call in history.calls:
        if call.outcome != "ok" or call.kind not in ACKNOWLEDGED or not isinstance(call.body, dict):
            continue
        if call.kind == "claim" and call.body.get("action") == "reuse_receipt":
            continue
        if answered_before is not None and ended_at(call) >= answered_before:
            continue
        view = call.body.get("operation", call.body)
        key = ("t1", str(call.operation_id))
        answered = ended_at(call) + CLOCK_SLACK_SECONDS
        events = [
            e
            for e in state.events.get(key, [])
            if e["kind"] in ACKNOWLEDGED[call.kind]
            and e["attempt"] == view["attempt"]
            and (call.kind != "complete" or e["to_status"] == view["status"])
            and parse_ts(e["at"]).timestamp() <= answered
        ]
        if not events:
            lost[call.kind] += 1
            details.append(
                f"{call.operation_id}: {call.kind} (attempt {view['attempt']}) answered, then lost"
            )
            continue
        if call.kind == "complete" and view["status"] == "committed":
            stored = (state.operations[key].get("receipt") or {}).get("external_ref")
            if stored != view["receipt"]["external_ref"]:
                lost["receipt"] += 1
                details.append(
                    f"{call.operation_id}: acknowledged receipt {view['receipt']['external_ref']}, stored {stored}"
                )
    return lost, details


def incidents_missing(history: History) -> list[str]:
    """Every 503 names an incident."""
    return [
        f"{c.method} {c.path}: 503 without an incident"
        for c in history.calls
        if c.status == 503
        and not (isinstance(c.body, dict) and str(c.body.get("incident", "")).startswith("inc_"))
    ]


def writes_resumed_after(history: History, moment: float) -> float | None:
    """Seconds from `moment` to the first acknowledged write answered after it."""
    ends = [
        ended_at(c)
        for c in history.calls
        if c.outcome == "ok" and c.kind in ACKNOWLEDGED and ended_at(c) > moment
    ]
    return min(ends) - moment if ends else None
